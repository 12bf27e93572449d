package outlier

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewPrometheusRecorder(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPrometheusRecorder(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	d, err := New(Config{Consecutive5xx: 3, LocalConsecutive5xx: 2, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	rec.Watch(func() int { return d.Ejected(now) })
	observe := func(ms int, endpoint string, status int) {
		if e := d.Observe(at(ms), endpoint, status); e.Reason != NotEjected {
			rec.Ejected(e.Reason)
		}
	}
	observe(0, "a", 500)
	observe(0, "a", 500)
	observe(1, "a", 500) // consecutive_5xx
	observe(2, "c", 500)
	observe(3, "b", 200)
	observe(4, "c", 500) // local_5xx
	now = at(10)

	// Every reason is exported from the start, at zero; the gauge counts the ejections in force at scrape time.
	const want = `
# HELP sluice_outlier_ejected_endpoints Endpoints ejected by passive outlier detection now (before each pick's cap on ejections).
# TYPE sluice_outlier_ejected_endpoints gauge
sluice_outlier_ejected_endpoints 2
# HELP sluice_outlier_ejections_total Endpoints ejected by passive outlier detection, by reason (consecutive_5xx, local_5xx, repeat: the first response after an ejection failed too; slow: its streams became several times slower than its usual pace while a peer's did not).
# TYPE sluice_outlier_ejections_total counter
sluice_outlier_ejections_total{reason="consecutive_5xx"} 1
sluice_outlier_ejections_total{reason="local_5xx"} 1
sluice_outlier_ejections_total{reason="repeat"} 0
sluice_outlier_ejections_total{reason="slow"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	now = at(1002)
	if got := testutil.ToFloat64(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, rec.ejected)); got != 1 {
		t.Errorf("ejected endpoints once a's ejection ended: %v, want 1", got)
	}
}
