package lora

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewPrometheusRecorder(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MemoryCapacity = 1
	s, err := NewScorer(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	pods := []PodState{{Name: "p1", MaxLoRA: 2}, {Name: "p2", MaxLoRA: 2, Running: NewAdapters("a")}}
	s.Score(Request{}, pods, t0)                // base_model
	s.Score(Request{Adapter: "a"}, pods, t0)    // resident
	s.Score(Request{Adapter: "cold"}, pods, t0) // cold_placement
	s.Record("a", "p2", t0)
	s.Record("b", "p1", t0) // capacity 1: forgets (a, p2)

	want := map[string]float64{
		`sluice_lora_memory_evictions_total{reason="capacity"}`:      1,
		`sluice_lora_memory_evictions_total{reason="expired"}`:       0,
		`sluice_lora_score_outcomes_total{outcome="base_model"}`:     1,
		`sluice_lora_score_outcomes_total{outcome="cold_placement"}`: 1,
		`sluice_lora_score_outcomes_total{outcome="no_lora_info"}`:   0,
		`sluice_lora_score_outcomes_total{outcome="no_slot"}`:        0,
		`sluice_lora_score_outcomes_total{outcome="resident"}`:       1,
		`sluice_lora_score_outcomes_total{outcome="spill"}`:          0,
	}
	got := gatherCounters(t, reg)
	if !maps.Equal(got, want) {
		t.Fatalf("counters = %v, want %v", got, want)
	}
	if _, err := NewPrometheusRecorder(reg); err == nil {
		t.Fatal("registering the metrics twice succeeded")
	}
}

// gatherCounters returns every counter in reg as `name{label="value",...}`.
// (client_golang's testutil would need a go.sum entry the module lacks.)
func gatherCounters(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}
