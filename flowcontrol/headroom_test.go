package flowcontrol

import (
	"cmp"
	"testing"
	"testing/synctest"
)

// TestBeyondMostRun: under the Critical reserve, in a pool where a slot limit (4) has been learned, a lower band does
// not send an endpoint whose own limit is not known and that has no tentative seats (it ran 24, more than the pool's
// limit) beyond the most it has been seen running; Critical may, and so may every band without the reserve, below that
// most, where the endpoint's limit is known, or before any slot limit is learned in the pool.
func TestBeyondMostRun(t *testing.T) {
	tests := []struct {
		name                    string
		band                    Band
		reserve                 bool
		occupancy, known, slots int
		// mostRun is the most the endpoint has run (24 when 0).
		mostRun int
		want    bool
	}{
		{name: "lower band at the most run", band: Standard, reserve: true, occupancy: 24, slots: 4},
		{name: "Sheddable at the most run", band: Sheddable, reserve: true, occupancy: 24, slots: 4},
		{name: "Critical at the most run", band: Critical, reserve: true, occupancy: 24, slots: 4, want: true},
		{name: "no Critical traffic", band: Standard, occupancy: 24, slots: 4, want: true},
		{name: "below the most run", band: Standard, reserve: true, occupancy: 23, slots: 4, want: true},
		{name: "own limit known", band: Standard, reserve: true, occupancy: 24, slots: 4, known: 30, want: true},
		{name: "no slot limit in the pool", band: Standard, reserve: true, occupancy: 24, want: true},
		// Ran more than the pool's limit but never a large batch, and never queued (so no tentative seats): nothing
		// suggests a limit there.
		{name: "a small batch never queued", band: Standard, reserve: true, occupancy: 8, mostRun: 8, slots: 4, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0))
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				e := &h.c.endpoints[h.c.endpointIndex["a"]]
				e.learner.maxRunning, e.foreign, e.known = cmp.Or(tc.mostRun, 24), tc.occupancy, tc.known
				h.c.poolSlots = tc.slots
				got := h.c.mayTakeLocked(e, tc.band, tc.reserve, tc.reserve, false, false, false, h.clk.Now())
				if got != tc.want {
					t.Fatalf("may take: %v, want %v", got, tc.want)
				}
			})
		})
	}
}
