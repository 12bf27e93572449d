package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
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
// When every candidate is saturated for ranking (each is computing a prompt, or is past a threshold), the scores
// spread the candidates' loads over [0, 1] instead, 1 for the least loaded: the endpoint expected to begin a new
// prompt first, where round-robin's rotation would have sent it, not whichever the other scorers happen to prefer.
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
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, sat := range buf.sats {
		if !math.IsInf(sat, 1) {
			lo, hi = min(lo, sat), max(hi, sat)
		}
	}
	allSaturated := lo >= 1 && hi > lo
	for i, ep := range endpoints {
		sat := buf.sats[i]
		switch {
		case math.IsInf(sat, 1):
			result[ep] = 0
		case allSaturated:
			result[ep] = (hi - sat) / (hi - lo)
		default:
			result[ep] = 1 - min(sat, 1)
		}
	}
	return result
}
