package modelrewrite

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// series gathers reg into "name{label=value,...} value" lines, sorted;
// histograms report their sample count.
func series(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Histogram != nil:
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

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
	rec.RecordTripped(sticky.Rule, "canary", true)

	got := strings.Join(series(t, reg), "\n")
	target := "target=" + sticky.Model
	other := map[string]string{"stable": "target=canary", "canary": "target=stable"}[sticky.Model]
	for _, want := range []string{
		"sluice_modelrewrite_decisions_total{kind=sticky,rewrite=default/canary,rule=0," + target + "} 2",
		"sluice_modelrewrite_decisions_total{kind=no_match,rewrite=,rule=,target=} 1",
		"sluice_modelrewrite_decisions_total{kind=unchanged,rewrite=default/exempt,rule=0,target=} 1",
		"sluice_modelrewrite_outcomes_total{outcome=success,rewrite=default/canary,rule=0," + target + "} 1",
		"sluice_modelrewrite_outcomes_total{outcome=error,rewrite=default/canary,rule=0," + target + "} 1",
		"sluice_modelrewrite_ttft_seconds{rewrite=default/canary,rule=0," + target + "} 1",
		"sluice_modelrewrite_guardrail_tripped{rewrite=default/canary,rule=0,target=canary} 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"client-chosen-name", "mistral", "kind=no_match,rewrite=default", "rewrite=default/exempt,rule=0,target=mistral"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("found %q in\n%s", unwanted, got)
		}
	}
	if strings.Contains(got, "decisions_total{kind=sticky,rewrite=default/canary,rule=0,"+other+"} 2") {
		t.Errorf("decision counted for the target not served:\n%s", got)
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
	var names []string
	for _, s := range series(t, reg) {
		if strings.HasPrefix(s, "sluice_modelrewrite_decisions_total{kind=weighted") {
			names = append(names, s)
		}
	}
	want := []string{
		"sluice_modelrewrite_decisions_total{kind=weighted,rewrite=_overflow,rule=_overflow,target=_overflow} 3",
		"sluice_modelrewrite_decisions_total{kind=weighted,rewrite=default/rw0,rule=0,target=m} 1",
		"sluice_modelrewrite_decisions_total{kind=weighted,rewrite=default/rw1,rule=0,target=m} 1",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
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
