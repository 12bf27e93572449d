package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	upflowcontrol "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// InProcessEndpoint is one model server of an InProcessPicker.
type InProcessEndpoint struct {
	// Name is the pod name (namespace "default"): the identity the scorers and indexes key on.
	Name string
	// Address and Port are where the EPP would route; the endpoint's routing name is address:port (EndpointName).
	Address, Port string
}

// InProcessOptions configure an InProcessPicker.
type InProcessOptions struct {
	// Config is an EndpointPickerConfig (YAML or JSON). Empty means what the EPP runs without --config-file:
	// upstream's default, or, with Admission set, DefaultEndpointPickerConfig (as FlowControlCommand selects it).
	Config []byte
	// Admission turns Sluice admission on with this policy. Nil means upstream's admission: its legacy controller,
	// which sheds sheddable requests (priority < 0) while the configured saturation detector reports saturation.
	Admission *flowcontrol.Config
	// AdmissionOptions are the adapter's settings (DefaultOutputTokens for cost estimates; SnapshotInterval is the
	// caller's business: it calls SyncAdmission).
	AdmissionOptions FlowControlOptions
	// Endpoints are the pool, in a fixed order; their index identifies them in Scrape and Routed.
	Endpoints []InProcessEndpoint
	// Objectives maps InferenceObjective names (the x-gateway-inference-objective header) to priorities; an unknown
	// or missing objective has priority 0, as in upstream's Director.
	Objectives map[string]int
	// Clock is the picker's time: admission timers, decision expiry, Sluice plugins' clocks and the staleness of
	// scraped metrics. Its AfterFunc callbacks must run on the goroutine that calls the picker, outside any call into
	// it (a discrete-event loop); call Resume after running them. Required.
	Clock clock.WithTickerAndDelayedExecution
	// Seed makes the picker's random choices (tie-breaks among equal scores, Retry-After jitter) reproducible.
	Seed uint64
}

// InProcessRequest is one request as the data plane hands it to the EPP.
type InProcessRequest struct {
	// ID is the request's x-request-id; unique among the picker's requests in flight.
	ID string
	// Headers are the request headers with lower-case keys, including the pseudo-headers :method, :path,
	// :authority and :scheme the data plane sends (upstream's parser reads the API from :path).
	Headers map[string]string
	// Body is the request body.
	Body []byte
}

// Routed is the EPP's answer to one request.
type Routed struct {
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

// InProcessPicker is the Sluice EPP's request path without gRPC, Envoy or a datastore, for discrete-event
// simulation (package virtualbench). It loads an EndpointPickerConfig through upstream's loader and Sluice's plugin
// registry, exactly as the EPP does, holds one endpoint per model server whose metrics the caller scrapes, and runs
// for each request what upstream's Director runs, in the same order:
//
//	header handling (fairness ID, objective) -> parse -> objective priority -> admission
//	-> PrepareData plugins (dependency order) -> AdmitRequest plugins -> Schedule -> PreRequest plugins -> re-encode
//	and, later, ResponseHeader plugins, then ResponseBody plugins with EndOfStream and the parsed usage.
//
// Admission is Sluice's (FlowControl, driven through flowcontrol.Controller.Submit, so a request that waits does not
// block the caller) or upstream's legacy controller. Scrape runs the configured data layer's extractors on a
// server's metrics, as the metrics data source does on each poll; SyncAdmission is FlowControl's snapshot tick.
//
// Deterministic by construction, given the same calls and Seed (see inprocess_determinism.go): plugin hooks run in
// configuration order (upstream's handle lists them in map order); the max-score picker breaks ties with a seeded
// hash instead of upstream's wall-clock-seeded shuffle; plugins whose background goroutines run on wall-clock
// tickers get a done context, and the Sluice prefix cache's maintenance runs on the picker's clock instead; the
// approximate prefix producer's background index update is waited for after PreRequest; PrepareData plugins run
// inline without upstream's 400ms wall-clock timeout; upstream code that compares metrics' UpdateTime with the wall
// clock (the utilization saturation detector) is shown metrics as old in wall time as they are on the picker's
// clock; plugin types that draw from unseedable random sources or time requests with the wall clock are refused.
// Not supported: upstream's experimental flow control, the legacy metrics path, InferenceModelRewrites, subset
// hints.
//
// Concurrency: not safe for concurrent use; one goroutine makes every call and runs the clock's callbacks.
type InProcessPicker struct {
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
	afterPreReq  []func()
	extractors   []fwkdl.Extractor

	fc     *FlowControl
	legacy requestcontrol.AdmissionController

	maintenance []clock.Timer
	requests    map[string]*inProcessState
	pending     []admitted
	resuming    bool
}

// inProcessState is one request between Route and the end of its response.
type inProcessState struct {
	id     string
	rc     *handlers.RequestContext
	body   *fwksched.LLMRequestBody
	done   func(Routed)
	routed bool
}

// admitted is an admission decision waiting for Resume.
type admitted struct {
	st        *inProcessState
	err       error
	cancelled bool
}

// installInProcess makes Sluice's plugin types available to upstream's loader once per process. Types already
// installed (by the EPP runner in the same process) are kept.
var installInProcess = sync.OnceValue(func() error {
	reg, err := Default()
	if err != nil {
		return err
	}
	reg.installMissing()
	return nil
})

// installMissing copies into upstream's global registry every factory it does not hold yet.
func (r *Registry) installMissing() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, f := range r.factories {
		if _, taken := fwkplugin.Registry[t]; !taken {
			fwkplugin.Register(t, f)
		}
	}
}

// NewInProcessPicker loads opts.Config and builds the picker. Every endpoint starts without metrics (no headroom,
// stale) until its first Scrape.
func NewInProcessPicker(opts InProcessOptions) (*InProcessPicker, error) {
	if opts.Clock == nil {
		return nil, errors.New("in-process picker: a clock is required")
	}
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("in-process picker: at least one endpoint is required")
	}
	if err := installInProcess(); err != nil {
		return nil, fmt.Errorf("in-process picker: registering plugins: %w", err)
	}
	logger := logr.Discard()
	p := &InProcessPicker{
		clock:      opts.Clock,
		ctx:        log.IntoContext(context.Background(), logger),
		index:      make(map[string]int, len(opts.Endpoints)),
		objectives: opts.Objectives,
		requests:   map[string]*inProcessState{},
	}
	for i, e := range opts.Endpoints {
		if e.Name == "" {
			return nil, fmt.Errorf("in-process picker: endpoint %d has no name", i)
		}
		if _, dup := p.index[e.Name]; dup {
			return nil, fmt.Errorf("in-process picker: endpoint name %q appears twice", e.Name)
		}
		p.index[e.Name] = i
		md := &fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "default", Name: e.Name},
			PodName:        e.Name, Address: e.Address, Port: e.Port, MetricsHost: net.JoinHostPort(e.Address, e.Port),
		}
		p.endpoints = append(p.endpoints, fwkdl.NewEndpoint(md, nil))
		p.names = append(p.names, EndpointName(md))
	}
	if err := p.load(opts, logger); err != nil {
		p.Close()
		return nil, fmt.Errorf("in-process picker: %w", err)
	}
	return p, nil
}

func (p *InProcessPicker) load(opts InProcessOptions, logger logr.Logger) error {
	text := opts.Config
	if len(bytes.TrimSpace(text)) == 0 {
		text = nil
		if opts.Admission != nil {
			def, err := DefaultEndpointPickerConfig()
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
	params := map[string]json.RawMessage{}
	for _, spec := range raw.Plugins {
		params[spec.Name] = spec.Parameters
	}

	// Plugins that maintain themselves on wall-clock tickers see a done context and stop at once.
	done, cancel := context.WithCancel(p.ctx)
	cancel()
	handle := &inProcessHandle{ctx: done, clock: opts.Clock, seed: opts.Seed, podList: p.podNames,
		plugins: map[string]fwkplugin.Plugin{}}
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logger)
	if err != nil {
		return fmt.Errorf("loading the EndpointPickerConfig: %w", err)
	}
	if err := errors.Join(handle.errs...); err != nil {
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
		fc, err := NewFlowControl(opts.Admission, opts.AdmissionOptions, FlowControlDeps{
			Endpoints: endpointList(p.endpoints), Clock: opts.Clock, SynchronousTimers: true,
			Rand: rand.New(rand.NewPCG(opts.Seed, 0x5111ce)),
		})
		if err != nil {
			return err
		}
		fc.Attach(handle.GetAllPluginsWithNames())
		p.fc = fc
		all = append(all, fc) // the runner adds the admission controller's hooks after the configured plugins
	} else {
		p.legacy = requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, wallClockCandidates{p})
	}
	p.addHooks(all, dag)
	for _, pl := range all {
		wait, err := asyncIndexWait(pl)
		if err != nil {
			return err
		}
		if wait != nil {
			p.afterPreReq = append(p.afterPreReq, wait)
		}
		if pc, ok := pl.(*PrefixCache); ok {
			run, every, err := prefixCacheMaintenance(pc, params[pc.TypedName().Name], p.podNames)
			if err != nil {
				return err
			}
			p.every(every, run)
		}
	}
	return nil
}

// addHooks sorts the plugins into the request-control extension points as upstream's requestcontrol.Config does,
// PrepareData plugins in data-dependency order.
func (p *InProcessPicker) addHooks(all []fwkplugin.Plugin, dagOrder []string) {
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
func (p *InProcessPicker) loadDataLayer(cfg *datalayer.Config) error {
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

// every runs f(now) every interval on the picker's clock until Close.
func (p *InProcessPicker) every(interval time.Duration, f func(now time.Time)) {
	slot := len(p.maintenance)
	p.maintenance = append(p.maintenance, nil)
	var tick func()
	tick = func() {
		f(p.clock.Now())
		p.maintenance[slot] = p.clock.AfterFunc(interval, tick)
	}
	p.maintenance[slot] = p.clock.AfterFunc(interval, tick)
}

// Close stops the picker's timers. Requests in flight are abandoned.
func (p *InProcessPicker) Close() {
	for _, t := range p.maintenance {
		if t != nil {
			t.Stop()
		}
	}
}

func (p *InProcessPicker) podNames() []types.NamespacedName {
	out := make([]types.NamespacedName, len(p.endpoints))
	for i, ep := range p.endpoints {
		out[i] = ep.GetMetadata().NamespacedName
	}
	return out
}

// NumEndpoints returns the size of the pool.
func (p *InProcessPicker) NumEndpoints() int { return len(p.endpoints) }

// EndpointName returns endpoint i's routing name, address:port.
func (p *InProcessPicker) EndpointName(i int) string { return p.names[i] }

// Metrics returns endpoint i's latest metrics as the scorers see them. Do not modify them.
func (p *InProcessPicker) Metrics(i int) *fwkdl.Metrics { return p.endpoints[i].GetMetrics() }

// Scrape is one poll of endpoint i by the metrics data source: every configured extractor reads families (what the
// source parses from the server's /metrics), and metrics updated by the poll are stamped with the clock's time
// (upstream's core extractor stamps the wall clock).
func (p *InProcessPicker) Scrape(i int, families sourcemetrics.PrometheusMetricMap) error {
	ep := p.endpoints[i]
	before := ep.GetMetrics()
	var errs []error
	for _, x := range p.extractors {
		if err := x.Extract(p.ctx, families, ep); err != nil {
			errs = append(errs, fmt.Errorf("extractor %s: %w", x.TypedName(), err))
		}
	}
	if m := ep.GetMetrics(); m != before {
		m.UpdateTime = p.clock.Now() // the extractor's fresh clone, not yet shared
	}
	return errors.Join(errs...)
}

// SyncAdmission is FlowControl's snapshot tick: the controller sees every endpoint's latest metrics and dispatches
// waiting requests onto endpoints with headroom. A no-op without Sluice admission.
func (p *InProcessPicker) SyncAdmission() error {
	if p.fc == nil {
		return nil
	}
	err := p.fc.SyncEndpoints()
	p.Resume()
	return err
}

// AdmissionQueue returns the number of requests waiting in Sluice admission per band (Critical, Standard,
// Sheddable); zeros without Sluice admission.
func (p *InProcessPicker) AdmissionQueue() [flowcontrol.NumBands]int {
	if p.fc == nil {
		return [flowcontrol.NumBands]int{}
	}
	return p.fc.ctrl.Stats().Queued
}

// Route takes a request through the EPP. done is called exactly once with the answer: before Route returns, or,
// when the request waits in admission, from the picker call (or Resume after a clock callback) that dispatches or
// rejects it. done must not call the picker.
func (p *InProcessPicker) Route(req InProcessRequest, done func(Routed)) {
	if _, dup := p.requests[req.ID]; dup || req.ID == "" {
		done(Routed{Endpoint: -1, Status: 400, Message: fmt.Sprintf("request ID %q is empty or already in flight", req.ID)})
		return
	}
	st := &inProcessState{id: req.ID, done: done}
	p.requests[req.ID] = st
	if err := p.prepare(st, req); err != nil {
		p.fail(st, err)
		return
	}
	if p.fc != nil {
		p.fc.submit(st.rc, st.rc.Priority, func(err error, cancelled bool) {
			p.pending = append(p.pending, admitted{st: st, err: err, cancelled: cancelled})
		})
	} else {
		err := p.legacy.Admit(p.ctx, st.rc, st.rc.Priority)
		p.pending = append(p.pending, admitted{st: st, err: err})
	}
	p.Resume()
}

// prepare is the ext_proc handler's header and body handling and the first half of Director.HandleRequest: it
// fills the request context up to the LLMRequest admission sees.
func (p *InProcessPicker) prepare(st *inProcessState, req InProcessRequest) error {
	headers := make(map[string]string, len(req.Headers)+1)
	for k, v := range req.Headers {
		headers[k] = v
	}
	headers[reqcommon.RequestIdHeaderKey] = req.ID
	rc := &handlers.RequestContext{
		Request:  &handlers.Request{Headers: headers, RawBody: req.Body, Metadata: map[string]any{}},
		Response: &handlers.Response{Headers: map[string]string{}},
	}
	st.rc = rc
	rc.FairnessID = headers[metadata.FlowFairnessIDKey]
	if rc.FairnessID == "" {
		rc.FairnessID = metadata.DefaultFairnessID
	}
	rc.ObjectiveKey = headers[metadata.ObjectiveKey]
	rc.TargetModelName = headers[metadata.ModelNameRewriteKey]
	rc.RequestSize = len(req.Body)

	body, err := p.parser.ParseRequest(p.ctx, req.Body, headers)
	if err != nil {
		return errcommon.Error{Code: errcommon.BadRequest, Msg: err.Error()}
	}
	switch payload := body.Payload.(type) {
	case fwksched.PayloadMap:
		model, ok := payload["model"].(string)
		if !ok {
			return errcommon.Error{Code: errcommon.BadRequest, Msg: "model not found in request body"}
		}
		rc.IncomingModelName = model
		if rc.TargetModelName == "" {
			rc.TargetModelName = model
		}
		payload["model"] = rc.TargetModelName
	case fwksched.PayloadProto, fwksched.RawPayload:
	default:
		return errcommon.Error{Code: errcommon.BadRequest, Msg: "Unsupported llmRequest parsedBody"}
	}
	st.body = body
	rc.Priority = p.objectives[rc.ObjectiveKey]
	rc.SchedulingRequest = &fwksched.LLMRequest{
		RequestId:        req.ID,
		TargetModel:      rc.TargetModelName,
		Body:             body,
		Headers:          headers,
		Objectives:       fwksched.RequestObjectives{Priority: rc.Priority},
		RequestSizeBytes: rc.RequestSize,
	}
	return nil
}

// submit is Admit without blocking: decided gets Admit's result once the controller decides (see
// flowcontrol.Controller.Submit for when and under which lock), or cancelled when the request was withdrawn.
func (f *FlowControl) submit(reqCtx *handlers.RequestContext, priority int, decided func(err error, cancelled bool)) {
	req := f.requestOf(reqCtx, priority)
	f.ctrl.Submit(req, func(d flowcontrol.Decision, err error) {
		if d.Outcome == flowcontrol.Cancelled {
			decided(err, true)
			return
		}
		decided(f.settle(req, d, err), false)
	})
}

// Resume continues every request whose admission was decided since the last call: it is scheduled and answered, or
// answered with the rejection. The picker's own methods call it; call it after running the clock's callbacks, which
// may time requests out of the admission queue.
func (p *InProcessPicker) Resume() {
	if p.resuming {
		return
	}
	p.resuming = true
	defer func() { p.resuming = false }()
	for i := 0; i < len(p.pending); i++ {
		a := p.pending[i]
		p.pending[i] = admitted{}
		switch {
		case a.cancelled:
			delete(p.requests, a.st.id)
			a.st.done(Routed{Endpoint: -1, Cancelled: true, Message: "withdrawn while waiting for admission"})
		case a.err != nil:
			p.fail(a.st, a.err)
		default:
			p.schedule(a.st)
		}
	}
	p.pending = p.pending[:0]
}

// schedule is the second half of Director.HandleRequest, after admission.
func (p *InProcessPicker) schedule(st *inProcessState) {
	req := st.rc.SchedulingRequest
	cands := p.schedulerCandidates()
	for _, pd := range p.prepareData {
		// Upstream logs a PrepareData failure and schedules anyway.
		if err := pd.PrepareRequestData(p.ctx, req, cands); err != nil {
			break
		}
	}
	for _, ap := range p.admitPlugins {
		if ap.AdmitRequest(p.ctx, req, cands) != nil {
			p.fail(st, errcommon.Error{Code: errcommon.Internal, Msg: "request cannot be admitted"})
			return
		}
	}
	result, err := p.scheduler.Schedule(p.ctx, req, cands)
	if err != nil {
		p.fail(st, errcommon.Error{Code: errcommon.ResourceExhausted, Msg: fmt.Errorf("failed to find target endpoint: %w", err).Error()})
		return
	}
	var primary *fwksched.ProfileRunResult
	if result != nil {
		primary = result.ProfileResults[result.PrimaryProfileName]
	}
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		p.fail(st, errcommon.Error{Code: errcommon.Internal, Msg: "results must be greater than zero"})
		return
	}
	target := primary.TargetEndpoints[0].GetMetadata()
	idx, ok := p.index[target.NamespacedName.Name]
	if !ok {
		p.fail(st, errcommon.Error{Code: errcommon.Internal, Msg: "scheduler chose unknown endpoint " + target.NamespacedName.String()})
		return
	}
	st.rc.TargetPod = target
	st.rc.TargetEndpoint = p.names[idx]
	for _, pr := range p.preRequest {
		pr.PreRequest(p.ctx, req, result)
	}
	for _, wait := range p.afterPreReq {
		wait()
	}
	body := st.rc.Request.RawBody
	if m, ok := st.body.Payload.(fwksched.PayloadMap); ok {
		if body, err = json.Marshal(m); err != nil {
			p.fail(st, errcommon.Error{Code: errcommon.Internal, Msg: "Error marshalling request body"})
			return
		}
		st.rc.Request.RawBody, st.rc.RequestSize = body, len(body)
	}
	st.routed = true
	st.done(Routed{Endpoint: idx, Body: body})
}

// schedulerCandidates snapshots every endpoint for the scheduler, as the Director's toSchedulerEndpoints does, with
// UpdateTime moved onto the wall clock (see wallTime).
func (p *InProcessPicker) schedulerCandidates() []fwksched.Endpoint {
	now, wall := p.clock.Now(), time.Now()
	out := make([]fwksched.Endpoint, len(p.endpoints))
	for i, ep := range p.endpoints {
		s := fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), ep.GetAttributes())
		if m := s.GetMetrics(); m != nil {
			m.UpdateTime = wallTime(m.UpdateTime, now, wall)
		}
		out[i] = s
	}
	return out
}

// wallTime maps a time on the picker's clock (now) to the wall clock (wall), keeping its age: upstream code that
// checks staleness with time.Since then sees the age the metrics have on the picker's clock. Zero stays zero.
func wallTime(t, now, wall time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return wall.Add(t.Sub(now))
}

// wallClockCandidates is the legacy admission controller's candidate source: every endpoint, with UpdateTime on the
// wall clock for its saturation detector.
type wallClockCandidates struct{ p *InProcessPicker }

// Locate implements contracts.EndpointCandidates.
func (c wallClockCandidates) Locate(context.Context, map[string]any) []fwkdl.Endpoint {
	now, wall := c.p.clock.Now(), time.Now()
	out := make([]fwkdl.Endpoint, len(c.p.endpoints))
	for i, ep := range c.p.endpoints {
		m := *ep.GetMetrics() // shallow: the detector reads it only
		m.UpdateTime = wallTime(m.UpdateTime, now, wall)
		out[i] = fwkdl.NewEndpoint(ep.GetMetadata(), &m)
	}
	return out
}

// endpointList is FlowControl's view of the pool: the picker's endpoints, with UpdateTime on the picker's clock.
type endpointList []*fwkdl.ModelServer

// PodList implements EndpointLister.
func (l endpointList) PodList(predicate func(fwkdl.Endpoint) bool) []fwkdl.Endpoint {
	out := make([]fwkdl.Endpoint, 0, len(l))
	for _, ep := range l {
		if predicate(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// fail answers st as the EPP answers an error: upstream's immediate response for the error's code, shaped by Sluice
// admission (Retry-After, shed reason, OpenAI body) when it is on.
func (p *InProcessPicker) fail(st *inProcessState, err error) {
	delete(p.requests, st.id)
	resp, berr := errcommon.BuildErrResponse(err)
	if berr != nil {
		st.done(Routed{Endpoint: -1, Status: 500, Message: berr.Error()})
		return
	}
	imm := resp.GetImmediateResponse()
	if p.fc != nil {
		p.fc.ShapeImmediateResponse(p.ctx, st.id, imm)
	}
	r := Routed{Endpoint: -1, Status: int(imm.GetStatus().GetCode()), Message: string(imm.GetBody())}
	for _, h := range imm.GetHeaders().GetSetHeaders() {
		if hv := h.GetHeader(); hv != nil && strings.EqualFold(hv.GetKey(), "retry-after") {
			v := string(hv.GetRawValue())
			if v == "" {
				v = hv.GetValue()
			}
			if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
				r.RetryAfter, r.RetryAfterSet = time.Duration(secs)*time.Second, true
			}
		}
	}
	st.done(r)
}

// ResponseHeader runs the ResponseHeader plugins for a routed request whose response headers arrived (lower-case
// keys; content-type tells the parser whether the body streams).
func (p *InProcessPicker) ResponseHeader(id string, headers map[string]string) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	for k, v := range headers {
		st.rc.Response.Headers[k] = v
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, ReqMetadata: st.rc.Request.Metadata}
	for _, h := range p.respHeader {
		h.ResponseHeader(p.ctx, st.rc.SchedulingRequest, resp, st.rc.TargetPod)
	}
}

// ResponseChunk runs the ResponseBody plugins for a non-final chunk of a routed request's streamed response, as
// upstream does for every chunk. Callers may report only the first chunk: no plugin acts on later ones (Sluice
// admission counts a streamed request as pending on its endpoint until its first chunk).
func (p *InProcessPicker) ResponseChunk(id string) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, Usage: st.rc.Usage}
	for _, h := range p.respBody {
		h.ResponseBody(p.ctx, st.rc.SchedulingRequest, resp, st.rc.TargetPod)
	}
	p.Resume()
}

// ResponseComplete ends a routed request: the configured parser reads the usage from the last body chunk (for a
// stream, the usage event and [DONE]; nil when the client went away), and the ResponseBody plugins run once with
// EndOfStream, as upstream runs them at the end of every response, after errors and disconnects too. Sluice
// admission releases the request's reservation here, which may dispatch waiting requests.
func (p *InProcessPicker) ResponseComplete(id string, lastChunk []byte) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	delete(p.requests, id)
	if len(lastChunk) > 0 {
		parsed, err := p.parser.ParseResponse(p.ctx, lastChunk, st.rc.Response.Headers, true)
		if err == nil && parsed != nil && parsed.Usage != nil {
			st.rc.Usage = *parsed.Usage
		}
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, EndOfStream: true, Usage: st.rc.Usage}
	for _, h := range p.respBody {
		h.ResponseBody(p.ctx, st.rc.SchedulingRequest, resp, st.rc.TargetPod)
	}
	p.Resume()
}

// Cancel is the client going away: a request waiting in admission is withdrawn (its done gets Cancelled), a routed
// one ends as ResponseComplete without a body. Unknown IDs are ignored.
func (p *InProcessPicker) Cancel(id string) {
	st := p.requests[id]
	switch {
	case st == nil:
	case st.routed:
		p.ResponseComplete(id, nil)
	case p.fc != nil && p.fc.ctrl.Cancel(id):
		p.Resume()
	}
}

// InFlight returns the number of requests between Route and the end of their response.
func (p *InProcessPicker) InFlight() int { return len(p.requests) }
