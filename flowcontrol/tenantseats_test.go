package flowcontrol

import (
	"fmt"
	"math"
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
				h := newSeatHarness(t)
				running, heavy := fillWithHeavy(t, h, heavyCost)
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

// TestTenantsUnderShareKeepNoSeatsFromEachOther: two tenants under their share, each with a request waiting, both
// start as seats free: neither keeps the freed seats idle for the other.
func TestTenantsUnderShareKeepNoSeatsFromEachOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSeatHarness(t)
		running, _ := fillWithHeavy(t, h, 10)
		x := h.admit(0, "x", 1)
		h.step(100 * time.Millisecond)
		y := h.admit(0, "y", 1)
		h.step(time.Second)
		x.wantWaiting(t)
		y.wantWaiting(t)
		h.c.Release(running[0].req.ID)
		synctest.Wait()
		h.c.Release(running[1].req.ID)
		synctest.Wait()
		if !x.finished() || !y.finished() {
			t.Fatalf("after two seats freed: x dispatched %v, y dispatched %v; want both", x.finished(), y.finished())
		}
	})
}

// fillWithHeavy fills h's two endpoints of two seats with requests of tenant "heavy" costing cost (running), then
// queues 8 more of them, one every 100 ms (waiting).
func fillWithHeavy(t *testing.T, h *harness, cost uint64) (running, waiting []*call) {
	h.scrape(ep("a", 0), ep("b", 0))
	for range 4 {
		cl := h.admit(0, "heavy", cost)
		cl.wantOutcome(t, Dispatched, ReasonNone)
		running = append(running, cl)
	}
	for range 8 {
		waiting = append(waiting, h.admit(0, "heavy", cost))
		h.step(100 * time.Millisecond)
	}
	return running, waiting
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

// TestUnderShare: a tenant is under its share when it asks less than its weight's share of what its band drains, and
// only while another tenant of the band is active. Until the drain rate has a window of evidence (a warm-up that
// dispatched nothing leaves it near zero) the band drains at least what it is asked. A tenant under its share is
// predicted to wait only behind its own requests, not the band's fair backlog.
func TestUnderShare(t *testing.T) {
	tests := []struct {
		name         string
		heavy, light float64 // requests per second, of cost 1
		drain        float64 // measured drain rate, cost per second (0: none)
		settled      bool
		under        bool
	}{
		{name: "no drain rate: a share of the demand", heavy: 8, light: 2, under: true},
		{name: "settled drain rate below twice its demand", heavy: 8, light: 2, drain: 3, settled: true},
		{name: "settled drain rate above twice its demand", heavy: 8, light: 2, drain: 5, settled: true, under: true},
		{name: "drain rate not settled: a share of the demand", heavy: 8, light: 2, drain: 3, under: true},
		{name: "as much as the other tenant", heavy: 2, light: 2, drain: 3, settled: true},
		{name: "alone in its band", light: 2, drain: 10, settled: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newHarness(t, testConfig(t, nil)).c
			c.mu.Lock()
			defer c.mu.Unlock()
			window := c.cfg.DrainRateWindow
			now := noteTenantArrivals(c, t0, window, tt.heavy, tt.light)
			if tt.drain > 0 {
				span := window.Seconds() / 5
				if tt.settled {
					span = window.Seconds()
				}
				c.drain.meter = rateMeter{window: window.Seconds(), events: tt.drain * span, span: span, last: now}
			}
			if _, got := c.underShareLocked(now)[tenantKey{Standard, "light"}]; got != tt.under {
				t.Errorf("light under its share: %v, want %v", got, tt.under)
			}
			if _, got := c.underShareLocked(now)[tenantKey{Standard, "heavy"}]; got {
				t.Errorf("heavy under its share")
			}

			// Backlogs of 100 heavy and 5 light requests: a new light request is predicted to wait behind its own 5,
			// and fair queuing would put as many heavy ones before it unless it is under its share.
			for i := range 105 {
				tenant := "heavy"
				if i >= 100 {
					tenant = "light"
				}
				c.bands[Standard].push(&item{id: fmt.Sprint(i), tenant: tenant, cost: 1, seq: uint64(i)}, 1)
			}
			wait, known := c.estimatedWaitLocked(Standard, "light", 1, 1, now)
			for c.bands[Standard].count > 0 {
				c.bands[Standard].pop()
			}
			want := 11.0 // itself, its own 5 and 5 of the heavy tenant's
			if tt.under {
				want = 6
			}
			if ahead := wait.Seconds() * tt.drain; known && math.Abs(ahead-want) > 0.01 {
				t.Errorf("cost ahead of a light request and itself %.2f (wait %v), want %v", ahead, wait, want)
			}
		})
	}
}

// TestTenantUnderShareKVRoom: on endpoints whose KV cache is over the band's ceiling but that have free seats, a heavy
// tenant's requests wait; a tenant under its share is judged by the seats, as Critical is under its reserve (seats
// stand for KV there), and starts at once. A tenant asking as much as the heavy one waits with it.
func TestTenantUnderShareKVRoom(t *testing.T) {
	tests := []struct {
		name     string
		light    int // requests the second tenant sends, one with each of the heavy tenant's four
		dispatch bool
	}{
		{name: "under its share", light: 1, dispatch: true},
		{name: "as much as the heavy tenant", light: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newSeatHarness(t)
				full := func(name string) Endpoint { return Endpoint{Name: name, KVCacheUsage: 0.85} }
				h.scrape(full("a"), full("b"))
				var heavy, light []*call
				for i := range 4 {
					heavy = append(heavy, h.admit(0, "heavy", 10))
					if i >= 4-tt.light {
						light = append(light, h.admit(0, "light", 10))
					}
					h.step(100 * time.Millisecond)
				}
				for _, cl := range heavy {
					cl.wantWaiting(t)
				}
				last := light[len(light)-1]
				if got := last.finished(); got != tt.dispatch {
					t.Fatalf("light request dispatched: %v, want %v", got, tt.dispatch)
				}
				if tt.dispatch {
					last.wantOutcome(t, Dispatched, ReasonNone)
				}
			})
		})
	}
}

// TestTenantUnderShareYields: while a tenant of the band is under its share, no request of the band, its own
// included, is sent where it would wait inside a server: beyond the pool's slot limit on an endpoint whose own limit is
// not known, or beyond an endpoint's capacity (its tentative seats while requests wait there). Without a tenant under
// its share the band goes there as before (the saturation thresholds alone judge it), and so it does beyond the
// capacity of an endpoint whose KV cache is what bounds it.
func TestTenantUnderShareYields(t *testing.T) {
	tests := []struct {
		name string
		// light: a light tenant (under its share) has a request in the band; queued: the scrape shows a request
		// waiting in the endpoint, so its tentative seats are what it ran; else the pool's slot limit is 2.
		light, queued bool
		// foreign: the requests sent so far have ended, and the endpoint's scrapes show as many running that the EPP
		// did not send.
		foreign  bool
		kv       float64 // the endpoint's KV cache use
		tenant   string  // of the request asking
		wantWait bool
	}{
		{name: "heavy, at the pool's slot limit", light: true, tenant: "heavy", wantWait: true},
		{name: "light, at the pool's slot limit", light: true, tenant: "light", wantWait: true},
		{name: "heavy, at its capacity", light: true, queued: true, tenant: "heavy", wantWait: true},
		{name: "one tenant, at the pool's slot limit", tenant: "heavy"},
		{name: "one tenant, at its capacity", queued: true, tenant: "heavy"},
		{name: "heavy, at the capacity its KV cache bounds", light: true, queued: true, kv: 0.95, tenant: "heavy"},
		{name: "heavy, foreign load at the pool's slot limit", light: true, foreign: true, tenant: "heavy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.KVCacheUtil = 1 }))
				h.scrape(ep("a", 0))
				first := "heavy"
				if tt.light {
					first = "light"
				}
				sent := []*call{h.admit(0, first, 1), h.admit(0, "heavy", 10)}
				for _, cl := range sent {
					cl.wantOutcome(t, Dispatched, ReasonNone)
				}
				h.step(50 * time.Millisecond)
				a := Endpoint{Name: "a", Running: 2, KVCacheUsage: tt.kv}
				if tt.foreign {
					for _, cl := range sent {
						h.c.Release(cl.req.ID)
					}
					h.step(50 * time.Millisecond)
					h.scrape(a) // the second scrape that shows them after their end makes them foreign
					h.step(50 * time.Millisecond)
				}
				if tt.queued {
					h.admit(0, "heavy", 10).wantOutcome(t, Dispatched, ReasonNone)
					a.WaitingQueue = 1
				} else {
					h.c.SetPeers(Peers{PoolSlots: 2})
				}
				h.scrape(a)
				cost := uint64(10)
				if tt.tenant == "light" {
					cost = 1
				}
				cl := h.admit(0, tt.tenant, cost)
				if tt.wantWait {
					cl.wantWaiting(t)
					cl.cancel()
					return
				}
				cl.wantOutcome(t, Dispatched, ReasonNone)
			})
		})
	}
}

// TestUnderShareLateScrapes: the pool's drain, and so a tenant's share, is the rate the seats of the whole pool free,
// whatever scrape is fresh at the instant asked. In real time scrapes come a little late under load: an endpoint whose
// scrape is 20 ms past the staleness threshold still frees its seats, and a tenant asking 0.9 of its share stays
// under it (counted over the fresh endpoints only, two late scrapes of twelve made it over its share for that
// moment). An endpoint down (no scrape for ten staleness thresholds) frees nothing the EPP can use.
func TestUnderShareLateScrapes(t *testing.T) {
	const (
		endpoints = 12
		seats     = 4
		staleness = 200 * time.Millisecond
		hold      = 5 * time.Second // 48 seats free 9.6 times a second: a share of 4.8 requests a second each
	)
	tests := []struct {
		name  string
		light float64 // requests per second, of cost 1; the heavy tenant sends 15
		late  int     // endpoints whose scrape is late: 220 ms old
		down  int     // endpoints not scraped for 3 s
		under bool
	}{
		{name: "every scrape fresh", light: 4.3, under: true},
		{name: "two scrapes late", light: 4.3, late: 2, under: true},
		{name: "every scrape late", light: 4.3, late: endpoints, under: true},
		{name: "over its share", light: 5.5, late: 2},
		{name: "half the pool down", light: 4.3, down: endpoints / 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newHarness(t, testConfig(t, func(cfg *Config) { cfg.Endpoint.MetricsStaleness = staleness })).c
			c.mu.Lock()
			defer c.mu.Unlock()
			window := c.cfg.DrainRateWindow
			for tenant, rate := range map[string]float64{"heavy": 15, "light": tt.light} {
				every := time.Duration(float64(time.Second) / rate)
				for at := time.Duration(0); at < window; at += every {
					c.noteArrivalLocked(Standard, tenant, 1, 1, t0.Add(at))
				}
			}
			now := t0.Add(window)
			c.holdTime = hold
			c.endpoints = c.endpoints[:0]
			for i := range endpoints {
				age := 10 * time.Millisecond
				switch {
				case i < tt.late:
					age = staleness + 20*time.Millisecond
				case i >= endpoints-tt.down:
					age = 3 * time.Second
				}
				e := newEndpointState(Endpoint{Name: fmt.Sprint("e", i), Running: seats, ScrapedAt: now.Add(-age)})
				e.seats, e.capacity, e.known, e.inflight = seats, seats, seats, seats
				e.fullNs = now.Add(-time.Second).UnixNano()
				c.endpoints = append(c.endpoints, e)
			}
			if _, got := c.underShareLocked(now)[tenantKey{Standard, "light"}]; got != tt.under {
				t.Errorf("light (%.1f/s) under its share: %v, want %v", tt.light, got, tt.under)
			}
		})
	}
}

// noteTenantArrivals records Standard arrivals of cost 1 from tenants "heavy" and "light", at their rates per second,
// over window from t0, with c's lock held, and returns the time of the last tick.
func noteTenantArrivals(c *Controller, t0 time.Time, window time.Duration, heavy, light float64) time.Time {
	now := t0
	for tick := time.Duration(0); tick < window; tick += 10 * time.Millisecond {
		now = t0.Add(tick)
		for tenant, rate := range map[string]float64{"heavy": heavy, "light": light} {
			if every := time.Duration(float64(time.Second) / max(rate, 1e-9)); rate > 0 && tick%every == 0 {
				c.noteArrivalLocked(Standard, tenant, 1, 1, now)
			}
		}
	}
	return now
}

// TestUnderShareSeatFreesCoverThePool: before the drain rate settles, the rate the seat-bound seats free is all the
// pool drains only while every endpoint not down is seat-bound, here and at the peers that report demand. Where one is
// not (a large batch, a server with room: it drains beyond that rate), a tenant over its share of that rate but under
// its share of the demand has its share in doubt: it is not protected (not under its share), but not shed as a tenant
// over its share either (it does not share its band's drain: its band's MaxQueueTime, not OverShareMaxQueueTime).
// Measured on the mixed fleet (a 128-slot server beside 24- and 4-slot ones), the light tenant asking 80% of its share
// was over the small servers' rate in the warm-up, and a replica owning two 4-slot servers answered its waiting
// requests 429.
func TestUnderShareSeatFreesCoverThePool(t *testing.T) {
	const (
		seatBound = 12
		seats     = 4
		hold      = 5 * time.Second // 48 seats free 9.6 times a second: a share of 4.8 requests a second each
		light     = 5.5             // over that share, under half of the demand (15 + 5.5)
	)
	tests := []struct {
		name          string
		unseated      bool // one more endpoint, running 30 with no seat count (never queued)
		down          bool // that endpoint is down
		peers         *PeerDemand
		settled       bool // the drain rate has a window of evidence: 9.6 cost/s
		doubt         bool
		reportsUnseat bool // Demand().Unseated
	}{
		{name: "every endpoint seat-bound: its seats' free rate is the drain"},
		{name: "an endpoint not seat-bound: in doubt", unseated: true, doubt: true, reportsUnseat: true},
		{name: "an endpoint not seat-bound and down counts for nothing", unseated: true, down: true},
		{name: "a peer's endpoint not seat-bound: in doubt", peers: &PeerDemand{Peers: 1, Unseated: true}, doubt: true},
		{name: "the peers' endpoints seat-bound", peers: &PeerDemand{Peers: 1}},
		{name: "drain rate settled: measured, whatever is seat-bound", unseated: true, settled: true, reportsUnseat: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, testConfig(t, func(cfg *Config) { cfg.Endpoint.MetricsStaleness = 200 * time.Millisecond }))
			c := h.c
			if tt.peers != nil {
				c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }, Demand: *tt.peers})
			}
			window := c.cfg.DrainRateWindow
			now := t0.Add(window)
			h.clk.SetTime(now) // Demand judges at the clock's now
			c.mu.Lock()
			for tenant, rate := range map[string]float64{"heavy": 15, "light": light} {
				every := time.Duration(float64(time.Second) / rate)
				for at := time.Duration(0); at < window; at += every {
					c.noteArrivalLocked(Standard, tenant, 1, 1, t0.Add(at))
				}
			}
			c.holdTime = hold
			if tt.settled {
				c.drain.meter = rateMeter{window: window.Seconds(), events: 9.6 * window.Seconds(), span: window.Seconds(), last: now}
			}
			c.endpoints = c.endpoints[:0]
			for i := range seatBound {
				e := newEndpointState(Endpoint{Name: fmt.Sprint("e", i), Running: seats, ScrapedAt: now.Add(-10 * time.Millisecond)})
				e.seats, e.capacity, e.known, e.inflight = seats, seats, seats, seats
				e.fullNs = now.Add(-time.Second).UnixNano()
				c.endpoints = append(c.endpoints, e)
			}
			if tt.unseated {
				age := 10 * time.Millisecond
				if tt.down {
					age = time.Minute
				}
				c.endpoints = append(c.endpoints, newEndpointState(Endpoint{Name: "large", Running: 30, ScrapedAt: now.Add(-age)}))
			}
			if c.isUnderShareLocked(Standard, "light", now) {
				t.Errorf("light (%.1f/s against heavy's 15/s) under its share: over the seats' free rate it is not", light)
			}
			if got := c.shareInDoubtLocked(Standard, "light", now); got != tt.doubt {
				t.Errorf("light's share in doubt: %v, want %v", got, tt.doubt)
			}
			if c.shareInDoubtLocked(Standard, "heavy", now) {
				t.Errorf("heavy's share in doubt: it asks more than half the demand")
			}
			// With a heavy request waiting, a light one over its share may be predicted to wait OverShareMaxQueueTime
			// at most; one whose share is in doubt its band's MaxQueueTime.
			c.bands[Standard].push(&item{id: "h", tenant: "heavy", cost: 1}, 1)
			want := c.cfg.Bands[Standard].overShareQueueTime()
			if tt.doubt {
				want = c.cfg.Bands[Standard].MaxQueueTime
			}
			if got := c.maxQueueTimeLocked(Standard, "light", now); got != want {
				t.Errorf("light's longest predicted wait %v, want %v", got, want)
			}
			c.bands[Standard].pop()
			c.mu.Unlock()
			if un := c.Demand().Unseated; un != tt.reportsUnseat {
				t.Errorf("Demand().Unseated %v, want %v", un, tt.reportsUnseat)
			}
		})
	}
}
