package benchsuite

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// seededEngine answers every run with TTFTs that depend on the seed: Sluice's
// are seed ms, round-robin's 2×seed ms, upstream-default's 10 ms, so Sluice's
// TTFT ratio is 0.5 against round-robin whatever the seed, and seed/10
// against upstream-default. A contender named in fail fails.
type seededEngine struct {
	fail  map[string]bool
	seeds []uint64
}

func (e *seededEngine) Run(_ context.Context, sc *Scenario, c Contender) (*RunResult, error) {
	e.seeds = append(e.seeds, sc.Seed)
	if e.fail[c.Name] {
		return nil, &SkippedError{Reason: "not here"}
	}
	d := time.Duration(sc.Seed) * time.Millisecond
	switch c.Name {
	case RoundRobin:
		d *= 2
	case UpstreamDefault:
		d = 10 * time.Millisecond
	}
	return fakeRun(sc.Name, c.Name, fakeRequests{class: "chat", ttft: []time.Duration{d, d}}), nil
}

func TestRunSeeds(t *testing.T) {
	scenarios := twoScenarios(t)
	scenarios[0].Targets = []Target{{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.6, Versus: RoundRobin},
		{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.5, Versus: UpstreamDefault}}
	engine := &seededEngine{fail: map[string]bool{}}
	progress := &recordingProgress{}
	sweep, err := RunSeeds(t.Context(), engine, "seeded", scenarios, []uint64{2, 8, 5}, progress)
	if err != nil {
		t.Fatal(err)
	}
	if scenarios[0].Seed != DefaultSeed || scenarios[1].Seed != DefaultSeed {
		t.Errorf("the sweep changed the scenarios' own seeds: %d, %d", scenarios[0].Seed, scenarios[1].Seed)
	}
	// Every seed runs every scenario's three contenders, seed after seed.
	want := []uint64{2, 2, 2, 2, 2, 2, 8, 8, 8, 8, 8, 8, 5, 5, 5, 5, 5, 5}
	if len(engine.seeds) != len(want) {
		t.Fatalf("engine saw seeds %v, want %v", engine.seeds, want)
	}
	for i := range want {
		if engine.seeds[i] != want[i] {
			t.Fatalf("engine saw seeds %v, want %v", engine.seeds, want)
		}
	}
	if len(progress.events) != 2*len(want) {
		t.Errorf("progress saw %d events, want %d", len(progress.events), 2*len(want))
	}

	s := &sweep.Scenarios[0]
	if s.Name != "one" || s.OwnSeed != DefaultSeed || len(s.Runs) != 3 {
		t.Fatalf("scenario %+v", s)
	}
	if got := s.Ratios(RoundRobin, FigureTTFTP99); len(got) != 3 || got[0] != 0.5 || got[1] != 0.5 || got[2] != 0.5 {
		t.Errorf("P99 ratios vs round-robin %v, want 0.5 for each seed", got)
	}
	if got := s.Ratios(UpstreamDefault, FigureTTFTP50); len(got) != 3 || got[0] != 0.2 || got[1] != 0.8 || got[2] != 0.5 {
		t.Errorf("P50 ratios vs upstream %v, want [0.2 0.8 0.5]", got)
	}
	// The first target holds for every seed, the second for seeds 2 and 5.
	if got := s.TargetsMet(); len(got) != 2 || got[0] != 3 || got[1] != 2 {
		t.Errorf("targets met %v, want [3 2]", got)
	}

	var buf bytes.Buffer
	b := bufio.NewWriter(&buf)
	writeSeeds(b, sweep)
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Across seeds",
		"load seeds 2, 8, 5",
		"| Scenario | Figure | vs round-robin | vs upstream-default |",
		"| one | TTFT P50 | 0.50x (0.50–0.50x) | 0.50x (0.20–0.80x) |",
		"| one | TTFT P99 vs round-robin at most 0.6x | 3 of 3 seeds |",
		"| one | TTFT P99 vs upstream-default at most 0.5x | 2 of 3 seeds |",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the section lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestRunSeedsMissingRuns: a contender that did not run leaves its ratios out
// and says why; no seeds is an error.
func TestRunSeedsMissingRuns(t *testing.T) {
	engine := &seededEngine{fail: map[string]bool{UpstreamDefault: true}}
	sweep, err := RunSeeds(t.Context(), engine, "seeded", twoScenarios(t)[:1], []uint64{1, 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &sweep.Scenarios[0]
	if got := s.Ratios(UpstreamDefault, FigureTTFTP99); len(got) != 0 {
		t.Errorf("ratios against a contender that never ran: %v", got)
	}
	if r := s.Runs[0]; r.Errors[UpstreamDefault] != "not here" || r.Figures[UpstreamDefault] != nil {
		t.Errorf("seed 1: errors %v, figures %v", r.Errors, r.Figures)
	}
	var buf bytes.Buffer
	b := bufio.NewWriter(&buf)
	writeSeeds(b, sweep)
	_ = b.Flush()
	if !strings.Contains(buf.String(), "| one | TTFT P99 | 0.50x (0.50–0.50x) | no run |") {
		t.Errorf("section:\n%s", buf.String())
	}
	if _, err := RunSeeds(t.Context(), engine, "seeded", twoScenarios(t), nil, nil); err == nil {
		t.Error("a sweep without seeds ran")
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want string
	}{
		{nil, "no run"},
		{[]float64{0.5}, "0.50x"},
		{[]float64{0.5, 0.3, 0.4}, "0.40x (0.30–0.50x)"},
		{[]float64{1.2, 0.8, 1.0, 0.9}, "0.95x (0.80–1.20x)"},
		{[]float64{0.011, 0.0096}, "0.01x (0.0096–0.011x)"},
	} {
		if got := spread(tc.in); got != tc.want {
			t.Errorf("spread(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
