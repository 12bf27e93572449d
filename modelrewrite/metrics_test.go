package modelrewrite

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewPrometheusRecorder(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	table := mustTable(t,
		rewrite("canary", t0, weighted([]string{"llama"}, Target{"stable", 50}, Target{"canary", 50})),
		rewrite("exempt", t0, exact([]string{"mistral"})),
	)
	sticky := table.Decide(Request{Pool: pool, Model: "llama", SessionKey: "s"}, nil, nil)
	rec.RecordDecision(sticky)
	rec.RecordDecision(sticky)
	rec.RecordOutcome(sticky, 120*time.Millisecond, false)
	rec.RecordOutcome(sticky, 0, true)
	rec.RecordDecision(table.Decide(Request{Pool: pool, Model: "client-chosen-name"}, nil, nil))
	unchanged := table.Decide(Request{Pool: pool, Model: "mistral"}, nil, nil)
	rec.RecordDecision(unchanged)
	rec.RecordOutcome(unchanged, time.Second, false) // not rewritten: not recorded
	rec.RecordTripped(sticky.Rule, sticky.Model, true)

	// Only the served target has series (whichever of the two the session sticks to); a client's model name
	// (client-chosen-name, mistral) is never a label value.
	want := strings.ReplaceAll(`
# HELP sluice_modelrewrite_decisions_total Model rewrite decisions by rule, served target model and kind (sticky, weighted, diverted, unchanged, no_match).
# TYPE sluice_modelrewrite_decisions_total counter
sluice_modelrewrite_decisions_total{kind="diverted",rewrite="default/canary",rule="0",target="SERVED"} 0
sluice_modelrewrite_decisions_total{kind="no_match",rewrite="",rule="",target=""} 1
sluice_modelrewrite_decisions_total{kind="sticky",rewrite="default/canary",rule="0",target="SERVED"} 2
sluice_modelrewrite_decisions_total{kind="unchanged",rewrite="default/exempt",rule="0",target=""} 1
sluice_modelrewrite_decisions_total{kind="weighted",rewrite="default/canary",rule="0",target="SERVED"} 0
# HELP sluice_modelrewrite_guardrail_tripped 1 while the guardrail diverts a target's share to its rule's stable target.
# TYPE sluice_modelrewrite_guardrail_tripped gauge
sluice_modelrewrite_guardrail_tripped{rewrite="default/canary",rule="0",target="SERVED"} 1
# HELP sluice_modelrewrite_outcomes_total Finished rewritten requests by rule, served target model and outcome (success, error).
# TYPE sluice_modelrewrite_outcomes_total counter
sluice_modelrewrite_outcomes_total{outcome="error",rewrite="default/canary",rule="0",target="SERVED"} 1
sluice_modelrewrite_outcomes_total{outcome="success",rewrite="default/canary",rule="0",target="SERVED"} 1
# HELP sluice_modelrewrite_ttft_seconds Time to first token of rewritten requests by rule and served target model.
# TYPE sluice_modelrewrite_ttft_seconds histogram
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.01"} 0
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.025"} 0
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.05"} 0
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.1"} 0
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.25"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="0.5"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="1"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="2.5"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="5"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="10"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="30"} 1
sluice_modelrewrite_ttft_seconds_bucket{rewrite="default/canary",rule="0",target="SERVED",le="+Inf"} 1
sluice_modelrewrite_ttft_seconds_sum{rewrite="default/canary",rule="0",target="SERVED"} 0.12
sluice_modelrewrite_ttft_seconds_count{rewrite="default/canary",rule="0",target="SERVED"} 1
`, "SERVED", sticky.Model)
	if sticky.Model != "stable" && sticky.Model != "canary" {
		t.Fatalf("sticky decision served %q, want one of the rule's targets", sticky.Model)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestPrometheusRecorderCapsSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewPrometheusRecorder(reg, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		rule := RuleID{Object: ObjectKey{Namespace: "default", Name: fmt.Sprintf("rw%d", i)}}
		rec.RecordDecision(Decision{Kind: KindWeighted, Rule: rule, Model: "m", Chosen: "m", Stable: "m"})
	}
	// Two pairs get their own series; the other three share the overflow series.
	const want = `
# HELP sluice_modelrewrite_decisions_total Model rewrite decisions by rule, served target model and kind (sticky, weighted, diverted, unchanged, no_match).
# TYPE sluice_modelrewrite_decisions_total counter
sluice_modelrewrite_decisions_total{kind="diverted",rewrite="_overflow",rule="_overflow",target="_overflow"} 0
sluice_modelrewrite_decisions_total{kind="diverted",rewrite="default/rw0",rule="0",target="m"} 0
sluice_modelrewrite_decisions_total{kind="diverted",rewrite="default/rw1",rule="0",target="m"} 0
sluice_modelrewrite_decisions_total{kind="sticky",rewrite="_overflow",rule="_overflow",target="_overflow"} 0
sluice_modelrewrite_decisions_total{kind="sticky",rewrite="default/rw0",rule="0",target="m"} 0
sluice_modelrewrite_decisions_total{kind="sticky",rewrite="default/rw1",rule="0",target="m"} 0
sluice_modelrewrite_decisions_total{kind="weighted",rewrite="_overflow",rule="_overflow",target="_overflow"} 3
sluice_modelrewrite_decisions_total{kind="weighted",rewrite="default/rw0",rule="0",target="m"} 1
sluice_modelrewrite_decisions_total{kind="weighted",rewrite="default/rw1",rule="0",target="m"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_modelrewrite_decisions_total"); err != nil {
		t.Error(err)
	}
}

func TestNewPrometheusRecorderErrors(t *testing.T) {
	if _, err := NewPrometheusRecorder(nil, 0); err == nil {
		t.Error("nil Registerer: want an error")
	}
	reg := prometheus.NewRegistry()
	if _, err := NewPrometheusRecorder(reg, 0); err != nil {
		t.Fatal(err)
	}
	_, err := NewPrometheusRecorder(reg, 0)
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		t.Errorf("second registration: error %v, want AlreadyRegisteredError", err)
	}
}

func TestDecisionKindString(t *testing.T) {
	seen := map[string]bool{}
	for k := range DecisionKind(numDecisionKinds) {
		s := k.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("kind %d: label %q is empty, unknown or repeated", k, s)
		}
		seen[s] = true
	}
	if DecisionKind(numDecisionKinds).String() != "unknown" {
		t.Error("out-of-range kind must render as unknown")
	}
}
