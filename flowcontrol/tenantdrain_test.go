package flowcontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// tenantDrainHarness saturates a one-slot endpoint and for seconds drives two dispatches a second (one per scrape) of
// the Standard band, where tenant "heavy" sends one request (cost 100) a second on top of two waiting from the start;
// with light, tenant "light" sends one of the same cost a second too, which takes one of the two dispatches: the heavy
// tenant then drains 100 a second of the pool's 200. It returns the heavy tenant's calls.
func tenantDrainHarness(t *testing.T, h *harness, seconds int, light bool) []*call {
	t.Helper()
	h.scrape(ep("a", 1))
	calls := []*call{h.admit(0, "heavy", 100), h.admit(0, "heavy", 100)}
	for range seconds {
		h.step(500 * time.Millisecond)
		if light {
			h.admit(0, "light", 100)
		}
		calls = append(calls, h.admit(0, "heavy", 100))
		h.scrape(ep("a", 0))
		h.step(500 * time.Millisecond)
		h.scrape(ep("a", 0))
	}
	return calls
}

// TestTenantDrainPredictsWait: a tenant that shares its band with another gets only part of the band's drain, so its
// arrival is predicted to wait its own backlog over its own drain. A burst of 12 heavy requests arrives: over the
// pool's drain (200/s) all of them would start within the band's 8 s, but at the heavy tenant's own 100/s only the
// first seven or so can, and the rest are turned away at once (ReasonPredictedWait, with a Retry-After at least that
// long) rather than left to wait out their deadline. With the band to itself the tenant drains at the band's rate and
// the whole burst waits. An OverShareMaxQueueTime of 3 s, set after the warm-up, turns away all but the first one or
// two of the burst while the tenant shares the band, with a Retry-After at least that long, and nothing while it has
// the band alone.
func TestTenantDrainPredictsWait(t *testing.T) {
	tests := []struct {
		name      string
		light     bool
		overShare time.Duration // the band's OverShareMaxQueueTime; its MaxQueueTime is 8 s
		minShed   int
	}{
		{name: "sharing the band", light: true, overShare: 8 * time.Second, minShed: 3},
		{name: "alone in the band", overShare: 8 * time.Second},
		{name: "sharing the band, over-share limit 3 s", light: true, overShare: 3 * time.Second, minShed: 10},
		{name: "alone in the band, over-share limit 3 s", overShare: 3 * time.Second},
		// Above the band's MaxQueueTime the limit is the band's.
		{name: "sharing the band, over-share limit 20 s", light: true, overShare: 20 * time.Second, minShed: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				config := func(overShare time.Duration) *Config {
					return testConfig(t, func(c *Config) {
						oneSlot(c)
						c.Bands[Standard].MaxQueueTime = 8 * time.Second
						c.Bands[Standard].OverShareMaxQueueTime = overShare
					})
				}
				h := newHarness(t, config(8*time.Second))
				calls := tenantDrainHarness(t, h, 10, tt.light)
				for _, cl := range calls {
					if cl.finished() && cl.d.Outcome != Dispatched {
						t.Fatalf("%s: %s/%q during the warm-up", cl.req.ID, cl.d.Outcome, cl.d.Reason)
					}
				}
				if err := h.c.SetConfig(config(tt.overShare)); err != nil {
					t.Fatal(err)
				}
				shed := 0
				for range 12 {
					cl := h.admit(0, "heavy", 100)
					if !cl.finished() || cl.d.Outcome == Dispatched {
						continue
					}
					if d := cl.wantOutcome(t, Rejected, ReasonPredictedWait); d.RetryAfter < min(tt.overShare, 8*time.Second) {
						t.Fatalf("Retry-After %v, want at least the %v limit", d.RetryAfter, min(tt.overShare, 8*time.Second))
					}
					shed++
				}
				if (tt.minShed == 0 && shed > 0) || shed < tt.minShed {
					t.Fatalf("%d of the burst turned away, want at least %d (0 alone)", shed, tt.minShed)
				}
			})
		})
	}
}

// TestUnreachableAnsweredEarly: 20 heavy requests admitted before any drain was known wait with a deadline 8 s out;
// once the heavy tenant's drain (100/s, the other half going to a light tenant) shows that those beyond the first
// seven or so cannot start by then, they are answered 429 (ReasonPredictedWait, with a Retry-After) at once rather
// than at their deadline, and the ones that can start keep waiting and are dispatched. Every request gets one answer.
// With an OverShareMaxQueueTime of 3 s, those predicted to start more than 3 s after they arrived are answered too.
func TestUnreachableAnsweredEarly(t *testing.T) {
	tests := []struct {
		name      string
		overShare time.Duration // the band's OverShareMaxQueueTime; its MaxQueueTime is 8 s
		minEarly  int           // at least this many answered early
		kept      int           // the first kept
	}{
		{name: "over-share limit the band's", overShare: 8 * time.Second, minEarly: 5, kept: 3},
		{name: "over-share limit 3 s", overShare: 3 * time.Second, minEarly: 17, kept: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { unreachableAnsweredEarly(t, tt.overShare, tt.minEarly, tt.kept) })
		})
	}
}

func unreachableAnsweredEarly(t *testing.T, overShare time.Duration, minEarly, kept int) {
	h := newHarness(t, testConfig(t, func(c *Config) {
		oneSlot(c)
		c.Bands[Standard].MaxQueueTime = 8 * time.Second
		c.Bands[Standard].OverShareMaxQueueTime = overShare
	}))
	h.scrape(ep("a", 1))
	var calls []*call
	for range 20 {
		calls = append(calls, h.admit(0, "heavy", 100))
	}
	lightEverySecond(h, 3)
	var early []*call
	for _, cl := range calls {
		if cl.finished() && cl.d.Outcome == Rejected {
			if cl.d.Reason != ReasonPredictedWait || cl.d.RetryAfter < time.Second || cl.d.Waited >= overShare {
				t.Fatalf("%s: %s/%q after %v, Retry-After %v; want predicted_wait before the deadline",
					cl.req.ID, cl.d.Outcome, cl.d.Reason, cl.d.Waited, cl.d.RetryAfter)
			}
			early = append(early, cl)
		}
	}
	if len(early) < minEarly {
		t.Fatalf("%d waiting heavy requests answered before their deadline, want the tail (at least %d)", len(early), minEarly)
	}
	if last := calls[len(calls)-1]; !last.finished() {
		t.Fatalf("the newest heavy request still waits, predicted to start after its deadline")
	}
	for i, cl := range calls[:kept] {
		if cl.finished() && cl.d.Outcome != Dispatched {
			t.Fatalf("heavy request %d: %s/%q, want it kept", i, cl.d.Outcome, cl.d.Reason)
		}
	}
	// The rest are answered by the end: dispatched, or at the latest at their deadline.
	for range 10 {
		h.step(time.Second)
		h.scrape(ep("a", 0))
	}
	for _, cl := range calls {
		cl.result(t)
	}
}

// TestReturnLetInWhileLoadFalls: a Sheddable request turned away while its band is blocked by saturation alone (no
// backlog in the EPP) comes back once its Retry-After has passed, the band still blocked. If the servers' load has
// been falling fast (by 10 requests every 100 ms, from 400 to 200), capacity is on its way back and the return waits
// for it, then is dispatched when it comes; if the load stands, the overload goes on and the return is turned away.
func TestReturnLetInWhileLoadFalls(t *testing.T) {
	tests := []struct {
		name    string
		falling bool
		// stale: a second endpoint, as loaded, stops being scraped halfway; the sum of the load halves, its mean per
		// fresh endpoint does not.
		stale bool
	}{
		{name: "load falling", falling: true},
		{name: "load standing"},
		{name: "load standing, an endpoint gone stale", stale: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) { c.Endpoint.MetricsStaleness = 200 * time.Millisecond }))
				running := 400
				// Waiting 4 of a queue depth of 5: Sheddable's ceiling (0.8) is reached, Standard's is not.
				blocked := func() Endpoint { return Endpoint{Name: "a", WaitingQueue: 4, Running: running} }
				other := func() Endpoint { return Endpoint{Name: "b", WaitingQueue: 4, Running: running} }
				h.scrape(blocked(), other())
				const key = 0x5111ce
				first := h.admitReq(Request{ID: "shed-1", Priority: -1, EstimatedCost: 1, ReturnKey: key})
				retry := first.wantOutcome(t, Rejected, ReasonSaturated).RetryAfter
				half := max(retry, 2*time.Second) / 2
				for waited := time.Duration(0); waited < max(retry, 2*time.Second); waited += 100 * time.Millisecond {
					h.step(100 * time.Millisecond)
					if tt.falling {
						running -= 10
					}
					if tt.stale && waited >= half {
						h.scrape(blocked())
					} else {
						h.scrape(blocked(), other())
					}
				}
				back := h.admitReq(Request{ID: "shed-2", Priority: -1, EstimatedCost: 1, ReturnKey: key})
				if !tt.falling {
					back.wantOutcome(t, Rejected, ReasonSaturated)
					return
				}
				back.wantWaiting(t)
				h.step(100 * time.Millisecond)
				h.scrape(Endpoint{Name: "a", Running: running})
				back.wantOutcome(t, Dispatched, ReasonNone)
			})
		})
	}
}

// TestQueuedUnderShareJudgedByDeadline: in a pool with a slot limit, a request queued while its tenant was under its
// share (item.underShare) is answered early only when predicted to start after its deadline, as if its band's
// over-share time were its MaxQueueTime; without a slot limit, and for a request queued over its share, the over-share
// time answers it.
func TestQueuedUnderShareJudgedByDeadline(t *testing.T) {
	run := func(overShare time.Duration, underShare bool, poolSlots int) (early int) {
		synctest.Test(t, func(t *testing.T) { early = answeredEarly(t, overShare, underShare, poolSlots) })
		return early
	}
	deadlineOnly := run(8*time.Second, false, 4)
	tests := []struct {
		name       string
		underShare bool
		poolSlots  int
		want       int
	}{
		{name: "queued under its share, pool slot limit", underShare: true, poolSlots: 4, want: deadlineOnly},
		{name: "queued under its share, no pool slot limit", underShare: true, want: run(3*time.Second, false, 0)},
	}
	for _, tt := range tests {
		if got := run(3*time.Second, tt.underShare, tt.poolSlots); got != tt.want {
			t.Errorf("%s: %d answered early with a 3 s over-share time, want %d", tt.name, got, tt.want)
		}
	}
	if overShare := run(3*time.Second, false, 4); overShare <= deadlineOnly {
		t.Errorf("queued over its share: %d answered early with a 3 s over-share time, want more than the deadline's %d",
			overShare, deadlineOnly)
	}
}

// answeredEarly queues 20 heavy requests behind one slot as unreachableAnsweredEarly does, marked as queued under
// their tenant's share if underShare, with the pool's slot limit poolSlots (0: none learned), and returns how many were
// answered predicted_wait within the first 3 s.
func answeredEarly(t *testing.T, overShare time.Duration, underShare bool, poolSlots int) int {
	h := newHarness(t, testConfig(t, func(c *Config) {
		oneSlot(c)
		c.Bands[Standard].MaxQueueTime = 8 * time.Second
		c.Bands[Standard].OverShareMaxQueueTime = overShare
	}))
	h.scrape(ep("a", 1))
	h.c.mu.Lock()
	h.c.endpoints[h.c.endpointIndex["a"]].learner.slots = poolSlots // its slot limit learned: the pool's
	h.c.mu.Unlock()
	var calls []*call
	for range 20 {
		calls = append(calls, h.admit(0, "heavy", 100))
	}
	if underShare {
		h.c.mu.Lock()
		for _, it := range h.c.queued {
			it.underShare = true
		}
		h.c.mu.Unlock()
	}
	lightEverySecond(h, 3)
	early := 0
	for _, cl := range calls {
		if cl.finished() && cl.d.Outcome == Rejected && cl.d.Reason == ReasonPredictedWait {
			early++
		}
	}
	for range 10 {
		h.step(time.Second)
		h.scrape(ep("a", 0))
	}
	for _, cl := range calls {
		cl.result(t)
	}
	return early
}

// lightEverySecond admits one light request a second for n seconds, with a scrape of the idle endpoint a at each
// arrival and half a second after it.
func lightEverySecond(h *harness, n int) {
	for range n {
		h.step(500 * time.Millisecond)
		h.admit(0, "light", 100)
		h.scrape(ep("a", 0))
		h.step(500 * time.Millisecond)
		h.scrape(ep("a", 0))
	}
}
