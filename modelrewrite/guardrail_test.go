package modelrewrite

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

var canaryRule = RuleID{Object: ObjectKey{Namespace: "default", Name: "canary"}, Index: 0}

func served(target string) Decision {
	return Decision{Kind: KindSticky, Rule: canaryRule, Model: target, Chosen: target, Stable: "stable"}
}

// outcomes is one step of a guardrail scenario: n outcomes for target at
// offset from t0, the last failed of them failures.
type outcomes struct {
	at          time.Duration
	target      string
	n, failed   int
	clear       bool // instead of recording, the operator clears target
	wantTripped bool // canary state after the step
}

func TestGuardrailScenarios(t *testing.T) {
	cfg := GuardrailConfig{Margin: 0.1, Window: 60 * time.Second, MinRequests: 10, Buckets: 6}
	tests := []struct {
		name  string
		steps []outcomes
	}{
		{
			name: "trips once both sides have enough outcomes and the margin is exceeded",
			steps: []outcomes{
				{at: 0, target: "stable", n: 20},
				{at: time.Second, target: "canary", n: 9, failed: 9}, // below MinRequests
				{at: 2 * time.Second, target: "canary", n: 1, wantTripped: true},
			},
		},
		{
			name: "within the margin",
			steps: []outcomes{
				{at: 0, target: "stable", n: 20, failed: 1},           // 5%
				{at: time.Second, target: "canary", n: 20, failed: 3}, // 15%: 10 points above, not more
			},
		},
		{
			name: "stable lacks outcomes",
			steps: []outcomes{
				{at: 0, target: "stable", n: 9},
				{at: time.Second, target: "canary", n: 50, failed: 50},
			},
		},
		{
			name: "high error ratio on both sides is not the canary's fault",
			steps: []outcomes{
				{at: 0, target: "stable", n: 20, failed: 10},
				{at: time.Second, target: "canary", n: 20, failed: 11},
			},
		},
		{
			name: "errors older than the window no longer count",
			steps: []outcomes{
				{at: 0, target: "canary", n: 10, failed: 10},
				{at: 70 * time.Second, target: "stable", n: 20},
				{at: 71 * time.Second, target: "canary", n: 10},
			},
		},
		{
			name: "errors inside the window still count",
			steps: []outcomes{
				{at: 0, target: "canary", n: 10, failed: 10},
				{at: 45 * time.Second, target: "stable", n: 20, wantTripped: true},
			},
		},
		{
			name: "a stable outcome can open the margin",
			steps: []outcomes{
				{at: 0, target: "stable", n: 10, failed: 2},                       // 20%
				{at: time.Second, target: "canary", n: 10, failed: 3},             // 30%: not more than 10 points
				{at: 2 * time.Second, target: "stable", n: 30, wantTripped: true}, // 2/40 = 5%
			},
		},
		{
			name: "tripped stays tripped until cleared, then starts afresh",
			steps: []outcomes{
				{at: 0, target: "stable", n: 20},
				{at: time.Second, target: "canary", n: 10, failed: 5, wantTripped: true},
				{at: 2 * time.Second, target: "canary", n: 100, wantTripped: true},
				{at: 120 * time.Second, target: "stable", n: 100, wantTripped: true},
				{at: 121 * time.Second, target: "canary", clear: true},
				{at: 122 * time.Second, target: "canary", n: 9, failed: 9}, // fresh window: below MinRequests
				{at: 123 * time.Second, target: "canary", n: 1, wantTripped: true},
			},
		},
		{
			name: "the stable target never trips",
			steps: []outcomes{
				{at: 0, target: "canary", n: 20},
				{at: time.Second, target: "stable", n: 20, failed: 20},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGuardrail(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if s.clear {
					g.Clear(canaryRule, s.target)
				}
				for j := 0; j < s.n; j++ {
					g.Record(served(s.target), j >= s.n-s.failed, now)
				}
				if got := g.Tripped(canaryRule, "canary"); got != s.wantTripped {
					t.Fatalf("step %d (%+v): canary tripped = %v, want %v", i, s, got, s.wantTripped)
				}
				if g.Tripped(canaryRule, "stable") {
					t.Fatalf("step %d: the stable target tripped", i)
				}
			}
		})
	}
}

func TestGuardrailRecordReportsTheTrip(t *testing.T) {
	rec := &tripLog{}
	g, err := NewGuardrail(GuardrailConfig{Margin: 0.1, MinRequests: 2, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	g.Record(served("stable"), false, t0)
	g.Record(served("stable"), false, t0)
	if g.Record(served("canary"), true, t0) {
		t.Fatal("tripped below MinRequests")
	}
	if !g.Record(served("canary"), true, t0.Add(time.Second)) {
		t.Fatal("Record did not report the trip")
	}
	if g.Record(served("canary"), true, t0.Add(2*time.Second)) {
		t.Fatal("Record reported an already tripped target again")
	}
	trips := g.Trips()
	want := Trip{Rule: canaryRule, Target: "canary", Stable: "stable", Since: t0.Add(time.Second),
		TargetErrorRatio: 1, StableErrorRatio: 0, TargetRequests: 2, StableRequests: 2}
	if len(trips) != 1 || trips[0] != want {
		t.Fatalf("Trips() = %+v, want [%+v]", trips, want)
	}
	if g.Clear(canaryRule, "stable") {
		t.Error("Clear of a target that is not tripped reported true")
	}
	if !g.Clear(canaryRule, "canary") {
		t.Error("Clear of the tripped target reported false")
	}
	if got := g.Trips(); len(got) != 0 {
		t.Errorf("Trips() after Clear = %+v", got)
	}
	if want := "default/canary/rules[0] canary true;default/canary/rules[0] canary false;"; rec.String() != want {
		t.Errorf("recorder saw %q, want %q", rec.String(), want)
	}
}

type tripLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *tripLog) RecordTripped(rule RuleID, target string, tripped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, "%s %s %v;", rule, target, tripped)
}

func (l *tripLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestGuardrailDivertsOnlyTheTrippedShare: once the canary trips, exactly
// the sessions that chose it go to the stable target; the others keep their
// target; after Clear every session is back where it was.
func TestGuardrailDivertsOnlyTheTrippedShare(t *testing.T) {
	table := mustTable(t, rewrite("canary", t0, weighted([]string{"llama"}, Target{"stable", 90}, Target{"canary", 10})))
	g, err := NewGuardrail(GuardrailConfig{MinRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	const sessions = 10_000
	before := make([]Decision, sessions)
	for i := range before {
		before[i] = table.Decide(Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}, nil, g)
	}
	var stableDecision, canaryDecision Decision
	for _, d := range before {
		switch d.Model {
		case "stable":
			stableDecision = d
		case "canary":
			canaryDecision = d
		}
	}
	g.Record(stableDecision, false, t0)
	if !g.Record(canaryDecision, true, t0) {
		t.Fatal("canary did not trip")
	}
	diverted := 0
	for i := range before {
		d := table.Decide(Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}, nil, g)
		switch {
		case before[i].Model == "canary":
			diverted++
			if d.Kind != KindDiverted || d.Model != "stable" || d.Chosen != "canary" {
				t.Fatalf("session %d: %+v, want diverted from canary to stable", i, d)
			}
		case d != before[i]:
			t.Fatalf("session %d: %+v, was %+v; only the canary's sessions may move", i, d, before[i])
		}
	}
	if diverted == 0 {
		t.Fatal("no session chose the canary; the test checks nothing")
	}
	// A diverted outcome counts for the stable target, not the canary.
	g.Record(Decision{Kind: KindDiverted, Rule: canaryRule, Model: "stable", Chosen: "canary", Stable: "stable"}, true, t0)
	g.Clear(canaryDecision.Rule, "canary")
	for i := range before {
		if d := table.Decide(Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}, nil, g); d != before[i] {
			t.Fatalf("session %d after Clear: %+v, want %+v", i, d, before[i])
		}
	}
}

func TestGuardrailIgnoresUnrewrittenDecisions(t *testing.T) {
	g, err := NewGuardrail(GuardrailConfig{MinRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	g.Record(Decision{Kind: KindNoMatch, Model: "llama"}, true, t0)
	g.Record(Decision{Kind: KindUnchanged, Rule: canaryRule, Model: "llama"}, true, t0)
	if len(g.rules) != 0 {
		t.Errorf("state kept for unrewritten decisions: %v", g.rules)
	}
}

func TestGuardrailForgetsIdleRulesButKeepsTrips(t *testing.T) {
	g, err := NewGuardrail(GuardrailConfig{Window: time.Minute, MinRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	idle := RuleID{Object: ObjectKey{Namespace: "default", Name: "idle"}}
	g.Record(Decision{Kind: KindWeighted, Rule: idle, Model: "stable", Stable: "stable"}, false, t0)
	g.Record(served("stable"), false, t0)
	g.Record(served("canary"), true, t0)
	later := t0.Add(2 * time.Minute)
	g.Record(Decision{Kind: KindWeighted, Rule: RuleID{Object: ObjectKey{Namespace: "default", Name: "busy"}}, Model: "m", Stable: "m"}, false, later)
	if _, ok := g.rules[idle]; ok {
		t.Error("idle rule state was not dropped")
	}
	if !g.Tripped(canaryRule, "canary") {
		t.Error("a trip was dropped with idle state")
	}
}

func TestGuardrailIgnoresOutcomesFromBeforeTheSlot(t *testing.T) {
	g, err := NewGuardrail(GuardrailConfig{Window: time.Minute, Buckets: 6, MinRequests: 1, Margin: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	g.Record(served("stable"), false, t0)
	g.Record(served("canary"), false, t0.Add(time.Minute))
	// A full window earlier maps to the same slot; it must not count there.
	g.Record(served("canary"), true, t0)
	g.Record(served("canary"), true, t0)
	total, failed := g.rules[canaryRule].windows["canary"].sum(g.epoch(t0.Add(time.Minute)))
	if total != 1 || failed != 0 {
		t.Errorf("window = %d outcomes, %d failed; want 1, 0", total, failed)
	}
}

func TestNewGuardrailValidates(t *testing.T) {
	tests := []struct {
		cfg     GuardrailConfig
		wantErr string
	}{
		{GuardrailConfig{}, ""},
		{GuardrailConfig{Margin: 1}, "margin"},
		{GuardrailConfig{Margin: -0.1}, "margin"},
		{GuardrailConfig{MinRequests: -1}, "minRequests"},
		{GuardrailConfig{Buckets: -1}, "buckets"},
		{GuardrailConfig{Window: 5, Buckets: 10}, "window"},
		{GuardrailConfig{Margin: 2, MinRequests: -1}, "minRequests"}, // all problems reported
	}
	for _, tt := range tests {
		g, err := NewGuardrail(tt.cfg)
		if tt.wantErr == "" {
			if err != nil || g == nil {
				t.Errorf("NewGuardrail(%+v) = %v, want a Guardrail", tt.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewGuardrail(%+v) error = %v, want one mentioning %q", tt.cfg, err, tt.wantErr)
		}
	}
}

func TestNilGuardrailTripsNothing(t *testing.T) {
	var g *Guardrail
	if g.Record(served("canary"), true, t0) || g.Tripped(canaryRule, "canary") || g.Clear(canaryRule, "canary") || g.Trips() != nil {
		t.Error("a nil Guardrail must do nothing")
	}
	table := mustTable(t, rewrite("canary", t0, generic("canary")))
	if d := table.Decide(Request{Pool: pool, Model: "x", SessionKey: "k"}, nil, g); d.Model != "canary" {
		t.Errorf("Decide with a nil *Guardrail = %+v", d)
	}
}

// TestGuardrailConcurrent exercises every method from several goroutines;
// run with -race.
func TestGuardrailConcurrent(t *testing.T) {
	g, err := NewGuardrail(GuardrailConfig{MinRequests: 5, Recorder: &tripLog{}})
	if err != nil {
		t.Fatal(err)
	}
	table := mustTable(t, rewrite("canary", t0, weighted([]string{"llama"}, Target{"stable", 50}, Target{"canary", 50})))
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				d := table.Decide(Request{Pool: pool, Model: "llama", SessionKey: sessionKey(w*10_000 + i)}, nil, g)
				g.Record(d, d.Model == "canary" && i%2 == 0, t0.Add(time.Duration(i)*time.Millisecond))
				if i%500 == 0 {
					g.Clear(d.Rule, "canary")
					_ = g.Trips()
				}
			}
		})
	}
	wg.Wait()
}
