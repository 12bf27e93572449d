package flowcontrol

import (
	"cmp"
	"slices"
	"testing"
	"testing/synctest"
	"time"
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

// TestQueuedAtTheMostRun: a request is not sent where its latest scrape shows requests waiting while the endpoint's
// own limit is not known and it holds what it is known to run. On a large batch (24 run, no tentative seats) the rule
// holds a band whose requests yield to a tenant under its share (yieldedFullLocked), in a pool with a slot limit, and
// only while the endpoint runs the most it has run and holds that many; on a small server at its tentative seats (4) it holds every band once the
// pool has a slot limit (queuedBeyondSeatsLocked), unless its KV cache is what bounds it.
func TestQueuedAtTheMostRun(t *testing.T) {
	tests := []struct {
		name                        string
		yields                      bool
		running, waiting, occupancy int
		mostRun, poolSlots          int
		kvBound                     bool
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0))
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				e := &h.c.endpoints[h.c.endpointIndex["a"]]
				e.Running, e.WaitingQueue, e.inflight = tc.running, tc.waiting, tc.occupancy
				e.learner.maxRunning, e.learner.queued = cmp.Or(tc.mostRun, tc.running), true
				if tc.kvBound {
					e.learner.perKV = float64(tc.running) // its KV cache holds what it runs
				}
				e.refresh(h.c.cfg.Endpoint)
				h.c.poolSlots = tc.poolSlots
				got := h.c.mayTakeLocked(e, Standard, false, false, tc.yields, false, false, h.clk.Now())
				if got != tc.want {
					t.Fatalf("may take: %v, want %v", got, tc.want)
				}
			})
		})
	}
}

// TestSuspectedFull: before any slot limit is learned, one scrape of a small server queued at the 4 it runs makes the
// endpoints that never ran more than 4 and hold 4 suspected full. A request of a tenant under its share goes to an
// endpoint seen running more (c) rather than the least loaded suspect (b), or, if every place is suspected, waits in
// the EPP (held); the other tenants' requests are placed as before.
func TestSuspectedFull(t *testing.T) {
	tests := []struct {
		name      string
		tenant    string
		light     bool // a light tenant is under its share in the band
		noC       bool // c holds none of the EPP's requests and is out of the pool's candidates
		want      string
		wantNames []string
	}{
		{name: "tenant under its share", tenant: "light", light: true, want: "c", wantNames: []string{"c"}},
		{name: "tenant over its share", tenant: "heavy", light: true, want: "b", wantNames: []string{"b", "c"}},
		// Nobody to yield to: a, queued at its 4, takes the band's requests as before.
		{name: "one tenant", tenant: "heavy", want: "b", wantNames: []string{"a", "b", "c"}},
		// It waits (held), and the scheduler would be offered the suspects only were it sent.
		{name: "every place suspected", tenant: "light", light: true, noC: true, wantNames: []string{"b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				for i := range 8 {
					h.c.mu.Lock()
					h.c.noteArrivalLocked(Standard, "heavy", 1, 10, h.clk.Now())
					if tc.light && i%4 == 0 {
						h.c.noteArrivalLocked(Standard, "light", 1, 1, h.clk.Now())
					}
					h.c.mu.Unlock()
					h.step(100 * time.Millisecond)
				}
				eps := []Endpoint{{Name: "a", Running: 4, WaitingQueue: 1}, {Name: "b", Running: 4}, {Name: "c", Running: 5}}
				if tc.noC {
					eps = eps[:2]
				}
				h.scrape(eps...)
				h.c.mu.Lock()
				defer h.c.mu.Unlock()
				now := h.clk.Now()
				for _, name := range []string{"a", "b", "c"} {
					if i, ok := h.c.endpointIndex[name]; ok {
						e := &h.c.endpoints[i]
						e.inflight = e.Running + e.WaitingQueue
						e.refresh(h.c.cfg.Endpoint)
					}
				}
				if h.c.poolQueuedAt != 4 {
					t.Fatalf("pool queued at %d, want 4", h.c.poolQueuedAt)
				}
				if got := h.c.isUnderShareLocked(Standard, "light", now); got != tc.light {
					t.Fatalf("light tenant under its share: %v, want %v", got, tc.light)
				}
				_, best, _, held := h.c.headroomOrHeldLocked(Standard, tc.tenant, now)
				if held != (tc.want == "") {
					t.Fatalf("held: %v, want %v", held, tc.want == "")
				}
				if tc.want == "" && best >= 0 || tc.want != "" && (best < 0 || h.c.endpoints[best].Name != tc.want) {
					t.Fatalf("picked %d, want %q", best, tc.want)
				}
				if got := h.c.endpointsWithHeadroomLocked(Standard, tc.tenant, false, now); !slices.Equal(got, tc.wantNames) {
					t.Fatalf("candidates %v, want %v", got, tc.wantNames)
				}
			})
		})
	}
}

// TestHeldTenantLetsOthersGrow: a request of a tenant under its share held in the EPP because every place is suspected
// full (TestSuspectedFull) does not hold its band: the next waiting request of a tenant over its share is dispatched
// (to grow an endpoint, showing whether it runs more), and the held one keeps waiting, first in line.
func TestHeldTenantLetsOthersGrow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		for i := range 8 {
			h.c.mu.Lock()
			h.c.noteArrivalLocked(Standard, "heavy", 1, 10, h.clk.Now())
			if i%4 == 0 {
				h.c.noteArrivalLocked(Standard, "light", 1, 1, h.clk.Now())
			}
			h.c.mu.Unlock()
			h.step(100 * time.Millisecond)
		}
		h.scrape(Endpoint{Name: "a", Running: 4, WaitingQueue: 1}, Endpoint{Name: "b", Running: 4})
		h.c.mu.Lock()
		for name, n := range map[string]int{"a": 5, "b": 4} {
			e := &h.c.endpoints[h.c.endpointIndex[name]]
			e.inflight = n
			e.refresh(h.c.cfg.Endpoint)
		}
		h.c.mu.Unlock()
		light := h.admit(0, "light", 1)
		heavy := h.admit(0, "heavy", 10)
		light.wantWaiting(t)
		h.c.mu.Lock()
		h.c.dispatchLocked(h.clk.Now())
		h.c.mu.Unlock()
		synctest.Wait()
		heavy.wantOutcome(t, Dispatched, ReasonNone)
		light.wantWaiting(t)
		light.cancel()
	})
}
