package flowcontrol

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestKVWaitsNotOnAnIdlePool: an idle pool (no request of the EPP's nor a peer's anywhere), live peers, a protected
// tenant, and a prompt above the learned capacity (learned a few percent low, or a long prompt): alone it is placed,
// and with peers too, since nothing that can happen on an idle pool would give it room.
func TestKVWaitsNotOnAnIdlePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := kvHarness(t, map[string][]time.Duration{})
		h.c.SetPeers(Peers{ReserveShare: func(pool, seats int) int { return pool / 2 }, Seats: 33})
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		now := h.clk.Now()
		h.c.kvMeanFinal = kvReq.final()
		h.c.underShare = map[tenantKey]tenantArrivals{{Standard, "light"}: {here: 1, pool: 2}}
		h.c.underShareAt = now
		big := kvSize{prompt: 6900, output: 100}
		if h.c.kvWaitsForRoomLocked(Standard, "light", big, []string{"a", "b", "c"}, now) {
			t.Errorf("a protected request waits on an idle pool: no event will ever give it room")
		}
		for _, n := range []string{"a", "b", "c"} {
			e := &h.c.endpoints[h.c.endpointIndex[n]]
			if !h.c.kvOffersRoomLocked(e, now) {
				t.Errorf("%s idle but not offered", n)
			}
		}
	})
}

// TestKVWaitNotInABandThatSheds: a protected request of a band that sheds when saturated (Sheddable by default), with
// headroom and nobody ahead, at a replica with live peers and no KV room for its prompt on its endpoints, is dispatched
// as alone: a band that does not queue cannot wait for room, and would otherwise be answered 429 saturated.
func TestKVWaitNotInABandThatSheds(t *testing.T) {
	for _, alone := range []bool{true, false} {
		t.Run(map[bool]string{true: "alone", false: "peers"}[alone], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				three := repeatAgo(3, 3*time.Second)
				h := kvHarness(t, map[string][]time.Duration{"a": three, "b": three, "c": three})
				if !alone {
					h.c.SetPeers(Peers{ReserveShare: func(pool, seats int) int { return pool / 2 }, Seats: 33})
				}
				for range 20 {
					h.c.mu.Lock()
					for range 5 {
						h.c.noteArrivalLocked(Sheddable, "heavy", 1, 680, h.clk.Now())
					}
					h.c.noteArrivalLocked(Sheddable, "light", 1, 100, h.clk.Now())
					h.c.mu.Unlock()
					h.clk.Step(100 * time.Millisecond)
				}
				h.c.mu.Lock()
				now := h.clk.Now()
				under := h.c.isUnderShareLocked(Sheddable, "light", now)
				_, best, _ := h.c.headroomLocked(Sheddable, "light", now)
				h.c.mu.Unlock()
				if !under || best < 0 {
					t.Fatalf("setup: light under share %v, headroom best %d", under, best)
				}
				cl := h.admitReq(Request{ID: "l1", Tenant: "light", Priority: -1, Bytes: 100, EstimatedCost: 5000, OutputTokens: 128})
				if d := cl.result(t); d.Outcome != Dispatched {
					t.Errorf("protected Sheddable request with headroom: %s/%q, want dispatched (as alone)", d.Outcome, d.Reason)
				}
			})
		})
	}
}

// TestKVWaitStopsLowerBands: with live peers a protected Standard request waits for KV room; a queued Sheddable request
// of a tenant over its share (no KV gate for it: kvKeepsRoomLocked is false) must not go to the endpoints the Standard
// request waits to find room on: a lower band never overtakes a higher one.
func TestKVWaitStopsLowerBands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		three := repeatAgo(3, 3*time.Second)
		h := kvHarnessConfig(t, queueingSheddable, map[string][]time.Duration{"a": three, "b": three, "c": three})
		h.c.SetPeers(Peers{ReserveShare: func(pool, seats int) int { return pool / 2 }, Seats: 33})
		for range 20 {
			h.c.mu.Lock()
			for range 5 {
				h.c.noteArrivalLocked(Standard, "heavy", 1, 680, h.clk.Now())
				h.c.noteArrivalLocked(Sheddable, "heavy", 1, 680, h.clk.Now())
			}
			h.c.noteArrivalLocked(Standard, "light", 1, 100, h.clk.Now())
			h.c.mu.Unlock()
			h.clk.Step(100 * time.Millisecond)
		}
		std := h.admitReq(Request{ID: "std-light", Tenant: "light", Priority: 0, Bytes: 100, EstimatedCost: 5000, OutputTokens: 128})
		if std.finished() {
			t.Fatalf("setup: Standard light finished %s/%q, want it waiting for KV room", std.d.Outcome, std.d.Reason)
		}
		shed := h.admitReq(Request{ID: "shed-heavy", Tenant: "heavy", Priority: -1, Bytes: 100, EstimatedCost: 680, OutputTokens: 128})
		if shed.finished() && !std.finished() {
			t.Errorf("Sheddable %s to %v while Standard waits for KV room", shed.d.Outcome, shed.d.Endpoints)
		}
	})
}
