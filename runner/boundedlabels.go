package runner

import (
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// OtherLabelValue is the value a bounded label takes beyond its limit.
const OtherLabelValue = "other"

// DefaultMaxLabelValues is the default --metrics-max-label-values: room for
// the models and LoRA adapters of a large pool.
const DefaultMaxLabelValues = 256

// boundedLabels maps the metric labels whose values clients choose to the
// value space they share: upstream labels its request metrics by the model
// name in each request body (and the model it is rewritten to), and its
// flow-control metrics by the fairness ID header. One model keeps its own
// series under both model labels or under neither.
var boundedLabels = map[string]string{"model_name": "model", "target_model_name": "model", "fairness_id": "fairness"}

// boundedRegistry registers collectors wrapped so that each bounded value
// space keeps at most limit distinct values, the first seen by a scrape,
// process-wide; series
// with any other value are reported under OtherLabelValue. Without it a
// client that sends a new model name per request grows the EPP's memory and
// the monitoring system's series without bound.
//
// The wrapped collector of a metric vector also deletes the child series it
// folded, so memory stays bounded too: counters and histograms are kept
// summed under "other" (an increment racing with the fold of its series may
// be lost), gauges are summed live and their children deleted once back at
// zero (upstream's labelled gauges count up and down).
type boundedRegistry struct {
	inner  prometheus.Registerer
	values *labelValues

	mu      sync.Mutex
	wrapped map[prometheus.Collector]prometheus.Collector
}

var _ prometheus.Registerer = (*boundedRegistry)(nil)

func newBoundedRegistry(inner prometheus.Registerer, limit int) *boundedRegistry {
	return &boundedRegistry{inner: inner, values: newLabelValues(limit), wrapped: map[prometheus.Collector]prometheus.Collector{}}
}

// Register registers c's wrapper.
func (r *boundedRegistry) Register(c prometheus.Collector) error {
	w := &boundedCollector{inner: c, values: r.values, retired: map[string]*foldedSeries{}}
	if v, ok := c.(seriesDeleter); ok {
		w.vec = v
	}
	if err := r.inner.Register(w); err != nil {
		return err
	}
	r.mu.Lock()
	r.wrapped[c] = w
	r.mu.Unlock()
	return nil
}

// MustRegister registers the collectors' wrappers and panics on an error.
func (r *boundedRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c's wrapper.
func (r *boundedRegistry) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	w, ok := r.wrapped[c]
	delete(r.wrapped, c)
	r.mu.Unlock()
	return ok && r.inner.Unregister(w)
}

// boundRegistryOnce installs the bounded registry once per process.
var boundRegistryOnce sync.Once

// boundMetricLabels makes controller-runtime's registry, which the EPP's
// /metrics serves and on which upstream and Sluice register their metrics,
// bound client-chosen labels to limit values each. It must run before they
// register, and only the first call per process counts.
func boundMetricLabels(limit int) {
	boundRegistryOnce.Do(func() {
		inner := ctrlmetrics.Registry
		ctrlmetrics.Registry = struct {
			prometheus.Registerer
			prometheus.Gatherer
		}{newBoundedRegistry(inner, limit), inner}
	})
}

// labelValues admits the first limit distinct values of each value space.
type labelValues struct {
	limit int
	mu    sync.Mutex
	seen  map[string]map[string]bool // value space -> admitted values
}

func newLabelValues(limit int) *labelValues {
	return &labelValues{limit: limit, seen: map[string]map[string]bool{}}
}

// admit reports whether value keeps its own series in its value space. The
// value OtherLabelValue never does: a client sending it must not collide
// with the folded series.
func (l *labelValues) admit(space, value string) bool {
	if value == OtherLabelValue {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	vals := l.seen[space]
	if vals == nil {
		vals = map[string]bool{}
		l.seen[space] = vals
	}
	if vals[value] {
		return true
	}
	if len(vals) >= l.limit {
		return false
	}
	vals[value] = true
	return true
}

// seriesDeleter is what metric vectors (CounterVec, GaugeVec, HistogramVec)
// offer to remove a child series.
type seriesDeleter interface {
	Delete(prometheus.Labels) bool
}

// boundedCollector passes its inner collector's series through, folding
// those with a bounded label beyond its limit under OtherLabelValue.
type boundedCollector struct {
	inner  prometheus.Collector
	vec    seriesDeleter // nil when inner is not a vector
	values *labelValues

	mu sync.Mutex
	// retired holds the folded counters and histograms whose children were
	// deleted, by series key.
	retired map[string]*foldedSeries
}

// foldedSeries is one "other" series: its descriptor and summed value.
type foldedSeries struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (f *foldedSeries) Desc() *prometheus.Desc { return f.desc }

func (f *foldedSeries) Write(out *dto.Metric) error {
	*out = dto.Metric{Counter: f.m.Counter, Gauge: f.m.Gauge, Histogram: f.m.Histogram}
	for _, lp := range f.m.Label {
		name, value := lp.GetName(), lp.GetValue()
		out.Label = append(out.Label, &dto.LabelPair{Name: &name, Value: &value})
	}
	return nil
}

func (c *boundedCollector) Describe(ch chan<- *prometheus.Desc) { c.inner.Describe(ch) }

func (c *boundedCollector) Collect(ch chan<- prometheus.Metric) {
	// A vector holds its lock while it collects: read everything first, delete children after.
	ms := make(chan prometheus.Metric)
	go func() {
		c.inner.Collect(ms)
		close(ms)
	}()
	var collected []prometheus.Metric
	for m := range ms {
		collected = append(collected, m)
	}
	live := map[string]*foldedSeries{} // folded gauges, this collection only
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range collected {
		var d dto.Metric
		if err := m.Write(&d); err != nil || d.Summary != nil || d.Untyped != nil {
			ch <- m
			continue
		}
		over := c.overflowing(d.GetLabel())
		if over == nil {
			ch <- m
			continue
		}
		key, labels := folded(m.Desc(), d.GetLabel(), over)
		if d.Gauge != nil {
			if d.GetGauge().GetValue() == 0 && c.vec != nil {
				c.vec.Delete(labelMap(d.GetLabel()))
				continue
			}
			add(live, key, m.Desc(), labels, &d)
			continue
		}
		add(c.retired, key, m.Desc(), labels, &d)
		if c.vec != nil {
			c.vec.Delete(labelMap(d.GetLabel()))
		}
	}
	for _, f := range c.retired {
		ch <- &foldedSeries{desc: f.desc, m: cloneMetric(f.m)}
	}
	for _, f := range live {
		ch <- f
	}
}

// overflowing returns, per label of a series, whether its value is beyond
// its bounded label's limit (admitting the values that fit); nil when none
// is.
func (c *boundedCollector) overflowing(labels []*dto.LabelPair) []bool {
	var over []bool
	for i, lp := range labels {
		if space, ok := boundedLabels[lp.GetName()]; ok && !c.values.admit(space, lp.GetValue()) {
			if over == nil {
				over = make([]bool, len(labels))
			}
			over[i] = true
		}
	}
	return over
}

// folded returns the "other" series a series folds into: its labels with the
// overflowing values replaced, and a key naming it.
func folded(desc *prometheus.Desc, labels []*dto.LabelPair, over []bool) (string, []*dto.LabelPair) {
	var b strings.Builder
	b.WriteString(desc.String())
	out := make([]*dto.LabelPair, len(labels))
	for i, lp := range labels {
		name, value := lp.GetName(), lp.GetValue()
		if over[i] {
			value = OtherLabelValue
		}
		out[i] = &dto.LabelPair{Name: &name, Value: &value}
		fmt.Fprintf(&b, "|%s=%s", name, value)
	}
	return b.String(), out
}

func labelMap(labels []*dto.LabelPair) prometheus.Labels {
	m := prometheus.Labels{}
	for _, lp := range labels {
		m[lp.GetName()] = lp.GetValue()
	}
	return m
}

// add sums d into the folded series key of into.
func add(into map[string]*foldedSeries, key string, desc *prometheus.Desc, labels []*dto.LabelPair, d *dto.Metric) {
	f := into[key]
	if f == nil {
		f = &foldedSeries{desc: desc, m: &dto.Metric{Label: labels}}
		into[key] = f
	}
	switch {
	case d.Counter != nil:
		if f.m.Counter == nil {
			f.m.Counter = &dto.Counter{Value: new(float64)}
		}
		*f.m.Counter.Value += d.GetCounter().GetValue()
	case d.Gauge != nil:
		if f.m.Gauge == nil {
			f.m.Gauge = &dto.Gauge{Value: new(float64)}
		}
		*f.m.Gauge.Value += d.GetGauge().GetValue()
	case d.Histogram != nil:
		h := d.GetHistogram()
		if f.m.Histogram == nil {
			f.m.Histogram = &dto.Histogram{SampleCount: new(uint64), SampleSum: new(float64)}
			for _, b := range h.GetBucket() {
				f.m.Histogram.Bucket = append(f.m.Histogram.Bucket, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: new(uint64)})
			}
		}
		*f.m.Histogram.SampleCount += h.GetSampleCount()
		*f.m.Histogram.SampleSum += h.GetSampleSum()
		for i, b := range h.GetBucket() {
			if i < len(f.m.Histogram.Bucket) {
				*f.m.Histogram.Bucket[i].CumulativeCount += b.GetCumulativeCount()
			}
		}
	}
}

// cloneMetric copies a folded series so the registry reads a value no later
// collection changes.
func cloneMetric(m *dto.Metric) *dto.Metric {
	c := &dto.Metric{Label: m.Label}
	if m.Counter != nil {
		v := m.Counter.GetValue()
		c.Counter = &dto.Counter{Value: &v}
	}
	if m.Histogram != nil {
		n, s := m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
		c.Histogram = &dto.Histogram{SampleCount: &n, SampleSum: &s}
		for _, b := range m.Histogram.Bucket {
			cc := b.GetCumulativeCount()
			c.Histogram.Bucket = append(c.Histogram.Bucket, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: &cc})
		}
	}
	return c
}
