package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// HeadroomFilterType is the plugin type of HeadroomFilter.
const HeadroomFilterType = "sluice-headroom-filter"

var _ fwksched.Filter = (*HeadroomFilter)(nil)

// headroomScanMax: up to this many candidates and allowed names each, membership is a scan; beyond, a map is cheaper.
const headroomScanMax = 16

// HeadroomFilter restricts a request's scheduling candidates to the endpoints that had headroom for its band when
// flow control dispatched it (flowcontrol.Decision.Endpoints). Without it the scheduler may place an admitted
// request on an endpoint that is saturated for its band, e.g. a Sheddable request on an endpoint only Critical
// traffic may still use.
//
// One exception keeps prefix affinity: when the configuration has exactly one sluice-prefix-cache-scorer, an
// endpoint without headroom stays a candidate if it holds at least affinityMargin more of the request's prompt than
// any endpoint with headroom (the scorer's guardrails applied: an overloaded endpoint's match does not count).
// Sending such a request elsewhere recomputes most of its prompt there, which costs more than the short queue the
// headroom threshold allows; under skewed prefix groups, restricting it drove every hot group's requests onto
// whichever endpoint had a free place, cold, until the whole pool was recomputing prompts. The scorers then weigh
// the match against the endpoint's load as for any candidate.
//
// It must be listed in every scheduling profile that should honour flow control (the default EndpointPickerConfig
// Sluice uses with its admission includes it; see FlowControlCommand). It filters nothing when Sluice admission is
// off, when the request's decision is unknown (expired, or the request was not admitted by Sluice) or when none of
// the candidates had headroom (e.g. the proxy's subset hint excludes them): the restriction steers placement, it
// never turns an admitted request into a scheduling failure.
//
// Concurrency: safe for concurrent use; the adapter is attached once, before requests flow.
type HeadroomFilter struct {
	typedName fwkplugin.TypedName
	source    atomic.Pointer[FlowControl]
	affinity  atomic.Pointer[affinitySource]
}

// affinityMargin is how much more of a request's prompt (as a fraction of it) an endpoint without headroom must hold
// than every endpoint with headroom to remain a candidate.
const affinityMargin = 0.5

// affinityScorer is what the filter needs of the prefix-cache scorer: the guarded fraction of the request's prompt
// each endpoint holds.
type affinityScorer interface {
	Score(ctx context.Context, cs *fwksched.CycleState, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64
}

type affinitySource struct{ scorer affinityScorer }

// HeadroomFilterFactory builds a HeadroomFilter. It takes no parameters; any given are an error.
func HeadroomFilterFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	if err := decodeParams(raw, &struct{}{}); err != nil {
		return nil, fmt.Errorf("%s takes no parameters: %w", HeadroomFilterType, err)
	}
	if name == "" {
		name = HeadroomFilterType
	}
	return &HeadroomFilter{typedName: fwkplugin.TypedName{Type: HeadroomFilterType, Name: name}}, nil
}

// TypedName implements fwkplugin.Plugin.
func (h *HeadroomFilter) TypedName() fwkplugin.TypedName { return h.typedName }

// Filter implements fwksched.Filter.
func (h *HeadroomFilter) Filter(ctx context.Context, cs *fwksched.CycleState, request *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	fc := h.source.Load()
	if fc == nil || request == nil {
		return endpoints
	}
	sd, ok := fc.headroom.get(request.RequestId)
	if !ok || len(sd.decision.Endpoints) == 0 {
		return endpoints
	}
	names := sd.decision.Endpoints
	var set map[string]struct{}
	if len(names)*len(endpoints) > headroomScanMax*headroomScanMax {
		set = make(map[string]struct{}, len(names))
		for _, n := range names {
			set[n] = struct{}{}
		}
	}
	kept := make([]fwksched.Endpoint, 0, min(len(endpoints), len(names)))
	for _, ep := range endpoints {
		name := EndpointName(ep.GetMetadata())
		in := false
		if set != nil {
			_, in = set[name]
		} else {
			in = slices.Contains(names, name)
		}
		if in {
			kept = append(kept, ep)
		}
	}
	if len(kept) == 0 {
		return endpoints
	}
	if len(kept) < len(endpoints) {
		kept = h.keepAffine(ctx, cs, request, endpoints, kept)
	}
	return kept
}

// keepAffine returns kept (the candidates with headroom, in candidate order) plus the endpoints without headroom
// that hold at least affinityMargin more of the request's prompt than any of them, in candidate order.
func (h *HeadroomFilter) keepAffine(ctx context.Context, cs *fwksched.CycleState, request *fwksched.LLMRequest, endpoints, kept []fwksched.Endpoint) []fwksched.Endpoint {
	src := h.affinity.Load()
	if src == nil {
		return kept
	}
	scores := src.scorer.Score(ctx, cs, request, endpoints)
	best := 0.0
	for _, ep := range kept {
		best = max(best, scores[ep])
	}
	var affine []fwksched.Endpoint
	for _, ep := range endpoints {
		if scores[ep] >= best+affinityMargin && !slices.Contains(kept, ep) {
			affine = append(affine, ep)
		}
	}
	if len(affine) == 0 {
		return kept
	}
	out := make([]fwksched.Endpoint, 0, len(kept)+len(affine))
	for _, ep := range endpoints {
		if slices.Contains(kept, ep) || slices.Contains(affine, ep) {
			out = append(out, ep)
		}
	}
	return out
}
