package flowcontrol

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 4), ep("b", 0), ep("c", 9))
		d := h.admit(0, "t", 10).wantOutcome(t, Dispatched, ReasonNone)
		if !slices.Equal(d.Endpoints, []string{"a", "b"}) || d.Waited != 0 || d.Band != Standard || d.RetryAfter != 0 ||
			d.Reserved != "b" {
			t.Fatalf("decision = %+v, want endpoints [a b] and reserved on b, no wait, band Standard", d)
		}
		if s := h.c.Stats(); s.Reserved != 1 || s.Queued != [NumBands]int{} {
			t.Fatalf("stats = %+v, want one reservation and nothing queued", s)
		}
		// Reservations go to the least saturated endpoint: b until it levels with a at 4, then a (first on ties).
		for range 3 {
			h.admit(0, "t", 10).wantOutcome(t, Dispatched, ReasonNone)
		}
		if d = h.admit(0, "t", 10).wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, []string{"a", "b"}) ||
			d.Reserved != "a" {
			t.Fatalf("endpoints = %v reserved on %q, want [a b] reserved on a", d.Endpoints, d.Reserved)
		}
		if d = h.admit(0, "t", 10).wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, []string{"b"}) {
			t.Fatalf("endpoints = %v, want [b] (a is full)", d.Endpoints)
		}
		h.admit(0, "t", 10).wantWaiting(t) // a and b both at their threshold until the next scrape
	})
}

// TestStrictPriority: with the pool full, requests wait; as headroom appears one slot at a time they leave strictly
// by band, FIFO within a band.
func TestStrictPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, queueingSheddable))
		h.scrape(ep("a", 5))
		s1 := h.admit(0, "t", 1)
		x1 := h.admit(-1, "t", 1)
		c1 := h.admit(1, "t", 1)
		s2 := h.admit(0, "t", 1)
		c2 := h.admit(5, "t", 1)
		calls := []*call{s1, x1, c1, s2, c2}
		for _, cl := range calls {
			cl.wantWaiting(t)
		}
		var order []string
		for range calls {
			// A later scrape shows one free slot (and covers the previous dispatch's reservation).
			h.step(10 * time.Millisecond)
			h.scrape(ep("a", 4))
			got := dispatchedIDs(calls...)
			for _, cl := range calls {
				if cl.finished() && cl.d.Outcome == Dispatched && cl.d.Reserved != "a" {
					t.Fatalf("%s dispatched after waiting, reserved on %q, want a", cl.req.ID, cl.d.Reserved)
				}
			}
			if len(got) != len(order)+1 {
				t.Fatalf("after a one-slot scrape, dispatched %v (before: %v)", got, order)
			}
			for _, id := range got {
				if !slices.Contains(order, id) {
					order = append(order, id)
				}
			}
		}
		want := []string{c1.req.ID, c2.req.ID, s1.req.ID, s2.req.ID, x1.req.ID}
		if !slices.Equal(order, want) {
			t.Fatalf("dispatch order %v, want %v", order, want)
		}
		if d := c1.result(t); d.Waited != 10*time.Millisecond || !slices.Equal(d.Endpoints, []string{"a"}) {
			t.Fatalf("c1 decision %+v", d)
		}
	})
}

// TestPerEndpointDispatch reproduces upstream's goodput failure: nine endpoints far past their thresholds and one
// idle, so the pool's average saturation is ~9x. Requests must still flow to the idle endpoint, and only to it.
func TestPerEndpointDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		busy := func() []Endpoint {
			var eps []Endpoint
			for _, n := range []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8"} {
				eps = append(eps, Endpoint{Name: n, WaitingQueue: 50, KVCacheUsage: 0.99})
			}
			return eps
		}
		h.scrape(append(busy(), Endpoint{Name: "idle", WaitingQueue: 50, KVCacheUsage: 0.2})...)
		var waiting []*call
		for range 7 {
			cl := h.admit(0, "t", 1)
			cl.wantWaiting(t)
			waiting = append(waiting, cl)
		}
		if avg := h.rec.lastSample().PoolSaturation; avg < 5 {
			t.Fatalf("pool saturation %v; the scenario needs a high average", avg)
		}

		h.step(10 * time.Millisecond)
		h.scrape(append(busy(), Endpoint{Name: "idle", KVCacheUsage: 0.2})...)
		// The idle endpoint takes five (its queue-depth threshold) before the scrape; two keep waiting.
		got := dispatchedIDs(waiting...)
		if len(got) != 5 {
			t.Fatalf("dispatched %d onto the idle endpoint, want 5", len(got))
		}
		for _, cl := range waiting[:5] {
			if d := cl.result(t); !slices.Equal(d.Endpoints, []string{"idle"}) {
				t.Fatalf("%s restricted to %v, want [idle]", cl.req.ID, d.Endpoints)
			}
		}
		waiting[5].wantWaiting(t)
		if avg := h.rec.lastSample().PoolSaturation; avg < 5 {
			t.Fatalf("pool saturation %v while dispatching; want the average still high", avg)
		}
		// A new arrival does not jump the two waiting ones.
		late := h.admit(0, "t", 1)
		late.wantWaiting(t)
		h.c.Release(waiting[0].req.ID)
		synctest.Wait()
		waiting[5].wantOutcome(t, Dispatched, ReasonNone)
		waiting[6].wantWaiting(t)
		late.wantWaiting(t)
	})
}

// TestReservations: the EPP's own dispatches count against an endpoint until a later scrape covers them, so a burst
// between scrapes does not pile onto one endpoint; Release and Bind adjust the count.
func TestReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0), ep("b", 3))
		// a takes 5, b takes 2 (3 waiting + 2 reserved = threshold), interleaved by least saturation.
		var first []*call
		for range 7 {
			first = append(first, h.admit(0, "t", 1))
		}
		for _, cl := range first {
			cl.wantOutcome(t, Dispatched, ReasonNone)
		}
		if d := first[6].result(t); !slices.Equal(d.Endpoints, []string{"b"}) {
			t.Fatalf("last of the burst restricted to %v", d.Endpoints)
		}
		next := h.admit(0, "t", 1)
		next.wantWaiting(t)

		// A scrape at the same instant does not cover reservations made at that instant.
		h.scrape(ep("a", 0), ep("b", 3))
		next.wantWaiting(t)

		// Release of one request frees its slot.
		if !h.c.Release(first[0].req.ID) {
			t.Fatal("Release found no reservation")
		}
		synctest.Wait()
		next.wantOutcome(t, Dispatched, ReasonNone)
		if h.c.Release(first[0].req.ID) {
			t.Fatal("second Release found a reservation")
		}

		// Bind moves a reservation: moving one of a's onto b (full) frees a slot on a.
		blocked := h.admit(0, "t", 1)
		blocked.wantWaiting(t)
		if !h.c.Bind(first[1].req.ID, "b") {
			t.Fatal("Bind found no reservation")
		}
		synctest.Wait()
		if d := blocked.wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, []string{"a"}) {
			t.Fatalf("after Bind, restricted to %v, want [a]", d.Endpoints)
		}

		// A later scrape covers everything dispatched before it.
		h.step(50 * time.Millisecond)
		h.scrape(ep("a", 5), ep("b", 5))
		s := h.c.Stats()
		if s.Reserved != 0 {
			t.Fatalf("%d reservations survive a covering scrape", s.Reserved)
		}
		// The requests are still in flight: the EPP counts them until they end, fresher than any scrape.
		if !h.c.Release(first[2].req.ID) {
			t.Fatal("Release after a covering scrape found no request in flight")
		}
		if got := h.c.Stats().InFlight; got != s.InFlight-1 {
			t.Fatalf("in flight after Release: %d, want %d", got, s.InFlight-1)
		}
		if h.c.Release(first[2].req.ID) {
			t.Fatal("second Release after a covering scrape found a reservation")
		}
	})
}

// TestBindCountsOnceAfterAnEarlierScrape: the caller sends a request after Bind, so a scrape taken between its
// dispatch and its Bind cannot show it, even though that scrape covered its provisional reservation. Bind counts it
// on its endpoint again until a scrape taken after Bind does; then only that scrape counts it. Counting it once each
// time, the endpoint is full for the next request throughout.
func TestBindCountsOnceAfterAnEarlierScrape(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Endpoint.QueueDepth = 1
			c.Endpoint.Pending, c.Endpoint.PendingTime = 0, 0 // count waiting requests only
		}))
		h.scrape(ep("a", 0))
		sent := h.admitReq(Request{ID: "sent", Tenant: "t", Streamed: true}) // stays reserved while pending
		sent.wantOutcome(t, Dispatched, ReasonNone)
		h.step(10 * time.Millisecond)
		h.scrape(ep("a", 0)) // after the dispatch, before the request is sent
		h.step(time.Millisecond)
		if !h.c.Bind("sent", "a") {
			t.Fatal("Bind found no reservation for a pending request")
		}
		synctest.Wait()
		next := h.admit(0, "t", 1)
		next.wantWaiting(t) // a holds "sent", which no scrape has shown yet
		h.step(10 * time.Millisecond)
		h.scrape(ep("a", 1)) // taken after Bind: shows "sent" waiting there
		next.wantWaiting(t)
		h.scrape(ep("a", 0))
		next.wantOutcome(t, Dispatched, ReasonNone) // counted by the scrape only, not twice
	})
}

// TestCriticalReserve: while Critical requests arrive, a streamed request counts against its endpoint until its first
// response chunk (Started), not only until a scrape covers it: the scrape shows it running, yet its prompt still
// lengthens the endpoint's next steps, which a Critical prompt would share. Critical goes first to the next place
// that frees up; once Critical traffic stops, headroom is judged as before.
func TestCriticalReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.Pending, c.Endpoint.PendingTime = 2, 0 }))
		h.scrape(ep("a", 0))
		streamed := func(priority int) *call {
			h.seq++
			return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Priority: priority, Bytes: 100, Streamed: true})
		}
		crit := streamed(1)
		crit.wantOutcome(t, Dispatched, ReasonNone)
		first := streamed(0)
		first.wantOutcome(t, Dispatched, ReasonNone)
		next := streamed(0) // two prompts pending on a: Standard waits
		next.wantWaiting(t)
		urgent := streamed(1) // and so does Critical, ahead of it
		urgent.wantWaiting(t)

		// A covering scrape shows them running; they have not started, so a stays saturated for Standard.
		h.step(50 * time.Millisecond)
		h.scrape(Endpoint{Name: "a", Running: 2})
		next.wantWaiting(t)
		if s := h.c.Stats(); s.Reserved != 2 || h.rec.lastSample().Reserved != 2 {
			t.Fatalf("%d reservations (queue sample: %d) after the scrape, want the 2 pending ones", s.Reserved, h.rec.lastSample().Reserved)
		}
		var sat [1]float64
		h.c.Saturations("", []string{"a"}, sat[:])
		if sat[0] != 2 {
			t.Fatalf("saturation for ranking %v, want 2 (one per pending prompt)", sat[0])
		}

		// First chunks free places, once each: Critical's first.
		if !h.c.Started(crit.req.ID) {
			t.Fatal("Started found no pending request")
		}
		synctest.Wait()
		urgent.wantOutcome(t, Dispatched, ReasonNone)
		next.wantWaiting(t)
		if !h.c.Started(first.req.ID) || !h.c.Started(urgent.req.ID) {
			t.Fatal("Started found no pending request")
		}
		synctest.Wait()
		next.wantOutcome(t, Dispatched, ReasonNone)
		if h.c.Started(first.req.ID) {
			t.Fatal("second Started found the request pending")
		}
		if !h.c.Release(first.req.ID) {
			t.Fatal("Release after Started and a covering scrape found no request in flight")
		}
		// Release ends a pending request that never started (the client went away).
		if !h.c.Release(next.req.ID) {
			t.Fatal("Release found no reservation for a pending request")
		}

		// Once no Critical request arrived for a drain-rate window, pending prompts no longer hold Standard back: the
		// end of the reserve dispatches what it held, without waiting for a scrape.
		streamed(1).wantOutcome(t, Dispatched, ReasonNone)
		streamed(1).wantOutcome(t, Dispatched, ReasonNone)
		held := streamed(0)
		held.wantWaiting(t)
		h.step(h.c.Config().DrainRateWindow - time.Millisecond)
		held.wantWaiting(t)
		h.step(time.Millisecond)
		held.wantOutcome(t, Dispatched, ReasonNone)
		h.scrape(Endpoint{Name: "a", Running: 3})
		more := []*call{streamed(0), streamed(0), streamed(0)}
		for _, cl := range more {
			cl.wantOutcome(t, Dispatched, ReasonNone)
		}
		plain := h.admit(0, "t", 1)
		plain.wantOutcome(t, Dispatched, ReasonNone)
		if h.c.Started(plain.req.ID) || h.c.Started("unknown") {
			t.Fatal("Started reported a non-streamed or unknown request as pending")
		}
	})
}

// TestPendingTime: under the shipped thresholds (time only, no count), an endpoint's pending prompts cost its learned
// first-chunk time each, divided among the prompts that were pending ahead, with no Critical traffic at all; an endpoint with nothing learned takes one pending prompt at a time; the learned time
// survives scrapes and is forgotten with the endpoint.
func TestPendingTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t, nil)
		if cfg.Endpoint.Pending != 0 || cfg.Endpoint.PendingTime != 100*time.Millisecond {
			t.Fatalf("default thresholds are %d pending, %v; this test assumes time only, 100ms", cfg.Endpoint.Pending, cfg.Endpoint.PendingTime)
		}
		h := newHarness(t, cfg)
		h.scrape(ep("fast", 0), ep("slow", 0))
		streamed := func(priority int) *call {
			h.seq++
			return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Priority: priority, Bytes: 100, Streamed: true})
		}
		dispatchedTo := func(cl *call, want ...string) {
			t.Helper()
			if d := cl.wantOutcome(t, Dispatched, ReasonNone); !slices.Equal(d.Endpoints, want) {
				t.Fatalf("%s: endpoints with headroom %v, want %v", cl.req.ID, d.Endpoints, want)
			}
		}

		// Nothing learned: one pending prompt saturates an endpoint. No Critical traffic yet: the time applies anyway.
		first := streamed(0)
		dispatchedTo(first, "fast", "slow")
		h.c.Bind(first.req.ID, "slow")
		a := streamed(0)
		dispatchedTo(a, "fast")
		h.c.Bind(a.req.ID, "fast")
		b := streamed(0)
		b.wantWaiting(t)

		// slow learns 300ms from a lone prompt; its place frees up and b goes, then moves to fast behind a.
		h.step(300 * time.Millisecond)
		h.c.Started(first.req.ID)
		synctest.Wait()
		dispatchedTo(b, "slow")
		h.c.Bind(b.req.ID, "fast")
		h.c.Release(a.req.ID) // a never started (its client went away): no lesson
		// fast learns 75ms: b took 150ms with one prompt ahead of it.
		h.step(150 * time.Millisecond)
		h.c.Started(b.req.ID)
		h.step(10 * time.Millisecond)
		h.scrape(Endpoint{Name: "fast", Running: 1}, Endpoint{Name: "slow", Running: 1}) // the times outlive it

		one := streamed(0)
		dispatchedTo(one, "fast", "slow")
		h.c.Bind(one.req.ID, "slow") // 1 × 300ms: slow is saturated
		two := streamed(0)
		dispatchedTo(two, "fast")
		h.c.Bind(two.req.ID, "fast") // 1 × 75ms: fast still has headroom
		three := streamed(0)
		dispatchedTo(three, "fast")
		h.c.Bind(three.req.ID, "fast") // 2 × 75ms: saturated
		four := streamed(0)
		four.wantWaiting(t)

		// slow leaves (its pending prompt and its time go) and comes back with nothing learned.
		h.step(10 * time.Millisecond)
		h.scrape(Endpoint{Name: "fast", Running: 3})
		h.step(10 * time.Millisecond)
		h.scrape(Endpoint{Name: "fast", Running: 3}, Endpoint{Name: "slow", Running: 1})
		dispatchedTo(four, "slow")
		h.c.Bind(four.req.ID, "slow")
		streamed(0).wantWaiting(t)
	})
}

// TestBurstTier: when no endpoint has headroom in the normal tier and no Critical traffic is active, a band may
// dispatch to endpoints judged by the burst thresholds; an endpoint with normal headroom is preferred to any in the
// burst tier; Critical traffic turns the tier off until its drain-rate window ends, and the end dispatches what it
// held; the burst tier's pending time bounds the prompts a learned endpoint takes.
func TestBurstTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Endpoint.BurstQueueDepth = 10
			c.Endpoint.BurstPendingTime = 400 * time.Millisecond
		}))
		dispatchedTo := func(cl *call, burst bool, want ...string) {
			t.Helper()
			d := cl.wantOutcome(t, Dispatched, ReasonNone)
			if !slices.Equal(d.Endpoints, want) || d.Burst != burst {
				t.Fatalf("%s: endpoints with headroom %v, burst tier %v; want %v, %v", cl.req.ID, d.Endpoints, d.Burst, want, burst)
			}
		}

		// a is past the normal queue depth (5 of 5), within the burst one (5 of 10); b has normal headroom.
		// Each scrape comes a moment after the last dispatch and covers it.
		h.scrape(ep("a", 5), ep("b", 4))
		dispatchedTo(h.admit(0, "t", 1), false, "b")
		h.step(time.Millisecond)
		h.scrape(ep("a", 5), ep("b", 5))
		dispatchedTo(h.admit(0, "t", 1), true, "a", "b")
		h.step(time.Millisecond)
		h.scrape(ep("a", 10), ep("b", 9))
		dispatchedTo(h.admit(0, "t", 1), true, "b")
		h.admit(0, "t", 1).wantWaiting(t) // b has 10 of 10 now: nothing left in either tier

		// Critical traffic turns the burst tier off: Standard waits behind a normally saturated pool.
		h.step(time.Millisecond)
		h.scrape(ep("a", 5), ep("b", 5)) // the waiting request goes to the burst tier
		h.admit(1, "t", 1).wantWaiting(t)
		held := h.admit(0, "t", 1)
		held.wantWaiting(t)
		h.step(h.c.Config().DrainRateWindow - time.Millisecond)
		held.wantWaiting(t)
		h.step(time.Millisecond)
		held.wantOutcome(t, Dispatched, ReasonNone)

		// The burst tier's time: fast learns 100ms per prompt, so the normal tier (100ms) takes one pending prompt and
		// the burst tier (400ms) three more.
		h.scrape(Endpoint{Name: "fast"})
		streamed := func() *call {
			h.seq++
			return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Bytes: 100, Streamed: true})
		}
		lesson := streamed()
		dispatchedTo(lesson, false, "fast")
		h.step(100 * time.Millisecond)
		h.c.Started(lesson.req.ID)
		h.scrape(Endpoint{Name: "fast", Running: 1})
		dispatchedTo(streamed(), false, "fast") // normal tier: nothing pending
		for range 3 {
			dispatchedTo(streamed(), true, "fast") // burst tier: 1, 2, 3 pending of 100ms each, under 400ms
		}
		streamed().wantWaiting(t) // 4 × 100ms: saturated in the burst tier too
	})
}

// TestBurstTierLimits: a band that rejects when saturated never uses the burst tier; without a normal pending time
// the burst tier has none either; a Critical arrival that starts the reserve while requests wait arms a timer for
// the reserve's end, which may dispatch them.
func TestBurstTierLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.BurstQueueDepth = 10 }))
		h.scrape(ep("a", 5)) // saturated in the normal tier, room in the burst tier
		h.admit(-1, "t", 1).wantOutcome(t, Rejected, ReasonSaturated)
		if d := h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone); !d.Burst {
			t.Fatal("Standard did not use the burst tier")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Endpoint.PendingTime, c.Endpoint.BurstQueueDepth, c.Endpoint.BurstPendingTime = 0, 10, 400*time.Millisecond
		}))
		h.scrape(ep("a", 0))
		for i := range 9 { // 9 unscraped streamed prompts, nothing learned: only the burst count bounds them
			h.seq++
			cl := h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "t", Bytes: 100, Streamed: true})
			if d := cl.wantOutcome(t, Dispatched, ReasonNone); d.Burst != (i >= 5) {
				t.Fatalf("prompt %d: burst tier %v", i, d.Burst)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Bands[Standard].SaturationCeiling = 0.8
			c.Bands[Sheddable].SaturationCeiling = 0.8
		}))
		h.scrape(ep("a", 4)) // 0.8: none for Standard, room for Critical
		waiting := h.admit(0, "t", 1)
		waiting.wantWaiting(t)
		h.admit(1, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // the fast path
		h.c.mu.Lock()
		armed, end := h.c.ttlAt, h.clk.Now().Add(h.c.cfg.DrainRateWindow)
		h.c.mu.Unlock()
		if armed.IsZero() || armed.After(end) {
			t.Fatalf("timer at %v, want one no later than the reserve's end %v", armed, end)
		}
	})
}

// TestMayExceedHeadroom: the headroom filter's prefix-affinity exception needs fresh metrics, a band that queues when
// saturated, and, under the Critical reserve, the Critical band.
func TestMayExceedHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.MetricsStaleness = time.Second }))
		h.scrape(Endpoint{Name: "fresh"}, Endpoint{Name: "stale", ScrapedAt: h.clk.Now().Add(-time.Minute)})
		check := func(what string, band Band, name string, want bool) {
			t.Helper()
			if got := h.c.MayExceedHeadroom(band, name); got != want {
				t.Errorf("%s: MayExceedHeadroom(%s, %q) = %v, want %v", what, band, name, got, want)
			}
		}
		if got := h.rec.lastSample().StaleEndpoints; got != 1 {
			t.Errorf("queue sample counts %d stale endpoints, want 1", got)
		}
		check("Standard, no reserve", Standard, "fresh", true)
		check("Critical", Critical, "fresh", true)
		check("holdback band", Sheddable, "fresh", false)
		check("stale metrics", Standard, "stale", false)
		check("unknown endpoint", Standard, "gone", false)
		check("no such band", NumBands, "fresh", false)
		h.admit(1, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // Critical traffic: the reserve is on
		check("Standard under the reserve", Standard, "fresh", false)
		check("Critical under the reserve", Critical, "fresh", true)
	})
}

// TestInvalidCriticalLeavesReserveOff: a Critical request rejected as invalid is not Critical traffic, so it does not
// switch the Critical reserve on (which would hold the burst tier and prefix-affinity overflow from lower bands).
func TestInvalidCriticalLeavesReserveOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
	}{
		{"empty ID", Request{ID: "", Priority: 1}},
		{"negative size", Request{ID: "neg", Priority: 1, Bytes: -1}},
		{"ID already dispatched", Request{ID: "dispatched", Priority: 1}},
		{"ID already waiting", Request{ID: "waiting", Priority: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.QueueDepth = 1 }))
				h.scrape(ep("a", 0), ep("full", 1))
				h.admitReq(Request{ID: "dispatched", Tenant: "t"}).wantOutcome(t, Dispatched, ReasonNone)
				h.admitReq(Request{ID: "waiting", Tenant: "t"}).wantWaiting(t)
				h.admitReq(tc.req).wantOutcome(t, Rejected, ReasonInvalidRequest)
				if !h.c.MayExceedHeadroom(Standard, "full") {
					t.Fatal("a rejected Critical request switched the Critical reserve on")
				}
				h.admit(1, "t", 1) // a valid one does
				if h.c.MayExceedHeadroom(Standard, "full") {
					t.Fatal("a valid Critical request left the Critical reserve off")
				}
			})
		})
	}
}

// TestTenantFairnessController: a light tenant arriving behind a heavy tenant's backlog is served next, not after it.
func TestTenantFairnessController(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 5))
		var heavy []*call
		for range 20 {
			heavy = append(heavy, h.admit(0, "heavy", 100))
		}
		light := h.admit(0, "light", 100)
		h.c.Release("none") // no-op; exercises the unknown-ID path
		h.step(10 * time.Millisecond)
		h.scrape(ep("a", 3)) // two slots
		if got := dispatchedIDs(append(heavy, light)...); !slices.Equal(got, []string{heavy[0].req.ID, light.req.ID}) {
			t.Fatalf("dispatched %v, want the first heavy request and the light one", got)
		}
	})
}

func TestSheddableHoldback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 4)) // saturation 0.8: not below the holdback ceiling
		d := h.admit(-1, "t", 1).wantOutcome(t, Rejected, ReasonSaturated)
		if d.RetryAfter != time.Second || d.Band != Sheddable {
			t.Fatalf("holdback decision %+v, want Retry-After 1s (nothing queued)", d)
		}
		h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone) // Standard still has headroom
		h.step(10 * time.Millisecond)
		h.scrape(ep("a", 3))
		h.admit(-1, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
	})
}

func TestDisplacement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			queueingSheddable(c)
			c.MaxQueuedRequests = 3
			c.Bands[Standard].MayDisplace = false
		}))
		h.scrape(ep("a", 5))
		x1 := h.admit(-1, "t", 1)
		x2 := h.admit(-1, "t", 1)
		s1 := h.admit(0, "t", 1)
		// Full. Standard may not displace: refused.
		h.admit(0, "t", 1).wantOutcome(t, Rejected, ReasonQueueFull)
		// Critical displaces the newest Sheddable.
		c1 := h.admit(1, "t", 1)
		c1.wantWaiting(t)
		d := x2.wantOutcome(t, Rejected, ReasonDisplaced)
		if d.RetryAfter < time.Second || d.Band != Sheddable {
			t.Fatalf("displaced decision %+v", d)
		}
		x1.wantWaiting(t)
		c2 := h.admit(1, "t", 1)
		x1.wantOutcome(t, Rejected, ReasonDisplaced)
		// Then the newest of the next lowest band.
		c3 := h.admit(1, "t", 1)
		s1.wantOutcome(t, Rejected, ReasonDisplaced)
		// Nothing lower left: refused, nobody evicted.
		h.admit(1, "t", 1).wantOutcome(t, Rejected, ReasonQueueFull)
		for _, cl := range []*call{c1, c2, c3} {
			cl.wantWaiting(t)
		}
		if s := h.c.Stats(); s.Queued != [NumBands]int{3, 0, 0} {
			t.Fatalf("queued %v", s.Queued)
		}
	})
}

func TestBandCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			queueingSheddable(c)
			c.Bands[Critical].MaxQueuedRequests = 1
			c.Bands[Standard].MaxQueuedBytes = 250
		}))
		h.scrape(ep("a", 5))
		x := h.admit(-1, "t", 1)
		h.admit(1, "t", 1).wantWaiting(t)
		// The band itself is full: displacing lower bands would not help.
		h.admit(1, "t", 1).wantOutcome(t, Rejected, ReasonQueueFull)
		x.wantWaiting(t)
		// Bytes: two 100-byte requests fit in 250, a third does not.
		h.admit(0, "t", 1).wantWaiting(t)
		h.admit(0, "t", 1).wantWaiting(t)
		d := h.admit(0, "t", 1).wantOutcome(t, Rejected, ReasonQueueFull)
		// Unknown drain rate with a backlog: Retry-After is the band maximum.
		if d.RetryAfter != 30*time.Second {
			t.Fatalf("Retry-After %v, want the Standard maximum 30s", d.RetryAfter)
		}
		if s := h.c.Stats(); s.QueuedBytes != [NumBands]int64{100, 200, 100} {
			t.Fatalf("queued bytes %v", s.QueuedBytes)
		}
	})
}

// warmDrainRate runs one Critical request per second through a one-slot endpoint for 20 s while keeping `backlog`
// Critical requests of cost 100 waiting, so the drain rate is about 100 tokens per second. It returns the waiting calls.
func warmDrainRate(t *testing.T, h *harness, backlog int) []*call {
	t.Helper()
	h.scrape(ep("a", 1))
	var waiting []*call
	for range backlog {
		waiting = append(waiting, h.admit(1, "warm", 100))
	}
	for range 20 {
		h.step(time.Second)
		waiting = append(waiting, h.admit(1, "warm", 100))
		h.scrape(ep("a", 0)) // one slot; dispatches the head
	}
	var still []*call
	for _, cl := range waiting {
		if !cl.finished() {
			still = append(still, cl)
		}
	}
	if len(still) != backlog {
		t.Fatalf("backlog %d after warm-up, want %d", len(still), backlog)
	}
	rate := h.c.Stats().DrainRate
	if rate < 90 || rate > 115 {
		t.Fatalf("drain rate %v, want about 100/s", rate)
	}
	return still
}

func oneSlot(c *Config) { c.Endpoint.QueueDepth = 1 }

func TestPredictiveShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			oneSlot(c)
			c.Bands[Standard].MaxQueueTime = 5 * time.Second
		}))
		backlog := warmDrainRate(t, h, 10)
		// 10 Critical requests (1000 tokens) ahead plus its own 100 at ~100 tokens/s: ~11 s > 5 s.
		d := h.admit(0, "t", 100).wantOutcome(t, Rejected, ReasonPredictedWait)
		if d.RetryAfter < 10*time.Second || d.RetryAfter > 13*time.Second {
			t.Fatalf("Retry-After %v, want about the predicted 11 s", d.RetryAfter)
		}
		// Drain the backlog down to 2: a ~3 s wait is admitted to the queue.
		for range 8 {
			h.step(100 * time.Millisecond)
			h.scrape(ep("a", 0))
		}
		for _, cl := range backlog[:8] {
			cl.wantOutcome(t, Dispatched, ReasonNone)
		}
		h.admit(0, "t", 100).wantWaiting(t)
	})
}

// TestRetryAfterGrowsWithBacklog: with jitter off and a known drain rate, a deeper backlog never yields a shorter
// Retry-After, and it stays within the band's bounds.
func TestRetryAfterGrowsWithBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			oneSlot(c)
			c.Bands[Standard].MaxQueuedRequests = 0    // every Standard arrival without headroom is refused
			c.Bands[Standard].MaxQueueTime = time.Hour // never predicted to wait too long
			c.Bands[Standard].RetryAfterMax = 2 * time.Minute
		}))
		warmDrainRate(t, h, 1)
		prev := time.Duration(0)
		var seen []time.Duration
		for range 40 {
			d := h.admit(0, "t", 100).wantOutcome(t, Rejected, ReasonQueueFull)
			if d.RetryAfter < prev || d.RetryAfter < time.Second || d.RetryAfter > 2*time.Minute {
				t.Fatalf("Retry-After %v after %v (bounds [1s, 2m])", d.RetryAfter, prev)
			}
			prev = d.RetryAfter
			seen = append(seen, prev)
			h.admit(1, "t", 100) // deepen the Critical backlog ahead of Standard
		}
		if seen[0] >= seen[len(seen)-1] {
			t.Fatalf("Retry-After did not grow with the backlog: %v", seen)
		}
	})
}

// TestRetryAfterCoversBlockedEpisode: a band that stays blocked (here Sheddable, saturated for as long as the burst
// lasts, with no backlog to estimate from) tells clients to come back no sooner than the episode has lasted, so they
// do not return into the same burst; a snapshot with headroom ends the episode.
func TestRetryAfterCoversBlockedEpisode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		shed := func() time.Duration {
			t.Helper()
			return h.admit(-1, "batch", 1).wantOutcome(t, Rejected, ReasonSaturated).RetryAfter
		}
		h.scrape(ep("a", 5))
		if got := shed(); got != time.Second {
			t.Fatalf("Retry-After at the start of the episode = %v, want the 1s minimum", got)
		}
		for _, elapsed := range []time.Duration{3 * time.Second, 8 * time.Second} {
			h.step(elapsed - h.clk.Since(t0))
			h.scrape(ep("a", 5))
			if got := shed(); got != elapsed {
				t.Fatalf("Retry-After %v into the episode = %v, want %v", elapsed, got, elapsed)
			}
		}
		h.step(2 * time.Second)
		h.scrape(ep("a", 0)) // headroom: the episode ends
		h.scrape(ep("a", 5))
		if got := shed(); got != time.Second {
			t.Fatalf("Retry-After in a new episode = %v, want the 1s minimum", got)
		}
	})
}

func TestRetryAfterJitterSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.RetryAfterJitter = 0.5
			c.Bands[Sheddable].RetryAfterMin = 4 * time.Second
		}))
		h.scrape(ep("a", 5))
		values := map[time.Duration]int{}
		for range 200 {
			d := h.admit(-1, "t", 1).wantOutcome(t, Rejected, ReasonSaturated)
			if d.RetryAfter < 4*time.Second || d.RetryAfter > 6*time.Second || d.RetryAfter%time.Second != 0 {
				t.Fatalf("Retry-After %v outside [4s, 6s] or not whole seconds", d.RetryAfter)
			}
			values[d.RetryAfter]++
		}
		if len(values) < 2 {
			t.Fatalf("jitter produced a single value: %v", values)
		}
		for v, n := range values {
			if n > 150 {
				t.Fatalf("%d of 200 clients told %v: lock-step (%v)", n, v, values)
			}
		}
	})
}

// TestQueueTimeout: the maximum queue time is a clock event, not a context deadline.
func TestQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Bands[Standard].MaxQueueTime = 2 * time.Second }))
		h.scrape(ep("a", 5))
		s := h.admit(0, "t", 1)
		h.step(time.Second)
		c := h.admit(1, "t", 1) // Critical: 30 s
		s2 := h.admit(0, "t", 1)
		h.step(time.Second - time.Nanosecond)
		s.wantWaiting(t)
		h.step(time.Nanosecond)
		d := s.wantOutcome(t, Rejected, ReasonQueueTimeout)
		if d.Waited != 2*time.Second || d.RetryAfter < time.Second {
			t.Fatalf("timeout decision %+v", d)
		}
		s2.wantWaiting(t)
		c.wantWaiting(t)
		h.step(time.Second)
		s2.wantOutcome(t, Rejected, ReasonQueueTimeout)
		c.wantWaiting(t)
		// The pool vanishes: the remaining request times out as Unavailable.
		h.scrape()
		h.step(28 * time.Second)
		c.wantOutcome(t, Unavailable, ReasonNoEndpoints)
		if s := h.c.Stats(); s.Queued != [NumBands]int{} {
			t.Fatalf("queued %v", s.Queued)
		}
	})
}

// TestNoEndpoints: with no endpoint ever scraped, or none scraped for ten staleness thresholds (the pool is down),
// requests are answered 503 at once; metrics that are merely late make a band that queues wait for the next scrape,
// and a band shed when saturated, which cannot tell, is answered 503.
func TestNoEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.MetricsStaleness = 200 * time.Millisecond }))
		d := h.admit(1, "t", 1).wantOutcome(t, Unavailable, ReasonNoEndpoints)
		if d.RetryAfter != time.Second {
			t.Fatalf("Retry-After %v", d.RetryAfter)
		}
		h.scrape(ep("a", 0))
		h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone)

		h.step(201 * time.Millisecond) // every endpoint's metrics are now late
		late := h.admit(0, "t", 1)
		late.wantWaiting(t)
		h.admit(-1, "t", 1).wantOutcome(t, Unavailable, ReasonNoEndpoints)
		h.scrape(ep("a", 0))
		late.wantOutcome(t, Dispatched, ReasonNone)

		h.step(201 * time.Millisecond)
		waits := h.admit(1, "t", 1)
		h.step(1600 * time.Millisecond)
		waits.wantWaiting(t)
		h.step(199*time.Millisecond - time.Nanosecond)
		waits.wantWaiting(t)
		h.step(time.Nanosecond) // 2 s since the last scrape: the pool is down
		waits.wantOutcome(t, Unavailable, ReasonNoEndpoints)
		cl := h.admit(0, "t", 1)
		cl.wantOutcome(t, Unavailable, ReasonNoEndpoints)
		if !errors.Is(cl.err, ErrUnavailable) || errors.Is(cl.err, ErrRejected) {
			t.Fatalf("error %v does not match ErrUnavailable only", cl.err)
		}
		if s := h.c.Stats(); s.Queued != [NumBands]int{} {
			t.Fatalf("queued %v", s.Queued)
		}
	})
}

func TestDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 5))
		gone := h.admit(0, "t", 1)
		stays := h.admit(0, "t", 1)
		h.step(time.Second)
		gone.cancel()
		synctest.Wait()
		d := gone.wantOutcome(t, Cancelled, ReasonCancelled)
		if d.Waited != time.Second || !errors.Is(gone.err, ErrCancelled) || !errors.Is(gone.err, context.Canceled) {
			t.Fatalf("cancelled decision %+v, error %v", d, gone.err)
		}
		if s := h.c.Stats(); s.Queued[Standard] != 1 {
			t.Fatalf("queued %v after disconnect", s.Queued)
		}
		h.step(10 * time.Millisecond)
		h.scrape(ep("a", 4))
		stays.wantOutcome(t, Dispatched, ReasonNone)
		stays.cancel() // cancelling after the decision changes nothing
		synctest.Wait()
		stays.wantOutcome(t, Dispatched, ReasonNone)

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d, err := h.c.Admit(ctx, Request{ID: "early", Priority: 1})
		if d.Outcome != Cancelled || d.Band != Critical || !errors.Is(err, context.Canceled) {
			t.Fatalf("pre-cancelled Admit = %+v, %v", d, err)
		}
	})
}

func TestShutdownDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 5))
		var waiting []*call
		for range 3 {
			waiting = append(waiting, h.admit(0, "t", 1))
		}
		done := h.c.Shutdown(10 * time.Second)
		if again := h.c.Shutdown(time.Hour); again != done {
			t.Fatal("second Shutdown returned a different channel")
		}
		d := h.admit(1, "t", 1).wantOutcome(t, Unavailable, ReasonShuttingDown)
		if d.RetryAfter < time.Second {
			t.Fatalf("shutdown Retry-After %v", d.RetryAfter)
		}
		h.step(5 * time.Second)
		h.scrape(ep("a", 4)) // still dispatching during the grace period
		waiting[0].wantOutcome(t, Dispatched, ReasonNone)
		select {
		case <-done:
			t.Fatal("drained while requests still wait")
		default:
		}
		h.step(5 * time.Second)
		waiting[1].wantOutcome(t, Unavailable, ReasonShuttingDown)
		waiting[2].wantOutcome(t, Unavailable, ReasonShuttingDown)
		<-done
		if s := h.c.Stats(); !s.ShuttingDown || s.Queued != [NumBands]int{} {
			t.Fatalf("stats %+v", s)
		}
	})
}

func TestShutdownEmptyAndDrainedEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		<-h.c.Shutdown(time.Minute) // nothing waits: closed at once

		h = newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 5))
		w := h.admit(0, "t", 1)
		done := h.c.Shutdown(time.Minute)
		h.step(time.Second)
		h.scrape(ep("a", 0))
		w.wantOutcome(t, Dispatched, ReasonNone)
		<-done // closed by the dispatch, long before the grace period

		h = newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 5))
		w = h.admit(0, "t", 1)
		<-h.c.Shutdown(0)
		synctest.Wait()
		w.wantOutcome(t, Unavailable, ReasonShuttingDown)
	})
}

func TestTenantCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Tenants = map[string]TenantPolicy{"free": {Weight: 1, MaxBand: Standard}}
		}))
		h.scrape(ep("a", 0))
		d := h.admit(10, "free", 1).wantOutcome(t, Dispatched, ReasonNone)
		if d.Band != Standard || !d.Capped {
			t.Fatalf("capped tenant got band %s capped=%v", d.Band, d.Capped)
		}
		if d := h.admit(10, "paid", 1).result(t); d.Band != Critical || d.Capped {
			t.Fatalf("uncapped tenant got band %s capped=%v", d.Band, d.Capped)
		}
		if d := h.admit(-3, "free", 1).result(t); d.Band != Sheddable || d.Capped {
			t.Fatalf("below its cap, band %s capped=%v", d.Band, d.Capped)
		}
	})
}

// TestTenantCapReject: with AboveMaxBand CapReject, a request whose priority maps above its tenant's cap is refused
// (band_not_allowed, no Retry-After, a cause naming tenant and bands) instead of lowered; requests within the cap, and
// tenants without one, are unaffected, and the refusal queues nothing and does not switch the Critical reserve on.
func TestTenantCapReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			c.Tenants = map[string]TenantPolicy{"free": {Weight: 1, MaxBand: Standard}}
			c.DefaultTenant = TenantPolicy{Weight: 1, MaxBand: Sheddable}
			c.AboveMaxBand = CapReject
		}))
		h.scrape(ep("a", 0))
		for _, tc := range []struct {
			priority int
			tenant   string
			want     Band
			maxBand  Band
		}{{10, "free", Critical, Standard}, {0, "anonymous", Standard, Sheddable}, {10, "anonymous", Critical, Sheddable}} {
			cl := h.admit(tc.priority, tc.tenant, 1)
			d := cl.wantOutcome(t, Rejected, ReasonBandNotAllowed)
			if d.Band != tc.want || d.Capped || d.RetryAfter != 0 {
				t.Errorf("%s at priority %d: decision %+v, want band %s, not capped, no Retry-After", tc.tenant, tc.priority, d, tc.want)
			}
			var cause *BandNotAllowedError
			if !errors.Is(cl.err, ErrBandNotAllowed) || !errors.Is(cl.err, ErrRejected) || errors.Is(cl.err, ErrInvalidRequest) ||
				!errors.As(cl.err, &cause) || *cause != (BandNotAllowedError{Tenant: tc.tenant, Band: tc.want, MaxBand: tc.maxBand}) {
				t.Errorf("%s at priority %d: error %v", tc.tenant, tc.priority, cl.err)
			}
		}
		if h.c.Stats().Queued != [NumBands]int{} || h.c.criticalReserveLocked(h.clk.Now()) {
			t.Fatalf("refused requests queued (%v) or switched the Critical reserve on", h.c.Stats().Queued)
		}
		if d := h.admit(0, "free", 1).wantOutcome(t, Dispatched, ReasonNone); d.Band != Standard || d.Capped {
			t.Errorf("within its cap: band %s capped=%v", d.Band, d.Capped)
		}
		if d := h.admit(-3, "anonymous", 1).wantOutcome(t, Dispatched, ReasonNone); d.Band != Sheddable {
			t.Errorf("default tenant at its cap: band %s", d.Band)
		}

		// The same policy with CapLower serves them in their cap again, from the next arrival.
		cfg := h.c.Config().clone()
		cfg.AboveMaxBand = CapLower
		if err := h.c.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
		if d := h.admit(10, "free", 1).wantOutcome(t, Dispatched, ReasonNone); d.Band != Standard || !d.Capped {
			t.Errorf("lowered: band %s capped=%v", d.Band, d.Capped)
		}
	})
}

func TestInvalidRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 4))
		h.admitReq(Request{ID: "dup", Tenant: "t"}).wantOutcome(t, Dispatched, ReasonNone) // reserved
		h.admitReq(Request{ID: "q", Tenant: "t"}).wantWaiting(t)                           // queued
		for _, req := range []Request{{ID: ""}, {ID: "neg", Bytes: -1}, {ID: "dup"}, {ID: "q"}} {
			cl := h.admitReq(req)
			d := cl.wantOutcome(t, Rejected, ReasonInvalidRequest)
			if !errors.Is(cl.err, ErrInvalidRequest) || !errors.Is(cl.err, ErrRejected) || d.RetryAfter != 0 {
				t.Errorf("request %+v: error %v, decision %+v", req, cl.err, d)
			}
		}
		var fcErr *Error
		cl := h.admitReq(Request{ID: ""})
		if !errors.As(cl.err, &fcErr) || fcErr.Reason != ReasonInvalidRequest || fcErr.Error() == "" {
			t.Fatalf("error %v is not a descriptive *Error", cl.err)
		}
	})
}

func TestUpdateEndpointsValidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		now := h.clk.Now()
		err := h.c.UpdateEndpoints([]Endpoint{
			{Name: "", ScrapedAt: now},
			{Name: "neg", WaitingQueue: -1, ScrapedAt: now},
			{Name: "kv", KVCacheUsage: 1.5, ScrapedAt: now},
			{Name: "good", ScrapedAt: now},
			{Name: "good", WaitingQueue: 100, ScrapedAt: now},
		})
		if err == nil {
			t.Fatal("invalid endpoints accepted silently")
		}
		for _, w := range []string{"name must not be empty", `"neg"`, `"kv"`, `"good" appears twice`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
		d := h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
		if !slices.Equal(d.Endpoints, []string{"good"}) {
			t.Fatalf("endpoints %v, want only the valid one", d.Endpoints)
		}
	})
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Bands[Critical].MaxQueuedRequests = -1
	if _, err := New(cfg, Deps{}); err == nil {
		t.Fatal("New accepted an invalid Config")
	}
	c, err := New(nil, Deps{})
	if err != nil || c.Config().Bands[Sheddable].SaturationCeiling != DefaultConfig().Bands[Sheddable].SaturationCeiling {
		t.Fatalf("New(nil) = %v, %v", c, err)
	}
}

// TestSaturations: the saturation schedulers rank by includes dispatches since the snapshot, except the request being
// scheduled; unknown and stale endpoints read as +Inf, never preferred.
func TestSaturations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.MetricsStaleness = 10 * time.Second }))
		h.scrape(ep("a", 0), ep("b", 1))
		got := make([]float64, 3)
		h.c.Saturations("", []string{"a", "b", "unknown"}, got)
		inf := math.Inf(1)
		if want := []float64{0, 0.2, inf}; !slices.Equal(got, want) {
			t.Fatalf("after the scrape: %v, want %v", got, want)
		}
		cl := h.admit(0, "t", 1)
		cl.wantOutcome(t, Dispatched, ReasonNone) // reserves the least saturated endpoint, a
		h.c.Saturations("", []string{"a", "b", "unknown"}, got)
		if want := []float64{0.2, 0.2, inf}; !slices.Equal(got, want) {
			t.Fatalf("after a dispatch: %v, want %v", got, want)
		}
		// The request being scheduled does not see its own provisional reservation.
		h.c.Saturations(cl.req.ID, []string{"a", "b", "unknown"}, got)
		if want := []float64{0, 0.2, inf}; !slices.Equal(got, want) {
			t.Fatalf("for the dispatched request itself: %v, want %v", got, want)
		}
		h.step(11 * time.Second)
		h.c.Saturations("", []string{"a", "b", "unknown"}, got)
		if want := []float64{inf, inf, inf}; !slices.Equal(got, want) {
			t.Fatalf("with stale metrics: %v, want %v", got, want)
		}
	})
}

// TestSaturationsRankBusyEndpoints: an endpoint computing a prompt ranks above 1 by when a new prompt would begin
// answering there (the wait for its pending prompts, on a finish clock of their expected times, plus one more),
// in units of the pending time threshold; so among busy endpoints the one expected to free first ranks lowest, a
// fast endpoint below a slow one, and a reservation moved away or being scheduled takes its time back.
func TestSaturationsRankBusyEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Pending time 400ms, nothing learned yet: each pending prompt is expected to take 400ms.
		h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.PendingTime = 400 * time.Millisecond }))
		h.scrape(ep("a", 0), ep("b", 0))
		names := []string{"a", "b"}
		got := make([]float64, 2)
		ranks := func(self string) []float64 {
			h.c.Saturations(self, names, got)
			return slices.Clone(got)
		}
		near := func(x, y []float64) bool {
			return slices.EqualFunc(x, y, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })
		}
		dispatch := func(id, to string) *call {
			t.Helper()
			cl := h.admitReq(Request{ID: id, Tenant: "t", Bytes: 100, EstimatedCost: 1, Streamed: true})
			cl.wantOutcome(t, Dispatched, ReasonNone)
			if !h.c.Bind(id, to) {
				t.Fatalf("Bind(%s, %s) found no reservation", id, to)
			}
			return cl
		}

		dispatch("r1", "a")
		h.step(20 * time.Millisecond)
		dispatch("r2", "b")
		// a: 380ms left of r1, then 400ms for a new one: 1 + 780/400. b: 1 + 800/400.
		if want := []float64{2.95, 3}; !near(ranks(""), want) {
			t.Fatalf("two busy endpoints: %v, want %v", got, want)
		}
		h.step(50 * time.Millisecond)
		if want := []float64{2.825, 2.875}; !near(ranks(""), want) {
			t.Fatalf("50ms later: %v, want %v", got, want)
		}

		// r1's first chunk after 70ms: a learns 70ms per prompt and is free again (nothing waits there).
		if !h.c.Started("r1") {
			t.Fatal("Started found r1 not pending")
		}
		if r := ranks(""); r[0] != 0 {
			t.Fatalf("a with nothing pending ranks %v, want 0", r[0])
		}
		// Prompts sent together queue on the finish clock: two pending on a, 1 + (70 + 70 + 70)/400 for a third,
		// which the fast endpoint a still ranks below b.
		dispatch("r3", "a")
		dispatch("r4", "a")
		if want := []float64{1.525, 2.875}; !near(ranks(""), want) {
			t.Fatalf("two prompts pending on a: %v, want %v", got, want)
		}
		// The request being scheduled does not count its own reservation; moving it away takes its time back.
		if want := []float64{1.35, 2.875}; !near(ranks("r4"), want) {
			t.Fatalf("for r4 itself: %v, want %v", got, want)
		}
		if !h.c.Bind("r4", "b") {
			t.Fatal("Bind found no reservation")
		}
		// b: r4 queues 400ms behind r2 (due at 420ms), a new prompt 400ms more: 1 + 1150/400.
		if want := []float64{1.35, 3.875}; !near(ranks(""), want) {
			t.Fatalf("after moving r4 to b: %v, want %v", got, want)
		}
		h.step(430 * time.Millisecond)
		if want := []float64{1.175, 2.8}; !near(ranks(""), want) {
			t.Fatalf("430ms later: %v, want %v (a's overdue prompt waits no less than zero)", got, want)
		}
		// Releasing the last pending prompts empties the clocks; the next prompt starts b's clock again now.
		for _, id := range []string{"r2", "r3", "r4"} {
			h.c.Release(id)
		}
		if want := []float64{0, 0}; !near(ranks(""), want) {
			t.Fatalf("after every release: %v, want %v", got, want)
		}
		dispatch("r5", "b")
		if want := []float64{0, 3}; !near(ranks(""), want) {
			t.Fatalf("a fresh prompt on b: %v, want %v", got, want)
		}
	})
}

// TestRetryAfterAddsBacklogToEpisode: a blocked band's clients are told to come back when the overload is expected
// to end (as long again as it has lasted) plus the time the backlog waiting ahead of them then takes to drain (as
// long as it took to build: it has stood for the whole episode), not at the overload's end, when that backlog would
// shed them again, nor after the backlog over the drain rate, which assumes nothing arrives once it ends.
func TestRetryAfterAddsBacklogToEpisode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			oneSlot(c)
			c.Bands[Sheddable].RetryAfterMax = 5 * time.Minute
		}))
		warmDrainRate(t, h, 10) // blocked for 20 s, 10 Critical requests (1000 tokens) waiting at ~100 tokens/s
		d := h.admit(-1, "batch", 100).wantOutcome(t, Rejected, ReasonSaturated)
		if d.RetryAfter < 59*time.Second || d.RetryAfter > 61*time.Second {
			t.Fatalf("Retry-After %v, want 20 s more of the episode plus the 40 s the backlog will then have stood", d.RetryAfter)
		}
	})
}

// TestEjectedEndpointsOfferNoHeadroom: an endpoint the scheduler leaves out (Endpoint.Ejected) offers no capacity:
// requests are not dispatched on its headroom, their candidate lists leave it out, Saturations ranks it last and it
// may not take a request beyond headroom; requests wait for headroom elsewhere, and are dispatched on it once a
// snapshot no longer ejects it.
func TestEjectedEndpointsOfferNoHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		ejected := func(name string, waiting int) Endpoint {
			e := ep(name, waiting)
			e.Ejected = true
			return e
		}
		h.scrape(ejected("bad", 0), ep("good", 4))
		d := h.admit(0, "t", 1).wantOutcome(t, Dispatched, ReasonNone)
		if !slices.Equal(d.Endpoints, []string{"good"}) {
			t.Fatalf("endpoints = %v, want [good]: the ejected endpoint has no headroom", d.Endpoints)
		}
		got := make([]float64, 2)
		h.c.Saturations("", []string{"bad", "good"}, got)
		if !math.IsInf(got[0], 1) || got[1] != 1 {
			t.Errorf("saturations = %v, want [+Inf 1]", got)
		}
		if h.c.MayExceedHeadroom(Critical, "bad") {
			t.Error("an ejected endpoint may take a request beyond headroom")
		}
		// good is full (4 waiting + 1 reserved): the next request waits, although bad is idle.
		waiting := h.admit(0, "t", 1)
		waiting.wantWaiting(t)
		h.scrape(ejected("bad", 0), ep("good", 5))
		waiting.wantWaiting(t)
		h.scrape(ep("bad", 0), ep("good", 5)) // the ejection ended
		if d := waiting.result(t); d.Outcome != Dispatched || !slices.Equal(d.Endpoints, []string{"bad"}) {
			t.Fatalf("after the ejection: %+v, want dispatched on [bad]", d)
		}
	})
}

// TestRetryAfterSpreadsReturns: clients turned away at the same moment are not all told the same second. The pool
// drains about 100 tokens a second, so each second gets at most one 100-token request back (returnLedger).
func TestRetryAfterSpreadsReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, func(c *Config) {
			oneSlot(c)
			c.Bands[Sheddable].RetryAfterMax = 5 * time.Minute
		}))
		warmDrainRate(t, h, 10)
		seen := map[time.Duration]bool{}
		var first time.Duration
		for i := range 5 {
			d := h.admit(-1, "batch", 100).wantOutcome(t, Rejected, ReasonSaturated)
			if i == 0 {
				first = d.RetryAfter
			}
			if seen[d.RetryAfter] || d.RetryAfter != first+time.Duration(i)*time.Second {
				t.Fatalf("client %d told %v (first %v): want one second after the previous", i, d.RetryAfter, first)
			}
			seen[d.RetryAfter] = true
		}
	})
}

// TestReturnsWaitForPromisedCapacity: in a band that sheds at once, a request turned away that comes back with the
// same content when its Retry-After told it, once the overload is over (the backlog ahead of it drains), waits for
// capacity instead of being turned away again, ahead of later arrivals of its band, which are still turned away; up
// to the band's maximum queue time, after which it is turned away with a new promise. A request that comes back
// early, twice, with other content, or while the backlog ahead of it still builds is a fresh arrival.
func TestReturnsWaitForPromisedCapacity(t *testing.T) {
	const retry = 8 * time.Second
	cfg := func(t *testing.T) *Config {
		return testConfig(t, func(c *Config) {
			c.Bands[Sheddable].RetryAfterMin = retry // no drain rate yet: Retry-After is the minimum
			c.Bands[Sheddable].RetryAfterMax = 20 * time.Second
			c.Bands[Sheddable].MaxQueueTime = 10 * time.Second
		})
	}
	shedReq := func(h *harness, key uint64) *call {
		h.seq++
		return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: "batch", Priority: -1, Bytes: 100,
			EstimatedCost: 1, ReturnKey: key})
	}
	// comeBack has request 42 turned away by a full endpoint, told Retry-After retry, while eight Standard requests
	// start waiting there; if draining, one of them leaves each second from 2 to 6 s; request 42 is sent again after
	// (since it was told).
	comeBack := func(t *testing.T, after time.Duration, draining bool) (*harness, *call) {
		t.Helper()
		h := newHarness(t, cfg(t))
		h.scrape(ep("a", 5))
		if d := shedReq(h, 42).wantOutcome(t, Rejected, ReasonSaturated); d.RetryAfter != retry {
			t.Fatalf("Retry-After %v, want %v", d.RetryAfter, retry)
		}
		for range 8 {
			h.admit(0, "t", 1).wantWaiting(t)
		}
		h.step(time.Second)
		h.scrape(ep("a", 5))
		for range 5 {
			h.step(time.Second)
			if draining {
				h.scrape(ep("a", 4))
			}
		}
		h.step(after - 6*time.Second)
		return h, shedReq(h, 42)
	}
	t.Run("a return on time waits ahead of fresh arrivals", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, back := comeBack(t, retry, true)
			back.wantWaiting(t)
			shedReq(h, 7).wantOutcome(t, Rejected, ReasonSaturated)
			shedReq(h, 42).wantOutcome(t, Rejected, ReasonSaturated) // the promise is used up
			h.scrape(ep("a", 0))
			back.wantOutcome(t, Dispatched, ReasonNone)
		})
	})
	t.Run("a return waits no longer than the band's maximum, and is promised again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h, back := comeBack(t, retry, true)
			h.step(10 * time.Second)
			back.wantOutcome(t, Rejected, ReasonQueueTimeout)
			if _, ok := h.c.promises[Sheddable].due[42]; !ok {
				t.Fatal("no new promise for the return turned away")
			}
		})
	})
	for _, tc := range []struct {
		name     string
		after    time.Duration
		draining bool
	}{
		{"early", retry - 2*time.Second, true},
		{"while the backlog ahead builds", retry, false},
	} {
		t.Run("a return "+tc.name+" is a fresh arrival", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, back := comeBack(t, tc.after, tc.draining)
				back.wantOutcome(t, Rejected, ReasonSaturated)
			})
		})
	}
}
