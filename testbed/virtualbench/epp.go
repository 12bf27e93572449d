package virtualbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	upflowcontrol "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/plugins"
)

// eppEndpoint is one model server of an inProcessEPP.
type eppEndpoint struct {
	// Name is the pod name (namespace "default"): the identity the scorers and indexes key on.
	Name string
	// Address and Port are where the EPP would route; the endpoint's routing name is address:port
	// (plugins.EndpointName).
	Address, Port string
}

// eppOptions configure an inProcessEPP.
type eppOptions struct {
	// Config is an EndpointPickerConfig (YAML or JSON). Empty means what the EPP runs without --config-file:
	// upstream's default, or, with Admission set, plugins.DefaultEndpointPickerConfig (as FlowControlCommand selects
	// it).
	Config []byte
	// Admission turns Sluice admission on with this policy. Nil means upstream's admission: its legacy controller,
	// which sheds sheddable requests (priority < 0) while the configured saturation detector reports saturation.
	Admission *flowcontrol.Config
	// AdmissionOptions are the adapter's settings (DefaultOutputTokens for cost estimates; SnapshotInterval is the
	// caller's business: it calls SyncAdmission).
	AdmissionOptions plugins.FlowControlOptions
	// Endpoints are the pool, in a fixed order; their index identifies them in Scrape and routed.
	Endpoints []eppEndpoint
	// Objectives maps InferenceObjective names (the x-gateway-inference-objective header) to priorities; an unknown
	// or missing objective has priority 0, as in upstream's Director.
	Objectives map[string]int
	// Clock is the EPP's time: admission timers, decision expiry, Sluice plugins' clocks and the staleness of
	// scraped metrics. Its AfterFunc callbacks must run on the goroutine that calls the EPP, outside any call into it
	// (a discrete-event loop); call Resume after running them. Required.
	Clock clock.WithTickerAndDelayedExecution
	// Seed makes the EPP's random choices (tie-breaks among equal scores, Retry-After jitter) reproducible.
	Seed uint64
	// Ownership is the replica's share of the endpoints when replicas own them (nil: all), as --peers gives it.
	Ownership plugins.EndpointOwnership
	// Peers is the replica's side of the peer exchange (nil: none).
	Peers *replication.Exchange
}

// eppRequest is one request as the data plane hands it to the EPP.
type eppRequest struct {
	// ID is the request's x-request-id; unique among the EPP's requests in flight.
	ID string
	// Headers are the request headers with lower-case keys, including the pseudo-headers :method, :path,
	// :authority and :scheme the data plane sends (upstream's parser reads the API from :path).
	Headers map[string]string
	// Body is the request body.
	Body []byte
}

// eppAnswer is the EPP's answer to one request.
type eppAnswer struct {
	// Endpoint is the index of the endpoint the request goes to, or -1 when the EPP answered it itself.
	Endpoint int
	// Body is what the EPP forwards: the body re-encoded after parsing, as upstream's Director does.
	Body []byte
	// Status is the HTTP status of the EPP's own answer (Endpoint -1), e.g. 429 or 503 from admission; 0 with
	// Cancelled.
	Status int
	// RetryAfter is the answer's Retry-After (whole seconds); RetryAfterSet tells whether it carries one.
	RetryAfter    time.Duration
	RetryAfterSet bool
	// Message is the answer's body.
	Message string
	// Cancelled is true when the request was withdrawn with Cancel before it was routed.
	Cancelled bool
}

// inProcessEPP is the Sluice EPP's request path without gRPC, Envoy or a datastore, for the discrete-event
// simulation. It loads an EndpointPickerConfig through upstream's loader and Sluice's plugin registry, exactly as the
// EPP does, holds one endpoint per model server whose metrics the caller scrapes, and runs for each request what
// upstream's Director runs, in the same order (TestDirectorOrder compares the two):
//
//	header handling (fairness ID, objective) -> parse -> objective priority -> admission
//	-> PrepareData plugins (dependency order) -> AdmitRequest plugins -> Schedule -> PreRequest plugins -> re-encode
//	and, later, ResponseHeader plugins, then ResponseBody plugins with EndOfStream and the parsed usage.
//
// Admission is Sluice's (plugins.FlowControl, driven through Submit, so a request that waits does not block the
// caller) or upstream's legacy controller. Scrape runs the configured data layer's extractors on a server's metrics,
// as the metrics data source does on each poll; SyncAdmission is FlowControl's snapshot tick.
//
// Deterministic by construction, given the same calls and Seed: plugin hooks run in configuration order (upstream's
// handle lists them in map order) and the max-score picker breaks ties with a seeded hash instead of upstream's
// wall-clock-seeded shuffle (epp_determinism.go); Sluice's plugins read the EPP's clock (plugins.ClockHandle);
// plugins that maintain themselves on wall-clock tickers get a done context, and the Sluice prefix cache's
// maintenance runs on the EPP's clock instead; every call into plugin code returns only once the goroutines it
// started have ended (epp_hooks.go: upstream's approximate prefix producer updates its index from one); PrepareData
// plugins run inline without upstream's 400ms wall-clock timeout; upstream code that judges staleness with
// time.Since is shown metrics as fresh or as stale as they are on the EPP's clock (epp_staleness.go); plugin types
// that draw from unseedable random sources or time requests with the wall clock are refused. Not supported:
// upstream's experimental flow control, the legacy metrics path, InferenceModelRewrites, subset hints.
//
// Concurrency: not safe for concurrent use; one goroutine makes every call and runs the clock's callbacks.
type inProcessEPP struct {
	clock      clock.WithTickerAndDelayedExecution
	ctx        context.Context
	endpoints  []*fwkdl.ModelServer
	names      []string       // routing names, address:port
	index      map[string]int // pod name -> endpoint index
	objectives map[string]int

	parser       fwkrh.Parser
	scheduler    *scheduling.Scheduler
	prepareData  []fwkrc.PrepareDataPlugin
	admitPlugins []fwkrc.AdmissionPlugin
	preRequest   []fwkrc.PreRequest
	respHeader   []fwkrc.ResponseHeader
	respBody     []fwkrc.ResponseBody
	extractors   []fwkdl.Extractor

	fc     *plugins.FlowControl
	legacy requestcontrol.AdmissionController
	// candidates locates a request's scheduling candidates, as the runner's Director does: every endpoint, narrowed
	// by Sluice admission (plugins.FlowControl.NarrowCandidates) when it is on.
	candidates contracts.EndpointCandidates
	// staleness shows upstream's staleness checks the age metrics have on the EPP's clock.
	staleness staleness
	// hooks runs every call into plugin code and waits for the goroutines it starts.
	hooks *hookGoroutines

	maintenance []clock.Timer
	requests    map[string]*eppState
	pending     []admitted
	resuming    bool
	// err is the first failure of the code under test outside any one request (a plugin's goroutine that never
	// ends); the run stops on it.
	err error
}

// eppState is one request between Route and the end of its response.
type eppState struct {
	id     string
	rc     *handlers.RequestContext
	done   func(eppAnswer)
	routed bool
}

// admitted is an admission decision waiting for Resume.
type admitted struct {
	st        *eppState
	err       error
	cancelled bool
}

// installPlugins makes Sluice's plugin types available to upstream's loader once per process. Types already
// installed (by an EPP runner in the same process) are kept.
var installPlugins = sync.OnceValue(func() error {
	reg, err := plugins.Default()
	if err != nil {
		return err
	}
	reg.InstallMissing()
	return nil
})

// newInProcessEPP loads opts.Config and builds the EPP. Every endpoint starts without metrics (no headroom, stale)
// until its first Scrape.
func newInProcessEPP(opts eppOptions) (*inProcessEPP, error) {
	if opts.Clock == nil {
		return nil, errors.New("in-process EPP: a clock is required")
	}
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("in-process EPP: at least one endpoint is required")
	}
	if err := installPlugins(); err != nil {
		return nil, fmt.Errorf("in-process EPP: registering plugins: %w", err)
	}
	logger := logr.Discard()
	p := &inProcessEPP{
		clock:      opts.Clock,
		ctx:        log.IntoContext(context.Background(), logger),
		index:      make(map[string]int, len(opts.Endpoints)),
		objectives: opts.Objectives,
		requests:   map[string]*eppState{},
		hooks:      newHookGoroutines(),
	}
	for i, e := range opts.Endpoints {
		if e.Name == "" {
			return nil, fmt.Errorf("in-process EPP: endpoint %d has no name", i)
		}
		if _, dup := p.index[e.Name]; dup {
			return nil, fmt.Errorf("in-process EPP: endpoint name %q appears twice", e.Name)
		}
		p.index[e.Name] = i
		md := &fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "default", Name: e.Name},
			PodName:        e.Name, Address: e.Address, Port: e.Port, MetricsHost: net.JoinHostPort(e.Address, e.Port),
		}
		p.endpoints = append(p.endpoints, fwkdl.NewEndpoint(md, nil))
		p.names = append(p.names, plugins.EndpointName(md))
	}
	if err := p.load(opts, logger); err != nil {
		p.Close()
		return nil, fmt.Errorf("in-process EPP: %w", err)
	}
	return p, nil
}

func (p *inProcessEPP) load(opts eppOptions, logger logr.Logger) error {
	text := opts.Config
	if len(bytes.TrimSpace(text)) == 0 {
		text = nil
		if opts.Admission != nil {
			def, err := plugins.DefaultEndpointPickerConfig()
			if err != nil {
				return err
			}
			text = []byte(def)
		}
	}
	loader.RegisterFeatureGate(datalayer.ExperimentalDatalayerFeatureGate)
	loader.RegisterFeatureGate(datalayer.EnableLegacyMetricsFeatureGate)
	loader.RegisterFeatureGate(upflowcontrol.FeatureGate)
	raw, gates, err := loader.LoadRawConfig(text, logger)
	if err != nil {
		return fmt.Errorf("parsing the EndpointPickerConfig: %w", err)
	}
	switch {
	case gates[upflowcontrol.FeatureGate] && opts.Admission == nil:
		return fmt.Errorf("feature gate %s (upstream's experimental flow control) is not supported in process", upflowcontrol.FeatureGate)
	case gates[datalayer.EnableLegacyMetricsFeatureGate]:
		return fmt.Errorf("feature gate %s (the legacy metrics path) is not supported in process", datalayer.EnableLegacyMetricsFeatureGate)
	}

	// Plugins that maintain themselves on wall-clock tickers see a done context and stop at once.
	done, cancel := context.WithCancel(p.ctx)
	cancel()
	handle := &eppHandle{ctx: done, clock: opts.Clock, seed: opts.Seed, podList: p.podNames,
		plugins: map[string]fwkplugin.Plugin{}}
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logger)
	if err != nil {
		return fmt.Errorf("loading the EndpointPickerConfig: %w", err)
	}
	if err := errors.Join(handle.errs...); err != nil {
		return err
	}
	if p.staleness, err = stalenessOf(raw); err != nil {
		return err
	}
	all := handle.GetAllPlugins()
	dag, err := datalayer.ValidateAndOrderDataDependencies(all)
	if err != nil {
		return fmt.Errorf("loading the EndpointPickerConfig: %w", err)
	}
	p.parser = handlers.NewParser(cfg.ParserConfig)
	p.scheduler = scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig)
	if err := p.loadDataLayer(cfg.DataConfig); err != nil {
		return err
	}

	if opts.Admission != nil {
		fc, err := plugins.NewFlowControl(opts.Admission, opts.AdmissionOptions, plugins.FlowControlDeps{
			Endpoints: endpointList(p.endpoints), Clock: opts.Clock, SynchronousTimers: true, Ownership: opts.Ownership,
			Peers: opts.Peers,
			Rand:  rand.New(rand.NewPCG(opts.Seed, 0x5111ce)),
		})
		if err != nil {
			return err
		}
		fc.Attach(handle.GetAllPluginsWithNames())
		p.fc = fc
		p.candidates = fc.NarrowCandidates(allEndpoints{p})
		all = append(all, fc) // the runner adds the admission controller's hooks after the configured plugins
	} else {
		p.legacy = requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, stalenessCandidates{p})
		p.candidates = allEndpoints{p}
	}
	p.addHooks(all, dag)
	for _, pl := range all {
		if pc, ok := pl.(*plugins.PrefixCache); ok {
			p.every(pc.PodSyncInterval(), func(now time.Time) { pc.SyncPods(now, p.podNames()) })
		}
	}
	return nil
}

// addHooks sorts the plugins into the request-control extension points as upstream's requestcontrol.Config does,
// PrepareData plugins in data-dependency order.
func (p *inProcessEPP) addHooks(all []fwkplugin.Plugin, dagOrder []string) {
	prepare := map[string]fwkrc.PrepareDataPlugin{}
	for _, pl := range all {
		if h, ok := pl.(fwkrc.PreRequest); ok {
			p.preRequest = append(p.preRequest, h)
		}
		if h, ok := pl.(fwkrc.ResponseHeader); ok {
			p.respHeader = append(p.respHeader, h)
		}
		if h, ok := pl.(fwkrc.ResponseBody); ok {
			p.respBody = append(p.respBody, h)
		}
		if h, ok := pl.(fwkrc.PrepareDataPlugin); ok {
			prepare[h.TypedName().String()] = h
		}
		if h, ok := pl.(fwkrc.AdmissionPlugin); ok {
			p.admitPlugins = append(p.admitPlugins, h)
		}
	}
	for _, name := range dagOrder {
		if h, ok := prepare[name]; ok {
			p.prepareData = append(p.prepareData, h)
		}
	}
}

// loadDataLayer keeps the extractors of the configured metrics data sources: Scrape feeds them what the source
// would have parsed from /metrics.
func (p *inProcessEPP) loadDataLayer(cfg *datalayer.Config) error {
	if cfg == nil {
		return nil
	}
	for _, src := range cfg.Sources {
		if src.Plugin.OutputType() != sourcemetrics.PrometheusMetricType {
			return fmt.Errorf("data source %s does not produce Prometheus metrics: only metrics sources are supported in process",
				src.Plugin.TypedName())
		}
		p.extractors = append(p.extractors, src.Extractors...)
	}
	return nil
}

// every runs f(now) every interval on the EPP's clock until Close.
func (p *inProcessEPP) every(interval time.Duration, f func(now time.Time)) {
	slot := len(p.maintenance)
	p.maintenance = append(p.maintenance, nil)
	var tick func()
	tick = func() {
		p.call(func(context.Context) { f(p.clock.Now()) })
		p.maintenance[slot] = p.clock.AfterFunc(interval, tick)
	}
	p.maintenance[slot] = p.clock.AfterFunc(interval, tick)
}

// Close stops the EPP's timers. Requests in flight are abandoned.
func (p *inProcessEPP) Close() {
	for _, t := range p.maintenance {
		if t != nil {
			t.Stop()
		}
	}
}

// Err returns the first failure of the code under test that belongs to no request (see epp_hooks.go); the EPP's
// answers are not to be trusted after one.
func (p *inProcessEPP) Err() error { return p.err }

// call runs f, a call into plugin code, through p.hooks; a failure is kept for Err.
func (p *inProcessEPP) call(f func(ctx context.Context)) {
	if err := p.hooks.run(p.ctx, f); err != nil && p.err == nil {
		p.err = err
	}
}

func (p *inProcessEPP) podNames() []types.NamespacedName {
	out := make([]types.NamespacedName, len(p.endpoints))
	for i, ep := range p.endpoints {
		out[i] = ep.GetMetadata().NamespacedName
	}
	return out
}

// Scrape is one poll of endpoint i by the metrics data source: every configured extractor reads families (what the
// source parses from the server's /metrics), and metrics updated by the poll are stamped with the clock's time
// (upstream's core extractor stamps the wall clock).
func (p *inProcessEPP) Scrape(i int, families sourcemetrics.PrometheusMetricMap) error {
	ep := p.endpoints[i]
	before := ep.GetMetrics()
	var errs []error
	p.call(func(ctx context.Context) {
		for _, x := range p.extractors {
			if err := x.Extract(ctx, families, ep); err != nil {
				errs = append(errs, fmt.Errorf("extractor %s: %w", x.TypedName(), err))
			}
		}
	})
	if m := ep.GetMetrics(); m != before {
		m.UpdateTime = p.clock.Now() // the extractor's fresh clone, not yet shared
	}
	return errors.Join(errs...)
}

// SyncAdmission is FlowControl's snapshot tick: the controller sees every endpoint's latest metrics and dispatches
// waiting requests onto endpoints with headroom. A no-op without Sluice admission.
func (p *inProcessEPP) SyncAdmission() error {
	if p.fc == nil {
		return nil
	}
	err := p.fc.SyncEndpoints()
	p.Resume()
	return err
}

// PeerSummary is the replica's next peer summary in its wire form (Router.PeerExchange); putting its peers' latest
// figures in force may dispatch waiting requests.
func (p *inProcessEPP) PeerSummary() ([]byte, error) {
	wire, err := p.fc.PeerSummary().AppendBinary(nil)
	p.Resume()
	return wire, err
}

// HearPeer takes in a peer's summary in its wire form.
func (p *inProcessEPP) HearPeer(wire []byte) error {
	s, err := replication.ParseSummary(wire)
	if err != nil {
		return err
	}
	p.fc.HearPeer(s)
	p.Resume()
	return nil
}

// AdmissionQueue returns the number of requests waiting in Sluice admission per band (Critical, Standard,
// Sheddable); zeros without Sluice admission.
func (p *inProcessEPP) AdmissionQueue() [flowcontrol.NumBands]int {
	if p.fc == nil {
		return [flowcontrol.NumBands]int{}
	}
	return p.fc.Controller().Stats().Queued
}

// InFlight returns the number of requests between Route and the end of their response.
func (p *inProcessEPP) InFlight() int { return len(p.requests) }
