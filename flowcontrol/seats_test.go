package flowcontrol

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// scrapeStep is one scrape an endpoint's concurrency learner folds in, after ends releases of the EPP's requests
// there.
type scrapeStep struct {
	running, waiting, ends int
	kv                     float64
}

// probeOutcome is how a probe beyond a learned slot limit started: after one of the EPP's requests there ended or
// not, and after waiting for a slot (longer than a prompt takes) or not; lateEnd: an end arrived after its first
// chunk, within a prompt's time (an end late to the EPP, which tells what it would have in order).
type probeOutcome struct{ ended, waited, lateEnd bool }

// TestConcurrencyLearner: a running count that holds at its most while requests wait, across ends of requests, is
// the slot limit; on a small endpoint two scrapes showing a queue at that count are enough, a limit a probe confirms
// is strict, and one a probe or a scrape disproves is forgotten and learned again only by the slow rule. A queue that
// comes and goes, a count that moves, one below the most ever run, or a queue on a full KV cache is no limit.
// Tentative seats exist only for a small endpoint that has queued.
func TestConcurrencyLearner(t *testing.T) {
	plateau := []scrapeStep{{4, 1, 0, 0.1}, {4, 2, 1, 0.1}, {4, 1, 0, 0.1}, {4, 1, 1, 0.1}}
	twoQueued := []scrapeStep{{4, 1, 0, 0.1}, {4, 1, 0, 0.1}}
	disproved := append(append([]scrapeStep{}, twoQueued...), scrapeStep{5, 0, 0, 0.1})
	large := []scrapeStep{{20, 2, 0, 0.3}, {20, 2, 1, 0.3}, {20, 1, 0, 0.3}, {20, 1, 1, 0.3}}
	// A step-bound server ramping up: ends and admissions one for one across a step, one or two requests waiting for
	// the next step in each scrape.
	stepBound := []scrapeStep{{225, 1, 0, 0.3}, {225, 2, 1, 0.3}, {225, 1, 0, 0.3}, {225, 0, 1, 0.3}}
	tests := []struct {
		name            string
		stated          int
		steps           []scrapeStep
		prefilling      int // of the running requests, how many have not had their first chunk
		probe           *probeOutcome
		waiting         bool
		slots           int
		seats, capacity int
		source          concurrencySource
		known           int
	}{
		{name: "nothing seen", source: concurrencyUnknown},
		// Outside the reserve a learned limit not yet confirmed may be exceeded by one while nothing waits there (the
		// probe), so a plateau of the EPP's own making can be disproved.
		{name: "plateau with ends", steps: plateau, slots: 4, seats: 4, capacity: 4, source: concurrencySlots, known: 5},
		{name: "plateau, latest scrape waiting", steps: plateau, waiting: true, slots: 4, seats: 4, capacity: 4,
			source: concurrencySlots, known: 4},
		{name: "small endpoint, queue in two scrapes", steps: twoQueued, slots: 4, seats: 4, capacity: 4,
			source: concurrencySlots, known: 5},
		{name: "small endpoint, latest scrape waiting", steps: twoQueued, waiting: true, slots: 4, seats: 4, capacity: 4,
			source: concurrencySlots, known: 4},
		{name: "probe waited for a slot: strict", steps: twoQueued, probe: &probeOutcome{ended: true, waited: true},
			slots: 4, seats: 4, capacity: 4, source: concurrencySlots, known: 4},
		{name: "probe started after an end, at once: says nothing", steps: twoQueued,
			probe: &probeOutcome{ended: true}, slots: 4, seats: 4, capacity: 4, source: concurrencySlots, known: 5},
		{name: "probe started with nothing ended: forgotten", steps: twoQueued, probe: &probeOutcome{},
			seats: 4, capacity: 5, source: concurrencyRunning},
		{name: "queue in one scrape", steps: twoQueued[:1], seats: 4, capacity: 5, source: concurrencyRunning},
		// A long prompt holds the running count with a queue while no step ends: no limit until the prompts start.
		{name: "queue behind prompts not started", steps: []scrapeStep{{2, 3, 0, 0.1}, {2, 3, 0, 0.1}}, prefilling: 1,
			seats: 2, capacity: 3, source: concurrencyRunning},
		{name: "queue gone each scrape", steps: []scrapeStep{{4, 1, 1, 0.1}, {4, 0, 1, 0.1}, {4, 1, 1, 0.1}, {4, 0, 1, 0.1}},
			seats: 4, capacity: 5, source: concurrencyRunning},
		{name: "count moves", steps: []scrapeStep{{3, 1, 1, 0.1}, {4, 1, 1, 0.1}, {5, 1, 1, 0.1}, {6, 1, 1, 0.1}},
			seats: 6, capacity: 7, source: concurrencyRunning},
		{name: "below the most run", steps: append([]scrapeStep{{6, 0, 0, 0.1}}, plateau...), seats: 6, capacity: 7,
			source: concurrencyRunning},
		{name: "more running forgets", steps: append(append([]scrapeStep{}, plateau...), scrapeStep{6, 0, 0, 0.1}),
			seats: 6, capacity: 7, source: concurrencyRunning},
		// Once disproved, two scrapes with a queue are not enough; the slow rule (ends across four scrapes) still is.
		{name: "disproved, queue in two scrapes", steps: slices.Concat(disproved, []scrapeStep{{5, 1, 0, 0.1},
			{5, 1, 0, 0.1}}), seats: 5, capacity: 6, source: concurrencyRunning},
		{name: "disproved, plateau with ends", steps: slices.Concat(disproved, []scrapeStep{{5, 1, 0, 0.1},
			{5, 1, 1, 0.1}, {5, 1, 0, 0.1}, {5, 1, 1, 0.1}}), slots: 5, seats: 5, capacity: 5, source: concurrencySlots,
			known: 6},
		// Requests waiting on a full KV cache wait for blocks, not slots, however long the plateau; the tentative
		// capacity goes no further than what the KV cache holds (10 at 85%: 11.8).
		{name: "queue on a full KV cache", steps: []scrapeStep{{10, 1, 0, 0.85}, {10, 1, 0, 0.85}}, seats: 10,
			capacity: 11, source: concurrencyRunning},
		{name: "plateau with ends on a full KV cache", steps: []scrapeStep{{10, 1, 0, 0.9}, {10, 1, 1, 0.9},
			{10, 1, 0, 0.9}, {10, 1, 1, 0.9}}, seats: 10, capacity: 11, source: concurrencyRunning},
		{name: "latest scrape waiting", steps: plateau[:1], waiting: true, seats: 4, capacity: 4, source: concurrencyRunning},
		{name: "never queued", steps: []scrapeStep{{4, 0, 1, 0.1}, {4, 0, 1, 0.1}}, source: concurrencyUnknown},
		{name: "large batch, queue in two scrapes", steps: large[:2], source: concurrencyUnknown},
		{name: "large batch, plateau with ends", steps: large, slots: 20, seats: 20, capacity: 20,
			source: concurrencySlots, known: 21},
		{name: "large batch, probe waited for a slot: strict", steps: large, probe: &probeOutcome{ended: true, waited: true},
			slots: 20, seats: 20, capacity: 20, source: concurrencySlots, known: 20},
		{name: "probe waited, its end late: strict", steps: twoQueued,
			probe: &probeOutcome{waited: true, lateEnd: true}, slots: 4, seats: 4, capacity: 4, source: concurrencySlots,
			known: 4},
		// On a step-bound server the probe waits for the next step, longer than a prompt takes, whether the limit is
		// real or not: it stays tentative, and the endpoint may still run one more.
		{name: "step-bound, plateau with ends", steps: stepBound, slots: 225, seats: 225, capacity: 225,
			source: concurrencySlots, known: 226},
		{name: "step-bound, probe waited: tentative", steps: stepBound, probe: &probeOutcome{ended: true, waited: true},
			slots: 225, seats: 225, capacity: 225, source: concurrencySlots, known: 226},
		{name: "step-bound, probe waited, its end late: tentative", steps: stepBound,
			probe: &probeOutcome{waited: true, lateEnd: true}, slots: 225, seats: 225, capacity: 225,
			source: concurrencySlots, known: 226},
		{name: "step-bound, probe started with nothing ended: forgotten", steps: stepBound, probe: &probeOutcome{},
			source: concurrencyUnknown},
		{name: "stated", stated: 3, source: concurrencyStated, seats: 3, capacity: 3, known: 3},
		{name: "stated over learned", stated: 8, steps: plateau, slots: 4, seats: 4, capacity: 4, source: concurrencySlots,
			known: 5},
		{name: "stated under learned", stated: 4, steps: plateau, slots: 4, seats: 4, capacity: 4, source: concurrencyStated,
			known: 4},
		// Four running use 80% of KV: five fill it, and the default threshold (0.8) keeps four.
		{name: "KV bounds the slots", stated: 8, steps: []scrapeStep{{4, 0, 0, 0.8}}, seats: 4, capacity: 4,
			source: concurrencyKV, known: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := DefaultConfig().Endpoint
			th.Concurrency = tt.stated
			var l concurrencyLearner
			for _, s := range tt.steps {
				l.releases += s.ends
				l.observe(Endpoint{Running: s.running, WaitingQueue: s.waiting, KVCacheUsage: s.kv}, s.running-tt.prefilling)
			}
			if p := tt.probe; p != nil {
				deadlineNs := int64(0) // no end arrives: the EPP's own view is believed at once
				if p.lateEnd {
					deadlineNs = 1
				}
				l.probeStarted(p.ended, p.waited, 0, deadlineNs)
				if p.lateEnd {
					l.ended(0, 0)
				}
			}
			if l.slots != tt.slots {
				t.Errorf("slots = %d, want %d", l.slots, tt.slots)
			}
			seats, capacity, source := l.limits(th, tt.waiting)
			if seats != tt.seats || capacity != tt.capacity || source != tt.source {
				t.Errorf("limits = %d seats, capacity %d, %s; want %d, %d, %s", seats, capacity, source, tt.seats,
					tt.capacity, tt.source)
			}
			if k := l.known(th, tt.waiting); k != tt.known {
				t.Errorf("known = %d, want %d", k, tt.known)
			}
		})
	}
}

// TestReserveSeats: the reserve is the fewest idle seats that a Critical arrival finds empty at most seatMiss of the
// time, bounded by maxSeats.
func TestReserveSeats(t *testing.T) {
	tests := []struct {
		arrivals, frees float64
		maxSeats, want  int
	}{
		{0, 10, 8, 1},   // no Critical demand measured: one seat
		{1, 1000, 8, 1}, // seats free 1000x as often as Critical arrives: 1/(1+1000) < 1%
		{1, 50, 8, 2},   // 1/(1+50) > 1%, 1/(1+50+2500) < 1%
		{10, 10, 8, 8},  // as many arrivals as frees: 1/(n+1), more than 8 needed
		{10, 10, 0, 1},  // at least one
		{5, 0, 3, 3},    // nothing frees yet: the most allowed
		{1, 9.0, 20, 3}, // 1/(1+9+81) > 1%, 1/(1+9+81+729) < 1%
	}
	for _, tt := range tests {
		if got := reserveSeats(tt.arrivals, tt.frees, tt.maxSeats); got != tt.want {
			t.Errorf("reserveSeats(%v, %v, %d) = %d, want %d", tt.arrivals, tt.frees, tt.maxSeats, got, tt.want)
		}
	}
}

// TestRateMeter: the rate is right from the first window on, follows a change of rate, and survives a new window.
func TestRateMeter(t *testing.T) {
	m := newRateMeter(10 * time.Second)
	now := t0
	if _, ok := m.rate(now); ok {
		t.Fatal("a rate before any time passed")
	}
	for range 20 { // 4 per second for 5 s
		now = now.Add(250 * time.Millisecond)
		m.add(now, 1)
	}
	if r, _ := m.rate(now); r < 3.6 || r > 4.4 {
		t.Fatalf("rate after 5 s at 4/s = %v", r)
	}
	for range 200 { // 1 per second for 200 s
		now = now.Add(time.Second)
		m.add(now, 1)
	}
	if r, _ := m.rate(now); r < 0.9 || r > 1.1 {
		t.Fatalf("rate after 200 s at 1/s = %v", r)
	}
	m.setWindow(time.Second)
	if r, _ := m.rate(now); r < 0.9 || r > 1.1 {
		t.Fatalf("rate after a new window = %v", r)
	}
}

// TestOccupancyRecon: a surplus in two consecutive scrapes is foreign occupancy; a shortfall in three drops the EPP's
// oldest requests there; a request released after a scrape still counts for that scrape.
func TestOccupancyRecon(t *testing.T) {
	type obs struct{ server, sentBefore, foreign, drop int }
	tests := []struct {
		name string
		obs  []obs
	}{
		{"agree", []obs{{3, 3, 0, 0}, {3, 3, 0, 0}}},
		{"surplus once", []obs{{5, 3, 0, 0}, {3, 3, 0, 0}}},
		{"surplus twice", []obs{{5, 3, 0, 0}, {6, 3, 2, 0}, {6, 3, 3, 0}}},
		{"shortfall twice", []obs{{1, 3, 0, 0}, {1, 3, 0, 0}, {3, 3, 0, 0}}},
		{"shortfall thrice", []obs{{1, 3, 0, 0}, {2, 3, 0, 0}, {1, 3, 0, 1}, {2, 2, 0, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o occupancyRecon
			for i, ob := range tt.obs {
				foreign, drop := o.observe(int64(i+1)*int64(time.Second), ob.server, ob.sentBefore)
				if foreign != ob.foreign || drop != ob.drop {
					t.Fatalf("scrape %d: foreign %d, drop %d; want %d, %d", i, foreign, drop, ob.foreign, ob.drop)
				}
			}
		})
	}
	var o occupancyRecon
	o.release(t0, t0.Add(2*time.Second)) // sent before the scrape at 1 s, released after it
	if foreign, _ := o.observe(t0.Add(time.Second).UnixNano(), 3, 2); foreign != 0 {
		t.Fatalf("a request released after the scrape counted as foreign")
	}
	if foreign, _ := o.observe(t0.Add(3*time.Second).UnixNano(), 3, 2); foreign != 0 {
		t.Fatalf("surplus counted as foreign after one scrape: %d", foreign)
	}
}

// TestStatedConcurrency: an endpoint with a stated concurrency gets no more than that many requests in flight,
// whatever its scrapes say of its queue, and the request waiting next goes the moment one ends (Release), before any
// scrape.
func TestStatedConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = 2 }))
		h.scrape(ep("a", 0))
		first, second, third := h.admit(0, "t", 1), h.admit(0, "t", 1), h.admit(0, "t", 1)
		first.wantOutcome(t, Dispatched, ReasonNone)
		second.wantOutcome(t, Dispatched, ReasonNone)
		third.wantWaiting(t)
		h.step(50 * time.Millisecond)
		h.scrape(Endpoint{Name: "a", Running: 2})
		third.wantWaiting(t) // the scrape covers both; they still hold the endpoint's two slots
		if s := h.c.Stats(); s.InFlight != 2 || s.Reserved != 0 {
			t.Fatalf("stats %+v, want 2 in flight, none reserved", s)
		}
		h.step(10 * time.Millisecond)
		h.c.Release(first.req.ID)
		synctest.Wait()
		third.wantOutcome(t, Dispatched, ReasonNone)
	})
}

// newSeatHarness is a harness whose endpoints run two requests each and hold none pending: each is seat-bound once full.
func newSeatHarness(t *testing.T) *harness {
	return newHarness(t, testConfig(t, func(c *Config) {
		c.Endpoint.Concurrency = 2
		c.Endpoint.Pending, c.Endpoint.PendingTime = 0, 0
	}))
}

// TestCriticalSeatReserve: while Critical traffic is active, a seat that frees on a full (seat-bound) endpoint stays
// idle for Critical rather than going to a waiting Standard request; a Critical arrival takes it at once, and when
// Critical traffic stops the Standard request gets the next seat.
func TestCriticalSeatReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSeatHarness(t)
		h.scrape(ep("a", 0), ep("b", 0))
		critical := h.admit(1, "t", 1)
		critical.wantOutcome(t, Dispatched, ReasonNone)
		var standard []*call
		for range 4 {
			standard = append(standard, h.admit(0, "t", 1))
		}
		for _, cl := range standard[:3] {
			cl.wantOutcome(t, Dispatched, ReasonNone)
		}
		standard[3].wantWaiting(t) // both endpoints are full
		h.step(time.Second)
		h.c.Release(standard[0].req.ID)
		synctest.Wait()
		standard[3].wantWaiting(t) // the freed seat is Critical's reserve
		late := h.admit(1, "t", 1)
		late.wantOutcome(t, Dispatched, ReasonNone)

		// Critical traffic stops: once the reserve ends, the next seat to free goes to Standard.
		h.step(h.c.cfg.DrainRateWindow + time.Second)
		h.c.Release(late.req.ID)
		synctest.Wait()
		standard[3].wantOutcome(t, Dispatched, ReasonNone)
	})
}

// TestConcurrencyExactlyOneOutcome: with a stated concurrency, requests that end in any order (released, started
// first, or never reported) each get one outcome, and the counts stay consistent throughout.
func TestConcurrencyExactlyOneOutcome(t *testing.T) {
	for _, concurrency := range []int{1, 3} {
		t.Run(fmt.Sprint(concurrency), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Concurrency = concurrency }))
				h.scrape(ep("a", 0), ep("b", 0))
				var calls []*call
				for i := range 20 {
					calls = append(calls, h.admitReq(Request{ID: fmt.Sprintf("r%d", i), Tenant: "t", Priority: i%3 - 1,
						Bytes: 10, Streamed: i%2 == 0}))
				}
				for round := 0; round < 40; round++ {
					for _, cl := range calls {
						if cl.finished() && cl.result(t).Outcome == Dispatched {
							switch round % 3 {
							case 0:
								h.c.Started(cl.req.ID)
							default:
								h.c.Release(cl.req.ID)
							}
						}
					}
					h.step(50 * time.Millisecond)
					h.scrape(ep("a", 0), ep("b", 0))
					if err := checkInvariants(h.c); err != nil {
						t.Fatal(err)
					}
				}
				<-h.c.Shutdown(0)
				synctest.Wait()
				for _, cl := range calls {
					if !cl.finished() {
						t.Fatalf("%s got no outcome", cl.req.ID)
					}
				}
			})
		})
	}
}

// TestLearnedSlotLimit: two scrapes showing a request waiting at the running count make a small endpoint's limit, so
// the next request waits in the EPP rather than in the server. The request that waited there tells whether the limit
// is real: starting after one of the EPP's requests there ended, long after it was sent, it confirms the limit, which
// is then strict; starting with nothing ended, it disproves it. Without such evidence the endpoint may run one more
// once nothing waits there (the probe), whose first chunk tells the same.
func TestLearnedSlotLimit(t *testing.T) {
	const prompt = 20 * time.Millisecond
	tests := []struct {
		name string
		// waiter is what becomes of the request that waited in the server: "slot" (starts after an end), "at once"
		// (starts with nothing ended) or "failed" (ends without a first chunk).
		waiter string
		// probe: after a failed waiter, whether one more goes beyond the limit and then waits for a slot.
		probe bool
		// running is what the last scrape shows; nextWaits, whether the request after it, of priority next, waits in
		// the EPP.
		running   int
		next      int
		nextWaits bool
		// nextTenant sends the request after it for another tenant than the one that sent the rest ("t").
		nextTenant string
		// light: a tenant "light" sent one request first (it ended at once), so it is under its share.
		light bool
	}{
		{name: "it waited for a slot: strict", waiter: "slot", running: 4, nextWaits: true},
		{name: "it started with nothing ended: forgotten", waiter: "at once", running: 5},
		{name: "no evidence: one more may go", waiter: "failed", running: 4},
		// A Critical request is never the probe: it turns the Critical reserve on, under which a learned limit is
		// strict (in the EPP it goes first to the next seat that frees).
		{name: "no evidence: Critical is no probe", waiter: "failed", running: 4, next: 1, nextWaits: true},
		{name: "the probe waited for a slot: strict", waiter: "failed", probe: true, running: 4, nextWaits: true},
		// Nor is a request of a tenant under its share (tenantseats.go): it goes first to the next seat that frees.
		{name: "no evidence: a tenant under its share is no probe", waiter: "failed", running: 4, nextWaits: true,
			nextTenant: "light"},
		// Nor, then, is a request of its band-mates (yieldsLocked): the probe would take the next slot to free there.
		{name: "no evidence: a band-mate of a tenant under its share is no probe", waiter: "failed", running: 4,
			nextWaits: true, light: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, streamedAs := slotBoundHarness(t)
				streamed := func(priority int) *call { return streamedAs("t", priority) }
				next := func() *call {
					if tt.nextTenant != "" {
						return streamedAs(tt.nextTenant, tt.next)
					}
					return streamed(tt.next)
				}
				if tt.light {
					cl := streamedAs("light", 0)
					cl.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Release(cl.req.ID)
				}
				var sent []*call
				for range 5 { // nothing is known yet: all five go, and the fifth waits in the server
					cl := streamed(0)
					cl.wantOutcome(t, Dispatched, ReasonNone)
					sent = append(sent, cl)
				}
				h.step(prompt)
				for _, cl := range sent[:4] {
					h.c.Started(cl.req.ID)
				}
				for range fastPlateauScrapes {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: 4, WaitingQueue: 1})
				}
				held := next()
				held.wantWaiting(t) // five in flight, four slots learned, one waiting there
				h.step(prompt)
				switch tt.waiter {
				case "slot":
					h.c.Release(sent[0].req.ID)
					h.step(prompt)
					h.c.Started(sent[4].req.ID)
				case "at once":
					h.c.Started(sent[4].req.ID)
				case "failed":
					h.c.Release(sent[4].req.ID)
				}
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: tt.running})
				if tt.probe {
					held.wantOutcome(t, Dispatched, ReasonNone) // nothing waits there: one more may go
					h.step(300 * time.Millisecond)
					h.c.Release(sent[0].req.ID)
					h.step(prompt)
					h.c.Started(held.req.ID)
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: tt.running})
					held = next()
				}
				if tt.nextWaits {
					held.wantWaiting(t)
				} else {
					held.wantOutcome(t, Dispatched, ReasonNone)
				}
			})
		})
	}
}

// TestLateEnd: under CPU load the end of a response can reach the EPP after the first chunk of the request the
// server started in its slot. The EPP then counts one more running than the server runs, and the request that waited
// there seems to start with nothing ended; neither is believed until one prompt's time has passed without the end
// arriving, and the end that arrives in that time tells what it would have in order (the request waited for a slot:
// the limit is strict). A scrape showing more running is believed at once.
func TestLateEnd(t *testing.T) {
	tests := []struct {
		name string
		// endAfter is when the end of the first request reaches the EPP, after the waiting request's first chunk
		// (negative: before it); running is what the next scrape shows.
		endAfter time.Duration
		running  int
		// slots, confirmed and maxRunning are what the endpoint has learned then; dispatched, how many of two
		// requests sent next go at once (with the limit strict none does).
		slots, maxRunning int
		confirmed         bool
		dispatched        int
	}{
		{name: "end before the first chunk", endAfter: -time.Millisecond, running: 4, slots: 4, maxRunning: 4,
			confirmed: true},
		{name: "end after the first chunk, within a prompt's time", endAfter: 3 * time.Millisecond, running: 4,
			slots: 4, maxRunning: 4, confirmed: true},
		{name: "no end within a prompt's time: forgotten", endAfter: 60 * time.Millisecond, running: 4,
			maxRunning: 5, dispatched: 2},
		{name: "a scrape shows five running: forgotten", endAfter: 3 * time.Millisecond, running: 5, maxRunning: 5,
			dispatched: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, streamedAs := slotBoundHarness(t)
				streamed := func() *call { return streamedAs("t", 0) }
				var sent []*call
				for range 5 { // nothing is known yet: all five go, and the fifth waits in the server
					cl := streamed()
					cl.wantOutcome(t, Dispatched, ReasonNone)
					sent = append(sent, cl)
				}
				h.step(20 * time.Millisecond)
				for _, cl := range sent[:4] {
					h.c.Started(cl.req.ID)
				}
				for range fastPlateauScrapes {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: 4, WaitingQueue: 1})
				}
				// The first request ends in the server and the fifth takes its slot; the EPP hears of the end at
				// endAfter from the fifth's first chunk. Its prompt time here is about 15 ms.
				h.step(500 * time.Millisecond)
				if tt.endAfter < 0 {
					h.c.Release(sent[0].req.ID)
					h.step(-tt.endAfter)
					h.c.Started(sent[4].req.ID)
				} else {
					h.c.Started(sent[4].req.ID)
					if tt.endAfter < 50*time.Millisecond {
						h.step(tt.endAfter)
						h.c.Release(sent[0].req.ID)
					}
				}
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: tt.running})
				if tt.endAfter >= 50*time.Millisecond {
					h.step(tt.endAfter - 50*time.Millisecond)
					h.c.Release(sent[0].req.ID)
				}
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: tt.running})
				h.c.mu.Lock()
				l := h.c.endpoints[h.c.endpointIndex["a"]].learner
				h.c.mu.Unlock()
				if l.slots != tt.slots || l.confirmed != tt.confirmed || l.maxRunning != tt.maxRunning {
					t.Errorf("slots %d (confirmed %v), most run %d; want %d (%v), %d", l.slots, l.confirmed,
						l.maxRunning, tt.slots, tt.confirmed, tt.maxRunning)
				}
				for i, cl := range []*call{streamed(), streamed()} {
					if i < tt.dispatched {
						cl.wantOutcome(t, Dispatched, ReasonNone)
					} else {
						cl.wantWaiting(t)
					}
				}
			})
		})
	}
}

// TestForeignLoadDoesNotStarve: an endpoint whose scrapes keep showing requests the EPP did not send (another
// replica's, or load sent around the gateway) fills its seats with them for as long as that load lasts; the
// foreign-load floor still sends it one request at a time, so every request is served, each with exactly one outcome.
// Without the floor each case below waits until its queue time ends.
func TestForeignLoadDoesNotStarve(t *testing.T) {
	cases := []struct {
		name string
		cfg  func(*Config)
		// report is what every scrape of the only endpoint shows, whatever the EPP sent it.
		report Endpoint
		// priorities are cycled through by the arrivals; a Critical one keeps the Critical reserve (seats) on.
		priorities []int
	}{{
		name:       "learned slots, foreign queue",
		cfg:        func(c *Config) { c.Endpoint.QueueDepth = 100 },
		report:     Endpoint{Name: "a", Running: 4, WaitingQueue: 5},
		priorities: []int{0},
	}, {
		name:       "stated concurrency, every seat foreign",
		cfg:        func(c *Config) { c.Endpoint.Concurrency = 4 },
		report:     Endpoint{Name: "a", Running: 4},
		priorities: []int{1, 0, 0},
	}, {
		name:       "tentative seats under the Critical reserve",
		cfg:        func(c *Config) { c.Endpoint.QueueDepth = 100 },
		report:     Endpoint{Name: "a", Running: 1, WaitingQueue: 1},
		priorities: []int{1, 0},
	}}
	const (
		interval = 50 * time.Millisecond
		hold     = 2 // scrape intervals a dispatched request runs before it ends
		every    = 3 // scrape intervals between arrivals: slower than one request at a time serves
		arrivals = 30
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, tc.cfg))
				var calls []*call
				dispatchedAt := map[string]int{}
				for round := 0; round < every*arrivals+20; round++ {
					h.scrape(tc.report)
					if err := checkInvariants(h.c); err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					for _, cl := range calls {
						id := cl.req.ID
						if _, seen := dispatchedAt[id]; !seen && cl.finished() && cl.result(t).Outcome == Dispatched {
							dispatchedAt[id] = round
						}
						if at, ok := dispatchedAt[id]; ok && round-at == hold {
							h.c.Release(id)
							synctest.Wait()
						}
					}
					if n := len(calls); n < arrivals && round%every == 0 {
						calls = append(calls, h.admit(tc.priorities[n%len(tc.priorities)], "t", 1))
					}
					h.step(interval)
				}
				for _, cl := range calls {
					cl.wantOutcome(t, Dispatched, ReasonNone)
				}
				if s := h.c.Stats(); s.InFlight != 0 || s.Queued != [NumBands]int{} {
					t.Fatalf("stats %+v, want nothing in flight or waiting", s)
				}
			})
		})
	}
}

// TestEjectedSeatsReserveNothing: the idle seats of an ejected endpoint are nobody's, so they do not count towards
// the Critical reserve: once the usable seat-bound endpoints are down to their reserve, a waiting Standard request
// keeps waiting although the ejected endpoint stands idle.
func TestEjectedSeatsReserveNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSeatHarness(t)
		h.scrape(ep("b", 0))
		onB := []*call{h.admit(1, "t", 1), h.admit(0, "t", 1)}
		for _, cl := range onB {
			cl.wantOutcome(t, Dispatched, ReasonNone)
		}
		h.scrape(ep("a", 0), ep("b", 0))
		onA := []*call{h.admit(0, "t", 1), h.admit(0, "t", 1)}
		for _, cl := range onA {
			if d := cl.wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, []string{"a"}) {
				t.Fatalf("dispatched on %v, want [a]: b is full", d.Endpoints)
			}
		}
		waiting := h.admit(0, "t", 1)
		waiting.wantWaiting(t)

		h.step(time.Second)
		b := ep("b", 0)
		b.Ejected = true
		h.scrape(ep("a", 0), b)
		for _, cl := range onB {
			h.c.Release(cl.req.ID)
		}
		synctest.Wait()
		waiting.wantWaiting(t) // b is idle but ejected
		h.c.Release(onA[0].req.ID)
		synctest.Wait()
		waiting.wantWaiting(t) // a's freed seat is Critical's reserve; b's idle seats are not
	})
}

// TestRankByKVRoom: under the Critical reserve a KV-bound endpoint ranks by its occupancy over the seats its KV cache
// has room for (kvRoomFill of what fills it), not over the most it has run: a request goes where it starts at once,
// not to a server whose cache is nearly full while another has room. An endpoint whose KV cache holds all its seats,
// or whose KV use is unknown, ranks by its seats as before.
func TestRankByKVRoom(t *testing.T) {
	// Each endpoint first queues at 11 running (tentative seats: 11) with its KV use at full, then runs occupied
	// requests with KV use kv: the running count over KV use is what fills its cache.
	for _, tc := range []struct {
		name     string
		full     float64 // KV use at the scrape that showed 11 running and a queue
		occupied int
		kv       float64
		want     float64 // the rank
	}{
		// Fills at 11 requests: room for int(0.9 * 11) = 9; 9 of them are taken.
		{name: "kv-bound, room taken", full: 1.0, occupied: 9, kv: 0.82, want: 1},
		{name: "kv-bound, room left", full: 1.0, occupied: 6, kv: 0.55, want: 6.0 / 9},
		// Fills at 55 requests: its 11 seats all fit.
		{name: "room for every seat", full: 0.2, occupied: 10, kv: 0.18, want: 10.0 / 11},
		// Reports no KV use: only its seats say anything.
		{name: "no KV use reported", full: 0, occupied: 9, kv: 0, want: 9.0 / 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				// A Critical request arrives and ends: the reserve is on, schedulers rank by seats.
				h.scrape(ep("a", 0))
				critical := h.admit(1, "t", 1)
				critical.wantOutcome(t, Dispatched, ReasonNone)
				h.c.Release(critical.req.ID)
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 11, WaitingQueue: 1, KVCacheUsage: tc.full})
				// Two scrapes in a row show the requests of another sender: the occupancy.
				for range 2 {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: tc.occupied, KVCacheUsage: tc.kv})
				}
				got := make([]float64, 1)
				h.c.Saturations("", []string{"a"}, got)
				if math.Abs(got[0]-tc.want) > 0.01 {
					t.Fatalf("rank %.3f, want %.3f", got[0], tc.want)
				}
			})
		})
	}
}

// TestRankAdopted: under the Critical reserve endpoints rank by their occupancy over their seats. An endpoint that
// joined after a peer replica had been live (taken over from a departed peer) and has no seat count learned here
// ranks by its occupancy over the pool's seats (the slot limit learned, else the most the pool has run), not as idle
// while it runs that many; once it has seats of its own it ranks by them. One that joined a replica that never had
// peers, or any endpoint outside the reserve, ranks by its queue as before.
func TestRankAdopted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hadPeers  bool // a peer was live before b joined
		peersStay bool // and still is (three replicas, one gone)
		reserveOn bool
		slotLimit bool // a's queue shows a plateau long enough to learn its slot limit (4)
		bQueues   bool // b then queues at 4: seats of its own
		want      []float64
	}{
		{name: "adopted, peers gone", hadPeers: true, reserveOn: true, want: []float64{0.5, 1}},
		{name: "adopted, a peer still live", hadPeers: true, peersStay: true, reserveOn: true, want: []float64{0.5, 1}},
		{name: "adopted, the pool's slot limit", hadPeers: true, reserveOn: true, slotLimit: true, want: []float64{0.5, 1}},
		{name: "adopted, seats of its own since", hadPeers: true, reserveOn: true, bQueues: true, want: []float64{0.5, 1}},
		{name: "never had peers", reserveOn: true, want: []float64{0.5, 0}},
		{name: "adopted, no Critical traffic", hadPeers: true, want: []float64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, nil))
				h.scrape(ep("a", 0))
				if tc.hadPeers {
					h.c.SetPeers(Peers{ReserveShare: func(pool, _ int) int { return pool }})
				}
				h.step(50 * time.Millisecond)
				h.scrape(ep("a", 0), ep("b", 0)) // b joins
				if tc.hadPeers && !tc.peersStay {
					h.c.SetPeers(Peers{})
				}
				if tc.reserveOn {
					critical := h.admit(1, "t", 1)
					critical.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Release(critical.req.ID)
				}
				// a queues at 4 running (tentative seats: 4); b runs 4, queueing only if bQueues.
				bWaiting := 0
				if tc.bQueues {
					bWaiting = 1
				}
				plateau := 1
				if tc.slotLimit {
					plateau = 4
				}
				for range plateau {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: 4, WaitingQueue: 1}, Endpoint{Name: "b", Running: 4, WaitingQueue: bWaiting})
				}
				// Two scrapes in a row show the requests of another sender: the occupancy.
				for range 2 {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: 2}, Endpoint{Name: "b", Running: 4})
				}
				got := make([]float64, 2)
				h.c.Saturations("", []string{"a", "b"}, got)
				if math.Abs(got[0]-tc.want[0]) > 0.01 || math.Abs(got[1]-tc.want[1]) > 0.01 {
					t.Fatalf("ranks %.3f, want %.3f", got, tc.want)
				}
			})
		})
	}
}

// TestPoolSlotsCap: once one endpoint of the pool has shown its slot limit, under the Critical reserve a lower band
// sends an endpoint whose own limit is unknown, and that was never seen running more, no more than that limit: the
// request beyond it would wait inside the server and take its first free slot ahead of Critical. Critical may go
// beyond it (and so show an endpoint that runs more); an endpoint seen running more, or the pool outside the reserve,
// is not capped.
func TestPoolSlotsCap(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bRan      int  // the most endpoint b was seen running before
		reserveOn bool // Critical traffic is active when the requests arrive
		priority  int  // of the request that finds b at a's limit
		wantWait  bool // it waits in the EPP; else it is dispatched to b
	}{
		{name: "capped at the pool's limit", reserveOn: true, priority: 0, wantWait: true},
		{name: "Critical goes beyond it", reserveOn: true, priority: 1},
		{name: "seen running more", bRan: 3, reserveOn: true, priority: 0},
		{name: "no Critical traffic", priority: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Pending, c.Endpoint.PendingTime = 0, 0 }))
				h.scrape(ep("a", 0), Endpoint{Name: "b", Running: tc.bRan})
				h.step(50 * time.Millisecond)
				h.scrape(ep("a", 0), ep("b", 0))
				if tc.reserveOn {
					critical := h.admit(1, "t", 1)
					critical.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Release(critical.req.ID)
				}
				// Two streamed requests start on each endpoint.
				for _, name := range []string{"a", "a", "b", "b"} {
					h.seq++
					cl := h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Bytes: 100, Streamed: true})
					cl.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Bind(cl.req.ID, name)
					h.c.Started(cl.req.ID)
				}
				// a shows a request waiting at the two it runs, twice: its slot limit is 2, the pool's.
				for range 2 {
					h.step(50 * time.Millisecond)
					h.scrape(Endpoint{Name: "a", Running: 2, WaitingQueue: 1}, Endpoint{Name: "b", Running: 2})
				}
				if h.c.poolSlots != 2 {
					t.Fatalf("pool slots %d, want 2", h.c.poolSlots)
				}
				cl := h.admit(tc.priority, "t", 1)
				if tc.wantWait {
					cl.wantWaiting(t)
					return
				}
				if d := cl.wantOutcome(t, Dispatched, ReasonNone); len(d.Endpoints) != 1 || d.Endpoints[0] != "b" {
					t.Fatalf("dispatched to %v, want [b]", d.Endpoints)
				}
			})
		})
	}
}

// TestWarmUpGrowth: in the warm-up (no seat-bound request has ended yet) under the Critical reserve, once the pool
// has a slot limit, a band below Critical does not go beyond the seats of an endpoint whose own limit is not known
// (the places beyond them are where every Critical arrival of the warm-up must start); Critical does, and so does a
// lower band once a request has ended, without a slot limit in the pool, or without Critical traffic.
func TestWarmUpGrowth(t *testing.T) {
	for _, tc := range []struct {
		name      string
		aLearns   bool // a shows its slot limit, the pool's
		reserveOn bool // Critical traffic is active
		ended     bool // a seat-bound request ended before (the hold time is known)
		priority  int  // of the request that finds b's seats full
		wantWait  bool // it waits in the EPP; else it is dispatched to b
	}{
		{name: "a lower band does not grow b", aLearns: true, reserveOn: true, priority: 0, wantWait: true},
		{name: "Critical grows b", aLearns: true, reserveOn: true, priority: 1},
		{name: "a request has ended", aLearns: true, reserveOn: true, ended: true, priority: 0},
		{name: "no slot limit in the pool", reserveOn: true, priority: 0},
		{name: "no Critical traffic", aLearns: true, priority: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Pending, c.Endpoint.PendingTime = 0, 0 }))
				h.scrape(ep("a", 0), ep("b", 0))
				if tc.reserveOn {
					critical := h.admit(1, "t", 1)
					critical.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Release(critical.req.ID)
				}
				// Two streamed requests start on a, three on b.
				var onA []string
				for _, name := range []string{"a", "a", "b", "b", "b"} {
					h.seq++
					cl := h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Bytes: 100, Streamed: true})
					cl.wantOutcome(t, Dispatched, ReasonNone)
					h.c.Bind(cl.req.ID, name)
					h.c.Started(cl.req.ID)
					if name == "a" {
						onA = append(onA, cl.req.ID)
					}
				}
				// b shows a request waiting once (a step's queue, no plateau): its seats are the three it runs, its
				// limit unknown. a shows one waiting at its two twice when aLearns (its slot limit, the pool's), else
				// once, in the latest scrape: it is full either way.
				aWaiting := 0
				if tc.aLearns {
					aWaiting = 1
				}
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2, WaitingQueue: aWaiting}, Endpoint{Name: "b", Running: 3, WaitingQueue: 1})
				h.step(50 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: 2, WaitingQueue: 1}, Endpoint{Name: "b", Running: 3})
				if want := map[bool]int{true: 2}[tc.aLearns]; h.c.poolSlots != want {
					t.Fatalf("pool slots %d, want %d", h.c.poolSlots, want)
				}
				if tc.ended {
					h.step(time.Second)
					h.c.Release(onA[0])
					synctest.Wait()
					if h.c.holdTime == 0 {
						t.Fatal("no hold time learned")
					}
				}
				if !tc.reserveOn {
					// Seats kept for a tenant under its share (seatsFull) do not hold the ramp: the warm-up's places
					// are kept for Critical's arrivals only.
					h.c.mu.Lock()
					b := &h.c.endpoints[h.c.endpointIndex["b"]]
					may := h.c.mayTakeLocked(b, Standard, false, true, false, true, false, h.clk.Now())
					h.c.mu.Unlock()
					if !may {
						t.Fatal("seats kept for a tenant under its share kept a lower band from growing b")
					}
				}
				cl := h.admit(tc.priority, "t", 1)
				if tc.wantWait {
					cl.wantWaiting(t)
					return
				}
				d := cl.wantOutcome(t, Dispatched, ReasonNone)
				if len(d.Endpoints) != 1 || d.Endpoints[0] != "b" {
					t.Fatalf("dispatched to %v, want [b]", d.Endpoints)
				}
			})
		})
	}
}

// slotBoundHarness returns a harness whose endpoint "a", scraped idle, is bound by its slots alone (neither the queue
// depth nor the pending prompts bound it), and a sender of streamed requests of a tenant at a priority.
func slotBoundHarness(t *testing.T) (*harness, func(tenant string, priority int) *call) {
	t.Helper()
	h := newHarness(t, testConfig(t, func(c *Config) {
		c.Endpoint.QueueDepth, c.Endpoint.PendingTime = 100, 0
	}))
	h.scrape(ep("a", 0))
	return h, func(tenant string, priority int) *call {
		h.seq++
		return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: tenant, Priority: priority, Bytes: 100,
			Streamed: true})
	}
}
