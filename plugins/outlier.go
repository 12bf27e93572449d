package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/outlier"
)

// OutlierFilterType is the plugin type of OutlierFilter.
const OutlierFilterType = "sluice-outlier-filter"

var (
	_ fwksched.Filter      = (*OutlierFilter)(nil)
	_ fwkrc.PreRequest     = (*OutlierFilter)(nil)
	_ fwkrc.ResponseHeader = (*OutlierFilter)(nil)
	_ fwkrc.ResponseBody   = (*OutlierFilter)(nil)
)

// outlierAPIConfig is the JSON schema of OutlierFilter's parameters; unset fields take outlier.DefaultConfig's.
type outlierAPIConfig struct {
	// Consecutive5xx: 5xx responses in a row that eject an endpoint. Default 5.
	Consecutive5xx *int `json:"consecutive5xx,omitempty"`
	// LocalConsecutive5xx: 5xx responses in a row that eject an endpoint while another endpoint's latest response
	// (within 10 s) was a success; 0 turns the rule off. Default 2.
	LocalConsecutive5xx *int `json:"localConsecutive5xx,omitempty"`
	// BaseEjectionTime: the first ejection's length; the n-th in a row lasts n times as long. Default 1s.
	BaseEjectionTime *metav1.Duration `json:"baseEjectionTime,omitempty"`
	// MaxEjectionTime caps an ejection. Default 30s.
	MaxEjectionTime *metav1.Duration `json:"maxEjectionTime,omitempty"`
	// MaxEjectionPercent: at most this share of a pick's candidates is left out (at least one of two or more, never
	// all). Default 50.
	MaxEjectionPercent *int `json:"maxEjectionPercent,omitempty"`
	// SlowFactor: a gap between two chunks of a streamed response at least this many times its server's usual gap
	// is slow, and a server all of whose streams are silent this long, with no prompt sent there whose prefill
	// explains it, is ejected while most other servers' pace is normal (see ejectOnStall); 0 turns slow detection
	// off. Default 4.
	SlowFactor *float64 `json:"slowFactor,omitempty"`
	// SlowGaps: this many of the last 2·slowGaps-1 gaps of one stream, slow, eject its server while most other
	// servers' pace is normal (1-32). Default 7.
	SlowGaps *int `json:"slowGaps,omitempty"`
	// EjectOnStall: a server all of whose streams are silent for slowFactor times its usual gap, with no prompt sent
	// there whose prefill explains it, is ejected at once; false leaves slow servers to slowGaps. Default true, false
	// when the EPP runs with peers (--peers: a replica does not see the prompts its peers send to a server, whose
	// prefill looks like a stall); set, it is in force either way.
	EjectOnStall *bool `json:"ejectOnStall,omitempty"`
}

func (c outlierAPIConfig) config() outlier.Config {
	cfg := outlier.DefaultConfig()
	if c.Consecutive5xx != nil {
		cfg.Consecutive5xx = *c.Consecutive5xx
	}
	if c.LocalConsecutive5xx != nil {
		cfg.LocalConsecutive5xx = *c.LocalConsecutive5xx
	}
	if c.BaseEjectionTime != nil {
		cfg.BaseEjectionTime = c.BaseEjectionTime.Duration
	}
	if c.MaxEjectionTime != nil {
		cfg.MaxEjectionTime = c.MaxEjectionTime.Duration
	}
	if c.MaxEjectionPercent != nil {
		cfg.MaxEjectionPercent = *c.MaxEjectionPercent
	}
	if c.SlowFactor != nil {
		cfg.SlowFactor = *c.SlowFactor
	}
	if c.SlowGaps != nil {
		cfg.SlowGaps = *c.SlowGaps
	}
	if c.EjectOnStall != nil {
		cfg.EjectOnStall = *c.EjectOnStall
	}
	return cfg
}

// OutlierFilter is passive outlier detection (package outlier): it watches the HTTP status of every response the
// EPP routed, per endpoint, and leaves the endpoints that answer 5xx in a row out of the candidates for a while. A
// model server that fails every request answers at once, so without it every load scorer prefers the failing server.
// It also watches the pace of every streamed response (the gaps between its chunks) and leaves out, the same way, an
// endpoint that became several times slower than its usual pace while its peers did not (outlier.Pace): a slowed
// server's metrics stay fresh and its queue grows slowly, so the load scorers keep sending it requests that wait
// behind its slow steps. It learns, in PreRequest, each request sent to an endpoint and its prompt's length: the
// prefills that explain a healthy server's long steps.
//
// List it after filters that pick servers by what they serve (sluice-served-model-filter) and before filters that
// narrow by load (sluice-headroom-filter): the failing server always looks idle, so a load filter run first could
// leave it as the only candidate, which this filter never removes.
//
// Concurrency: safe for concurrent use.
type OutlierFilter struct {
	typedName fwkplugin.TypedName
	detector  *outlier.Detector
	pace      *outlier.Pace
	recorder  outlier.Recorder
	clock     clock.PassiveClock
	// stallRuleSet: the parameters set ejectOnStall, which running with peers then leaves in force (withPeers).
	stallRuleSet bool
}

// OutlierFilterFactory builds an OutlierFilter without metrics (see NewOutlierFilterFactory).
func OutlierFilterFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return NewOutlierFilterFactory(outlier.NopRecorder{})(name, raw, handle)
}

// NewOutlierFilterFactory returns a factory of OutlierFilters that report their ejections to rec, built from their
// parameters (see outlierAPIConfig) on the handle's clock (see ClockHandle) or the wall clock.
func NewOutlierFilterFactory(rec outlier.Recorder) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
		var api outlierAPIConfig
		if err := decodeParams(raw, &api); err != nil {
			return nil, fmt.Errorf("parsing %s parameters: %w", OutlierFilterType, err)
		}
		if name == "" {
			name = OutlierFilterType
		}
		d, err := outlier.New(api.config())
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", OutlierFilterType, name, err)
		}
		f := &OutlierFilter{
			typedName:    fwkplugin.TypedName{Type: OutlierFilterType, Name: name},
			detector:     d,
			pace:         outlier.NewPace(d),
			recorder:     rec,
			clock:        clockOf(handle, clock.RealClock{}),
			stallRuleSet: api.EjectOnStall != nil,
		}
		rec.Watch(func() int { return d.Ejected(f.clock.Now()) })
		return f, nil
	}
}

// withPeers tells f that the EPP runs with peers (replicas sharing the pool): prompts this replica never sees reach
// its endpoints, so the stall rule, which counts only the prompts it sent, stands down unless ejectOnStall was set.
// A slowed server is still ejected by its streams' slow gaps (slowGaps), each judged by the prompts this replica sent.
// It reports whether the stall rule stood down.
func (f *OutlierFilter) withPeers() bool {
	if f.stallRuleSet {
		return false
	}
	f.pace.SetEjectOnStall(false)
	return true
}

// TypedName implements fwkplugin.Plugin.
func (f *OutlierFilter) TypedName() fwkplugin.TypedName { return f.typedName }

// Filter implements fwksched.Filter: the candidates without the ejected ones (within the detector's cap, never all),
// once the streams stalled since their last chunk have ejected their endpoints, unless the requests the candidates'
// latest scrapes show beyond this EPP's explain it (outlier.Pace.Scraped).
func (f *OutlierFilter) Filter(ctx context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	now := f.clock.Now()
	for _, ep := range endpoints {
		if m := ep.GetMetrics(); m != nil {
			f.pace.Scraped(now, EndpointName(ep.GetMetadata()), requestLoad(m), m.UpdateTime)
		}
	}
	f.ejectStalled(ctx, now)
	if len(endpoints) < 2 || f.detector.Clean() {
		return endpoints
	}
	names := make([]string, len(endpoints))
	for i, ep := range endpoints {
		names[i] = EndpointName(ep.GetMetadata())
	}
	ejected := make([]bool, len(endpoints))
	if f.detector.Eject(f.clock.Now(), names, ejected) == 0 {
		return endpoints
	}
	kept := make([]fwksched.Endpoint, 0, len(endpoints))
	for i, ep := range endpoints {
		if !ejected[i] {
			kept = append(kept, ep)
		}
	}
	return kept
}

// PreRequest implements fwkrc.PreRequest: the request is dispatched to its endpoint with its prompt, whose prefill
// there, and the load of its LoRA adapter if the endpoint may not hold it, may stall the endpoint's streams for a
// while (outlier.Pace.Dispatch).
func (f *OutlierFilter) PreRequest(_ context.Context, req *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	if target := primaryTarget(result); req != nil && target != nil {
		f.pace.Dispatch(f.clock.Now(), req.RequestId, EndpointName(target.GetMetadata()), promptTokens(req),
			mayLoadAdapter(req.TargetModel, target))
	}
}

// mayLoadAdapter reports whether a request for model may make ep load a LoRA adapter: ep's latest scrape
// (LoRAResidency, from sluice-lora-residency-extractor) names the base models it serves, model is not one of them,
// and ep neither ran it nor held it in GPU memory then. An adapter held then counts as held still, though it may
// have been evicted since (the slowest prefill rate leaves some slack for that load). Without the residency
// extractor nothing tells an adapter from the base model, and no request counts as a load.
func mayLoadAdapter(model string, ep fwksched.Endpoint) bool {
	res := loraResidencyOf(ep)
	if model == "" || res == nil || len(res.BaseModels) == 0 || res.servesBase(model) || res.Adapters.Has(model) {
		return false
	}
	if m := ep.GetMetrics(); m != nil {
		if _, running := m.ActiveModels[model]; running {
			return false
		}
	}
	return true
}

// primaryTarget is the endpoint the request is sent to: the first of the primary profile's targets, or nil.
func primaryTarget(result *fwksched.SchedulingResult) fwksched.Endpoint {
	if result == nil {
		return nil
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return nil
	}
	return primary.TargetEndpoints[0]
}

// promptTokens estimates the request's prompt tokens as upstream's token estimator does: its tokenized prompt, or
// about 4 bytes of its body (or prompt text) per token.
func promptTokens(req *fwksched.LLMRequest) int {
	switch {
	case req.TokenizedPrompt != nil:
		return len(req.TokenizedPrompt.TokenIDs)
	case req.RequestSizeBytes > 0:
		return req.RequestSizeBytes / 4
	case req.Body != nil:
		return len(req.Body.PromptText()) / 4
	}
	return 0
}

// ResponseHeader implements fwkrc.ResponseHeader: the response's status counts for the endpoint that sent it. An
// ejection is logged, once per ejection: it is the operator's sign of a failing server.
func (f *OutlierFilter) ResponseHeader(ctx context.Context, _ *fwksched.LLMRequest, resp *fwkrc.Response, target *fwkdl.EndpointMetadata) {
	if resp == nil || target == nil {
		return
	}
	status, ok := responseStatus(resp.Headers)
	if !ok {
		return
	}
	endpoint := EndpointName(target)
	if e := f.detector.Observe(f.clock.Now(), endpoint, status); e.Reason != outlier.NotEjected {
		f.ejected(ctx, endpoint, e, "Endpoint ejected after consecutive 5xx responses", "status", status)
	}
}

// ResponseBody implements fwkrc.ResponseBody: each chunk of a streamed response times its endpoint's pace; the last
// one (or the call that ends a request whose stream broke off) ends the stream. A non-streamed response has only the
// last call, so it times nothing.
func (f *OutlierFilter) ResponseBody(ctx context.Context, req *fwksched.LLMRequest, resp *fwkrc.Response, target *fwkdl.EndpointMetadata) {
	if resp == nil {
		return
	}
	id := resp.RequestId
	if req != nil && req.RequestId != "" {
		id = req.RequestId
	}
	if resp.EndOfStream || target == nil {
		f.pace.End(f.clock.Now(), id)
		return
	}
	f.ObserveChunk(ctx, id, EndpointName(target))
}

// ObserveChunk is ResponseBody for a non-final chunk of request id's streamed response from endpoint (EndpointName
// of its target), for a caller that names the endpoint once per stream instead of once per chunk (the hot path).
func (f *OutlierFilter) ObserveChunk(ctx context.Context, id, endpoint string) {
	if e := f.pace.Chunk(f.clock.Now(), id, endpoint); e.Reason != outlier.NotEjected {
		f.paced(ctx, e, "Endpoint ejected: its streams became slow against its usual pace")
	}
}

// ejectStalled ejects the endpoints whose streams stalled (outlier.Pace.Stalled) at now.
func (f *OutlierFilter) ejectStalled(ctx context.Context, now time.Time) {
	for _, e := range f.pace.Stalled(now) {
		f.paced(ctx, e, "Endpoint ejected: a stream of it stalled against its usual pace")
	}
}

// paced counts and logs an ejection by the pace (msg, unless all the endpoint's streams stalled).
func (f *OutlierFilter) paced(ctx context.Context, e outlier.EndpointEjection, msg string) {
	kv := []any{"usualGap", e.Usual.String()}
	if e.All {
		msg = "Endpoint ejected: all its streams stalled, with no prefill sent there to explain it"
		kv = append(kv, "silentFor", e.Silent.String())
	}
	f.ejected(ctx, e.Endpoint, e.Ejection, msg, kv...)
}

// ejected counts and logs an ejection, once per ejection: it is the operator's sign of a failing or slowed server.
func (f *OutlierFilter) ejected(ctx context.Context, endpoint string, e outlier.Ejection, msg string, kv ...any) {
	f.recorder.Ejected(e.Reason)
	kv = append(kv, "endpoint", endpoint, "reason", e.Reason.String(), "ejectedFor", e.For.String(), "plugin", f.typedName.Name)
	log.FromContext(ctx).Info(msg, kv...)
}

// responseStatus reads the HTTP status from response headers as Envoy's ext_proc sends them (":status").
func responseStatus(headers map[string]string) (int, bool) {
	v, ok := headers[":status"]
	if !ok {
		return 0, false
	}
	status, err := strconv.Atoi(v)
	return status, err == nil
}
