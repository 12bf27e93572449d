package plugins

import (
	"reflect"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
)

// Which families of a metrics page the extractors read: MetricsSourceType parses only those (ValidateExtractor).

// familyReader is an extractor of parsed metric families (sourcemetrics.PrometheusMetricMap) that reads no family
// but those MetricFamiliesRead names, each by its name (families[name]).
type familyReader interface {
	MetricFamiliesRead() []string
}

var (
	_ familyReader = (*LoRAResidencyExtractor)(nil)
	_ familyReader = (*PrefixCache)(nil)
)

// familiesRead names the families ext reads; ok is false when it cannot tell (an extractor it does not know), and
// ext may read any.
func familiesRead(ext fwkdl.Extractor) (names []string, ok bool) {
	switch e := ext.(type) {
	case familyReader:
		return e.MetricFamiliesRead(), true
	case *extractormetrics.Extractor:
		return coreExtractorFamilies(e)
	}
	return nil, false
}

// coreExtractorFamilies names the families upstream's core-metrics-extractor reads: the metric name of each Spec of
// the mapping of each engine type it knows (GIE v1.5.0, extractor/metrics/extractor.go: Extract looks each Spec up
// as families[spec.Name] and reads nothing else). The extractor keeps its MappingRegistry in an unexported field
// with no accessor, hence reflection; a shape other than v1.5.0's (no such field, a Mapping field that is not a Spec,
// a LoRASpec or a label name) reads as "cannot tell", and the source parses every family, as before.
func coreExtractorFamilies(e *extractormetrics.Extractor) (names []string, ok bool) {
	if e == nil {
		return nil, false
	}
	f := reflect.ValueOf(e).Elem().FieldByName("registry")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*extractormetrics.MappingRegistry]() || f.IsNil() {
		return nil, false
	}
	registry := (*extractormetrics.MappingRegistry)(f.UnsafePointer())
	for _, engine := range registry.ListEngineTypes() {
		m, found := registry.Get(engine)
		if !found || m == nil {
			return nil, false
		}
		v := reflect.ValueOf(m).Elem()
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				return nil, false
			}
			switch spec := v.Field(i).Interface().(type) {
			case *extractormetrics.Spec:
				if spec != nil {
					names = append(names, spec.Name)
				}
			case *extractormetrics.LoRASpec:
				if spec != nil && spec.Spec != nil {
					names = append(names, spec.Name)
				}
			case string: // a label name (CacheBlockSizeLabel, CacheNumBlocksLabel)
			default:
				return nil, false
			}
		}
	}
	return names, true
}

// MetricFamiliesRead implements familyReader: the residency gauge and the base-model metric.
func (e *LoRAResidencyExtractor) MetricFamiliesRead() []string {
	return []string{e.metric, e.baseModelMetric}
}

// MetricFamiliesRead implements familyReader: the prefix-cache hit and query counters.
func (p *PrefixCache) MetricFamiliesRead() []string {
	return []string{p.hitsMetric, p.queriesMetric}
}
