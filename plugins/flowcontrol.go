package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"sigs.k8s.io/controller-runtime/pkg/log"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// FlowControlType is the plugin type of the FlowControl adapter. FlowControl is not declared in an
// EndpointPickerConfig: it is the EPP's admission controller, and the runner calls its request-control hooks because
// the admission controller is itself a plugin. The name labels its hooks in upstream's plugin latency metrics.
const FlowControlType = "sluice-flow-control"

// ShedReasonHeader is the response header naming why flow control did not admit a request: a flowcontrol.Reason
// value such as "saturated" or "queue_timeout".
const ShedReasonHeader = "x-sluice-shed-reason"

// bytesPerToken estimates prompt tokens from the request body size. Four bytes per token is the usual rule of thumb
// for English text with BPE tokenizers (upstream's LLMRequest.RequestSizeBytes documents the same estimate); the JSON
// envelope makes it an overestimate, which only matters relative to other requests, since fair queuing compares
// costs, never absolute token counts.
const bytesPerToken = 4

// maxEstimatedOutputTokens caps a client's max_tokens in the cost estimate, so an absurd value cannot overflow it.
const maxEstimatedOutputTokens = 1 << 24

var (
	_ fwkrc.PreRequest   = (*FlowControl)(nil)
	_ fwkrc.ResponseBody = (*FlowControl)(nil)
)

// EndpointLister lists the pool's endpoints with their latest metrics. upstream's datastore.Datastore implements it.
type EndpointLister interface {
	PodList(predicate func(fwkdl.Endpoint) bool) []fwkdl.Endpoint
}

// FlowControlOptions are the adapter's settings: how upstream requests become flowcontrol.Requests and how often the
// pool snapshot is taken. The admission policy itself is a flowcontrol.Config.
type FlowControlOptions struct {
	// DefaultOutputTokens is the expected output length of a request that sets no max_tokens (nor
	// max_completion_tokens or max_output_tokens). Default 256.
	DefaultOutputTokens int
	// SnapshotInterval is how often endpoint metrics are read from the datastore and handed to the controller; use
	// the EPP's metrics refresh interval. Default 50ms.
	SnapshotInterval time.Duration
	// ShutdownGrace is how long, after the EPP is told to stop, waiting requests may still be dispatched before the
	// rest are answered 503 with Retry-After. Keep it below the gRPC servers' drain period. Default 10s.
	ShutdownGrace time.Duration
	// MaxPendingDecisions bounds each per-request decision store (rejections waiting for their response, dispatches
	// waiting for the headroom filter). Default 65536.
	MaxPendingDecisions int
	// DecisionTTL drops a stored decision whose consumer never ran. Default 1m.
	DecisionTTL time.Duration
	// MaxCandidates is how many endpoints, at most, the Director schedules a request Sluice admission dispatched
	// among: the least loaded by admission's ranking (see NarrowCandidates). 0 means DefaultMaxCandidates; negative
	// schedules among every endpoint, as upstream does.
	MaxCandidates int
	// WarmUp bounds how long, from the start, admission holds requests that arrive before any endpoint's metrics
	// have been scraped: they are decided as soon as the first metrics arrive (then, as ever, on fresh metrics only),
	// instead of being answered 503 no_endpoints by an EPP that has not looked yet. After WarmUp without metrics
	// they are decided as they are: 503 no_endpoints. Default 5s.
	WarmUp time.Duration
}

// Defaults of FlowControlOptions.
const (
	DefaultOutputTokens        = 256
	DefaultSnapshotInterval    = 50 * time.Millisecond
	DefaultShutdownGrace       = 10 * time.Second
	DefaultMaxPendingDecisions = 1 << 16
	DefaultDecisionTTL         = time.Minute
	DefaultWarmUp              = 5 * time.Second
)

func (o *FlowControlOptions) applyDefaults() {
	if o.DefaultOutputTokens == 0 {
		o.DefaultOutputTokens = DefaultOutputTokens
	}
	if o.SnapshotInterval == 0 {
		o.SnapshotInterval = DefaultSnapshotInterval
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	if o.MaxPendingDecisions == 0 {
		o.MaxPendingDecisions = DefaultMaxPendingDecisions
	}
	if o.DecisionTTL == 0 {
		o.DecisionTTL = DefaultDecisionTTL
	}
	if o.WarmUp == 0 {
		o.WarmUp = DefaultWarmUp
	}
	if o.MaxCandidates == 0 {
		o.MaxCandidates = DefaultMaxCandidates
	}
}

func (o *FlowControlOptions) validate() error {
	var errs []error
	if o.DefaultOutputTokens < 0 {
		errs = append(errs, fmt.Errorf("default output tokens must not be negative, got %d", o.DefaultOutputTokens))
	}
	if o.SnapshotInterval < 0 {
		errs = append(errs, fmt.Errorf("snapshot interval must be positive, got %s", o.SnapshotInterval))
	}
	if o.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("shutdown grace must not be negative, got %s", o.ShutdownGrace))
	}
	if o.MaxPendingDecisions < 0 {
		errs = append(errs, fmt.Errorf("max pending decisions must be positive, got %d", o.MaxPendingDecisions))
	}
	if o.DecisionTTL < 0 {
		errs = append(errs, fmt.Errorf("decision TTL must be positive, got %s", o.DecisionTTL))
	}
	if o.WarmUp < 0 {
		errs = append(errs, fmt.Errorf("warm-up must not be negative, got %s", o.WarmUp))
	}
	return errors.Join(errs...)
}

// FlowControlDeps are FlowControl's seams. Endpoints is required; nil fields take production defaults.
type FlowControlDeps struct {
	Endpoints EndpointLister
	// Clock drives the controller's timers, the snapshot ticker and decision expiry. Default clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution
	// Rand draws Retry-After jitter. Default: seeded from the clock.
	Rand *rand.Rand
	// Recorder receives the controller's metrics. Default: discarded.
	Recorder flowcontrol.Recorder
	// Logger defaults to logr.Discard().
	Logger logr.Logger
	// SynchronousTimers is flowcontrol.Deps.SynchronousTimers: for a clock that runs callbacks on its driver's
	// goroutine (the virtual-time benchmark engine's).
	SynchronousTimers bool
	// Ownership, when this EPP is one of several replicas, says which endpoints it owns; nil: it owns every one.
	Ownership EndpointOwnership
	// Peers, with Ownership, is this replica's side of the peer exchange (flowcontrol_peers.go); nil: none.
	Peers *replication.Exchange
}

// EndpointOwnership is what admission needs of EPP replication (replication.View): the pool endpoints this replica
// owns at now. A replica admits on, and dispatches to, its own endpoints only, so it sees every request sent to them
// and no other replica's dispatches fill their headroom unseen; with no peer live it owns every endpoint.
type EndpointOwnership interface {
	Owned(endpoints []string, now time.Time) []string
}

// FlowControl adapts a flowcontrol.Controller to upstream's EPP:
//
//   - Admit (requestcontrol.AdmissionController) turns the request into a flowcontrol.Request and waits for the
//     controller's decision: Dispatched proceeds to scheduling; Rejected is 429 (400 for invalid requests, 403 for
//     a band the tenant may not use); Unavailable is 503; Cancelled returns the context's error (the client is gone).
//     The request's tenant is the value of the policy's tenant header (flowcontrol.Config.TenantHeader).
//     Until the first snapshot that holds a scraped endpoint (at most WarmUp from the start), arrivals wait for it
//     rather than being answered 503 no_endpoints by an EPP that has not looked at its pool yet.
//   - ShapeImmediateResponse (the runner's ResponseShaper) adds Retry-After, x-sluice-shed-reason and an OpenAI
//     error body to the immediate response of every request Admit did not admit.
//   - PreRequest binds the request's reservation to the endpoint the scheduler picked; ResponseBody reports a
//     streamed response's first chunk (flowcontrol.Controller.Started) and releases the reservation when the response
//     ends (upstream calls it with EndOfStream also on errors and client disconnects). Requests are marked
//     flowcontrol.Request.Streamed only once a first chunk has been seen: a gateway that does not send response
//     bodies to the EPP never reports one, and its streamed requests then count as they would without streaming.
//   - Run feeds the controller a snapshot of endpoint metrics every SnapshotInterval and, when its context ends,
//     shuts the controller down so that waiting requests get an answer.
//   - Attached HeadroomFilters restrict scheduling to the endpoints that had headroom when the request was
//     dispatched; the endpoints attached OutlierFilters eject offer no headroom.
//   - NarrowCandidates wraps the Director's candidate source: a dispatched request is scheduled among the
//     MaxCandidates endpoints admission ranks least loaded, not the whole pool (candidates.go).
//
// Concurrency: all methods are safe for concurrent use.
type FlowControl struct {
	ctrl      *flowcontrol.Controller
	endpoints EndpointLister
	ownership EndpointOwnership     // nil: every endpoint
	peers     *replication.Exchange // nil: no peer exchange
	clock     clock.WithTicker
	logger    logr.Logger
	opts      FlowControlOptions

	// shed holds rejections until ShapeImmediateResponse answers them.
	shed *decisionStore
	// headroom holds dispatched decisions until PreRequest; filled only while a HeadroomFilter is attached or the
	// Director's candidates are narrowed (NarrowCandidates).
	headroom  *decisionStore
	filtering atomic.Bool
	narrowing atomic.Bool
	// names are the endpoints' names in the last snapshot, by metadata (nameOf).
	names atomic.Pointer[map[*fwkdl.EndpointMetadata]string]
	// chunksSeen is set by the first non-final response chunk: from then on streamed requests are Streamed.
	chunksSeen atomic.Bool
	// awaitingFirstChunk holds the IDs of dispatched Streamed requests until their first chunk, so that Started
	// runs once per request rather than per chunk.
	awaitingFirstChunk sync.Map
	// tenantHeader is the configuration's TenantHeader, read for every request without the controller's lock.
	tenantHeader atomic.Pointer[string]
	// outliers are the attached OutlierFilters, whose ejections each snapshot carries (flowcontrol.Endpoint.Ejected).
	outliers atomic.Pointer[[]*OutlierFilter]
	// sharedPrefix is the attached PrefixCache whose inserts the peer exchange carries (flowcontrol_peers.go); nil
	// without peers or without exactly one.
	sharedPrefix atomic.Pointer[PrefixCache]
	prefixBlocks sharedBlocks
	// summaries counts the peer summaries built: every DemandEvery-th carries the demand (flowcontrol_peers.go).
	summaries atomic.Uint64
	// returnSeed keys requests by content (returnKey).
	returnSeed maphash.Seed

	// warm is closed once a snapshot holds an endpoint that has been scraped, or Run stops; until then, and at most
	// until warmUntil, Admit holds arrivals (FlowControlOptions.WarmUp).
	warm      chan struct{}
	warmOnce  sync.Once
	started   time.Time
	warmUntil time.Time
}

// NewFlowControl builds the adapter around a new controller running cfg (nil means flowcontrol.DefaultConfig()).
func NewFlowControl(cfg *flowcontrol.Config, opts FlowControlOptions, deps FlowControlDeps) (*FlowControl, error) {
	opts.applyDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("invalid flow control options: %w", err)
	}
	if deps.Endpoints == nil {
		return nil, errors.New("flow control needs an endpoint lister")
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Logger.GetSink() == nil {
		deps.Logger = logr.Discard()
	}
	if cfg == nil {
		cfg = flowcontrol.DefaultConfig()
	}
	ctrl, err := flowcontrol.New(cfg, flowcontrol.Deps{Clock: deps.Clock, Rand: deps.Rand, Recorder: deps.Recorder,
		SynchronousTimers: deps.SynchronousTimers, Replica: deps.Ownership != nil || deps.Peers != nil})
	if err != nil {
		return nil, err
	}
	f := &FlowControl{
		ctrl:      ctrl,
		endpoints: deps.Endpoints,
		ownership: deps.Ownership,
		peers:     deps.Peers,
		clock:     deps.Clock,
		logger:    deps.Logger,
		opts:      opts,
		shed:      newDecisionStore(deps.Clock, opts.DecisionTTL, opts.MaxPendingDecisions),
		headroom:  newDecisionStore(deps.Clock, opts.DecisionTTL, opts.MaxPendingDecisions),
		warm:      make(chan struct{}),
		started:   deps.Clock.Now(),
		warmUntil: deps.Clock.Now().Add(opts.WarmUp),
	}
	f.returnSeed = maphash.MakeSeed()
	f.tenantHeader.Store(&cfg.TenantHeader)
	return f, nil
}

// SetConfig puts cfg in force (flowcontrol.Controller.SetConfig), including the header tenants are read from, which
// applies from the next arrival. An invalid cfg is rejected and the configuration in force stays.
func (f *FlowControl) SetConfig(cfg *flowcontrol.Config) error {
	if err := f.ctrl.SetConfig(cfg); err != nil {
		return err
	}
	header := cfg.TenantHeader
	f.tenantHeader.Store(&header)
	return nil
}

// TypedName implements fwkplugin.Plugin.
func (f *FlowControl) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: FlowControlType, Name: FlowControlType}
}

// Controller returns the wrapped controller (for status and tests).
func (f *FlowControl) Controller() *flowcontrol.Controller { return f.ctrl }

// Attach connects every HeadroomFilter and SaturationScorer among plugins (the EPP configuration's plugins, by name) to
// this adapter and returns how many headroom filters it found. The endpoints every OutlierFilter among plugins ejects
// are marked ejected in the controller's snapshots: admission counts no capacity the scheduler will not use; with
// peers (ownership or the peer exchange) their stall rule stands down unless configured (OutlierFilter.withPeers).
// Dispatched decisions are kept for the filters only when at least one is attached. If plugins hold exactly one
// PrefixCache, the filters keep prefix affinity with it (see HeadroomFilter).
func (f *FlowControl) Attach(plugins map[string]fwkplugin.Plugin) int {
	var filters []*HeadroomFilter
	var prefix []*PrefixCache
	var outliers []*OutlierFilter
	for _, p := range plugins {
		switch pl := p.(type) {
		case *OutlierFilter:
			outliers = append(outliers, pl)
		case *HeadroomFilter:
			pl.source.Store(f)
			filters = append(filters, pl)
		case *SaturationScorer:
			pl.source.Store(f)
		case *PrefixCache:
			prefix = append(prefix, pl)
		}
	}
	for _, h := range filters {
		if len(prefix) == 1 {
			h.affinity.Store(&affinitySource{scorer: prefix[0]})
		} else {
			h.affinity.Store(nil)
		}
	}
	if len(filters) > 0 {
		f.filtering.Store(true)
	}
	f.outliers.Store(&outliers)
	if f.ownership != nil || f.peers != nil {
		for _, o := range outliers {
			if o.withPeers() {
				f.logger.Info("The outlier filter's stall rule stands down: a replica does not see the prompts its "+
					"peers send to a server; set ejectOnStall to keep it", "plugin", o.typedName.Name)
			}
		}
	}
	f.sharePrefix(prefix)
	return len(filters)
}

// Admit implements requestcontrol.AdmissionController. It blocks while the request waits in its band. A request not
// admitted is logged once, at verbosity VERBOSE (3): shedding is designed behaviour, which the shed metrics count, not
// an error (the runner keeps upstream's error lines for it out of the log; see Shed).
func (f *FlowControl) Admit(ctx context.Context, reqCtx *handlers.RequestContext, priority int) error {
	if err := f.awaitWarm(ctx); err != nil {
		return err
	}
	req := f.requestOf(reqCtx, priority)
	d, sent := f.sendElsewhere(req)
	var err error
	if !sent {
		d, err = f.ctrl.Admit(ctx, req)
	}
	traceAdmission(ctx, reqCtx, priority, req.Tenant, d, f.ctrl.Counts)
	if d.Outcome == flowcontrol.Cancelled {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return err
	}
	if d.Outcome != flowcontrol.Dispatched {
		log.FromContext(ctx).V(logutil.VERBOSE).Info("Request not admitted", "status", httpStatus(d), "band", d.Band.String(),
			"reason", d.Reason.String(), "retryAfterSeconds", d.RetryAfterSeconds(), "waited", d.Waited)
	}
	return f.settle(req, reqCtx.TargetModelName, d, err)
}

// Submit is Admit without blocking, for a caller that drives the controller's clock itself (the virtual-time
// benchmark engine): decided gets Admit's result once the controller decides (see flowcontrol.Controller.Submit for
// when, and under which lock: decided must not call the adapter), or cancelled when the request was withdrawn with
// Controller().Cancel.
func (f *FlowControl) Submit(reqCtx *handlers.RequestContext, priority int, decided func(err error, cancelled bool)) {
	req := f.requestOf(reqCtx, priority)
	if d, sent := f.sendElsewhere(req); sent {
		decided(f.settle(req, reqCtx.TargetModelName, d, nil), false)
		return
	}
	f.ctrl.Submit(req, func(d flowcontrol.Decision, err error) {
		if d.Outcome == flowcontrol.Cancelled {
			decided(err, true)
			return
		}
		decided(f.settle(req, reqCtx.TargetModelName, d, err), false)
	})
}

// Shed reports whether admission turned the request away and its answer has not been sent yet: the runner asks it
// (runner.Shedder) to keep upstream's error lines for designed shedding out of the log.
func (f *FlowControl) Shed(requestID string) bool {
	_, ok := f.shed.get(requestID)
	return ok
}

// settle keeps what later hooks need about a decision that is not Cancelled (the headroom of a dispatched request,
// the answer of a shed one) and returns Admit's result: nil when dispatched, else the error upstream answers.
func (f *FlowControl) settle(req flowcontrol.Request, model string, d flowcontrol.Decision, err error) error {
	id := req.ID
	if d.Outcome == flowcontrol.Dispatched {
		if req.Streamed {
			f.awaitingFirstChunk.Store(id, struct{}{})
		}
		if f.narrowing.Load() || (f.filtering.Load() && len(d.Endpoints) > 0) {
			f.headroom.put(id, storedDecision{decision: d, model: model})
		}
		return nil
	}
	msg := shedMessage(d, err)
	f.shed.put(id, storedDecision{decision: d, message: msg})
	return errcommon.Error{Code: errorCode(d), Msg: msg}
}

// requestOf maps an upstream request to the controller's plain request.
func (f *FlowControl) requestOf(reqCtx *handlers.RequestContext, priority int) flowcontrol.Request {
	req := flowcontrol.Request{Tenant: f.tenantOf(reqCtx), Priority: priority, Bytes: int64(reqCtx.RequestSize)}
	var body *fwksched.LLMRequestBody
	if sr := reqCtx.SchedulingRequest; sr != nil {
		req.ID, body = sr.RequestId, sr.Body
	}
	if req.ID == "" && reqCtx.Request != nil {
		req.ID = reqCtx.Request.Headers[reqcommon.RequestIdHeaderKey]
	}
	prompt, output := estimatedTokens(reqCtx.RequestSize, body, f.opts.DefaultOutputTokens)
	req.EstimatedCost, req.OutputTokens = prompt+output, output
	req.Streamed = body != nil && body.Stream && f.chunksSeen.Load()
	if reqCtx.Request != nil {
		req.ReturnKey = f.returnKey(req.Tenant, reqCtx.Request.RawBody)
	}
	return req
}

// returnKey identifies a request by its tenant and body (flowcontrol.Request.ReturnKey): a client that retries after
// Retry-After sends the same body again. 0 (no key) for an empty body.
func (f *FlowControl) returnKey(tenant string, body []byte) uint64 {
	if len(body) == 0 {
		return 0
	}
	var h maphash.Hash
	h.SetSeed(f.returnSeed)
	h.WriteString(tenant)
	h.WriteByte(0)
	h.Write(body)
	return max(h.Sum64(), 1)
}

// tenantOf is the request's tenant: the value of the configured tenant header, or upstream's default fairness ID
// when the request has none. With GIE's own fairness header that is the FairnessID upstream already read; no other
// header (a client-sent x-gateway-inference-fairness-id included) names the tenant then.
func (f *FlowControl) tenantOf(reqCtx *handlers.RequestContext) string {
	header := *f.tenantHeader.Load()
	if header == metadata.FlowFairnessIDKey {
		return reqCtx.FairnessID
	}
	if reqCtx.Request != nil {
		if v := reqCtx.Request.Headers[header]; v != "" {
			return v
		}
	}
	return metadata.DefaultFairnessID
}

// EstimatedCost is a request's expected work in tokens: its prompt, estimated as bodyBytes/4 rounded up, plus its
// expected output, the body's max_completion_tokens, max_tokens or max_output_tokens (first positive one), else
// defaultOutput.
func EstimatedCost(bodyBytes int, body *fwksched.LLMRequestBody, defaultOutput int) uint64 {
	prompt, output := estimatedTokens(bodyBytes, body, defaultOutput)
	return prompt + output
}

// estimatedTokens is EstimatedCost's two parts: the prompt and the expected output.
func estimatedTokens(bodyBytes int, body *fwksched.LLMRequestBody, defaultOutput int) (prompt, output uint64) {
	prompt = uint64(max(bodyBytes, 0)+bytesPerToken-1) / bytesPerToken
	output = uint64(max(defaultOutput, 0))
	if body != nil {
		if m, ok := body.Payload.(fwksched.PayloadMap); ok {
			for _, key := range [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
				if n, ok := positiveCount(m[key]); ok {
					output = min(n, maxEstimatedOutputTokens)
					break
				}
			}
		}
	}
	return prompt, output
}

// positiveCount reads a JSON number that counts something.
func positiveCount(v any) (uint64, bool) {
	var f float64
	switch n := v.(type) {
	case float64:
		f = n
	case json.Number:
		var err error
		if f, err = n.Float64(); err != nil {
			return 0, false
		}
	case json.RawMessage:
		// GIE's parser keeps each top-level field of the body undecoded.
		if err := json.Unmarshal(n, &f); err != nil {
			return 0, false
		}
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	default:
		return 0, false
	}
	if !(f >= 1) || math.IsInf(f, 0) {
		return 0, false
	}
	return uint64(min(f, maxEstimatedOutputTokens)), true
}

// PreRequest implements fwkrc.PreRequest: the reservation the controller made at dispatch moves to the endpoint the
// scheduler picked (the primary profile's first target, where the request is sent).
func (f *FlowControl) PreRequest(_ context.Context, request *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	if request == nil {
		return
	}
	sd, _ := f.headroom.take(request.RequestId)
	if result == nil {
		return
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return
	}
	endpoint := EndpointName(primary.TargetEndpoints[0].GetMetadata())
	// A request on a peer's endpoint is recorded as sent there, so that its owner counts it, with its KV size at its
	// end, read from its reservation before Bind moves it off this replica's endpoints (only then: a lock less per
	// request on its own endpoints).
	toPeer := f.isPeerEndpoint(endpoint)
	tokens := 0
	if toPeer {
		tokens = f.ctrl.ReservedKVTokens(request.RequestId)
	}
	f.ctrl.Bind(request.RequestId, endpoint)
	if toPeer {
		f.peers.SentTo(request.RequestId, endpoint, tokens, adapterAffinity(sd, endpoint), f.clock.Now())
	}
}

// ResponseBody implements fwkrc.ResponseBody: a streamed response's first chunk ends the request's pending count on
// its endpoint, and the reservation ends with the response. Upstream calls the hook for every chunk of a streamed
// response, and with EndOfStream once per request that reached an endpoint, also after errors and client
// disconnects.
func (f *FlowControl) ResponseBody(_ context.Context, request *fwksched.LLMRequest, response *fwkrc.Response, _ *fwkdl.EndpointMetadata) {
	if request == nil || response == nil {
		return
	}
	if !response.EndOfStream {
		if !f.chunksSeen.Load() {
			f.chunksSeen.Store(true)
		}
		if _, ok := f.awaitingFirstChunk.LoadAndDelete(request.RequestId); ok {
			f.ctrl.Started(request.RequestId)
		}
		return
	}
	f.awaitingFirstChunk.Delete(request.RequestId)
	f.release(request.RequestId)
}

// release ends a dispatched request's reservation, or its record as sent to a peer's endpoint.
func (f *FlowControl) release(id string) {
	f.ctrl.Release(id)
	if f.peers != nil {
		f.peers.Done(id)
	}
}

// ShapeImmediateResponse implements the runner's ResponseShaper. An immediate response ends its request, so a
// request Admit dispatched that failed afterwards (no candidates, scheduling error) releases its reservation here. A
// request Admit did not admit gets Retry-After (whenever the controller computed one: every 429 and 503),
// x-sluice-shed-reason, and an OpenAI-style JSON error whose code is the reason; it holds no reservation, so any
// reservation under its ID is another request's (one whose x-request-id it reused) and stays.
func (f *FlowControl) ShapeImmediateResponse(_ context.Context, requestID string, resp *extprocv3.ImmediateResponse) {
	sd, ok := f.shed.take(requestID)
	if !ok {
		f.headroom.delete(requestID)
		f.awaitingFirstChunk.Delete(requestID)
		f.release(requestID)
		return
	}
	d := sd.decision
	if s := d.RetryAfterSeconds(); s > 0 {
		SetImmediateHeader(resp, "retry-after", strconv.FormatInt(s, 10))
	}
	SetImmediateHeader(resp, ShedReasonHeader, d.Reason.String())
	SetImmediateHeader(resp, "content-type", "application/json")
	resp.Body = OpenAIError(httpStatus(d), sd.message, d.Reason.String())
}
