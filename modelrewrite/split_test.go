package modelrewrite

import (
	"math"
	"math/rand/v2"
	"testing"
)

const splitRequests = 100_000

func splitTable(tb interface {
	Helper()
	Fatalf(string, ...any)
}, targets ...Target) *Table {
	tb.Helper()
	return mustTable(tb, rewrite("canary", t0, weighted([]string{"llama"}, targets...)))
}

func shares(targets []Target) map[string]float64 {
	total := 0.0
	for _, t := range targets {
		total += float64(max(t.Weight, 1))
	}
	out := make(map[string]float64)
	for _, t := range targets {
		out[t.Model] += float64(max(t.Weight, 1)) / total
	}
	return out
}

var distributionCases = []struct {
	name    string
	targets []Target
}{
	{"90/10", []Target{{"stable", 90}, {"canary", 10}}},
	{"50/50", []Target{{"a", 50}, {"b", 50}}},
	{"99/1", []Target{{"stable", 99}, {"canary", 1}}},
	{"70/20/10", []Target{{"a", 70}, {"b", 20}, {"c", 10}}},
	{"unweighted x3", []Target{{"a", 0}, {"b", 0}, {"c", 0}}},
	{"weights need not sum to 100", []Target{{"a", 3}, {"b", 1}}},
	{"duplicate targets add up", []Target{{"a", 1}, {"b", 1}, {"a", 2}}},
	{"extreme", []Target{{"a", MaxWeight}, {"b", 1}}},
}

// checkShares fails when a target's observed share is more than one
// percentage point off its weight share.
func checkShares(t *testing.T, targets []Target, counts map[string]int) {
	t.Helper()
	want := shares(targets)
	for model, w := range want {
		got := float64(counts[model]) / splitRequests
		if math.Abs(got-w) > 0.01 {
			t.Errorf("target %s: share %.4f, want %.4f +- 0.01", model, got, w)
		}
	}
	for model := range counts {
		if _, ok := want[model]; !ok {
			t.Errorf("model %s chosen but not a target", model)
		}
	}
}

func TestKeylessDistribution(t *testing.T) {
	for _, tt := range distributionCases {
		t.Run(tt.name, func(t *testing.T) {
			table := splitTable(t, tt.targets...)
			src := rand.NewPCG(1, 2)
			counts := make(map[string]int)
			for range splitRequests {
				d := table.Decide(Request{Pool: pool, Model: "llama"}, src, nil)
				if d.Kind != KindWeighted {
					t.Fatalf("keyless request: kind %v, want weighted", d.Kind)
				}
				counts[d.Model]++
			}
			checkShares(t, tt.targets, counts)
		})
	}
}

func TestKeyedDistribution(t *testing.T) {
	for _, tt := range distributionCases {
		t.Run(tt.name, func(t *testing.T) {
			table := splitTable(t, tt.targets...)
			counts := make(map[string]int)
			for i := range splitRequests {
				d := table.Decide(Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}, nil, nil)
				if d.Kind != KindSticky {
					t.Fatalf("keyed request: kind %v, want sticky", d.Kind)
				}
				counts[d.Model]++
			}
			checkShares(t, tt.targets, counts)
		})
	}
}

// TestStickiness: a session lands on the same target every time, also after
// the Table is rebuilt with its targets reordered and unrelated rules and
// objects added, and whatever the random source does.
func TestStickiness(t *testing.T) {
	first := splitTable(t, Target{"stable", 90}, Target{"canary", 10})
	rebuilt := mustTable(t,
		rewrite("other", t0.Add(-1), exact([]string{"mistral"}, "mistral-v2")),
		rewrite("canary", t0, generic("fallback"), weighted([]string{"llama"}, Target{"canary", 10}, Target{"stable", 90})),
	)
	src := rand.NewPCG(3, 4)
	for i := range splitRequests {
		req := Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}
		want := first.Decide(req, src, nil).Model
		for _, table := range []*Table{first, first, rebuilt} {
			if got := table.Decide(req, src, nil).Model; got != want {
				t.Fatalf("session %q: %q then %q", req.SessionKey, want, got)
			}
		}
	}
}

func TestWeightChangeMovesMinimalShare(t *testing.T) {
	tests := []struct {
		name               string
		before, after      []Target
		minMoved, maxMoved float64
		// gainer is the only target sessions may move to ("" = not checked).
		gainer string
	}{
		{
			name:   "90/10 to 80/20",
			before: []Target{{"stable", 90}, {"canary", 10}}, after: []Target{{"stable", 80}, {"canary", 20}},
			minMoved: 0.09, maxMoved: 0.11, gainer: "canary",
		},
		{
			name:   "80/20 back to 90/10",
			before: []Target{{"stable", 80}, {"canary", 20}}, after: []Target{{"stable", 90}, {"canary", 10}},
			minMoved: 0.09, maxMoved: 0.11, gainer: "stable",
		},
		{
			name:   "same weights scaled",
			before: []Target{{"stable", 9}, {"canary", 1}}, after: []Target{{"stable", 900}, {"canary", 100}},
			minMoved: 0, maxMoved: 0,
		},
		{
			name:   "add a third target at 20%",
			before: []Target{{"a", 50}, {"b", 50}}, after: []Target{{"a", 50}, {"b", 50}, {"c", 25}},
			minMoved: 0.19, maxMoved: 0.21, gainer: "c",
		},
		{
			name:   "raise one of three from 10% to 20%",
			before: []Target{{"a", 90}, {"b", 90}, {"c", 20}}, after: []Target{{"a", 90}, {"b", 90}, {"c", 45}},
			minMoved: 0.09, maxMoved: 0.11, gainer: "c",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, after := splitTable(t, tt.before...), splitTable(t, tt.after...)
			moved := 0
			for i := range splitRequests {
				req := Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}
				b, a := before.Decide(req, nil, nil).Model, after.Decide(req, nil, nil).Model
				if a == b {
					continue
				}
				moved++
				if tt.gainer != "" && a != tt.gainer {
					t.Fatalf("session %q moved %s -> %s; only moves to %s are needed", req.SessionKey, b, a, tt.gainer)
				}
			}
			share := float64(moved) / splitRequests
			t.Logf("moved %.4f of sessions", share)
			if share < tt.minMoved || share > tt.maxMoved {
				t.Errorf("moved %.4f of sessions, want within [%.2f, %.2f]", share, tt.minMoved, tt.maxMoved)
			}
		})
	}
}

// TestRaisingAWeightOnlyMovesSessionsToThatTarget is the rendezvous
// invariant behind minimal movement, over seeded random rules.
func TestRaisingAWeightOnlyMovesSessionsToThatTarget(t *testing.T) {
	const seed = 7
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	names := []string{"a", "b", "c", "d", "e"}
	for iter := 0; iter < 50; iter++ {
		n := 2 + rng.IntN(len(names)-1)
		before := make([]Target, n)
		for i := range before {
			before[i] = Target{Model: names[i], Weight: 1 + rng.Int32N(1000)}
		}
		after := append([]Target(nil), before...)
		up := rng.IntN(n)
		after[up].Weight += 1 + rng.Int32N(1000)
		tb, ta := splitTable(t, before...), splitTable(t, after...)
		for i := range 2000 {
			req := Request{Pool: pool, Model: "llama", SessionKey: sessionKey(i)}
			b, a := tb.Decide(req, nil, nil).Model, ta.Decide(req, nil, nil).Model
			if a != b && a != names[up] {
				t.Fatalf("iter %d: raising %s moved session %d from %s to %s (before %v after %v)", iter, names[up], i, b, a, before, after)
			}
		}
	}
}

func TestUnitIntervalIsOpen(t *testing.T) {
	for _, h := range []uint64{0, 1, 1 << 11, math.MaxUint64, math.MaxUint64 >> 11 << 11} {
		u := unitInterval(h)
		if !(u > 0 && u < 1) || math.IsInf(-math.Log(u), 0) {
			t.Errorf("unitInterval(%#x) = %v, want in (0,1) with a finite log", h, u)
		}
	}
}

// FuzzSessionKeyHashing: for any key and weights the choice is a target with
// a positive weight, is the same on every call and does not depend on the
// order of the targets.
func FuzzSessionKeyHashing(f *testing.F) {
	f.Add("session-1", int32(90), int32(10), int32(0))
	f.Add("", int32(1), int32(1), int32(1))
	f.Add("\x00\xff", int32(MaxWeight), int32(1), int32(7))
	f.Fuzz(func(t *testing.T, key string, w1, w2, w3 int32) {
		clamp := func(w int32) int32 { return 1 + int32(uint32(w)%MaxWeight) }
		targets := []Target{{"t1", clamp(w1)}, {"t2", clamp(w2)}, {"t3", clamp(w3)}}
		reversed := []Target{targets[2], targets[1], targets[0]}
		table, rev := splitTable(t, targets...), splitTable(t, reversed...)
		req := Request{Pool: pool, Model: "llama", SessionKey: key}
		src := rand.NewPCG(uint64(len(key)), 1)
		d := table.Decide(req, src, nil)
		if d.Model != "t1" && d.Model != "t2" && d.Model != "t3" {
			t.Fatalf("key %q: chose %q", key, d.Model)
		}
		if key != "" {
			if again := table.Decide(req, src, nil); again != d {
				t.Fatalf("key %q: %+v then %+v", key, d, again)
			}
			if r := rev.Decide(req, src, nil); r.Model != d.Model {
				t.Fatalf("key %q: %q, with targets reversed %q", key, d.Model, r.Model)
			}
		}
		h := hashString(key)
		if h != hashString(key) {
			t.Fatalf("hashString(%q) not deterministic", key)
		}
		if u := unitInterval(mix64(h ^ hashString("t1"))); !(u > 0 && u < 1) {
			t.Fatalf("unit %v outside (0,1)", u)
		}
	})
}
