package modelrewrite

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestDecideAlwaysNamesAModel: over seeded random tables, every request gets
// exactly one model: a target of the rule that applied, or its own model
// when none applied or the rule has no targets.
func TestDecideAlwaysNamesAModel(t *testing.T) {
	const seed = 11
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	g, err := NewGuardrail(GuardrailConfig{MinRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	for iter := 0; iter < 200; iter++ {
		var rws []Rewrite
		targetsOf := map[RuleID][]string{}
		for o := 0; o < 1+rng.IntN(4); o++ {
			var rules []Rule
			for r := 0; r < rng.IntN(4); r++ {
				var models []string
				for m := 0; m < rng.IntN(3); m++ {
					models = append(models, fmt.Sprintf("m%d", rng.IntN(4)))
				}
				var targets []Target
				for n := rng.IntN(4); len(targets) < n; {
					targets = append(targets, Target{Model: fmt.Sprintf("t%d", rng.IntN(5)), Weight: 1 + rng.Int32N(100)})
				}
				rules = append(rules, Rule{Models: models, Targets: targets})
				id := RuleID{Object: ObjectKey{Namespace: pool.Namespace, Name: fmt.Sprint(o)}, Index: r}
				for _, tg := range targets {
					targetsOf[id] = append(targetsOf[id], tg.Model)
				}
			}
			rws = append(rws, rewrite(fmt.Sprint(o), t0.Add(time.Duration(rng.IntN(2))*time.Second), rules...))
		}
		table := mustTable(t, rws...)
		src := rand.NewPCG(uint64(iter), 0)
		for i := 0; i < 50; i++ {
			req := Request{Pool: pool, Model: fmt.Sprintf("m%d", rng.IntN(5))}
			if rng.IntN(2) == 0 {
				req.SessionKey = sessionKey(i)
			}
			d := table.Decide(req, src, g)
			switch d.Kind {
			case KindNoMatch, KindUnchanged:
				if d.Model != req.Model {
					t.Fatalf("iter %d: %+v for %+v: model must stay", iter, d, req)
				}
			case KindSticky, KindWeighted, KindDiverted:
				if !slices.Contains(targetsOf[d.Rule], d.Model) || !slices.Contains(targetsOf[d.Rule], d.Stable) {
					t.Fatalf("iter %d: %+v for %+v: model or stable is not a target of %v %v", iter, d, req, d.Rule, targetsOf[d.Rule])
				}
				if (req.SessionKey != "") != (d.Kind == KindSticky) && d.Kind != KindDiverted {
					t.Fatalf("iter %d: %+v for %+v: kind does not match the key", iter, d, req)
				}
			default:
				t.Fatalf("iter %d: unknown kind in %+v", iter, d)
			}
			// Trip some canaries so diversion is exercised too.
			g.Record(d, rng.IntN(3) == 0, t0)
		}
	}
}

func TestDecideWithoutSourceUsesGlobalGenerator(t *testing.T) {
	table := splitTable(t, Target{"a", 1}, Target{"b", 1})
	seen := map[string]bool{}
	for range 200 {
		seen[table.Decide(Request{Pool: pool, Model: "llama"}, nil, nil).Model] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("200 keyless 50/50 requests reached only %v", seen)
	}
}

func TestStableTarget(t *testing.T) {
	tests := []struct {
		name        string
		targets     []Target
		stableModel string
		want        string
	}{
		{"heaviest", []Target{{"canary", 10}, {"stable", 90}}, "", "stable"},
		{"first on ties", []Target{{"a", 50}, {"b", 50}}, "", "a"},
		{"first when unweighted", []Target{{"a", 0}, {"b", 0}}, "", "a"},
		{"merged duplicates count together", []Target{{"a", 40}, {"b", 50}, {"a", 20}}, "", "a"},
		{"annotation overrides weight", []Target{{"old", 20}, {"new", 80}}, "old", "old"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rw := rewrite("r", t0, weighted(nil, tt.targets...))
			rw.StableModel = tt.stableModel
			d := mustTable(t, rw).Decide(Request{Pool: pool, Model: "x", SessionKey: "k"}, nil, nil)
			if d.Stable != tt.want {
				t.Errorf("stable = %q, want %q", d.Stable, tt.want)
			}
		})
	}
}
