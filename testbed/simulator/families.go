package simulator

import (
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// MetricFamilies returns, by name, the families a Server's registry yields for its engine gauges and counters when
// the engine's state is st at now: what NewMetricsCollector's collector gives through prometheus.Registry.Gather,
// built directly (a test holds the two equal). A virtual-time benchmark that scrapes thousands of servers twenty
// times a virtual second cannot afford a registry per scrape.
func MetricFamilies(model string, cfg engine.Config, st engine.Stats, now time.Time) map[string]*dto.MetricFamily {
	b := familyBuilder{out: make(map[string]*dto.MetricFamily, 12)}
	modelValues := []string{model, engineLabelValue}
	b.add(metricRunning, dto.MetricType_GAUGE, float64(st.Running), modelLabels, modelValues)
	b.add(metricWaiting, dto.MetricType_GAUGE, float64(st.Waiting), modelLabels, modelValues)
	b.add(metricKVUsage, dto.MetricType_GAUGE, st.KVUsage, modelLabels, modelValues)
	b.add(metricCacheConfig, dto.MetricType_GAUGE, 1, cacheConfigLabels, []string{strconv.Itoa(cfg.BlockSize),
		strconv.Itoa(cfg.NumGPUBlocks), pythonBool(!cfg.DisablePrefixCaching), engineLabelValue})
	if cfg.MaxLoRAs > 0 {
		b.add(metricLoRAInfo, dto.MetricType_GAUGE, float64(now.UnixNano())/1e9, loraInfoLabels, []string{
			strconv.Itoa(cfg.MaxLoRAs), strings.Join(st.RunningAdapters, ","), strings.Join(st.WaitingAdapters, ",")})
		for _, a := range st.ResidentAdapters {
			b.add(metricAdapterLoaded, dto.MetricType_GAUGE, 1, adapterLabels, []string{model, a})
		}
		b.add(metricAdapterLoads, dto.MetricType_COUNTER, float64(st.AdapterLoads), modelNameLabels, []string{model})
	}
	b.add(metricPrefixHits, dto.MetricType_COUNTER, float64(st.PrefixHitTokens), modelLabels, modelValues)
	b.add(metricPrefixQueries, dto.MetricType_COUNTER, float64(st.PrefixQueryTokens), modelLabels, modelValues)
	b.add(metricPreemptions, dto.MetricType_COUNTER, float64(st.Preemptions), modelLabels, modelValues)
	b.add(metricPromptTokens, dto.MetricType_COUNTER, float64(st.PromptTokens), modelLabels, modelValues)
	b.add(metricGenTokens, dto.MetricType_COUNTER, float64(st.GenerationTokens), modelLabels, modelValues)
	for _, f := range b.out {
		if len(f.Metric) > 1 {
			slices.SortFunc(f.Metric, compareByLabelValues)
		}
	}
	return b.out
}

type familyBuilder struct {
	out map[string]*dto.MetricFamily
}

// add appends one sample to family name, labels sorted by name as the client library sorts them.
func (b *familyBuilder) add(name string, typ dto.MetricType, v float64, labels, values []string) {
	f := b.out[name]
	if f == nil {
		help := stateHelp[name]
		f = &dto.MetricFamily{Name: &name, Help: &help, Type: typ.Enum()}
		b.out[name] = f
	}
	m := &dto.Metric{Label: make([]*dto.LabelPair, len(labels))}
	for i := range labels {
		m.Label[i] = &dto.LabelPair{Name: &labels[i], Value: &values[i]}
	}
	slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
	if typ == dto.MetricType_COUNTER {
		m.Counter = &dto.Counter{Value: &v}
	} else {
		m.Gauge = &dto.Gauge{Value: &v}
	}
	f.Metric = append(f.Metric, m)
}

// compareByLabelValues orders samples of one family as Gather does: by label values, in label-name order.
func compareByLabelValues(a, b *dto.Metric) int {
	for i := range min(len(a.Label), len(b.Label)) {
		if c := strings.Compare(a.Label[i].GetValue(), b.Label[i].GetValue()); c != 0 {
			return c
		}
	}
	return len(a.Label) - len(b.Label)
}
