package flowcontrol

import (
	"testing"
	"time"
)

// TestReturnLedger books returns one after another at fixed instants: each goes to the first second at or after its
// Retry-After with room in the budget, never past the band's maximum.
func TestReturnLedger(t *testing.T) {
	s := time.Second
	type booking struct {
		at          time.Duration // since t0
		retry, hi   time.Duration
		cost        float64
		budget      float64
		want        time.Duration
		description string
	}
	for _, tc := range []struct {
		name     string
		bookings []booking
	}{
		{"returns within budget stay put", []booking{
			{0, 5 * s, 60 * s, 100, 300, 5 * s, "first"},
			{0, 5 * s, 60 * s, 100, 300, 5 * s, "second"},
			{0, 5 * s, 60 * s, 100, 300, 5 * s, "third fills the second"},
			{0, 5 * s, 60 * s, 100, 300, 6 * s, "fourth moves to the next second"},
			{0, 3 * s, 60 * s, 100, 300, 3 * s, "an earlier second has room"},
		}},
		{"a later turn-away counts what earlier ones booked", []booking{
			{0, 10 * s, 60 * s, 200, 300, 10 * s, "booked at 10 s"},
			{2 * s, 8 * s, 60 * s, 200, 300, 9 * s, "also due at 10 s: moves on"},
		}},
		{"never past the maximum", []booking{
			{0, 2 * s, 3 * s, 100, 100, 2 * s, "fills second 2"},
			{0, 2 * s, 3 * s, 100, 100, 3 * s, "fills second 3"},
			{0, 2 * s, 3 * s, 100, 100, 3 * s, "over budget, at the maximum"},
		}},
		{"unknown budget books without moving", []booking{
			{0, 2 * s, 60 * s, 1e6, 0, 2 * s, "first"},
			{0, 2 * s, 60 * s, 1e6, 0, 2 * s, "second"},
		}},
		{"past seconds are forgotten", []booking{
			{0, s, 60 * s, 100, 100, s, "due at 1 s"},
			{5 * s, s, 60 * s, 100, 100, s, "1 s later is free again"},
		}},
		{"a request above the budget alone takes an empty second", []booking{
			{0, 4 * s, 60 * s, 500, 100, 4 * s, "alone"},
			{0, 4 * s, 60 * s, 500, 100, 5 * s, "next second"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l returnLedger
			for _, b := range tc.bookings {
				if got := l.book(t0.Add(b.at), b.retry, b.hi, b.cost, b.budget); got != b.want {
					t.Fatalf("%s: book(at %v, retry %v) = %v, want %v", b.description, b.at, b.retry, got, b.want)
				}
			}
		})
	}
}

// TestPromiseKeeper: a promise is claimed by its own key only, from a second before the moment it names until ttl
// after it, and only once.
func TestPromiseKeeper(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name   string
		key    uint64
		claims []time.Duration // since t0; the promise says "come back after 10 s", kept 60 s past that
		want   []bool
	}{
		{"on time", 42, []time.Duration{10 * s}, []bool{true}},
		{"a second early counts", 42, []time.Duration{9 * s}, []bool{true}},
		{"too early uses the promise up", 42, []time.Duration{8 * s, 10 * s}, []bool{false, false}},
		{"only once", 42, []time.Duration{10 * s, 11 * s}, []bool{true, false}},
		{"late but kept", 42, []time.Duration{70 * s}, []bool{true}},
		{"too late", 42, []time.Duration{71 * s}, []bool{false}},
		{"another key", 43, []time.Duration{10 * s}, []bool{false}},
		{"no key", 0, []time.Duration{10 * s}, []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p promiseKeeper
			p.promise(42, t0, 10*s, 60*s)
			p.promise(0, t0, 10*s, 60*s) // no key: nothing to recognise the return by
			for i, at := range tc.claims {
				if got := p.claim(tc.key, t0.Add(at), 60*s); got != tc.want[i] {
					t.Fatalf("claim(%d) at %v = %v, want %v", tc.key, at, got, tc.want[i])
				}
			}
		})
	}
}

// TestPromisesArePruned: promises past their keeping are dropped, and no more than maxPromises are kept.
func TestPromisesArePruned(t *testing.T) {
	var p promiseKeeper
	for k := range uint64(maxPromises + 10) {
		p.promise(k+1, t0, time.Second, time.Minute)
	}
	if len(p.due) != maxPromises {
		t.Fatalf("%d promises kept, want at most %d", len(p.due), maxPromises)
	}
	p.promise(1<<40, t0.Add(2*time.Minute), time.Second, time.Minute)
	if len(p.due) != 1 {
		t.Fatalf("%d promises kept after all others expired, want 1", len(p.due))
	}
}
