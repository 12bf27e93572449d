package flowcontrol

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// TestEarlyReturnToldTheRest: a band that queues turns a request away with a Retry-After, its prediction of when
// capacity for it comes; a client that comes back well before that (the bench's clients cap their wait at 10 s) is
// told the rest of that wait at once, in whole seconds, unjittered and not booked again, rather than queued behind the
// backlog an overload's end leaves. One that comes back on time (or a second early: promiseEarly), or that finds
// headroom with nobody ahead, is decided as a fresh arrival is, and so is a request the band never turned away. The
// return is always predicted to wait less than MaxQueueTime, so without the rule every early one waits.
//
// One tenant, a one-slot endpoint, Standard's MaxQueueTime 8 s: after a warm-up that drains 200/s, a burst of cost
// 100 requests fills the queue until one is turned away (predicted wait over 8 s) with a Retry-After of 10-11 s; all
// but two queued requests then leave, so a new arrival would be predicted to wait about a second.
func TestEarlyReturnToldTheRest(t *testing.T) {
	const maxQueueTime = 8 * time.Second
	tests := []struct {
		name     string
		left     time.Duration // how long before the moment it was told the return comes
		sameKey  bool          // the return carries the turned-away request's key (false: a fresh request)
		emptyAll bool          // every queued request leaves and the endpoint frees: headroom, nobody ahead
		// replica: the controller is one of several replicas (Deps.Replica); it knows only the returns it turned away
		// itself and judges shares on its own dispatches, so it decides the return as a fresh arrival.
		replica bool
		// again: a second request of the same content comes at once after the told one (its client capped its wait
		// twice, or another client sends the same body): it is told the rest too, so that it does not queue behind
		// the backlog.
		again bool
		want  string // "told the rest" (429), "waits" (left in the queue) or "dispatched"
	}{
		{name: "9 s early", left: 9 * time.Second, sameKey: true, want: "told the rest"},
		{name: "4.5 s early", left: 4500 * time.Millisecond, sameKey: true, want: "told the rest"},
		{name: "2 s early", left: 2 * time.Second, sameKey: true, want: "told the rest"},
		// Retry-After is in whole seconds, and a client may count it from when it sent the request (promiseEarly).
		{name: "1 s early", left: time.Second, sameKey: true, want: "waits"},
		{name: "on time", sameKey: true, want: "waits"},
		{name: "a fresh request", left: 9 * time.Second, want: "waits"},
		{name: "9 s early to headroom and nobody ahead", left: 9 * time.Second, sameKey: true, emptyAll: true, want: "dispatched"},
		{name: "9 s early at one of several replicas", left: 9 * time.Second, sameKey: true, replica: true, want: "waits"},
		{name: "9 s early, the same content again", left: 9 * time.Second, sameKey: true, again: true, want: "told the rest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, func(c *Config) {
					oneSlot(c)
					c.Bands[Standard].MaxQueueTime = maxQueueTime
				}))
				h.c.replica = tt.replica // Deps.Replica, set before the first request
				tenantDrainHarness(t, h, 10, false)
				h.scrape(ep("a", 1))
				var queued []*call
				var turned *call
				for i := range 40 {
					cost := uint64(100)
					if i >= 14 {
						cost = 1200 // predicted to wait 13 s: turned away
					}
					cl := h.admitReq(Request{ID: fmt.Sprintf("burst-%d", i), Tenant: "heavy", Bytes: 100, EstimatedCost: cost,
						ReturnKey: uint64(1000 + i)})
					if !cl.finished() {
						queued = append(queued, cl)
						continue
					}
					turned = cl
					break
				}
				if turned == nil {
					t.Fatal("the burst was never turned away")
				}
				told := turned.wantOutcome(t, Rejected, ReasonPredictedWait).RetryAfter
				if told < maxQueueTime+time.Second {
					t.Fatalf("told %v, the test wants at least %v", told, maxQueueTime+time.Second)
				}
				back := told - tt.left
				keep := 1
				if tt.emptyAll {
					keep = 0
				}
				for _, cl := range queued[keep:] {
					cl.cancel()
				}
				synctest.Wait()
				// The drain goes on: every half second one request arrives and one dispatches, so one stays queued and
				// the drain rate stays known.
				for elapsed := time.Duration(0); elapsed < back; elapsed += 500 * time.Millisecond {
					h.step(500 * time.Millisecond)
					if !tt.emptyAll {
						h.admit(0, "heavy", 100)
					}
					h.scrape(ep("a", 0))
				}
				if tt.emptyAll {
					h.scrape(ep("a", 0))
				} else {
					h.scrape(ep("a", 1))
				}
				key := turned.req.ReturnKey
				if !tt.sameKey {
					key = 1
				}
				ret := h.admitReq(Request{ID: "return", Tenant: "heavy", Bytes: 100, EstimatedCost: 1200, ReturnKey: key})
				switch tt.want {
				case "waits":
					if ret.finished() {
						t.Fatalf("answered %s/%s, want it left waiting", ret.d.Outcome, ret.d.Reason)
					}
				case "dispatched":
					ret.wantOutcome(t, Dispatched, ReasonNone)
				case "told the rest":
					d := ret.wantOutcome(t, Rejected, ReasonEarlyReturn)
					if want := tt.left.Round(time.Second); d.RetryAfter < tt.left || d.RetryAfter != want {
						t.Fatalf("Retry-After %v, want the %v left of the %v told", d.RetryAfter, want, told)
					}
				}
				if tt.again {
					again := h.admitReq(Request{ID: "again", Tenant: "heavy", Bytes: 100, EstimatedCost: 1200, ReturnKey: key})
					if d := again.wantOutcome(t, Rejected, ReasonEarlyReturn); d.RetryAfter != tt.left.Round(time.Second) {
						t.Fatalf("the same content again: Retry-After %v, want the %v left", d.RetryAfter, tt.left.Round(time.Second))
					}
				}
			})
		})
	}
}

// TestKeepsEarlyPromises: the early-return rule, and the promises it reads, belong to a band that queues below
// Critical (Critical is shed only by its own predicted wait; Sheddable, which sheds at once, keeps its promises for
// its returns' claim) at a controller that is not one of several replicas.
func TestKeepsEarlyPromises(t *testing.T) {
	tests := []struct {
		band    Band
		replica bool
		want    bool
	}{
		{band: Critical},
		{band: Standard, want: true},
		{band: Sheddable},
		{band: Standard, replica: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/replica=%v", tt.band, tt.replica), func(t *testing.T) {
			c, err := New(DefaultConfig(), Deps{Replica: tt.replica})
			if err != nil {
				t.Fatal(err)
			}
			if got := c.keepsEarlyPromises(tt.band); got != tt.want {
				t.Fatalf("keepsEarlyPromises = %v, want %v", got, tt.want)
			}
		})
	}
}
