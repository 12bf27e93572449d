package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// InFlightScorerType is the plugin type of InFlightScorer.
const InFlightScorerType = "sluice-inflight-scorer"

// defaultInFlightTTL is how long a request whose end the EPP never saw keeps counting.
const defaultInFlightTTL = 5 * time.Minute

var (
	_ fwksched.Scorer    = (*InFlightScorer)(nil)
	_ fwkrc.PreRequest   = (*InFlightScorer)(nil)
	_ fwkrc.ResponseBody = (*InFlightScorer)(nil)
)

// inFlightAPIConfig is the JSON schema of InFlightScorer's parameters.
type inFlightAPIConfig struct {
	// TTL: a request whose response end the EPP never saw stops counting this long after it was sent. Default 5m.
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// InFlightScorer scores endpoints by the requests this EPP sent them that have not finished (least outstanding
// requests first; see inflight_tracker.go for why scraped queue lengths alone herd). PreRequest counts a request on the
// primary profile's target, the end of its response body uncounts it.
//
// Concurrency: safe for concurrent use.
type InFlightScorer struct {
	typedName fwkplugin.TypedName
	tracker   *inflightTracker
	clock     clock.PassiveClock
	buffers   sync.Pool // *inFlightBuffers
}

type inFlightBuffers struct {
	names  []string
	counts []int
	scores []float64
}

// InFlightScorerFactory builds an InFlightScorer from its parameters (see inFlightAPIConfig), on the handle's clock
// (see ClockHandle) or the wall clock.
func InFlightScorerFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	var cfg inFlightAPIConfig
	if err := decodeParams(raw, &cfg); err != nil {
		return nil, fmt.Errorf("parsing %s parameters: %w", InFlightScorerType, err)
	}
	ttl := defaultInFlightTTL
	if cfg.TTL != nil {
		ttl = cfg.TTL.Duration
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("%s %q: ttl must be positive, got %v", InFlightScorerType, name, ttl)
	}
	return &InFlightScorer{
		typedName: fwkplugin.TypedName{Type: InFlightScorerType, Name: name},
		tracker:   newInflightTracker(ttl),
		clock:     clockOf(handle, clock.RealClock{}),
	}, nil
}

// TypedName implements fwkplugin.Plugin.
func (s *InFlightScorer) TypedName() fwkplugin.TypedName { return s.typedName }

// Category implements fwksched.Scorer: it spreads load.
func (s *InFlightScorer) Category() fwksched.ScorerCategory { return fwksched.Distribution }

// Score implements fwksched.Scorer.
func (s *InFlightScorer) Score(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	result := make(map[fwksched.Endpoint]float64, len(endpoints))
	if len(endpoints) == 0 {
		return result
	}
	buf, _ := s.buffers.Get().(*inFlightBuffers)
	if buf == nil {
		buf = &inFlightBuffers{}
	}
	defer s.buffers.Put(buf)
	buf.names, buf.counts, buf.scores = buf.names[:0], grow(buf.counts, len(endpoints)), grow(buf.scores, len(endpoints))
	for _, ep := range endpoints {
		buf.names = append(buf.names, EndpointName(ep.GetMetadata()))
	}
	s.tracker.Counts(s.clock.Now(), buf.names, buf.counts)
	leastOutstandingScores(buf.counts, buf.scores)
	for i, ep := range endpoints {
		result[ep] = buf.scores[i]
	}
	return result
}

// PreRequest implements fwkrc.PreRequest: the request counts on the endpoint it was sent to.
func (s *InFlightScorer) PreRequest(_ context.Context, req *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	if target := primaryTarget(result); req != nil && target != nil {
		s.tracker.Start(s.clock.Now(), req.RequestId, EndpointName(target.GetMetadata()))
	}
}

// ResponseBody implements fwkrc.ResponseBody: at the end of the response the request stops counting.
func (s *InFlightScorer) ResponseBody(_ context.Context, req *fwksched.LLMRequest, resp *fwkrc.Response, _ *fwkdl.EndpointMetadata) {
	if req == nil || resp == nil || !resp.EndOfStream {
		return
	}
	s.tracker.Finish(req.RequestId)
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
