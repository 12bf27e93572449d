package plugins

import (
	"context"
	"encoding/json"
	"fmt"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// ServedModelFilterType is the plugin type of ServedModelFilter.
const ServedModelFilterType = "sluice-served-model-filter"

var (
	_ fwksched.Filter          = (*ServedModelFilter)(nil)
	_ fwkplugin.ConsumerPlugin = (*ServedModelFilter)(nil)
)

// ServedModelFilter keeps, of a request's candidates, the endpoints whose
// model server serves the request's target model as its base model, when at
// least one does. It makes a pool of model servers that serve different base
// models usable, e.g. a stable and a canary Deployment behind one
// InferencePool with an InferenceModelRewrite splitting between them: the
// target model (after the rewrite) only goes to servers that serve it.
//
// The served base models come from the LoRAResidencyKey attribute, which the
// sluice-lora-residency-extractor fills from each scrape (vLLM's model_name
// label); configure it on the metrics data source. When no candidate reports
// the target as its base model (the target is a LoRA adapter, or no server
// reports base models) the candidates pass unchanged: the filter never turns
// a servable request into a scheduling failure on missing information.
//
// List it before any filter that narrows candidates for another reason, such as sluice-headroom-filter: that one
// knows nothing of models, and could leave only servers of another model, which this filter would then let through.
//
// Concurrency: stateless; safe for concurrent use.
type ServedModelFilter struct {
	typedName fwkplugin.TypedName
}

// ServedModelFilterFactory builds a ServedModelFilter. It takes no
// parameters; any given are an error.
func ServedModelFilterFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	if err := decodeParams(raw, &struct{}{}); err != nil {
		return nil, fmt.Errorf("%s takes no parameters: %w", ServedModelFilterType, err)
	}
	if name == "" {
		name = ServedModelFilterType
	}
	return &ServedModelFilter{typedName: fwkplugin.TypedName{Type: ServedModelFilterType, Name: name}}, nil
}

// TypedName implements fwkplugin.Plugin.
func (f *ServedModelFilter) TypedName() fwkplugin.TypedName { return f.typedName }

// Consumes implements fwkplugin.ConsumerPlugin.
func (f *ServedModelFilter) Consumes() map[string]any {
	return map[string]any{LoRAResidencyKey: (*LoRAResidency)(nil)}
}

// Filter implements fwksched.Filter.
func (f *ServedModelFilter) Filter(_ context.Context, _ *fwksched.CycleState, request *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	if request == nil || request.TargetModel == "" {
		return endpoints
	}
	var kept []fwksched.Endpoint
	for _, ep := range endpoints {
		if loraResidencyOf(ep).servesBase(request.TargetModel) {
			kept = append(kept, ep)
		}
	}
	if len(kept) == 0 {
		return endpoints
	}
	return kept
}
