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
			onEndpointA(t, func(h *harness, e *endpointState) {
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

// TestQueuedAtTheMostRun: a request is not sent where its latest scrape shows requests waiting while the endpoint's
// own limit is not known and it holds what it is known to run. On a large batch (24 run, no tentative seats) the rule
// holds a band whose requests yield to a tenant under its share (yieldedFullLocked), in a pool with a slot limit, and
// only while the endpoint runs the most it has run and holds that many; on a small server at its tentative seats (4) it
// holds every band once the pool has a slot limit (queuedBeyondSeatsLocked), unless its KV cache is what bounds it. A
// replica with live peers holds them alike.
func TestQueuedAtTheMostRun(t *testing.T) {
	tests := []struct {
		name                        string
		yields                      bool
		running, waiting, occupancy int
		mostRun, poolSlots          int
		kvBound                     bool
		livePeers                   bool
		want                        bool
	}{
		{name: "large batch queued at its most run, band yields", yields: true, running: 24, waiting: 1, occupancy: 24, poolSlots: 4},
		{name: "large batch queued at its most run, band does not yield", running: 24, waiting: 1, occupancy: 24, poolSlots: 4, want: true},
		{name: "large batch queued at its most run, no slot limit in the pool", yields: true, running: 24, waiting: 1, occupancy: 24, want: true},
		{name: "large batch queued below its most run", yields: true, running: 24, waiting: 1, occupancy: 24, mostRun: 30, poolSlots: 4, want: true},
		{name: "large batch holding less than its most run", yields: true, running: 24, waiting: 1, occupancy: 23, poolSlots: 4, want: true},
		{name: "large batch without a queue", yields: true, running: 24, occupancy: 24, poolSlots: 4, want: true},
		{name: "small server queued at its seats, pool limit learned", running: 4, waiting: 1, occupancy: 4, poolSlots: 4},
		{name: "small server queued at its seats, no pool limit", running: 4, waiting: 1, occupancy: 4, want: true},
		{name: "small server below its seats", running: 4, waiting: 1, occupancy: 3, poolSlots: 4, want: true},
		{name: "small server without a queue", running: 4, occupancy: 4, poolSlots: 4, want: true},
		{name: "small server bound by its KV cache", running: 4, waiting: 1, occupancy: 4, poolSlots: 4, kvBound: true, want: true},
		// A replica with live peers holds its queued servers as one EPP does: its tenants' share is judged over the
		// pool, so what the rules hold waits here for a seat rather than inside the server.
		{name: "large batch queued at its most run, band yields, live peers", yields: true, running: 24, waiting: 1, occupancy: 24, poolSlots: 4, livePeers: true},
		{name: "large batch queued at its most run, band does not yield, live peers", running: 24, waiting: 1, occupancy: 24, poolSlots: 4, livePeers: true, want: true},
		{name: "small server queued at its seats, live peers", running: 4, waiting: 1, occupancy: 4, poolSlots: 4, livePeers: true},
		{name: "small server queued at its seats, live peers, band yields", yields: true, running: 4, waiting: 1, occupancy: 4, poolSlots: 4, livePeers: true},
		{name: "small server queued at its seats, live peers, no pool limit", running: 4, waiting: 1, occupancy: 4, livePeers: true, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			onEndpointA(t, func(h *harness, e *endpointState) {
				e.Running, e.WaitingQueue, e.inflight = tc.running, tc.waiting, tc.occupancy
				e.learner.maxRunning, e.learner.queued = cmp.Or(tc.mostRun, tc.running), true
				if tc.kvBound {
					e.learner.perKV = float64(tc.running) // its KV cache holds what it runs
				}
				e.refresh(h.c.cfg.Endpoint)
				h.c.poolSlots = tc.poolSlots
				if tc.livePeers {
					h.c.peers.ReserveShare = func(pool, seats int) int { return pool / 2 }
				}
				got := h.c.mayTakeLocked(e, Standard, false, false, tc.yields, false, false, h.clk.Now())
				if got != tc.want {
					t.Fatalf("may take: %v, want %v", got, tc.want)
				}
			})
		})
	}
}

// onEndpointA runs f in a bubble on a harness that has scraped one idle endpoint, a, with the controller's lock held.
func onEndpointA(t *testing.T, f func(h *harness, e *endpointState)) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0))
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		f(h, &h.c.endpoints[h.c.endpointIndex["a"]])
	})
}
