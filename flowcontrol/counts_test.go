package flowcontrol

import (
	"reflect"
	"testing"
	"testing/synctest"
	"time"
)

// TestCounts: admission's count of each named endpoint, in the order asked, with its own requests, the requests two
// scrapes in a row showed beyond them, the peers' requests there, its seats and whether it was adopted; an unknown
// name is left out.
func TestCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, testConfig(t, nil))
		h.scrape(ep("a", 0), ep("b", 0))
		h.c.SetPeers(Peers{Load: map[string]int{"a": 2}, ReserveShare: func(pool, _ int) int { return pool }})
		h.step(50 * time.Millisecond)
		h.scrape(ep("a", 0), ep("b", 0), ep("c", 0)) // c joins while a peer is live: adopted
		// b queues at 4 running, twice: seats 4 (tentative); then a scrape shows 3 there, which are not ours.
		for _, running := range []int{4, 4, 3, 3} {
			waiting := 0
			if running == 4 {
				waiting = 1
			}
			h.step(50 * time.Millisecond)
			h.scrape(ep("a", 0), Endpoint{Name: "b", Running: running, WaitingQueue: waiting}, ep("c", 0))
		}
		first := h.admit(0, "t", 1)
		first.wantOutcome(t, Dispatched, ReasonNone)
		got := h.c.Counts([]string{"c", "nowhere", "b", "a"})
		var inflight int
		for i := range got {
			inflight += got[i].InFlight
			got[i].InFlight = 0 // wherever admission placed the request: counted once below
		}
		want := []EndpointCount{{Name: "c", Adopted: true}, {Name: "b", Foreign: 3, Seats: got[1].Seats, Capacity: got[1].Capacity},
			{Name: "a", Peer: 2}}
		if inflight != 1 || !reflect.DeepEqual(got, want) {
			t.Errorf("Counts = %+v with %d of ours in flight, want %+v with 1", got, inflight, want)
		}
		if got[1].Seats != 4 {
			t.Errorf("b's seats %d, want 4 (it queued at 4 running)", got[1].Seats)
		}
	})
}
