package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
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
// any endpoint with headroom (the scorer's guardrails applied over all candidates: an endpoint far above the pool's
// load has no match) and flow control allows it (fresh metrics; not for a holdback band such as Sheddable; only
// Critical while the Critical reserve is active). Sending such a request elsewhere recomputes most of its prompt
// there, which costs more than the short queue the headroom threshold allows; under skewed prefix groups,
// restricting it drove every hot group's requests onto whichever endpoint had a free place, cold, until the whole
// pool was recomputing prompts. The scorers then weigh the match against the endpoint's load as for any candidate.
// With the peer exchange, an endpoint a peer owns may stay a candidate by the same rule (flowcontrol_peers.go), and
// also when it holds the request's LoRA adapter and none of the candidates kept does (keepAdapterHolders).
// Looking costs one more rendering and hashing of the prompt, only when some candidate lacks headroom.
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

// affinityScorer is what the filter needs of the prefix-cache scorer: into out[i], the guarded share of the request's
// prompt endpoints[i] holds.
type affinityScorer interface {
	Affinity(ctx context.Context, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint, out []float64)
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
func (h *HeadroomFilter) Filter(ctx context.Context, _ *fwksched.CycleState, request *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	fc := h.source.Load()
	if fc == nil || request == nil {
		return endpoints
	}
	sd, ok := fc.headroom.get(request.RequestId)
	if !ok || len(sd.decision.Endpoints) == 0 {
		return endpoints
	}
	keep := make([]bool, len(endpoints))
	markHeadroom(sd.decision.Endpoints, endpoints, keep)
	n := 0
	for _, k := range keep {
		if k {
			n++
		}
	}
	if n == 0 {
		return endpoints
	}
	if n < len(endpoints) && (fc.peers == nil || !fc.peers.Sent(request.RequestId)) {
		// A request sent to a peer's endpoint goes there alone: this replica's own endpoints had no room for it.
		n += h.keepAffine(ctx, fc, sd.decision.Band, request, endpoints, keep)
		if fc.peers != nil {
			n += keepAdapterHolders(fc, sd.decision.Band, request, endpoints, keep)
		}
	}
	kept := make([]fwksched.Endpoint, 0, n)
	for i, ep := range endpoints {
		if keep[i] {
			kept = append(kept, ep)
		}
	}
	return kept
}

// markHeadroom sets keep[i] for the endpoints whose names are among names. Small lists are scanned; otherwise the
// smaller side is indexed (with narrowed candidates, the candidates are far fewer than the endpoints with headroom).
func markHeadroom(names []string, endpoints []fwksched.Endpoint, keep []bool) {
	switch {
	case len(names)*len(endpoints) <= headroomScanMax*headroomScanMax:
		for i, ep := range endpoints {
			keep[i] = slices.Contains(names, EndpointName(ep.GetMetadata()))
		}
	case len(endpoints) < len(names):
		at := make(map[string]int, len(endpoints))
		for i, ep := range endpoints {
			at[EndpointName(ep.GetMetadata())] = i
		}
		for _, n := range names {
			if i, ok := at[n]; ok {
				keep[i] = true
			}
		}
	default:
		set := make(map[string]struct{}, len(names))
		for _, n := range names {
			set[n] = struct{}{}
		}
		for i, ep := range endpoints {
			_, keep[i] = set[EndpointName(ep.GetMetadata())]
		}
	}
}

// keepAffine marks in keep (the candidates with headroom) the candidates without headroom that hold at least
// affinityMargin more of the request's prompt than every candidate with headroom and that flow control lets a request
// of band use beyond its headroom (flowcontrol.Controller.MayExceedHeadroom), or, when a peer owns it, lets it go to a
// peer (mayUsePeerEndpoint). It returns how many it marked.
func (h *HeadroomFilter) keepAffine(ctx context.Context, fc *FlowControl, band flowcontrol.Band, request *fwksched.LLMRequest,
	endpoints []fwksched.Endpoint, keep []bool) int {
	src := h.affinity.Load()
	if src == nil {
		return 0
	}
	scores := make([]float64, len(endpoints))
	src.scorer.Affinity(ctx, request, endpoints, scores)
	best := 0.0
	for i := range endpoints {
		if keep[i] {
			best = max(best, scores[i])
		}
	}
	added := 0
	for i, ep := range endpoints {
		if keep[i] || scores[i] < best+affinityMargin || ep.GetMetadata() == nil {
			continue
		}
		if name := EndpointName(ep.GetMetadata()); fc.ctrl.MayExceedHeadroom(band, name) || fc.mayUsePeerEndpoint(band, name) {
			keep[i] = true
			added++
		}
	}
	return added
}
