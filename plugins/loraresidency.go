package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/utils/clock"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/lora"
)

// LoRAResidencyExtractorType reads a per-adapter residency gauge from the model server's metrics into the
// LoRAResidencyKey endpoint attribute, which the sluice-lora-affinity-scorer reads.
const LoRAResidencyExtractorType = "sluice-lora-residency-extractor"

// LoRAResidencyKey is the endpoint attribute holding a *LoRAResidency.
const LoRAResidencyKey = "sluice/lora-residency"

var (
	_ fwkdl.Extractor          = (*LoRAResidencyExtractor)(nil)
	_ fwkplugin.ProducerPlugin = (*LoRAResidencyExtractor)(nil)
)

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
// parameters (see loraResidencyAPIConfig), on the handle's clock (see
// ClockHandle) or the wall clock.
func LoRAResidencyExtractorFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
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
		clock:           clockOf(handle, clock.RealClock{}),
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
