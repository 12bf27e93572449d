package flowcontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestTenantUnderShare: on two full endpoints of two seats, a heavy tenant keeps requests waiting. A light tenant
// asking less than its fair share (fewer and smaller requests) has its waiting request dispatched on the next seat to free, ahead of the heavy
// tenant's older ones, and the seat after that stays idle for it, so its next arrival starts at once. A tenant asking
// as much as the heavy one is served in fair order and has no seat kept; with one tenant in the band nothing is kept.
func TestTenantUnderShare(t *testing.T) {
	const heavyCost = 10
	tests := []struct {
		name string
		// light is how many requests the second tenant sends before the first seat frees (one every 100 ms, the
		// last one waiting); 0: the band has one tenant.
		light     int
		lightCost uint64
		// lightFirst: the first seat to free goes to the second tenant's waiting request. seatKept: the next stays
		// idle for it (the heavy tenant's waiting request does not get it) and its next arrival takes it.
		lightFirst, seatKept bool
	}{
		{name: "under its share", light: 1, lightCost: 1, lightFirst: true, seatKept: true},
		{name: "as much as the heavy tenant", light: 8, lightCost: heavyCost},
		{name: "one tenant", light: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) {
					c.Endpoint.Concurrency = 2
					c.Endpoint.Pending, c.Endpoint.PendingTime = 0, 0
				}))
				h.scrape(ep("a", 0), ep("b", 0))
				var running, heavy []*call
				for range 4 {
					cl := h.admit(0, "heavy", heavyCost)
					cl.wantOutcome(t, Dispatched, ReasonNone)
					running = append(running, cl)
				}
				for range 8 {
					heavy = append(heavy, h.admit(0, "heavy", heavyCost))
					h.step(100 * time.Millisecond)
				}
				var light []*call
				for range tt.light {
					light = append(light, h.admit(0, "light", tt.lightCost))
					h.step(100 * time.Millisecond)
				}
				for _, cl := range append(heavy, light...) {
					cl.wantWaiting(t)
				}

				h.step(time.Second)
				h.c.Release(running[0].req.ID)
				synctest.Wait()
				if tt.light > 0 {
					if got := light[0].finished(); got != tt.lightFirst {
						t.Fatalf("light request dispatched on the first free seat: %v, want %v", got, tt.lightFirst)
					}
				}
				if got := heavy[0].finished(); got == tt.lightFirst {
					t.Fatalf("oldest heavy request dispatched on the first free seat: %v, want %v", got, !tt.lightFirst)
				}

				waiting := append(heavy, light...)
				before := countFinished(waiting)
				h.c.Release(running[1].req.ID)
				synctest.Wait()
				want := 1
				if tt.seatKept {
					want = 0
				}
				if got := countFinished(waiting) - before; got != want {
					t.Fatalf("%d waiting requests dispatched on the second free seat, want %d", got, want)
				}
				if tt.seatKept {
					h.admit(0, "light", tt.lightCost).wantOutcome(t, Dispatched, ReasonNone)
				}
			})
		})
	}
}

func countFinished(calls []*call) int {
	n := 0
	for _, cl := range calls {
		if cl.finished() {
			n++
		}
	}
	return n
}
