package flowcontrol

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"
)

// gathered flattens a registry into "name{k=v,...}" -> value (counter, gauge, or histogram sample count).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	r, err := NewPrometheusRecorder(reg, 2)
	if err != nil {
		t.Fatal(err)
	}
	r.RecordDecision("alice", Decision{Outcome: Dispatched, Band: Critical})
	r.RecordDecision("bob", Decision{Outcome: Dispatched, Band: Standard, Capped: true, Waited: 2 * time.Second})
	r.RecordDecision("carol", Decision{Outcome: Dispatched, Band: Standard, Burst: true}) // third tenant: "other"
	r.RecordDecision("dave", Decision{Outcome: Rejected, Reason: ReasonQueueFull, Band: Sheddable, RetryAfter: 3 * time.Second})
	r.RecordDecision("alice", Decision{Outcome: Unavailable, Reason: ReasonNoEndpoints, Band: Critical, RetryAfter: time.Second})
	r.RecordDecision("bob", Decision{Outcome: Cancelled, Reason: ReasonCancelled, Band: Standard})
	r.RecordQueue(QueueSample{Queued: [NumBands]int{1, 2, 3}, PoolSaturation: 0.75, DrainRate: 1234, StaleEndpoints: 2})

	want := map[string]float64{
		"sluice_flowcontrol_dispatched_total{band=Critical,tenant=alice}":                                   1,
		"sluice_flowcontrol_dispatched_total{band=Standard,tenant=bob}":                                     1,
		"sluice_flowcontrol_dispatched_total{band=Standard,tenant=other}":                                   1,
		"sluice_flowcontrol_burst_dispatched_total{band=Standard}":                                          1,
		"sluice_flowcontrol_shed_total{band=Critical,outcome=unavailable,reason=no_endpoints,tenant=alice}": 1,
		"sluice_flowcontrol_shed_total{band=Sheddable,outcome=rejected,reason=queue_full,tenant=other}":     1,
		"sluice_flowcontrol_cancelled_total{band=Standard}":                                                 1,
		"sluice_flowcontrol_capped_total{band=Standard}":                                                    1,
		"sluice_flowcontrol_retry_after_seconds{band=Sheddable,reason=queue_full}":                          1,
		"sluice_flowcontrol_retry_after_seconds{band=Critical,reason=no_endpoints}":                         1,
		"sluice_flowcontrol_queue_wait_seconds{band=Critical,outcome=dispatched}":                           1,
		"sluice_flowcontrol_queue_wait_seconds{band=Standard,outcome=dispatched}":                           2,
		"sluice_flowcontrol_queue_wait_seconds{band=Sheddable,outcome=rejected}":                            1,
		"sluice_flowcontrol_queue_wait_seconds{band=Critical,outcome=unavailable}":                          1,
		"sluice_flowcontrol_queue_wait_seconds{band=Standard,outcome=cancelled}":                            1,
		"sluice_flowcontrol_queue_length{band=Critical}":                                                    1,
		"sluice_flowcontrol_queue_length{band=Standard}":                                                    2,
		"sluice_flowcontrol_queue_length{band=Sheddable}":                                                   3,
		"sluice_flowcontrol_pool_saturation{}":                                                              0.75,
		"sluice_flowcontrol_drain_rate{}":                                                                   1234,
		"sluice_flowcontrol_stale_endpoints{}":                                                              2,
	}
	got := gathered(t, reg)
	if !maps.Equal(got, want) {
		for _, k := range slices.Sorted(maps.Keys(got)) {
			if want[k] != got[k] {
				t.Errorf("got %s = %v, want %v", k, got[k], want[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if _, ok := got[k]; !ok {
				t.Errorf("missing %s", k)
			}
		}
	}
	if _, err := NewPrometheusRecorder(reg, 2); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
}

// TestControllerFeedsRecorder: the controller reports each request's decision exactly once and its queue lengths.
func TestControllerFeedsRecorder(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := NewPrometheusRecorder(reg, 10)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(t0)
	c, err := New(nil, Deps{Recorder: r, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateEndpoints([]Endpoint{{Name: "a", ScrapedAt: clk.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(t.Context(), Request{ID: "1", Tenant: "x"}); err != nil {
		t.Fatal(err)
	}
	got := gathered(t, reg)
	if got["sluice_flowcontrol_dispatched_total{band=Standard,tenant=x}"] != 1 ||
		got["sluice_flowcontrol_queue_length{band=Standard}"] != 0 {
		t.Fatalf("metrics after one dispatch: %v", got)
	}
}
