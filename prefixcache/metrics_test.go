package prefixcache

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
	c := testConfig()
	c.Guard.OverloadAbsolute = 2
	ix, err := New(c, WithRecorder(rec))
	if err != nil {
		t.Fatal(err)
	}
	cs := cands(2)
	p := textPrompt("0123456789abcdef")
	ix.Route(t0, "", p, cs[0])
	cs[0].Load.Queued = 10 // overloaded holder
	score(ix, p, cs)
	ix.Route(t0, "r", p, cs[0])
	ix.ObserveUsage(t0, "r", Usage{PromptTokens: 17, CachedTokens: 0, CachedReported: true})

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"sluice_prefixcache_guard_total{action=overload}":       1,
		"sluice_prefixcache_guard_total{action=taper}":          0,
		"sluice_prefixcache_guard_total{action=kv_full}":        0,
		"sluice_prefixcache_calibration_ratio{source=usage}":    1,
		"sluice_prefixcache_calibration_ratio{source=counters}": 0,
	}
	if len(got) != len(want) {
		t.Fatalf("metrics %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("metrics %v, want %v", got, want)
		}
	}
}
