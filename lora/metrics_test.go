package lora

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

	const want = `
# HELP sluice_lora_memory_evictions_total (adapter, pod) sends forgotten by the LoRA affinity memory, by reason.
# TYPE sluice_lora_memory_evictions_total counter
sluice_lora_memory_evictions_total{reason="capacity"} 1
sluice_lora_memory_evictions_total{reason="expired"} 0
# HELP sluice_lora_score_outcomes_total LoRA affinity scoring calls, by the rule that decided them.
# TYPE sluice_lora_score_outcomes_total counter
sluice_lora_score_outcomes_total{outcome="base_model"} 1
sluice_lora_score_outcomes_total{outcome="cold_placement"} 1
sluice_lora_score_outcomes_total{outcome="no_lora_info"} 0
sluice_lora_score_outcomes_total{outcome="no_slot"} 0
sluice_lora_score_outcomes_total{outcome="resident"} 1
sluice_lora_score_outcomes_total{outcome="spill"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewPrometheusRecorder(reg); err == nil {
		t.Fatal("registering the metrics twice succeeded")
	}
}
