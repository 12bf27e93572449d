package flowcontrol

import (
	"math"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name      string
		estimate  time.Duration
		lo, hi    time.Duration
		jitter, u float64
		want      time.Duration
	}{
		{"below min clamps up", 100 * time.Millisecond, s, 30 * s, 0, 0.5, s},
		{"above max clamps down", time.Hour, s, 30 * s, 0, 0.5, 30 * s},
		{"rounds up to whole seconds", 2100 * time.Millisecond, s, 30 * s, 0, 0.5, 3 * s},
		{"exact seconds stay", 4 * s, s, 30 * s, 0, 0.5, 4 * s},
		{"jitter up", 10 * s, s, 30 * s, 0.2, 0.99, 12 * s},
		{"jitter never sends a client back before the estimate", 10 * s, s, 30 * s, 0.2, 0, 10 * s},
		{"jitter halfway", 10 * s, s, 30 * s, 0.2, 0.5, 11 * s},
		{"jitter stays within max", 30 * s, s, 30 * s, 0.2, 0.99, 30 * s},
		{"a spread below a second rounds to the estimate mostly", s, s, 30 * s, 0.2, 0.8, s},
		{"jitter spreads above min", s, s, 30 * s, 0.5, 0.99, 2 * s},
		{"saturating estimate", math.MaxInt64, s, 60 * s, 0.2, 0.5, 60 * s},
		{"bounds under a second still give one", 100 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond, 0.2, 0.5, s},
	} {
		if got := retryAfter(tc.estimate, tc.lo, tc.hi, tc.jitter, tc.u); got != tc.want {
			t.Errorf("%s: retryAfter(%v, [%v,%v], +%v, u=%v) = %v, want %v", tc.name, tc.estimate, tc.lo, tc.hi,
				tc.jitter, tc.u, got, tc.want)
		}
	}
}

// TestRetryAfterMonotone: for a fixed jitter draw, a longer estimate never yields a shorter Retry-After.
func TestRetryAfterMonotone(t *testing.T) {
	for _, u := range []float64{0, 0.3, 0.99} {
		prev := time.Duration(0)
		for est := time.Duration(0); est < 2*time.Minute; est += 137 * time.Millisecond {
			got := retryAfter(est, time.Second, time.Minute, 0.2, u)
			if got < prev {
				t.Fatalf("u=%v: retryAfter(%v) = %v < retryAfter(previous) = %v", u, est, got, prev)
			}
			prev = got
		}
	}
}

// TestDrainEstimator steps the estimator through fixed instants, like x/time/rate's tests.
func TestDrainEstimator(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	d := newDrainEstimator(10 * time.Second)
	d.advance(t0)
	if _, ok := d.rate(); ok {
		t.Fatal("rate known before any observation")
	}
	// Idle time (not backlogged) is not evidence.
	d.advance(t0.Add(time.Minute))
	d.add(500)
	if _, ok := d.rate(); ok {
		t.Fatal("rate known without backlogged time")
	}
	// 30 s backlogged, 100 cost units dispatched every 100 ms: 1000/s.
	d = newDrainEstimator(10 * time.Second)
	d.advance(t0)
	d.setBacklogged(true)
	now := t0
	for range 300 {
		now = now.Add(100 * time.Millisecond)
		d.advance(now)
		d.add(100)
	}
	rate, ok := d.rate()
	if !ok || math.Abs(rate-1000)/1000 > 0.02 {
		t.Fatalf("steady rate = %v (known %v), want 1000 ±2%%", rate, ok)
	}
	// A long idle spell keeps the last measured rate.
	d.setBacklogged(false)
	d.advance(now.Add(time.Hour))
	if idle, _ := d.rate(); idle != rate {
		t.Fatalf("rate after idle = %v, want unchanged %v", idle, rate)
	}
	// Time going backwards is ignored.
	d.setBacklogged(true)
	d.advance(now)
	if back, _ := d.rate(); back != rate {
		t.Fatalf("rate after backwards time = %v, want %v", back, rate)
	}
}

// TestDrainEstimatorSetWindow: a new window keeps the measured rate and the fraction of a window of evidence, so a
// rate known before stays known and one unknown stays unknown.
func TestDrainEstimatorSetWindow(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		steps     int // 100 ms steps of backlogged time, 100 cost each
		window    time.Duration
		wantKnown bool
	}{
		{"known rate survives a longer window", 300, time.Minute, true},
		{"known rate survives a shorter window", 300, time.Second, true},
		{"too little evidence stays too little", 5, time.Minute, false},
		{"same window is a no-op", 300, 10 * time.Second, true},
	} {
		d := newDrainEstimator(10 * time.Second)
		d.advance(t0)
		d.setBacklogged(true)
		now := t0
		for range tc.steps {
			now = now.Add(100 * time.Millisecond)
			d.advance(now)
			d.add(100)
		}
		before, _ := d.rate()
		d.setWindow(tc.window)
		after, ok := d.rate()
		if ok != tc.wantKnown || (ok && math.Abs(after-before)/before > 1e-9) {
			t.Errorf("%s: rate %v (known %v) after setWindow, want %v (known %v)", tc.name, after, ok, before, tc.wantKnown)
		}
		if d.meter.window != tc.window.Seconds() {
			t.Errorf("%s: window %vs, want %v", tc.name, d.meter.window, tc.window)
		}
	}
}
