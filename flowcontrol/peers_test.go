package flowcontrol

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// TestPooledReserve: with live peers the seat reserve is this replica's part of the reserve sized from the whole
// pool's figures (plus a seat per Critical request waiting at a peer), and what the peers' idle seats lack of theirs;
// alone it is sized from its own.
func TestPooledReserve(t *testing.T) {
	half := func(pool, seats int) int { return pool / 2 }
	for _, tc := range []struct {
		name            string
		arrivals, frees float64
		seats           int
		peers           Peers
		want            int
	}{
		// One replica of the pool, 12 seats freeing at 2.4/s, Critical at 0.95/s: its own reserve is 5 of 12.
		{name: "alone", arrivals: 0.95, frees: 2.4, seats: 12, want: 5},
		// Two such replicas: the pool needs 5 of 24 seats (r = 2.5 whatever the size), this one keeps its half while
		// the peer keeps the rest idle.
		{name: "half of the pool's", arrivals: 0.95, frees: 2.4, seats: 12,
			peers: Peers{CriticalRate: 0.95, SeatFrees: 2.4, Seats: 12, ReserveShare: half, IdleSeats: 3}, want: 2},
		// The peer's Critical requests took two of its three: this one keeps them too until the peer's seats free.
		{name: "and what the peer's part lacks", arrivals: 0.95, frees: 2.4, seats: 12,
			peers: Peers{CriticalRate: 0.95, SeatFrees: 2.4, Seats: 12, ReserveShare: half, IdleSeats: 1}, want: 4},
		// Three Critical requests wait at peers: the pool holds a seat for each on top.
		{name: "and peers' waiting Critical", arrivals: 0.95, frees: 2.4, seats: 12,
			peers: Peers{CriticalRate: 0.95, SeatFrees: 2.4, Seats: 12, CriticalWaiting: 3, ReserveShare: half, IdleSeats: 4}, want: 4},
		// The share never exceeds half the replica's own seats.
		{name: "at most half its seats", arrivals: 5, frees: 1, seats: 4,
			peers: Peers{CriticalRate: 5, SeatFrees: 1, Seats: 40, ReserveShare: func(pool, _ int) int { return pool }}, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Controller{peers: tc.peers}
			got := 0
			if tc.peers.ReserveShare == nil {
				got = reserveSeats(tc.arrivals, tc.frees, tc.seats/2)
			} else {
				got = c.pooledReserveLocked(tc.arrivals, tc.frees, tc.seats)
			}
			if got != tc.want {
				t.Fatalf("reserve %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPeerLoadTakesSeats: requests a peer says it sent to this replica's endpoint hold seats there until the peer
// says they ended, which frees them for what waits here; scrapes that show the same requests do not count them twice.
func TestPeerLoadTakesSeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 2 }))
		h.scrape(ep("a", 0))
		h.c.SetPeers(Peers{Load: map[string]int{"a": 1}})
		first, second := h.admit(0, "t", 1), h.admit(0, "t", 1)
		first.wantOutcome(t, Dispatched, ReasonNone)
		second.wantWaiting(t) // the peer's request holds the other seat
		// Two scrapes show three requests running (the peer's among them): still one seat taken by the peer.
		for range 2 {
			h.step(50 * time.Millisecond)
			h.scrape(Endpoint{Name: "a", Running: 2})
		}
		second.wantWaiting(t)
		h.c.SetPeers(Peers{Load: map[string]int{}})
		synctest.Wait()
		// The peer's request ended; the scrapes' surplus (foreign) still holds it until a scrape shows it gone.
		h.step(50 * time.Millisecond)
		h.scrape(Endpoint{Name: "a", Running: 1})
		h.step(50 * time.Millisecond)
		h.scrape(Endpoint{Name: "a", Running: 1})
		second.wantOutcome(t, Dispatched, ReasonNone)
	})
}

// TestPeerEndIsAnEnd: a peer's request ending on an endpoint is an end there, as one of this replica's would be, so a
// request sent beyond a learned slot limit that starts then confirms the limit instead of disproving it.
func TestPeerEndIsAnEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0))
		h.c.SetPeers(Peers{Load: map[string]int{"a": 2}})
		h.step(time.Second)
		h.c.SetPeers(Peers{Load: map[string]int{"a": 1}})
		h.c.mu.Lock()
		ended := h.c.endpoints[h.c.endpointIndex["a"]].endedNs
		h.c.mu.Unlock()
		if want := h.clk.Now().UnixNano(); ended != want {
			t.Fatalf("endedNs %d after a peer's request ended, want now (%d)", ended, want)
		}
	})
}

// TestCriticalElsewhere: a Critical request that would wait here is reported so (CriticalWouldWait), and one that
// waits is handed to a peer's endpoint when one is found (DispatchWaitingElsewhere), in order, as Dispatched there;
// other bands and requests with headroom here are not.
func TestCriticalElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 1 }))
		h.scrape(ep("a", 0))
		critical := Request{ID: "c0", Tenant: "t", Priority: 1, Bytes: 1, EstimatedCost: 1}
		if h.c.CriticalWouldWait(critical) {
			t.Fatal("a Critical request would wait with a free seat here")
		}
		h.admitReq(critical).wantOutcome(t, Dispatched, ReasonNone)
		if !h.c.CriticalWouldWait(Request{ID: "c1", Tenant: "t", Priority: 1, Bytes: 1}) {
			t.Fatal("a Critical request would not wait with the only seat taken")
		}
		if h.c.CriticalWouldWait(Request{ID: "s1", Tenant: "t", Priority: 0, Bytes: 1}) {
			t.Fatal("a Standard request is offered to peers")
		}
		d := h.c.DispatchedElsewhere(Request{ID: "c1", Tenant: "t", Priority: 1}, "peer-ep")
		if d.Outcome != Dispatched || d.Band != Critical || len(d.Endpoints) != 1 || d.Endpoints[0] != "peer-ep" {
			t.Fatalf("decision %+v, want Critical dispatched to peer-ep", d)
		}
		waiting := []*call{h.admit(1, "t", 1), h.admit(1, "t", 1)}
		for _, cl := range waiting {
			cl.wantWaiting(t)
		}
		var offered []string
		n := h.c.DispatchWaitingElsewhere(func(id string, _ int) (string, bool) {
			offered = append(offered, id)
			return "peer-ep", len(offered) == 1 // one idle seat among the peers
		})
		synctest.Wait()
		if n != 1 || len(offered) != 2 || offered[0] != waiting[0].req.ID {
			t.Fatalf("dispatched %d, offered %v; want the first waiting request dispatched, then the second offered", n, offered)
		}
		if d := waiting[0].wantOutcome(t, Dispatched, ReasonNone); d.Endpoints[0] != "peer-ep" {
			t.Fatalf("sent to %v, want peer-ep", d.Endpoints)
		}
		waiting[1].wantWaiting(t)
		if s := h.c.Stats(); s.InFlight != 1 {
			t.Fatalf("%d in flight here, want 1: requests sent to peers hold nothing here", s.InFlight)
		}
	})
}

// TestCriticalBeyondSeatsGoesToPeers: with a live peer, a Critical request that could go only beyond the seats of an
// endpoint whose slot limit is not learned (into its tentative capacity, where it would wait inside the server for a
// slot) would wait here, so its caller offers it a peer's idle seat first; alone, or with a seat free here, it goes
// here as before.
func TestCriticalBeyondSeatsGoesToPeers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		peers    bool
		inFlight int // this replica's requests on a, whose tentative seats are 2 (capacity 3)
		want     bool
	}{
		{name: "seats full, peer live", peers: true, inFlight: 2, want: true},
		{name: "a seat free, peer live", peers: true, inFlight: 1},
		{name: "seats full, alone", inFlight: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0))
				var sent []*call
				for range 2 {
					cl := h.admit(0, "t", 1)
					cl.wantOutcome(t, Dispatched, ReasonNone)
					sent = append(sent, cl)
				}
				// a showed a request waiting while it ran two, then none: tentative seats 2, capacity 3.
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2, WaitingQueue: 1})
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2})
				for _, cl := range sent[tc.inFlight:] {
					h.c.Release(cl.req.ID)
				}
				if tc.peers {
					h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }})
				}
				h.c.mu.Lock()
				e := h.c.endpoints[h.c.endpointIndex["a"]]
				h.c.mu.Unlock()
				if e.seats != 2 || e.capacity != 3 || e.known != 0 {
					t.Fatalf("seats %d, capacity %d, known %d; want tentative seats 2, capacity 3, no known limit", e.seats,
						e.capacity, e.known)
				}
				if got := h.c.CriticalWouldWait(Request{ID: "c", Tenant: "t", Priority: 1, Bytes: 1}); got != tc.want {
					t.Fatalf("CriticalWouldWait %v, want %v", got, tc.want)
				}
			})
		})
	}
}

// TestSeatSummaryListsIdleSeats: a summary lists the endpoints with free seats and how many, at most
// maxOfferedEndpoints of them, and counts the Critical requests waiting.
func TestSeatSummaryListsIdleSeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 2 }))
		var eps []Endpoint
		for i := range maxOfferedEndpoints + 8 {
			eps = append(eps, ep(fmt.Sprintf("e%02d", i), 0))
		}
		h.scrape(eps...)
		h.admit(1, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // on e00, the least saturated first
		h.step(time.Second)                                       // a rate is known once time has passed
		s := h.c.SeatSummary()
		if len(s.Idle) != maxOfferedEndpoints || s.Idle[0] != (EndpointSeats{"e00", 1}) || s.Idle[1] != (EndpointSeats{"e01", 2}) {
			t.Fatalf("idle %v, want %d endpoints, e00 with one seat, then e01 with two", s.Idle, maxOfferedEndpoints)
		}
		if s.CriticalWaiting != 0 || !(s.CriticalRate > 0) {
			t.Fatalf("summary %+v, want a Critical rate and nothing waiting", s)
		}
	})
}

// TestSeatSummaryOffersEndpointsWithoutSeats: with a live peer and no slot limit learned in the pool, an endpoint that
// has not queued (no seat count) lists as idle the places up to the most the pool has run, less what it holds: in a
// warm-up it is where a peer's Critical request starts at once when every seat of the peer's own is taken. The summary
// tells the most this replica's endpoints ran. Alone, once a slot limit is learned, or with a large batch's count, it
// lists none.
func TestSeatSummaryOffersEndpointsWithoutSeats(t *testing.T) {
	live := func(pool, _ int) int { return pool }
	for _, tc := range []struct {
		name  string
		peers Peers
		want  []EndpointSeats
	}{
		{name: "a peer's endpoint ran 4", peers: Peers{ReserveShare: live, PoolRunning: 4},
			want: []EndpointSeats{{"a", 2}, {"b", 3}}},
		{name: "alone", peers: Peers{PoolRunning: 4}},
		{name: "a slot limit learned", peers: Peers{ReserveShare: live, PoolRunning: 4, PoolSlots: 4}},
		{name: "a large batch ran", peers: Peers{ReserveShare: live, PoolRunning: largeBatchRunning}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0), ep("b", 0))
				h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // on a, the least saturated first
				h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // on b
				h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // on a
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2}, Endpoint{Name: "b", Running: 1})
				h.c.SetPeers(tc.peers)
				s := h.c.SeatSummary()
				if !slices.Equal(s.Idle, tc.want) {
					t.Fatalf("idle %v, want %v", s.Idle, tc.want)
				}
				if s.PoolRunning != 2 {
					t.Fatalf("summary tells the most run here %d, want 2 (a)", s.PoolRunning)
				}
			})
		})
	}
}

// TestMayUsePeerEndpoint: a peer's endpoint may take a request for prefix affinity only while a peer is live, never
// for a band shed when saturated, and below Critical only while the Critical reserve is off; this controller's own
// endpoints are MayExceedHeadroom's to judge, not this.
func TestMayUsePeerEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0))
		live := Peers{ReserveShare: func(pool, _ int) int { return pool / 2 }}
		for _, tc := range []struct {
			name     string
			peers    Peers
			critical bool // a Critical request arrived: the reserve is on
			band     Band
			endpoint string
			want     bool
		}{
			{"Standard to a peer's endpoint", live, false, Standard, "peer-ep", true},
			{"no live peer", Peers{}, false, Standard, "peer-ep", false},
			{"own endpoint", live, false, Standard, "a", false},
			{"holdback band", live, false, Sheddable, "peer-ep", false},
			{"Standard under the Critical reserve", live, true, Standard, "peer-ep", false},
			{"Critical under the Critical reserve", live, true, Critical, "peer-ep", true},
			{"unknown band", live, false, NumBands, "peer-ep", false},
		} {
			h.c.SetPeers(tc.peers)
			if tc.critical {
				h.admit(1, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
			}
			if got := h.c.MayUsePeerEndpoint(tc.band, tc.endpoint); got != tc.want {
				t.Errorf("%s: MayUsePeerEndpoint = %v, want %v", tc.name, got, tc.want)
			}
		}
	})
}

// TestIsPeerEndpoint: an endpoint not in this controller's snapshot is a peer's only while a peer is live.
func TestIsPeerEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0))
		if h.c.IsPeerEndpoint("peer-ep") {
			t.Fatal("with no live peer, peer-ep is a peer's")
		}
		h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool / 2 }})
		if !h.c.IsPeerEndpoint("peer-ep") || h.c.IsPeerEndpoint("a") {
			t.Fatalf("with a live peer: peer-ep a peer's %v, a a peer's %v; want true, false",
				h.c.IsPeerEndpoint("peer-ep"), h.c.IsPeerEndpoint("a"))
		}
	})
}

// TestCriticalStartsAtOnceWithPeers: with a live peer, a Critical request goes only to an endpoint where it starts at
// once while one exists here or a peer lists an idle seat (as one replica seeing the whole pool would), and waits here
// when every endpoint already holds the pool's slot limit; otherwise, or alone, it may still go beyond an endpoint's
// tentative seats, as before.
func TestCriticalStartsAtOnceWithPeers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		peers     bool
		idle      int  // idle seats the peers list
		freeOnB   bool // one of this replica's requests on b ends: b has a free seat
		poolSlots int  // the slot limit the peers learned
		want      []string
		wantQueue bool
	}{
		{name: "a seat free here, peer live", peers: true, freeOnB: true, want: []string{"b"}},
		{name: "a seat free here, alone", freeOnB: true, want: []string{"a", "b"}},
		{name: "seats full, a peer's seat idle", peers: true, idle: 1, wantQueue: true},
		{name: "seats full, no idle seat in the pool", peers: true, want: []string{"a", "b"}},
		// Both hold the pool's slot limit: beyond their seats it would wait inside a server, so it waits here for the
		// next seat to free in the pool.
		{name: "seats full, every endpoint at the pool's slot limit", peers: true, poolSlots: 2, wantQueue: true},
		{name: "seats full, below the pool's slot limit", peers: true, poolSlots: 3, want: []string{"a", "b"}},
		{name: "at the pool's slot limit, alone", poolSlots: 2, want: []string{"a", "b"}},
		{name: "seats full, alone", want: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0), ep("b", 0))
				var onB []string
				for i := range 4 {
					cl := h.admit(0, "t", 1)
					cl.wantOutcome(t, Dispatched, ReasonNone)
					name := []string{"a", "b"}[i%2]
					h.c.Bind(cl.req.ID, name)
					if name == "b" {
						onB = append(onB, cl.req.ID)
					}
				}
				// Both showed a request waiting while they ran two, then none: tentative seats 2, capacity 3.
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2, WaitingQueue: 1}, Endpoint{Name: "b", Running: 2, WaitingQueue: 1})
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2}, Endpoint{Name: "b", Running: 2})
				if tc.freeOnB {
					h.c.Release(onB[0])
				}
				if tc.peers {
					h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }, IdleSeats: tc.idle,
						PoolSlots: tc.poolSlots})
				} else if tc.poolSlots > 0 {
					h.c.SetPeers(Peers{PoolSlots: tc.poolSlots})
				}
				cl := h.admit(1, "t", 1)
				if tc.wantQueue {
					cl.wantWaiting(t)
					cl.cancel()
					return
				}
				if d := cl.wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, tc.want) {
					t.Fatalf("Critical request may go to %v, want %v", d.Endpoints, tc.want)
				}
			})
		})
	}
}

// TestPeersPoolSlots: a slot limit learned by a peer is the pool's here as soon as the peer tells it: under the
// Critical reserve a lower band sends an endpoint whose own limit is not known no more than it (poolSlotsCapLocked);
// and the summary tells only the limit learned on this replica's own endpoints.
func TestPeersPoolSlots(t *testing.T) {
	for _, tc := range []struct {
		name      string
		poolSlots int // the peers'
		wantWait  bool
	}{
		{name: "peer learned 2", poolSlots: 2, wantWait: true},
		{name: "peer learned 3", poolSlots: 3},
		{name: "nothing learned", poolSlots: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0))
				h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }, PoolSlots: tc.poolSlots})
				h.admit(1, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // Critical: the reserve is on
				h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
				// a runs both, nothing waits there: no limit of its own, no seats.
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2})
				cl := h.admit(0, "t", 1)
				if tc.wantWait {
					cl.wantWaiting(t)
					cl.cancel()
				} else {
					cl.wantOutcome(t, Dispatched, ReasonNone)
				}
				if s := h.c.SeatSummary(); s.PoolSlots != 0 {
					t.Fatalf("summary tells pool slots %d, want 0: nothing was learned here", s.PoolSlots)
				}
			})
		})
	}
}

// TestSeatsCountPoolSlots: with a live peer, an endpoint whose own slot limit is not known counts the pool's slot
// limit as its seats, within its tentative capacity, so that the reserve keeps those slots idle for Critical; alone,
// with its limit known, or having run more than the pool's limit, it counts its own seats. One with no seats yet (it
// has not queued) counts, while no slot limit is learned in the pool, the most the pool has run (here or at a peer) if
// a small server's and not below what it ran itself.
func TestSeatsCountPoolSlots(t *testing.T) {
	live := func(pool, _ int) int { return pool }
	for _, tc := range []struct {
		name                         string
		alone                        bool
		poolSlots                    int // the peers'
		peersRan, ownRan             int // the most the peers' endpoints and this replica's have run
		seats, capacity, known, most int // the endpoint's
		want                         int
	}{
		{name: "no seats yet, a peer's endpoint ran 4", peersRan: 4, most: 3, want: 4},
		{name: "no seats yet, an endpoint here ran 4", ownRan: 4, peersRan: 2, most: 2, want: 4},
		{name: "no seats yet, never ran", peersRan: 3, want: 3},
		{name: "no seats yet, a slot limit learned", poolSlots: 4, peersRan: 4, most: 3, want: 0},
		{name: "no seats yet, alone", alone: true, peersRan: 4, most: 3, want: 0},
		{name: "no seats yet, a large batch ran", peersRan: largeBatchRunning, most: 3, want: 0},
		{name: "no seats yet, ran more than the pool reported", peersRan: 3, most: 5, want: 0},
		{name: "pool's limit within capacity", poolSlots: 4, seats: 3, capacity: 4, want: 4},
		{name: "capacity bounds it", poolSlots: 4, seats: 2, capacity: 3, want: 3},
		{name: "alone", alone: true, poolSlots: 4, seats: 2, capacity: 3, want: 2},
		{name: "no pool limit learned", seats: 2, capacity: 3, want: 2},
		{name: "own limit known", poolSlots: 4, seats: 2, capacity: 3, known: 2, want: 2},
		{name: "ran more than the pool's limit", poolSlots: 4, seats: 2, capacity: 3, most: 5, want: 2},
		{name: "seats at the pool's limit", poolSlots: 4, seats: 4, capacity: 5, want: 4},
		{name: "no seats yet", poolSlots: 4, capacity: 3, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Controller{peers: Peers{PoolSlots: tc.poolSlots, PoolRunning: tc.peersRan}, poolRunning: tc.ownRan}
			if !tc.alone {
				c.peers.ReserveShare = live
			}
			e := &endpointState{seats: tc.seats, capacity: tc.capacity, known: tc.known}
			e.learner.maxRunning = tc.most
			if got := c.seatsLocked(e); got != tc.want {
				t.Fatalf("seats %d, want %d", got, tc.want)
			}
		})
	}
}

// TestTenantUnderShareOverThePool: with peers that report their demand, a tenant is judged under its share over the
// pool (its requests and the band's, and the drain, summed over this replica and those peers), as one replica seeing
// every request would, not over this replica's own share of the traffic: here light asks as much as heavy (4 a
// second each, a settled drain of 5), over its share of this replica; the peers see heavy much more, so over the pool
// light is under its share. A tenant active only at a peer counts in its band (it shares the band's drain); the
// peers' drain counts as settled only if each is; a replica whose peers are gone (Peers{}) judges alone again.
func TestTenantUnderShareOverThePool(t *testing.T) {
	tests := []struct {
		name         string
		heavy, light float64 // requests per second here, of cost 1
		peers        PeerDemand
		under        bool
	}{
		{name: "alone: light asks as much as heavy", heavy: 4, light: 4},
		{name: "the peers see heavy more", heavy: 4, light: 4, under: true, peers: PeerDemand{Peers: 1, Drain: 25,
			Settled: true, Tenants: []TenantDemand{{Standard, "heavy", 20, 20, 1, 10}, {Standard, "light", 1, 1, 1, 10}}}},
		{name: "the peers see light as much", heavy: 4, light: 4, peers: PeerDemand{Peers: 1, Drain: 5,
			Settled: true, Tenants: []TenantDemand{{Standard, "heavy", 10, 10, 1, 10}, {Standard, "light", 10, 10, 1, 10}}}},
		{name: "heavy only at the peers", light: 4, under: true, peers: PeerDemand{Peers: 1, Drain: 25, Settled: true,
			Tenants: []TenantDemand{{Standard, "heavy", 20, 20, 1, 10}}}},
		{name: "peers' drain settled and low", heavy: 4, light: 4, peers: PeerDemand{Peers: 1, Drain: 1, Settled: true,
			Tenants: []TenantDemand{{Standard, "heavy", 20, 20, 1, 10}, {Standard, "light", 1, 1, 1, 10}}}},
		{name: "peers' drain not settled: a share of the demand", heavy: 4, light: 4, under: true, peers: PeerDemand{
			Peers: 1, Drain: 1, Tenants: []TenantDemand{{Standard, "heavy", 20, 20, 1, 10}, {Standard, "light", 1, 1, 1, 10}}}},
		{name: "a higher band's demand drains first", heavy: 4, light: 4, peers: PeerDemand{Peers: 1, Drain: 25,
			Settled: true, Tenants: []TenantDemand{{Critical, "x", 24, 24, 1, 10}, {Standard, "heavy", 20, 20, 1, 10},
				{Standard, "light", 1, 1, 1, 10}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newHarness(t, testConfig(t, nil)).c
			if tt.peers.Peers > 0 {
				c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }, Demand: tt.peers})
			}
			c.mu.Lock()
			window := c.cfg.DrainRateWindow
			now := noteTenantArrivals(c, t0, window, tt.heavy, tt.light)
			c.drain.meter = rateMeter{window: window.Seconds(), events: 5 * window.Seconds(), span: window.Seconds(), last: now}
			under := c.underShareLocked(now)
			if _, got := under[tenantKey{Standard, "light"}]; got != tt.under {
				t.Errorf("light under its share: %v, want %v", got, tt.under)
			}
			if arrivals := under[tenantKey{Standard, "light"}]; tt.under && math.Abs(arrivals.here-tt.light) > 0.5 {
				t.Errorf("light's arrivals for the seats kept here %.2f/s, want its own %.0f/s", arrivals, tt.light)
			}
			if _, got := under[tenantKey{Standard, "heavy"}]; got {
				t.Errorf("heavy under its share (or judged while not active here)")
			}
			c.mu.Unlock()

			c.SetPeers(Peers{}) // the peers are gone: judged alone
			c.mu.Lock()
			defer c.mu.Unlock()
			_, got := c.underShareLocked(now)[tenantKey{Standard, "light"}]
			if alone := tt.heavy > 0 && tt.light < tt.heavy; got != alone {
				t.Errorf("peers gone: light under its share %v, want %v", got, alone)
			}
		})
	}
}

// TestDemandSummary: a replica tells its peers the tenants active within the drain-rate window, per band at most
// MaxSummaryTenants, the busiest, with its drain rate.
func TestDemandSummary(t *testing.T) {
	c := newHarness(t, testConfig(t, nil)).c
	c.mu.Lock()
	start := t0.Add(-time.Second)
	// Two bands with more tenants than a summary lists: each keeps its own busiest MaxSummaryTenants.
	for i := range MaxSummaryTenants + 2 {
		for k := range i + 1 {
			c.noteArrivalLocked(Standard, fmt.Sprint("t", i), 1, 1, start.Add(time.Duration(k)*time.Millisecond))
			c.noteArrivalLocked(Sheddable, fmt.Sprint("u", i), 1, 1, start.Add(time.Duration(k)*time.Millisecond))
		}
	}
	for k := range 2 * MaxSummaryTenants {
		c.noteArrivalLocked(Sheddable, "s", 2, 3, start.Add(time.Duration(k)*time.Millisecond))
	}
	c.noteArrivalLocked(Critical, "idle", 1, 1, t0.Add(-time.Hour))
	c.mu.Unlock()
	d := c.Demand()
	if len(d.Tenants) != 2*MaxSummaryTenants {
		t.Fatalf("%d tenants listed, want %d: %+v", len(d.Tenants), 2*MaxSummaryTenants, d.Tenants)
	}
	for i, td := range d.Tenants[:MaxSummaryTenants] {
		if want := fmt.Sprint("t", MaxSummaryTenants+1-i); td.Band != Standard || td.Tenant != want {
			t.Errorf("tenant %d listed %v %s, want Standard %s (the busiest first)", i, td.Band, td.Tenant, want)
		}
	}
	if s := d.Tenants[MaxSummaryTenants]; s.Band != Sheddable || s.Tenant != "s" || s.Weight != 2 || !(s.Cost > s.Requests) {
		t.Errorf("the busiest Sheddable tenant listed as %+v", s)
	}
	for i, td := range d.Tenants[MaxSummaryTenants+1:] {
		if want := fmt.Sprint("u", MaxSummaryTenants+1-i); td.Band != Sheddable || td.Tenant != want {
			t.Errorf("Sheddable tenant %d listed %v %s, want %s", i+1, td.Band, td.Tenant, want)
		}
	}
}

// TestPooledTenantRatesOverTheLongestSpan: a rate averages over the time since the tenant's first request until a
// window has passed, and that first request comes later at each replica than in the pool: the pool's rate is what the
// replicas counted, summed, over the longest span, not their rates summed (which overstate it in the first seconds).
func TestPooledTenantRatesOverTheLongestSpan(t *testing.T) {
	c := newHarness(t, testConfig(t, nil)).c
	c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }, Demand: PeerDemand{Peers: 1,
		Tenants: []TenantDemand{{Standard, "light", 1, 1, 1, 10}}}})
	c.mu.Lock()
	defer c.mu.Unlock()
	window := c.cfg.DrainRateWindow.Seconds()
	c.demand[tenantKey{Standard, "light"}] = &tenantDemand{ // 4 counted over its first second here
		requests: rateMeter{window: window, events: 4, span: 1, last: t0},
		cost:     rateMeter{window: window, events: 4, span: 1, last: t0}, weight: 1, last: t0}
	got := c.tenantRatesLocked(t0)[tenantKey{Standard, "light"}]
	if want := 1.4; math.Abs(got.cost-want) > 1e-9 || math.Abs(got.requests-want) > 1e-9 || got.arrivals != 4 {
		t.Fatalf("pooled light %.2f cost/s, %.2f requests/s, arrivals here %.2f/s; want %.2f, %.2f (4 + 10 counted over 10 s), 4",
			got.cost, got.requests, got.arrivals, want, want)
	}
}

// TestSeatsKeptForPeersProtected: with a live peer telling of requests of tenants under their share waiting there
// (Peers.ProtectedWaiting), a tenant over its share here leaves a seat idle for each (at most half the seats) as it does
// for this replica's own arrivals of such tenants, and the summary offers those seats to the peers' protected requests
// only (SpareProtected). Without such requests at the peers it takes the seat, and nothing is offered while it waits.
func TestSeatsKeptForPeersProtected(t *testing.T) {
	live := func(pool, _ int) int { return pool }
	for _, tc := range []struct {
		name      string
		protected int // requests of tenants under their share waiting at the peers
		waits     bool
		spare     []EndpointSeats
	}{
		{name: "none waits at the peers", protected: 0},
		{name: "one waits at a peer", protected: 1, waits: true, spare: []EndpointSeats{{"a", 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 2 }))
				h.scrape(ep("a", 0), ep("b", 0))
				h.c.SetPeers(Peers{ReserveShare: live, ProtectedWaiting: tc.protected})
				sent := fillTwoSeatEndpoints(t, h)
				h.step(time.Second)
				h.c.Release(sent[0].req.ID) // a seat of a frees
				next := h.admit(0, "heavy", 1)
				if tc.waits {
					next.wantWaiting(t)
				} else {
					next.wantOutcome(t, Dispatched, ReasonNone)
				}
				s := h.c.SeatSummary()
				if !slices.Equal(s.Spare, tc.spare) || s.SpareProtected != (tc.spare != nil) {
					t.Fatalf("spare %v (protected %v), want %v offered to protected requests only", s.Spare, s.SpareProtected, tc.spare)
				}
				h.c.SetPeers(Peers{}) // the peers are gone: the seat is this replica's again
				synctest.Wait()
				if tc.waits {
					next.wantOutcome(t, Dispatched, ReasonNone)
				}
			})
		})
	}
}

// TestSpareOffered: the summary offers the places this replica would leave idle: while nothing waits here, every free
// seat and one place on an endpoint without a seat count, to any request of a peer (or only to its requests of tenants
// under their share while some wait at the peers); nothing while the Critical reserve is on, or while requests wait
// here with none protected waiting at the peers; none on an endpoint whose seats are the pool's guess while a server
// of the pool ran more than the pool's slot limit (seatsGuessedLocked); none on an endpoint whose KV use is over
// Standard's ceiling, but to protected requests, which are judged by seats.
func TestSpareOffered(t *testing.T) {
	live := func(pool, _ int) int { return pool }
	for _, tc := range []struct {
		name      string
		known     bool // a and b state a concurrency of 2
		critical  bool // a Critical request arrived: the reserve is on
		extra     int  // more Standard requests than the first
		protected int
		poolSlots int     // the smallest slot limit the peers learned
		poolRan   int     // the most the peers' endpoints ran at once
		kv        float64 // the endpoints' KV cache use
		spare     []EndpointSeats
		onlyTo    bool
	}{
		{name: "free seats", known: true, spare: []EndpointSeats{{"a", 1}, {"b", 2}}},
		// Protected requests are judged by seats, not by the KV cache's use, and so are the places kept for them.
		{name: "KV use over Standard's ceiling: none", known: true, kv: 0.85},
		{name: "KV use over Standard's ceiling, protected requests at a peer: offered to them", known: true, kv: 0.85,
			protected: 2, onlyTo: true, spare: []EndpointSeats{{"a", 1}, {"b", 2}}},
		{name: "free seats, protected requests at a peer", known: true, protected: 2, onlyTo: true,
			spare: []EndpointSeats{{"a", 1}, {"b", 2}}},
		{name: "no seat count: one place each", spare: []EndpointSeats{{"a", 1}, {"b", 1}}},
		{name: "the pool's slot limit, run by every server: one place each", poolSlots: 4, poolRan: 4,
			spare: []EndpointSeats{{"a", 1}, {"b", 1}}},
		{name: "the pool's slot limit guessed, a server of the pool ran more: none", poolSlots: 4, poolRan: 24},
		{name: "what the pool ran guessed before a slot limit: none", poolRan: 4},
		{name: "the Critical reserve is on", known: true, critical: true},
		{name: "requests wait here", known: true, extra: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) {
					if tc.known {
						c.Endpoint.Concurrency = 2
					}
				}))
				h.scrape(ep("a", 0), ep("b", 0))
				h.c.SetPeers(Peers{ReserveShare: live, ProtectedWaiting: tc.protected, PoolSlots: tc.poolSlots,
					PoolRunning: tc.poolRan})
				priority := 0
				if tc.critical {
					priority = 1
				}
				h.admit(priority, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // on a
				for range tc.extra {
					h.admit(0, "t", 1)
				}
				if tc.kv > 0 {
					h.scrape(Endpoint{Name: "a", Running: 1, KVCacheUsage: tc.kv}, Endpoint{Name: "b", KVCacheUsage: tc.kv})
				}
				s := h.c.SeatSummary()
				if !slices.Equal(s.Spare, tc.spare) || s.SpareProtected != tc.onlyTo {
					t.Fatalf("spare %v (protected only %v), want %v (%v)", s.Spare, s.SpareProtected, tc.spare, tc.onlyTo)
				}
			})
		})
	}
}

// TestSpareElsewhere: requests waiting here go, in order, to the spare places a peer offers (DispatchSpareElsewhere)
// while take finds one, as Dispatched there and holding nothing here, once the next in line has waited SpareMinWait (a
// request of a tenant under nobody's share is not offered as protected); none goes while the Critical reserve is on
// here.
func TestSpareElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name     string
		critical bool
		waited   time.Duration
		sent     int
	}{
		{name: "Standard waiting", waited: SpareMinWait, sent: 1},
		{name: "not waited long enough", waited: SpareMinWait - time.Millisecond},
		{name: "the Critical reserve is on", critical: true, waited: SpareMinWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 1 }))
				h.scrape(ep("a", 0))
				h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }})
				priority := 0
				if tc.critical {
					priority = 1
				}
				h.admit(priority, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
				waiting := []*call{h.admit(0, "t", 1), h.admit(0, "t", 1)}
				for _, cl := range waiting {
					cl.wantWaiting(t)
				}
				h.step(tc.waited)
				var offered []string
				n := h.c.DispatchSpareElsewhere(func(id string, _ int, protected bool) (string, bool) {
					if protected {
						t.Errorf("%s offered as a protected request: one tenant is under nobody's share", id)
					}
					offered = append(offered, id)
					return "peer-ep", len(offered) == 1 // one spare place among the peers
				})
				synctest.Wait()
				if n != tc.sent {
					t.Fatalf("dispatched %d (offered %v), want %d", n, offered, tc.sent)
				}
				if tc.sent == 0 {
					if len(offered) > 0 {
						t.Fatalf("offered %v, want none", offered)
					}
					return
				}
				if len(offered) != 2 || offered[0] != waiting[0].req.ID {
					t.Fatalf("offered %v, want the first waiting request, then the second", offered)
				}
				if d := waiting[0].wantOutcome(t, Dispatched, ReasonNone); d.Endpoints[0] != "peer-ep" || d.Band != Standard {
					t.Fatalf("decision %+v, want Standard sent to peer-ep", d)
				}
				waiting[1].wantWaiting(t)
				if s := h.c.Stats(); s.InFlight != 1 {
					t.Fatalf("%d in flight here, want 1: requests sent to peers hold nothing here", s.InFlight)
				}
			})
		})
	}
}

// TestPooledTenantSeats: with live peers that report their demand, the seats a tenant over its share leaves idle for
// the band's tenants under theirs are this replica's part of the pool's, sized from the pool's figures as one replica
// owning the pool would size them; sized from each replica's own figures, every replica kept the whole reserve (the
// ratio of the rates is the same at each), N times over in the pool. Alone, or with peers of a release that sends no
// demand, they are sized from the arrivals here.
func TestPooledTenantSeats(t *testing.T) {
	quarter := func(pool, _ int) int { return pool / 4 }
	light := map[tenantKey]tenantArrivals{{Standard, "light"}: {here: 1.3, pool: 5.2}}
	for _, tc := range []struct {
		name   string
		peers  Peers
		tenant string
		want   int
	}{
		// One replica of four, ten seats freeing at 2.7/s, the light tenant at 1.3/s here: r = 2.1 keeps 6 seats,
		// held to half the seats.
		{name: "alone", tenant: "heavy", want: 5},
		{name: "peers of a release without demand", tenant: "heavy", want: 5,
			peers: Peers{Seats: 30, SeatFrees: 8.1, ReserveShare: quarter}},
		// The pool: 40 seats freeing at 10.8/s, light at 5.2/s: the same r keeps 6 of 40, a quarter of them here.
		{name: "a quarter of the pool's", tenant: "heavy", want: 1,
			peers: Peers{Seats: 30, SeatFrees: 8.1, ReserveShare: quarter, Demand: PeerDemand{Peers: 3}}},
		{name: "at most half its seats", tenant: "heavy", want: 5,
			peers: Peers{Seats: 30, SeatFrees: 8.1, ReserveShare: func(pool, _ int) int { return pool }, Demand: PeerDemand{Peers: 3}}},
		{name: "the tenant under its share keeps none", tenant: "light", want: 0,
			peers: Peers{Seats: 30, SeatFrees: 8.1, ReserveShare: quarter, Demand: PeerDemand{Peers: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Controller{peers: tc.peers, underShare: light, underShareAt: t0}
			if got := c.tenantSeatsLocked(Standard, tc.tenant, 10, 2.7, t0); got != tc.want {
				t.Fatalf("seats kept %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPooledTenantSeatsOfferedToPeersProtected: seats kept idle as this replica's part of the pool's seats for tenants
// under their share are the pool's: while requests of such tenants wait at a peer, the summary offers them to those
// requests, even while requests of a tenant over its share wait here; kept for this replica's own arrivals (the peers
// send no demand), they stay for those.
func TestPooledTenantSeatsOfferedToPeersProtected(t *testing.T) {
	live := func(pool, _ int) int { return pool }
	for _, tc := range []struct {
		name      string
		demand    PeerDemand
		protected int
		spare     []EndpointSeats
	}{
		{name: "pooled, a protected request waits at a peer", demand: PeerDemand{Peers: 1}, protected: 1,
			spare: []EndpointSeats{{"a", 1}}},
		{name: "pooled, none waits at the peers", demand: PeerDemand{Peers: 1}},
		{name: "kept for arrivals here", protected: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newSeatHarness(t)
				h.scrape(ep("a", 0), ep("b", 0))
				sent := fillTwoSeatEndpoints(t, h)
				h.step(time.Second)
				next := h.admit(0, "heavy", 1)
				next.wantWaiting(t)
				h.c.SetPeers(Peers{ReserveShare: live, ProtectedWaiting: tc.protected, Demand: tc.demand})
				h.c.mu.Lock()
				h.c.underShare = map[tenantKey]tenantArrivals{{Standard, "light"}: {here: 1, pool: 2}}
				h.c.underShareAt = h.clk.Now()
				h.c.mu.Unlock()
				h.c.Release(sent[0].req.ID) // a seat of a frees: kept for the light tenant
				synctest.Wait()
				next.wantWaiting(t)
				s := h.c.SeatSummary()
				if !slices.Equal(s.Spare, tc.spare) || tc.spare != nil && !s.SpareProtected {
					t.Fatalf("spare %v (protected %v), want %v offered to protected requests only", s.Spare, s.SpareProtected, tc.spare)
				}
			})
		})
	}
}

// fillTwoSeatEndpoints dispatches four of the heavy tenant's Standard requests onto two endpoints of two seats each
// (a, b, a, b): both full, so both seat-bound.
func fillTwoSeatEndpoints(t *testing.T, h *harness) []*call {
	t.Helper()
	var sent []*call
	for range 4 {
		cl := h.admit(0, "heavy", 1)
		cl.wantOutcome(t, Dispatched, ReasonNone)
		sent = append(sent, cl)
	}
	return sent
}
