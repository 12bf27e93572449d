package plugins

import (
	"context"
	"encoding/json"
	"sync"

	"k8s.io/utils/clock"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"

	"github.com/sluice-gw/sluice/lora"
)

// LoRAAffinityType scores endpoints with lora.Scorer and remembers, in PreRequest, where each adapter was sent.
const LoRAAffinityType = "sluice-lora-affinity-scorer"

var (
	_ fwksched.Scorer          = (*LoRAAffinity)(nil)
	_ fwkrc.PreRequest         = (*LoRAAffinity)(nil)
	_ fwkplugin.ConsumerPlugin = (*LoRAAffinity)(nil)
)

// LoRAAffinity is the Sluice LoRA affinity scorer: it translates upstream
// endpoints into lora.PodState, scores them with a lora.Scorer, and records
// in PreRequest which endpoint each adapter was sent to. See package lora for
// the rules. Safe for concurrent use.
type LoRAAffinity struct {
	typedName  fwkplugin.TypedName
	scorer     *lora.Scorer
	baseModels map[string]struct{}
	clock      clock.PassiveClock
	buffers    sync.Pool // *loraScoreBuffers
}

// loraScoreBuffers are Score's per-call slices, pooled so that scoring
// allocates only the result map the Scorer interface requires.
type loraScoreBuffers struct {
	pods   []lora.PodState
	scores []float64
}

// LoRAAffinityFactory builds a LoRAAffinity from its JSON parameters
// (see loraAffinityAPIConfig), with no metrics, on the handle's clock (see
// ClockHandle) or the wall clock.
func LoRAAffinityFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return NewLoRAAffinityFactory(nil, clock.RealClock{})(name, raw, handle)
}

// NewLoRAAffinityFactory returns a factory like LoRAAffinityFactory whose
// scorers report to rec (nil: nowhere) and read time from clk, unless the
// handle is a ClockHandle.
func NewLoRAAffinityFactory(rec lora.Recorder, clk clock.PassiveClock) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
		cfg, err := parseLoRAAffinityConfig(raw)
		if err != nil {
			return nil, err
		}
		return newLoRAAffinity(name, cfg, rec, clockOf(handle, clk))
	}
}

func newLoRAAffinity(name string, cfg loraAffinityConfig, rec lora.Recorder, clk clock.PassiveClock) (*LoRAAffinity, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	s, err := lora.NewScorer(cfg.scorer, rec)
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = LoRAAffinityType
	}
	return &LoRAAffinity{
		typedName:  fwkplugin.TypedName{Type: LoRAAffinityType, Name: name},
		scorer:     s,
		baseModels: cfg.baseModels,
		clock:      clk,
	}, nil
}

// TypedName implements fwkplugin.Plugin.
func (p *LoRAAffinity) TypedName() fwkplugin.TypedName { return p.typedName }

// Category implements fwksched.Scorer: the scorer keeps adapters where they
// are resident.
func (p *LoRAAffinity) Category() fwksched.ScorerCategory { return fwksched.Affinity }

// Consumes implements fwkplugin.ConsumerPlugin. The values mirror upstream's
// lora-affinity-scorer for the keys it shares.
func (p *LoRAAffinity) Consumes() map[string]any {
	return map[string]any{
		extractormetrics.ActiveModelsKey:  map[string]int{},
		extractormetrics.WaitingModelsKey: map[string]int{},
		LoRAResidencyKey:                  (*LoRAResidency)(nil),
	}
}

// Score implements fwksched.Scorer. The adapter is the request's TargetModel,
// which upstream sets after InferenceModelRewrite.
func (p *LoRAAffinity) Score(_ context.Context, _ *fwksched.CycleState, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	result := make(map[fwksched.Endpoint]float64, len(endpoints))
	if len(endpoints) == 0 {
		return result
	}
	buf := p.getBuffers(len(endpoints))
	defer p.putBuffers(buf)

	target := ""
	if req != nil {
		target = req.TargetModel
	}
	base := p.isConfiguredBase(target)
	for i, ep := range endpoints {
		var res *LoRAResidency
		buf.pods[i], res = loraPodState(ep)
		base = base || res.servesBase(target)
	}
	adapter := target
	if base {
		adapter = ""
	}
	p.scorer.ScoreInto(buf.scores, lora.Request{Adapter: adapter}, buf.pods, p.clock.Now())
	for i, ep := range endpoints {
		result[ep] = buf.scores[i]
	}
	return result
}

// PreRequest implements fwkrc.PreRequest: it remembers that the request's
// adapter was sent to the primary profile's first target endpoint.
func (p *LoRAAffinity) PreRequest(_ context.Context, req *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	if req == nil || result == nil || p.isConfiguredBase(req.TargetModel) {
		return
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 || primary.TargetEndpoints[0] == nil {
		return
	}
	ep := primary.TargetEndpoints[0]
	meta := ep.GetMetadata()
	if meta == nil {
		return
	}
	if res := loraResidencyOf(ep); res.servesBase(req.TargetModel) {
		return
	}
	p.scorer.Record(req.TargetModel, meta.NamespacedName.Name, p.clock.Now())
}

func (p *LoRAAffinity) isConfiguredBase(model string) bool {
	if model == "" {
		return true
	}
	_, ok := p.baseModels[model]
	return ok
}

func (p *LoRAAffinity) getBuffers(n int) *loraScoreBuffers {
	buf, _ := p.buffers.Get().(*loraScoreBuffers)
	if buf == nil {
		buf = &loraScoreBuffers{}
	}
	if cap(buf.pods) < n {
		buf.pods = make([]lora.PodState, n)
		buf.scores = make([]float64, n)
	}
	buf.pods, buf.scores = buf.pods[:n], buf.scores[:n]
	return buf
}

// putBuffers returns buf to the pool without clearing it: the endpoints' maps
// it still references stay alive at most until the buffer is reused or the
// pool drops it at a garbage collection, and clearing 64 pod states on every
// call costs more than the scoring itself while a collection runs.
func (p *LoRAAffinity) putBuffers(buf *loraScoreBuffers) {
	p.buffers.Put(buf)
}

// loraPodState translates an upstream endpoint into the scorer's plain input.
// The endpoint name (unique within the pool's namespace) identifies the pod for
// rendezvous hashing and memory, identically on every EPP replica.
func loraPodState(ep fwksched.Endpoint) (lora.PodState, *LoRAResidency) {
	var ps lora.PodState
	if meta := ep.GetMetadata(); meta != nil {
		ps.Name = meta.NamespacedName.Name
	}
	if m := ep.GetMetrics(); m != nil {
		ps.MaxLoRA = m.MaxActiveModels
		ps.Running = lora.Adapters(m.ActiveModels)
		ps.Waiting = lora.Adapters(m.WaitingModels)
		ps.QueueDepth = m.WaitingQueueSize
		ps.RunningRequests = m.RunningRequestsSize
	}
	res := loraResidencyOf(ep)
	if res != nil && res.Adapters != nil {
		ps.Resident = res.Adapters
		ps.ObservedAt = res.ObservedAt
	}
	return ps, res
}

func loraResidencyOf(ep fwksched.Endpoint) *LoRAResidency {
	v, ok := ep.Get(LoRAResidencyKey)
	if !ok {
		return nil
	}
	res, _ := v.(*LoRAResidency)
	return res
}
