package loadgen

import (
	"math"
	"strings"
	"testing"
	"time"
)

// These tests are statistical over seeded samples, not timing: they never
// look at a clock.

func TestPoissonArrivalStatistics(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		const n, rate = 200000, 50.0
		a, err := NewArrivals(ArrivalConfig{Kind: ArrivalPoisson, Rate: rate}, seed)
		if err != nil {
			t.Fatal(err)
		}
		var prev time.Duration
		var sum, sumSq float64
		for range n {
			at := a.Next()
			if at < prev {
				t.Fatalf("seed %d: arrivals went backwards: %v after %v", seed, at, prev)
			}
			gap := (at - prev).Seconds()
			sum += gap
			sumSq += gap * gap
			prev = at
		}
		mean := sum / n
		cv := math.Sqrt(sumSq/n-mean*mean) / mean
		// Standard error of the mean gap is mean/sqrt(n) ~ 0.2%; 2% is ~9 sigma.
		if got := 1 / mean; math.Abs(got-rate)/rate > 0.02 {
			t.Errorf("seed %d: mean rate %.2f, want %.2f within 2%%", seed, got, rate)
		}
		// Exponential gaps have a coefficient of variation of 1.
		if math.Abs(cv-1) > 0.03 {
			t.Errorf("seed %d: coefficient of variation %.3f, want 1 for Poisson", seed, cv)
		}
	}
}

func TestConstantArrivals(t *testing.T) {
	a, err := NewArrivals(ArrivalConfig{Kind: ArrivalConstant, Rate: 4}, 9)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if got, want := a.Next(), time.Duration(i)*250*time.Millisecond; got != want {
			t.Fatalf("arrival %d at %v, want %v", i, got, want)
		}
	}
}

func TestBurstyArrivals(t *testing.T) {
	cfg := ArrivalConfig{Kind: ArrivalBursty, Rate: 100, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second}
	a, err := NewArrivals(cfg, 42)
	if err != nil {
		t.Fatal(err)
	}
	const n = 100000
	var last time.Duration
	for range n {
		at := a.Next()
		if at < last {
			t.Fatalf("arrivals went backwards")
		}
		last = at
		if phase := at % (cfg.BurstOn + cfg.BurstOff); phase >= cfg.BurstOn {
			t.Fatalf("arrival at %v falls in an OFF window (phase %v)", at, phase)
		}
	}
	got := float64(n) / last.Seconds()
	if want := cfg.MeanRate(); math.Abs(got-want)/want > 0.02 {
		t.Errorf("mean rate %.2f, want %.2f (rate x on/(on+off)) within 2%%", got, want)
	}
}

func TestPhasedArrivals(t *testing.T) {
	// 200/s for 10 s, silence for 5 s, then 50/s, which goes on past the last phase's end.
	cfg := ArrivalConfig{Kind: ArrivalPhased, Phases: []Phase{
		{Rate: 200, Duration: 10 * time.Second}, {Rate: 0, Duration: 5 * time.Second}, {Rate: 50, Duration: 10 * time.Second}}}
	a, err := NewArrivals(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var last time.Duration
	for {
		at := a.Next()
		if at < last {
			t.Fatalf("arrivals went backwards: %v after %v", at, last)
		}
		last = at
		switch {
		case at < 10*time.Second:
			counts["overload"]++
		case at < 15*time.Second:
			t.Fatalf("arrival at %v falls in the silent phase", at)
		case at < 25*time.Second:
			counts["recovery"]++
		default:
			counts["after"]++
		}
		if at >= 45*time.Second {
			break
		}
	}
	// Poisson counts: 2000 +- 45, 500 +- 22 and 1000 +- 32 (one sigma); 5 sigma bounds.
	for phase, want := range map[string]int{"overload": 2000, "recovery": 500, "after": 1000} {
		if got, sigma := counts[phase], math.Sqrt(float64(want)); math.Abs(float64(got-want)) > 5*sigma {
			t.Errorf("%s: %d arrivals, want %d within 5 sigma", phase, got, want)
		}
	}
	if got := cfg.MeanRate(); got != (200*10+50*10)/25.0 {
		t.Errorf("mean rate %v, want 100", got)
	}
	for at, want := range map[time.Duration]float64{0: 200, 12 * time.Second: 0, 20 * time.Second: 50, time.Hour: 50} {
		if got := cfg.RateAt(at); got != want {
			t.Errorf("rate at %v is %v, want %v", at, got, want)
		}
	}
}

func TestArrivalsDeterministic(t *testing.T) {
	for _, kind := range []ArrivalKind{ArrivalPoisson, ArrivalBursty} {
		cfg := ArrivalConfig{Kind: kind, Rate: 10, BurstOn: time.Second, BurstOff: time.Second}
		a, _ := NewArrivals(cfg, 7)
		b, _ := NewArrivals(cfg, 7)
		c, _ := NewArrivals(cfg, 8)
		differs := false
		for range 1000 {
			x, y, z := a.Next(), b.Next(), c.Next()
			if x != y {
				t.Fatalf("%s: same seed gave %v and %v", kind, x, y)
			}
			differs = differs || x != z
		}
		if !differs {
			t.Errorf("%s: different seeds gave the same sequence", kind)
		}
	}
}

func TestArrivalConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg  ArrivalConfig
		want string
	}{
		{ArrivalConfig{Kind: "weird", Rate: 1}, "not poisson"},
		{ArrivalConfig{Kind: ArrivalPoisson, Rate: 0}, "rate must be"},
		{ArrivalConfig{Kind: ArrivalPoisson, Rate: math.Inf(1)}, "rate must be"},
		{ArrivalConfig{Kind: ArrivalBursty, Rate: 1}, "burst-on"},
		{ArrivalConfig{Kind: ArrivalPoisson, Rate: 1, Phases: []Phase{{Rate: 1, Duration: time.Second}}}, "phased arrivals only"},
		{ArrivalConfig{Kind: ArrivalPhased}, "at least one phase"},
		{ArrivalConfig{Kind: ArrivalPhased, Rate: 3, Phases: []Phase{{Rate: 1, Duration: time.Second}}}, "drop rate"},
		{ArrivalConfig{Kind: ArrivalPhased, Phases: []Phase{{Rate: 1}}}, "duration must be positive"},
		{ArrivalConfig{Kind: ArrivalPhased, Phases: []Phase{{Rate: -1, Duration: time.Second}, {Rate: 1, Duration: time.Second}}}, "non-negative"},
		{ArrivalConfig{Kind: ArrivalPhased, Phases: []Phase{{Rate: 1, Duration: time.Second}, {Rate: 0, Duration: time.Second}}}, "last phase"},
	} {
		if _, err := NewArrivals(tc.cfg, 1); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
