package benchsuite

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func TestFiguresOf(t *testing.T) {
	s := loadgen.ClassSummary{
		TTFT:       loadgen.Latency{Count: 3, P50: 100 * time.Millisecond, P95: 2 * time.Second, P99: 3 * time.Second},
		Throughput: 12.5, Goodput: 10,
	}
	got := FiguresOf(s)
	want := FigureValues{FigureTTFTP50: 0.1, FigureTTFTP95: 2, FigureTTFTP99: 3, FigureThroughput: 12.5, FigureGoodput: 10}
	if len(got) != len(want) {
		t.Fatalf("figures %v, want %v", got, want)
	}
	for f, v := range want {
		if got[f] != v {
			t.Errorf("%s = %v, want %v", f, got[f], v)
		}
	}

	// No successful request: no latency to compare, rates are zero.
	empty := FiguresOf(loadgen.ClassSummary{})
	if _, ok := empty[FigureTTFTP99]; ok {
		t.Errorf("latency of a run with no successes: %v", empty)
	}
	if v, ok := empty[FigureThroughput]; !ok || v != 0 {
		t.Errorf("throughput of a run with no successes: %v, %v", v, ok)
	}
}

func TestRatio(t *testing.T) {
	cases := []struct {
		name         string
		cand, base   FigureValues
		ratio        float64
		ok           bool
		figureToTest Figure
	}{
		{"lower", FigureValues{FigureTTFTP99: 0.5}, FigureValues{FigureTTFTP99: 10}, 0.05, true, FigureTTFTP99},
		{"higher", FigureValues{FigureThroughput: 54}, FigureValues{FigureThroughput: 50}, 1.08, true, FigureThroughput},
		{"zero candidate", FigureValues{FigureThroughput: 0}, FigureValues{FigureThroughput: 5}, 0, true, FigureThroughput},
		{"zero baseline", FigureValues{FigureThroughput: 1}, FigureValues{FigureThroughput: 0}, 0, false, FigureThroughput},
		{"missing candidate", FigureValues{}, FigureValues{FigureTTFTP99: 1}, 0, false, FigureTTFTP99},
		{"missing baseline", FigureValues{FigureTTFTP99: 1}, FigureValues{}, 0, false, FigureTTFTP99},
		{"nil baseline", FigureValues{FigureTTFTP99: 1}, nil, 0, false, FigureTTFTP99},
		{"NaN", FigureValues{FigureTTFTP99: math.NaN()}, FigureValues{FigureTTFTP99: 1}, 0, false, FigureTTFTP99},
		{"infinite baseline", FigureValues{FigureTTFTP99: 1}, FigureValues{FigureTTFTP99: math.Inf(1)}, 0, false, FigureTTFTP99},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := Ratio(tc.cand, tc.base, tc.figureToTest)
			if ok != tc.ok || math.Abs(r-tc.ratio) > 1e-12 {
				t.Errorf("Ratio = %v, %v; want %v, %v", r, ok, tc.ratio, tc.ok)
			}
		})
	}
}

func TestFormatRatio(t *testing.T) {
	for r, want := range map[float64]string{
		0.032: "0.032x (-97%)",
		0.5:   "0.50x (-50%)",
		0.519: "0.52x (-48%)",
		0.998: "1.00x (+0%)",
		0.1:   "0.10x (-90%)",
		1:     "1.00x (+0%)",
		1.08:  "1.08x (+8%)",
		23.4:  "23.4x (+2240%)",
	} {
		if got := FormatRatio(r); got != want {
			t.Errorf("FormatRatio(%v) = %q, want %q", r, got, want)
		}
	}
}

func TestTargetEvaluate(t *testing.T) {
	rr := FigureValues{FigureTTFTP50: 1, FigureTTFTP95: 2, FigureTTFTP99: 4, FigureThroughput: 10, FigureGoodput: 8}
	cases := []struct {
		name   string
		target Target
		sluice FigureValues
		met    bool
		checks []bool
	}{
		{"at most met", Target{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.05}, FigureValues{FigureTTFTP99: 0.2}, true, []bool{true}},
		{"at most missed", Target{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.05}, FigureValues{FigureTTFTP99: 0.21}, false, []bool{false}},
		{"at least met", Target{Figure: FigureThroughput, Kind: AtLeast, Bound: 1.08}, FigureValues{FigureThroughput: 10.8}, true, []bool{true}},
		{"at least missed", Target{Figure: FigureThroughput, Kind: AtLeast, Bound: 1.08}, FigureValues{FigureThroughput: 10.7}, false, []bool{false}},
		{"within, latency slightly worse", Target{Figure: FigureTTFTP95, Kind: Within, Bound: 0.05}, FigureValues{FigureTTFTP95: 2.1}, true, []bool{true}},
		{"within, latency much better", Target{Figure: FigureTTFTP95, Kind: Within, Bound: 0.05}, FigureValues{FigureTTFTP95: 0.5}, true, []bool{true}},
		{"within, latency worse", Target{Figure: FigureTTFTP95, Kind: Within, Bound: 0.05}, FigureValues{FigureTTFTP95: 2.2}, false, []bool{false}},
		{"within, throughput slightly lower", Target{Figure: FigureThroughput, Kind: Within, Bound: 0.05}, FigureValues{FigureThroughput: 9.5}, true, []bool{true}},
		{"within, throughput lower", Target{Figure: FigureThroughput, Kind: Within, Bound: 0.05}, FigureValues{FigureThroughput: 9.4}, false, []bool{false}},
		{"unmeasurable", Target{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.05}, FigureValues{}, false, []bool{false}},
		{"every met", Target{Figure: FigureEvery, Kind: Within, Bound: 0.05},
			FigureValues{FigureTTFTP50: 1.05, FigureTTFTP95: 1, FigureTTFTP99: 4.1, FigureThroughput: 9.6, FigureGoodput: 9}, true,
			[]bool{true, true, true, true, true}},
		{"every, one missed", Target{Figure: FigureEvery, Kind: Within, Bound: 0.05},
			FigureValues{FigureTTFTP50: 1.05, FigureTTFTP95: 1, FigureTTFTP99: 4.3, FigureThroughput: 9.6, FigureGoodput: 9}, false,
			[]bool{true, true, false, true, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.target.Versus = RoundRobin
			res := tc.target.Evaluate(tc.sluice, rr)
			if res.Met != tc.met {
				t.Errorf("met = %v, want %v (%+v)", res.Met, tc.met, res.Checks)
			}
			if len(res.Checks) != len(tc.checks) {
				t.Fatalf("%d checks, want %d", len(res.Checks), len(tc.checks))
			}
			for i, c := range res.Checks {
				if c.Met != tc.checks[i] {
					t.Errorf("check %s met = %v, want %v", c.Figure, c.Met, tc.checks[i])
				}
			}
		})
	}
}

func TestTargetResultMeasured(t *testing.T) {
	rr := FigureValues{FigureTTFTP50: 1, FigureTTFTP95: 2, FigureTTFTP99: 4, FigureThroughput: 10, FigureGoodput: 8}
	one := Target{Figure: FigureTTFTP99, Versus: RoundRobin, Kind: AtMost, Bound: 0.05}.Evaluate(FigureValues{FigureTTFTP99: 0.2}, rr)
	if got := one.Measured(); got != "0.05x" {
		t.Errorf("one figure: %q", got)
	}
	every := Target{Figure: FigureEvery, Versus: RoundRobin, Kind: Within, Bound: 0.05}
	if got := every.Evaluate(rr, rr).Measured(); got != "all within" {
		t.Errorf("all within: %q", got)
	}
	worse := FigureValues{FigureTTFTP50: 1, FigureTTFTP95: 3, FigureTTFTP99: 4, FigureThroughput: 10}
	if got := every.Evaluate(worse, rr).Measured(); got != "TTFT P95 1.50x, Goodput not measurable" {
		t.Errorf("failing figures: %q", got)
	}
	if got := (Target{Figure: FigureTTFTP99, Kind: AtMost, Bound: 0.05, Versus: RoundRobin}).String(); got != "TTFT P99 vs round-robin at most 0.05x" {
		t.Errorf("String: %q", got)
	}
	if got := every.String(); got != "every figure vs round-robin no worse by more than 5%" {
		t.Errorf("String: %q", got)
	}
}
