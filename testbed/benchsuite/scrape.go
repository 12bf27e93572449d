package benchsuite

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric names the suite reads. The vllm: ones are the simulator's (vLLM's
// names); sluice_flowcontrol_* are Sluice admission's (flowcontrol/metrics.go);
// inference_extension_flow_control_queue_size is upstream's flow-control
// queue (GIE pkg/epp/metrics).
const (
	metricServerWaiting   = "vllm:num_requests_waiting"
	metricServerRunning   = "vllm:num_requests_running"
	metricPrefixHits      = "vllm:prefix_cache_hits_total"
	metricPrefixQueries   = "vllm:prefix_cache_queries_total"
	metricPreemptions     = "vllm:num_preemptions_total"
	metricAdapterLoads    = "sluice_sim_lora_loads_total"
	metricSluiceQueue     = "sluice_flowcontrol_queue_length"
	metricSluiceDispatch  = "sluice_flowcontrol_dispatched_total"
	metricSluiceBurst     = "sluice_flowcontrol_burst_dispatched_total"
	metricSluiceShed      = "sluice_flowcontrol_shed_total"
	metricSluiceStale     = "sluice_flowcontrol_stale_endpoints"
	metricUpstreamQueue   = "inference_extension_flow_control_queue_size"
	labelBand             = "band"
	labelReason           = "reason"
	labelUpstreamPriority = "priority"
)

// MetricPage is a parsed /metrics page.
type MetricPage map[string]*dto.MetricFamily

// Scrape reads a Prometheus text page.
func Scrape(ctx context.Context, client *http.Client, url string) (MetricPage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics parses a Prometheus text page.
func ParseMetrics(r io.Reader) (MetricPage, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

// ScrapeMerged reads several pages of the same process kind (the EPP's
// replicas) as one: each metric's series from every page, so sums add
// over the replicas.
func ScrapeMerged(ctx context.Context, client *http.Client, urls []string) (MetricPage, error) {
	merged := MetricPage{}
	for _, u := range urls {
		page, err := Scrape(ctx, client, u)
		if err != nil {
			return nil, err
		}
		for name, fam := range page {
			if have := merged[name]; have != nil {
				have.Metric = append(have.Metric, fam.GetMetric()...)
			} else {
				merged[name] = fam
			}
		}
	}
	return merged, nil
}

// Sum adds every series of a counter, gauge or untyped metric; 0 when the
// page has none.
func (p MetricPage) Sum(name string) float64 {
	var total float64
	if fam := p[name]; fam != nil {
		for _, m := range fam.GetMetric() {
			total += metricValue(m)
		}
	}
	return total
}

// SumBy adds a metric's series grouped by one label's value; nil when the
// page has no such metric.
func (p MetricPage) SumBy(name, label string) map[string]float64 {
	fam := p[name]
	if fam == nil {
		return nil
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				key = l.GetValue()
			}
		}
		out[key] += metricValue(m)
	}
	return out
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// eppQueued is the EPP's queue per band: Sluice admission's gauges, or
// upstream flow control's per priority ("priority 10"); nil when the EPP
// exports neither.
func eppQueued(p MetricPage) map[string]float64 {
	if q := p.SumBy(metricSluiceQueue, labelBand); q != nil {
		return q
	}
	q := p.SumBy(metricUpstreamQueue, labelUpstreamPriority)
	if q == nil {
		return nil
	}
	out := make(map[string]float64, len(q))
	for prio, v := range q {
		out[strings.TrimSpace("priority "+prio)] = v
	}
	return out
}

// eppStaleEndpoints reads Sluice admission's count of endpoints with stale
// metrics; nil when the page has none (no Sluice admission).
func eppStaleEndpoints(p MetricPage) *float64 {
	if p[metricSluiceStale] == nil {
		return nil
	}
	n := p.Sum(metricSluiceStale)
	return &n
}

// admissionCounters reads Sluice admission's counters; nil when the EPP
// runs no Sluice admission (no queue gauge on its page).
func admissionCounters(p MetricPage) *AdmissionCounters {
	if p[metricSluiceQueue] == nil {
		return nil
	}
	c := &AdmissionCounters{
		Dispatched:      p.SumBy(metricSluiceDispatch, labelBand),
		BurstDispatched: p.SumBy(metricSluiceBurst, labelBand),
		Shed:            p.SumBy(metricSluiceShed, labelBand),
		ShedByReason:    p.SumBy(metricSluiceShed, labelReason),
	}
	// A counter vector without series is absent from the page: none yet.
	for _, m := range []*map[string]float64{&c.Dispatched, &c.BurstDispatched, &c.Shed, &c.ShedByReason} {
		if *m == nil {
			*m = map[string]float64{}
		}
	}
	return c
}
