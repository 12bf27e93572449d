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
}

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
func (h *HeadroomFilter) Filter(_ context.Context, _ *fwksched.CycleState, request *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
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
	return kept
}
