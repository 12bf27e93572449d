package flowcontrol

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"
)

// observations is the sample count of one histogram series.
func observations(t *testing.T, h *prometheus.HistogramVec, labels ...string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.WithLabelValues(labels...).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
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
	r.RecordQueue(QueueSample{Queued: [NumBands]int{1, 2, 3}, PoolSaturation: 0.75, DrainRate: 1234, StaleEndpoints: 2, Reserved: 4})

	const want = `
# HELP sluice_flowcontrol_burst_dispatched_total Requests dispatched in the burst tier (no endpoint had headroom under the normal thresholds), per band.
# TYPE sluice_flowcontrol_burst_dispatched_total counter
sluice_flowcontrol_burst_dispatched_total{band="Standard"} 1
# HELP sluice_flowcontrol_cancelled_total Requests whose client went away while waiting.
# TYPE sluice_flowcontrol_cancelled_total counter
sluice_flowcontrol_cancelled_total{band="Standard"} 1
# HELP sluice_flowcontrol_capped_total Requests served in a lower band than asked because of their tenant's cap.
# TYPE sluice_flowcontrol_capped_total counter
sluice_flowcontrol_capped_total{band="Standard"} 1
# HELP sluice_flowcontrol_dispatched_total Requests dispatched to the scheduler.
# TYPE sluice_flowcontrol_dispatched_total counter
sluice_flowcontrol_dispatched_total{band="Critical",tenant="alice"} 1
sluice_flowcontrol_dispatched_total{band="Standard",tenant="bob"} 1
sluice_flowcontrol_dispatched_total{band="Standard",tenant="other"} 1
# HELP sluice_flowcontrol_drain_rate Estimated pool drain rate while backlogged, in cost units (tokens) per second.
# TYPE sluice_flowcontrol_drain_rate gauge
sluice_flowcontrol_drain_rate 1234
# HELP sluice_flowcontrol_pool_saturation Mean saturation of endpoints with fresh metrics (informational).
# TYPE sluice_flowcontrol_pool_saturation gauge
sluice_flowcontrol_pool_saturation 0.75
# HELP sluice_flowcontrol_queue_length Requests waiting in the EPP, per band.
# TYPE sluice_flowcontrol_queue_length gauge
sluice_flowcontrol_queue_length{band="Critical"} 1
sluice_flowcontrol_queue_length{band="Sheddable"} 3
sluice_flowcontrol_queue_length{band="Standard"} 2
# HELP sluice_flowcontrol_reserved_requests Dispatched requests still counted against an endpoint (not yet covered by a scrape, or streamed without a first chunk).
# TYPE sluice_flowcontrol_reserved_requests gauge
sluice_flowcontrol_reserved_requests 4
# HELP sluice_flowcontrol_shed_total Requests answered rejected (429/400) or unavailable (503), by reason.
# TYPE sluice_flowcontrol_shed_total counter
sluice_flowcontrol_shed_total{band="Critical",outcome="unavailable",reason="no_endpoints",tenant="alice"} 1
sluice_flowcontrol_shed_total{band="Sheddable",outcome="rejected",reason="queue_full",tenant="other"} 1
# HELP sluice_flowcontrol_stale_endpoints Endpoints whose metrics are older than the staleness threshold: admission sends them nothing.
# TYPE sluice_flowcontrol_stale_endpoints gauge
sluice_flowcontrol_stale_endpoints 2
`
	// Every series but the histograms', whose buckets are checked by their sample counts below.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"sluice_flowcontrol_burst_dispatched_total", "sluice_flowcontrol_cancelled_total", "sluice_flowcontrol_capped_total",
		"sluice_flowcontrol_dispatched_total", "sluice_flowcontrol_drain_rate", "sluice_flowcontrol_pool_saturation",
		"sluice_flowcontrol_queue_length", "sluice_flowcontrol_reserved_requests", "sluice_flowcontrol_shed_total",
		"sluice_flowcontrol_stale_endpoints"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(r.queueWait); n != 5 {
		t.Errorf("queue_wait_seconds has %d series, want 5", n)
	}
	if n := testutil.CollectAndCount(r.retryAfter); n != 2 {
		t.Errorf("retry_after_seconds has %d series, want 2", n)
	}
	for _, h := range []struct {
		vec    *prometheus.HistogramVec
		labels []string
		want   uint64
	}{
		{r.queueWait, []string{"Critical", "dispatched"}, 1},
		{r.queueWait, []string{"Standard", "dispatched"}, 2},
		{r.queueWait, []string{"Sheddable", "rejected"}, 1},
		{r.queueWait, []string{"Critical", "unavailable"}, 1},
		{r.queueWait, []string{"Standard", "cancelled"}, 1},
		{r.retryAfter, []string{"Sheddable", "queue_full"}, 1},
		{r.retryAfter, []string{"Critical", "no_endpoints"}, 1},
	} {
		if got := observations(t, h.vec, h.labels...); got != h.want {
			t.Errorf("%v: %d observations, want %d", h.labels, got, h.want)
		}
	}
	if _, err := NewPrometheusRecorder(reg, 2); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
}

// TestPrometheusRecorderTenantNotUTF8: a tenant is a client-chosen header value; bytes that are not UTF-8 are
// labelled with U+FFFD instead of making the Prometheus client panic (which would end the EPP).
func TestPrometheusRecorderTenantNotUTF8(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	r, err := NewPrometheusRecorder(reg, 4)
	if err != nil {
		t.Fatal(err)
	}
	r.RecordDecision("acme\xff", Decision{Outcome: Dispatched, Band: Standard})
	r.RecordDecision("acme\xfe", Decision{Outcome: Dispatched, Band: Standard})
	r.RecordDecision("\xc3", Decision{Outcome: Rejected, Reason: ReasonQueueFull, Band: Sheddable})
	const want = `
# HELP sluice_flowcontrol_dispatched_total Requests dispatched to the scheduler.
# TYPE sluice_flowcontrol_dispatched_total counter
sluice_flowcontrol_dispatched_total{band="Standard",tenant="acme�"} 2
# HELP sluice_flowcontrol_shed_total Requests answered rejected (429/400) or unavailable (503), by reason.
# TYPE sluice_flowcontrol_shed_total counter
sluice_flowcontrol_shed_total{band="Sheddable",outcome="rejected",reason="queue_full",tenant="�"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"sluice_flowcontrol_dispatched_total", "sluice_flowcontrol_shed_total"); err != nil {
		t.Error(err)
	}
}

// TestControllerFeedsRecorder: the controller reports each request's decision exactly once and its queue lengths.
func TestControllerFeedsRecorder(t *testing.T) {
	r, err := NewPrometheusRecorder(prometheus.NewRegistry(), 10)
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
	if got := testutil.ToFloat64(r.dispatched.WithLabelValues("Standard", "x")); got != 1 {
		t.Errorf("dispatched_total{Standard,x} = %v after one dispatch, want 1", got)
	}
	if got := testutil.ToFloat64(r.queueLength.WithLabelValues("Standard")); got != 0 {
		t.Errorf("queue_length{Standard} = %v after one dispatch, want 0", got)
	}
	if got := observations(t, r.queueWait, "Standard", "dispatched"); got != 1 {
		t.Errorf("%d decisions observed, want exactly 1", got)
	}
}
