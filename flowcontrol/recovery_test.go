package flowcontrol

import (
	"math"
	"testing"
	"time"
)

// TestCapacityReturn steps a band through fixed instants, like x/time/rate's tests: each case feeds observations
// (blocked or not, backlog at and above the band) one second apart from t0, then asks at the last one when capacity
// returns for a backlog of `ask` at drain rate 100/s.
func TestCapacityReturn(t *testing.T) {
	const window = 10 * time.Second // trend time constant 2.5 s
	type obs struct {
		blocked bool
		backlog float64
	}
	steady := func(n int, o obs) []obs {
		out := make([]obs, n)
		for i := range out {
			out[i] = o
		}
		return out
	}
	ramp := func(from, to float64, n int) []obs { // n observations from..to, evenly
		out := make([]obs, n)
		for i := range out {
			out[i] = obs{true, from + (to-from)*float64(i)/float64(n-1)}
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		seen      []obs
		ask       float64
		want      time.Duration
		slack     time.Duration
		episode   bool // an episode is expected to be on at the last observation
		shrinking bool
	}{
		{
			// Saturated without backlog for 10 s: 10 s more of the overload; nothing to drain after.
			name: "saturated, no backlog", seen: steady(11, obs{true, 0}), ask: 100,
			want: 11 * time.Second, slack: 50 * time.Millisecond, episode: true,
		},
		{
			// A backlog standing at 500 for 10 s: 10 s more of the overload, then as long as it will have stood (20 s).
			name: "standing backlog", seen: steady(11, obs{true, 500}), ask: 500,
			want: 30 * time.Second, slack: 50 * time.Millisecond, episode: true,
		},
		{
			// Growing by 100/s for 10 s (to 1000): the overload goes on 10 s, and the backlog then drains for as
			// long as it built (20 s); the drain rate alone (1000+1000)/100 = 20 s agrees here.
			name: "growing backlog", seen: ramp(0, 1000, 11), ask: 1000,
			want: 30 * time.Second, slack: time.Second, episode: true,
		},
		{
			// Growing for 10 s, then shrinking by 200/s for 5 s (from 2000 to 1000): the overload is over; the 1000
			// left drain at the shrink rate the trend has caught up with, about 200/s but never faster than the
			// drain rate (100/s): 10 s.
			name: "shrinking backlog drains no faster than the drain rate",
			seen: append(ramp(0, 2000, 11), ramp(1800, 1000, 5)...), ask: 1000,
			want: 10 * time.Second, slack: 50 * time.Millisecond, episode: true, shrinking: true,
		},
		{
			name: "no episode after headroom",
			seen: append(steady(5, obs{true, 0}), obs{false, 0}), ask: 100,
		},
		{
			name: "headroom ends the episode; the next starts afresh",
			seen: append(append(steady(5, obs{true, 0}), obs{false, 0}), obs{true, 0}), ask: 100,
			want: time.Second, slack: 50 * time.Millisecond, episode: true, // 0 s old, plus its own 1 s
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r bandRecovery
			now := t0
			for i, o := range tc.seen {
				now = t0.Add(time.Duration(i) * time.Second)
				r.observe(now, o.blocked, o.backlog, window)
			}
			if on := !r.overloadSince.IsZero(); on != tc.episode {
				t.Fatalf("episode on = %v, want %v", on, tc.episode)
			}
			if shrinks := r.trend.slope < 0; shrinks != tc.shrinking {
				t.Fatalf("trend %v/s, want shrinking %v", r.trend.slope, tc.shrinking)
			}
			if !tc.episode {
				return
			}
			got := r.capacityReturn(now, tc.ask, 100)
			if d := got - tc.want; d < -tc.slack || d > tc.slack {
				t.Fatalf("capacityReturn = %v, want %v ±%v", got, tc.want, tc.slack)
			}
		})
	}
}

// TestCapacityReturnShrinkRate: once the backlog shrinks, it drains at the rate it is seen to shrink, which counts the
// arrivals that keep joining it, not at the pool's drain rate.
func TestCapacityReturnShrinkRate(t *testing.T) {
	var r bandRecovery
	now := t0
	for i := range 31 { // 20 s growing by 100/s to 2000, then 10 s shrinking by 50/s to 1500
		now = t0.Add(time.Duration(i) * time.Second)
		b := float64(min(i, 20)*100 - max(0, i-20)*50)
		r.observe(now, true, b, 10*time.Second)
	}
	got := r.capacityReturn(now, 1500, 1000).Seconds()
	if math.Abs(got-30)/30 > 0.1 { // the trend has not quite forgotten the growth
		t.Fatalf("capacityReturn = %.1fs, want 1500 over the 50/s shrink rate: 30 s ±10%% (not 1.5 s at the drain rate)", got)
	}
}

// TestEpisodeEndsWhenBacklogDrains: a backlog that built up and then drained ends the overload that built it, even
// while the band is still blocked (by saturation alone): the next estimate is a new episode's, not the old one's.
func TestEpisodeEndsWhenBacklogDrains(t *testing.T) {
	var r bandRecovery
	now := t0
	for i := range 21 { // 10 s growing to 1000, 10 s shrinking to 0, blocked throughout
		now = t0.Add(time.Duration(i) * time.Second)
		r.observe(now, true, float64(1000-absInt(i-10)*100), 10*time.Second)
	}
	if !r.overloadSince.IsZero() {
		t.Fatalf("episode since %v goes on after its backlog drained", r.overloadSince.Sub(t0))
	}
	r.observe(now.Add(time.Second), true, 0, 10*time.Second)
	if got := r.capacityReturn(now.Add(2*time.Second), 0, 100); got != time.Second {
		t.Fatalf("capacityReturn in the new episode = %v, want its 1 s age", got)
	}
}

func absInt(v int) int { return max(v, -v) }

// TestBacklogTrend: the trend is the backlog's slope, whatever the instants it is observed at, and ignores
// observations at the same instant until a later one.
func TestBacklogTrend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
		slope float64 // per second
	}{
		{"observed every 10ms", 10 * time.Millisecond, 40},
		{"observed every second", time.Second, 40},
		{"observed every 5s", 5 * time.Second, -25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr backlogTrend
			for at := time.Duration(0); at <= 30*time.Second; at += tc.every {
				now := t0.Add(at)
				tr.observe(now, 1000+tc.slope*at.Seconds(), 2.5)
				tr.observe(now, 1e9, 2.5) // same instant: ignored
			}
			if math.Abs(tr.slope-tc.slope) > 0.01*math.Abs(tc.slope) {
				t.Fatalf("slope %v, want %v", tr.slope, tc.slope)
			}
		})
	}
}

// TestReturnBudget: while a built-up backlog shrinks, returns are booked within its shrink rate (what is left for the
// band once it has drained), not the pool's drain rate; a backlog that forms and drains within moments does not
// count.
func TestReturnBudget(t *testing.T) {
	const window = 10 * time.Second
	for _, tc := range []struct {
		name    string
		backlog func(i int) float64 // at second i
		want    float64
	}{
		{"growing", func(i int) float64 { return float64(100 * i) }, 1000},
		{"built up, shrinking by 100/s", func(i int) float64 { return float64(100*min(i, 20) - 100*max(0, i-20)) }, 100},
		{"no backlog", func(int) float64 { return 0 }, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r bandRecovery
			now := t0
			for i := range 31 {
				now = t0.Add(time.Duration(i) * time.Second)
				r.observe(now, true, tc.backlog(i), window)
			}
			if got := r.returnBudget(now, 1000, window); math.Abs(got-tc.want) > 0.05*tc.want {
				t.Fatalf("returnBudget = %v, want %v ±5%%", got, tc.want)
			}
		})
	}
	// A backlog seen shrinking right after it formed: not built up.
	var r bandRecovery
	r.observe(t0, true, 0, window)
	r.observe(t0.Add(100*time.Millisecond), true, 500, window)
	r.observe(t0.Add(200*time.Millisecond), true, 100, window)
	if got := r.returnBudget(t0.Add(200*time.Millisecond), 1000, window); got != 1000 {
		t.Fatalf("returnBudget for a momentary backlog = %v, want the drain rate", got)
	}
}
