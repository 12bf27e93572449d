package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// SaturationScorerType is the plugin type of SaturationScorer.
const SaturationScorerType = "sluice-saturation-scorer"

var _ fwksched.Scorer = (*SaturationScorer)(nil)

// SaturationScorer scores an endpoint 1 − its Sluice admission saturation for ranking (capped at 1): the endpoint's
// last scrape plus the requests dispatched to it since that have not started, and the streamed prompts it has not
// begun answering, the request being scored excluded (flowcontrol.Controller.Saturations). Upstream's queue and KV
// scorers see only the scrape, so every request between two scrapes goes to the same "best" endpoint, and two
// prefills land in one server step where round-robin would have spread them; this scorer sees each dispatch at once.
// It needs Sluice admission (FlowControl attaches it, as it does the headroom filter); without it every endpoint
// scores 1 and the scorer changes nothing.
//
// Concurrency: safe for concurrent use.
type SaturationScorer struct {
	typedName fwkplugin.TypedName
	source    atomic.Pointer[FlowControl]
	buffers   sync.Pool // *saturationBuffers
}

type saturationBuffers struct {
	names []string
	sats  []float64
}

// SaturationScorerFactory builds a SaturationScorer. It takes no parameters; any given are an error.
func SaturationScorerFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	if err := decodeParams(raw, &struct{}{}); err != nil {
		return nil, fmt.Errorf("%s takes no parameters: %w", SaturationScorerType, err)
	}
	if name == "" {
		name = SaturationScorerType
	}
	return &SaturationScorer{typedName: fwkplugin.TypedName{Type: SaturationScorerType, Name: name}}, nil
}

// TypedName implements fwkplugin.Plugin.
func (s *SaturationScorer) TypedName() fwkplugin.TypedName { return s.typedName }

// Category implements fwksched.Scorer: it spreads load.
func (s *SaturationScorer) Category() fwksched.ScorerCategory { return fwksched.Distribution }

// Score implements fwksched.Scorer.
func (s *SaturationScorer) Score(_ context.Context, _ *fwksched.CycleState, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	result := make(map[fwksched.Endpoint]float64, len(endpoints))
	fc := s.source.Load()
	if fc == nil {
		for _, ep := range endpoints {
			result[ep] = 1
		}
		return result
	}
	buf, _ := s.buffers.Get().(*saturationBuffers)
	if buf == nil {
		buf = &saturationBuffers{}
	}
	defer s.buffers.Put(buf)
	buf.names, buf.sats = buf.names[:0], grow(buf.sats, len(endpoints))
	for _, ep := range endpoints {
		buf.names = append(buf.names, EndpointName(ep.GetMetadata()))
	}
	self := ""
	if req != nil {
		self = req.RequestId
	}
	fc.ctrl.Saturations(self, buf.names, buf.sats)
	for i, ep := range endpoints {
		result[ep] = 1 - min(buf.sats[i], 1)
	}
	return result
}
