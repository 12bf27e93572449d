package dataplane

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gatherCounters returns counter values keyed by "name{label=value,...}" in
// label order. (prometheus/testutil needs a module that go.sum lacks.)
func gatherCounters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			key += "}"
			if c := m.GetCounter(); c != nil {
				out[key] = c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				out[key+"_count"] = float64(h.GetSampleCount())
			}
		}
	}
	return out
}

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := NewPrometheusRecorder(reg)
	if err != nil {
		t.Fatal(err)
	}
	r.RecordRequest(OutcomeProxied, false, time.Millisecond)
	r.RecordRequest(OutcomeProxied, true, time.Millisecond)
	r.RecordRequest(OutcomeImmediate, false, time.Millisecond)
	r.RecordEPPFailure(EPPFailureTimeout)
	got := gatherCounters(t, reg)
	want := map[string]float64{
		"sluice_dataplane_requests_total{failed_open=false,outcome=immediate}": 1,
		"sluice_dataplane_requests_total{failed_open=false,outcome=proxied}":   1,
		"sluice_dataplane_requests_total{failed_open=true,outcome=proxied}":    1,
		"sluice_dataplane_request_duration_seconds{outcome=proxied}_count":     2,
		"sluice_dataplane_request_duration_seconds{outcome=immediate}_count":   1,
		"sluice_dataplane_epp_failures_total{phase=timeout}":                   1,
	}
	if len(got) != len(want) {
		t.Errorf("got series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, err := NewPrometheusRecorder(reg); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
}
