package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/lora"
)

// Plugin type names.
const (
	// LoRAAffinityType scores endpoints with lora.Scorer and remembers, in
	// PreRequest, where each adapter was sent.
	LoRAAffinityType = "sluice-lora-affinity-scorer"
	// LoRAResidencyExtractorType reads a per-adapter residency gauge from the
	// model server's metrics into the LoRAResidencyKey endpoint attribute.
	LoRAResidencyExtractorType = "sluice-lora-residency-extractor"
)

// LoRAResidencyKey is the endpoint attribute holding a *LoRAResidency.
const LoRAResidencyKey = "sluice/lora-residency"

var (
	_ fwksched.Scorer          = (*LoRAAffinity)(nil)
	_ fwkrc.PreRequest         = (*LoRAAffinity)(nil)
	_ fwkplugin.ConsumerPlugin = (*LoRAAffinity)(nil)

	_ fwkdl.Extractor          = (*LoRAResidencyExtractor)(nil)
	_ fwkplugin.ProducerPlugin = (*LoRAResidencyExtractor)(nil)
)

// ---------------------------------------------------------------------------
// Scorer

// loraAffinityAPIConfig is the JSON schema of LoRAAffinity's parameters.
type loraAffinityAPIConfig struct {
	// SpillQueueDepth: a pod holding the adapter with more waiting requests
	// than this is overloaded, and a pod with a free slot wins. Default 5.
	SpillQueueDepth *int `json:"spillQueueDepth,omitempty"`
	// LoadBound is epsilon of bounded-load rendezvous placement: the chosen
	// pod's load stays within (1+epsilon) times the average. Default 0.25.
	LoadBound *float64 `json:"loadBound,omitempty"`
	// MemoryHalfLife: a remembered send weighs half after this. Default 30s.
	MemoryHalfLife *metav1.Duration `json:"memoryHalfLife,omitempty"`
	// MemoryTTL: a remembered send is forgotten after this. Default 2m.
	MemoryTTL *metav1.Duration `json:"memoryTTL,omitempty"`
	// MemoryCapacity bounds the remembered (adapter, pod) sends. Default 4096.
	MemoryCapacity *int `json:"memoryCapacity,omitempty"`
	// BaseModels names the models served without an adapter. Requests for
	// them are never scored by adapter state. Names reported by the
	// residency extractor's base-model label are added at scoring time.
	BaseModels []string `json:"baseModels,omitempty"`
}

// loraAffinityConfig is the validated configuration of a LoRAAffinity.
type loraAffinityConfig struct {
	scorer     lora.Config
	baseModels map[string]struct{}
}

func applyLoRAAffinityDefaults(c *loraAffinityAPIConfig) {
	d := lora.DefaultConfig()
	if c.SpillQueueDepth == nil {
		c.SpillQueueDepth = &d.SpillQueueDepth
	}
	if c.LoadBound == nil {
		c.LoadBound = &d.LoadBound
	}
	if c.MemoryHalfLife == nil {
		c.MemoryHalfLife = &metav1.Duration{Duration: d.MemoryHalfLife}
	}
	if c.MemoryTTL == nil {
		c.MemoryTTL = &metav1.Duration{Duration: d.MemoryTTL}
	}
	if c.MemoryCapacity == nil {
		c.MemoryCapacity = &d.MemoryCapacity
	}
}

// validateLoRAAffinityConfig reports, by JSON field name, every constraint a
// defaulted configuration violates.
func validateLoRAAffinityConfig(c *loraAffinityAPIConfig) error {
	var errs []error
	if *c.SpillQueueDepth < 0 {
		errs = append(errs, fmt.Errorf("spillQueueDepth must be >= 0, got %d", *c.SpillQueueDepth))
	}
	if lb := *c.LoadBound; !(lb > 0) || lb > 1e6 {
		errs = append(errs, fmt.Errorf("loadBound must be in (0, 1e6], got %v", lb))
	}
	if c.MemoryHalfLife.Duration <= 0 {
		errs = append(errs, fmt.Errorf("memoryHalfLife must be > 0, got %v", c.MemoryHalfLife.Duration))
	}
	if c.MemoryTTL.Duration < c.MemoryHalfLife.Duration {
		errs = append(errs, fmt.Errorf("memoryTTL (%v) must be >= memoryHalfLife (%v)", c.MemoryTTL.Duration, c.MemoryHalfLife.Duration))
	}
	if *c.MemoryCapacity <= 0 {
		errs = append(errs, fmt.Errorf("memoryCapacity must be > 0, got %d", *c.MemoryCapacity))
	}
	for i, m := range c.BaseModels {
		if m == "" {
			errs = append(errs, fmt.Errorf("baseModels[%d] must not be empty", i))
		}
	}
	return errors.Join(errs...)
}

// parseLoRAAffinityConfig turns raw plugin parameters into a validated
// configuration. Unknown fields are rejected so a typo is not silently a
// default.
func parseLoRAAffinityConfig(raw json.RawMessage) (loraAffinityConfig, error) {
	var api loraAffinityAPIConfig
	if err := decodeParams(raw, &api); err != nil {
		return loraAffinityConfig{}, fmt.Errorf("parsing %s parameters: %w", LoRAAffinityType, err)
	}
	applyLoRAAffinityDefaults(&api)
	if err := validateLoRAAffinityConfig(&api); err != nil {
		return loraAffinityConfig{}, fmt.Errorf("invalid %s parameters: %w", LoRAAffinityType, err)
	}
	cfg := loraAffinityConfig{
		scorer: lora.Config{
			SpillQueueDepth: *api.SpillQueueDepth,
			LoadBound:       *api.LoadBound,
			MemoryHalfLife:  api.MemoryHalfLife.Duration,
			MemoryTTL:       api.MemoryTTL.Duration,
			MemoryCapacity:  *api.MemoryCapacity,
		},
		baseModels: make(map[string]struct{}, len(api.BaseModels)),
	}
	for _, m := range api.BaseModels {
		cfg.baseModels[m] = struct{}{}
	}
	return cfg, nil
}

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
// (see loraAffinityAPIConfig), with the real clock and no metrics.
func LoRAAffinityFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return NewLoRAAffinityFactory(nil, clock.RealClock{})(name, raw, handle)
}

// NewLoRAAffinityFactory returns a factory like LoRAAffinityFactory whose
// scorers report to rec (nil: nowhere) and read time from clk.
func NewLoRAAffinityFactory(rec lora.Recorder, clk clock.PassiveClock) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
		cfg, err := parseLoRAAffinityConfig(raw)
		if err != nil {
			return nil, err
		}
		return newLoRAAffinity(name, cfg, rec, clk)
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

// ---------------------------------------------------------------------------
// Residency extractor

// LoRAResidency is what a model server reported about its adapters at one
// scrape. It is immutable once stored, so Clone returns the receiver.
type LoRAResidency struct {
	// Adapters holds the adapters resident in GPU memory; nil when the server
	// does not export the residency metric (the scorer then infers residency).
	Adapters lora.Adapters
	// BaseModels holds the model names the server serves without an adapter.
	BaseModels map[string]struct{}
	// ObservedAt is when the scrape was extracted.
	ObservedAt time.Time
}

// Clone implements fwkdl.Cloneable. A LoRAResidency is never modified after
// it is stored, so sharing it is safe and keeps scoring allocation-free.
func (r *LoRAResidency) Clone() fwkdl.Cloneable { return r }

func (r *LoRAResidency) servesBase(model string) bool {
	if r == nil {
		return false
	}
	_, ok := r.BaseModels[model]
	return ok
}

// Defaults of the residency extractor.
const (
	// DefaultLoRAResidencyMetric is the per-adapter residency gauge of the
	// Sluice simulator ({lora_name="..."} 1 while resident) and of vLLM's
	// proposed loaded-adapter metric (vllm-project/vllm#45411, #54830:
	// {adapter_name="...",level="gpu"|"cpu",pinned="..."} 1 while loaded).
	DefaultLoRAResidencyMetric = "vllm:lora_adapter_loaded"
	// DefaultLoRABaseModelMetric carries the served base model in its
	// model_name label on vLLM.
	DefaultLoRABaseModelMetric = "vllm:num_requests_running"
	// DefaultLoRABaseModelLabel is the label naming the base model.
	DefaultLoRABaseModelLabel = "model_name"
	// loraLevelLabel, when present, tells where a loaded adapter sits; only
	// loraGPULevel occupies one of the max_lora GPU slots.
	loraLevelLabel = "level"
	loraGPULevel   = "gpu"
)

// DefaultLoRAAdapterLabels are the labels that may name the adapter, in the
// Sluice simulator and in vLLM respectively.
var DefaultLoRAAdapterLabels = []string{"lora_name", "adapter_name"}

// loraResidencyAPIConfig is the JSON schema of LoRAResidencyExtractor's
// parameters. An empty string or list means the default.
type loraResidencyAPIConfig struct {
	// Metric is the residency gauge's name.
	Metric string `json:"metric,omitempty"`
	// AdapterLabels are the labels that may carry the adapter name; the first
	// one present on a series is used.
	AdapterLabels []string `json:"adapterLabels,omitempty"`
	// BaseModelMetric is a metric whose BaseModelLabel names the base model;
	// "-" disables base-model discovery.
	BaseModelMetric string `json:"baseModelMetric,omitempty"`
	// BaseModelLabel is the label naming the base model.
	BaseModelLabel string `json:"baseModelLabel,omitempty"`
}

// LoRAResidencyExtractor is a datalayer extractor for the metrics data source.
// On each scrape it stores a *LoRAResidency under LoRAResidencyKey on the
// endpoint. Safe for concurrent use.
type LoRAResidencyExtractor struct {
	typedName       fwkplugin.TypedName
	metric          string
	adapterLabels   []string
	baseModelMetric string
	baseModelLabel  string
	clock           clock.PassiveClock
}

// LoRAResidencyExtractorFactory builds a LoRAResidencyExtractor from its JSON
// parameters (see loraResidencyAPIConfig).
func LoRAResidencyExtractorFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	var api loraResidencyAPIConfig
	if err := decodeParams(raw, &api); err != nil {
		return nil, fmt.Errorf("parsing %s parameters: %w", LoRAResidencyExtractorType, err)
	}
	if api.Metric == "" {
		api.Metric = DefaultLoRAResidencyMetric
	}
	if len(api.AdapterLabels) == 0 {
		api.AdapterLabels = DefaultLoRAAdapterLabels
	}
	if api.BaseModelMetric == "" {
		api.BaseModelMetric = DefaultLoRABaseModelMetric
	}
	if api.BaseModelLabel == "" {
		api.BaseModelLabel = DefaultLoRABaseModelLabel
	}
	var errs []error
	for i, l := range api.AdapterLabels {
		if l == "" {
			errs = append(errs, fmt.Errorf("adapterLabels[%d] must not be empty", i))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid %s parameters: %w", LoRAResidencyExtractorType, err)
	}
	if name == "" {
		name = LoRAResidencyExtractorType
	}
	baseMetric := api.BaseModelMetric
	if baseMetric == "-" {
		baseMetric = ""
	}
	return &LoRAResidencyExtractor{
		typedName:       fwkplugin.TypedName{Type: LoRAResidencyExtractorType, Name: name},
		metric:          api.Metric,
		adapterLabels:   append([]string(nil), api.AdapterLabels...),
		baseModelMetric: baseMetric,
		baseModelLabel:  api.BaseModelLabel,
		clock:           clock.RealClock{},
	}, nil
}

// TypedName implements fwkplugin.Plugin.
func (e *LoRAResidencyExtractor) TypedName() fwkplugin.TypedName { return e.typedName }

// ExpectedInputType implements fwkdl.Extractor: parsed Prometheus metrics.
func (e *LoRAResidencyExtractor) ExpectedInputType() reflect.Type {
	return sourcemetrics.PrometheusMetricType
}

// Produces implements fwkplugin.ProducerPlugin.
func (e *LoRAResidencyExtractor) Produces() map[string]any {
	return map[string]any{LoRAResidencyKey: (*LoRAResidency)(nil)}
}

// Extract implements fwkdl.Extractor. A scrape without the residency metric
// stores a LoRAResidency with nil Adapters, so that a server that stopped
// exporting it is not trusted on old data. The text parser drops families
// without samples, so a server with nothing resident also reads as "no
// gauge", and the scorer falls back to inference and memory. Series without an adapter label are
// reported as an error and skipped; the rest are still stored.
func (e *LoRAResidencyExtractor) Extract(_ context.Context, data any, ep fwkdl.Endpoint) error {
	families, ok := data.(sourcemetrics.PrometheusMetricMap)
	if !ok {
		return fmt.Errorf("%s: unexpected input type %T", LoRAResidencyExtractorType, data)
	}
	res := &LoRAResidency{ObservedAt: e.clock.Now()}
	var errs []error
	if fam, ok := families[e.metric]; ok {
		res.Adapters = lora.Adapters{}
		for _, m := range fam.GetMetric() {
			name, level := "", ""
			for _, l := range m.GetLabel() {
				if l.GetName() == loraLevelLabel {
					level = l.GetValue()
				} else if name == "" && e.isAdapterLabel(l.GetName()) {
					name = l.GetValue()
				}
			}
			switch {
			case name == "":
				errs = append(errs, fmt.Errorf("%s: a %s series has none of the adapter labels %v", LoRAResidencyExtractorType, e.metric, e.adapterLabels))
			case level != "" && level != loraGPULevel:
				// Cached in host memory: it does not hold a GPU slot.
			case loraSampleValue(m) > 0:
				res.Adapters[name] = 0
			}
		}
	}
	if fam, ok := families[e.baseModelMetric]; ok && e.baseModelMetric != "" {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == e.baseModelLabel && l.GetValue() != "" {
					if res.BaseModels == nil {
						res.BaseModels = map[string]struct{}{}
					}
					res.BaseModels[l.GetValue()] = struct{}{}
				}
			}
		}
	}
	ep.GetAttributes().Put(LoRAResidencyKey, res)
	return errors.Join(errs...)
}

func (e *LoRAResidencyExtractor) isAdapterLabel(name string) bool {
	for _, l := range e.adapterLabels {
		if l == name {
			return true
		}
	}
	return false
}

// loraSampleValue reads a gauge, or an untyped sample (text format without a
// TYPE line).
func loraSampleValue(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetUntyped().GetValue()
}
