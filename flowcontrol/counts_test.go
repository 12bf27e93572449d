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
		// b queues at 4 running, twice: seats 4, tentative (no slot limit known yet), so its capacity probes one more;
		// then scrapes show 3 there, which are not ours.
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
		// A scrape that shows the request where admission sent it: no longer reserved there, still in flight.
		var where string
		for _, c := range h.c.Counts([]string{"a", "b", "c"}) {
			if c.InFlight == 1 {
				where = c.Name
			}
		}
		scraped := map[string]int{"b": 3}
		scraped[where]++
		h.step(50 * time.Millisecond)
		h.scrape(Endpoint{Name: "a", Running: scraped["a"]}, Endpoint{Name: "b", Running: scraped["b"]}, Endpoint{Name: "c", Running: scraped["c"]})

		got := h.c.Counts([]string{"c", "nowhere", "b", "a"})
		if len(got) != 3 {
			t.Fatalf("Counts = %+v, want c, b and a", got)
		}
		inflight := map[string]int{}
		for i := range got {
			inflight[got[i].Name] = got[i].InFlight
			got[i].InFlight = 0
		}
		want := []EndpointCount{{Name: "c", Adopted: true}, {Name: "b", Foreign: 3, Seats: 4, Capacity: 5}, {Name: "a", Peer: 2}}
		if !reflect.DeepEqual(got, want) || inflight[where] != 1 || inflight["a"]+inflight["b"]+inflight["c"] != 1 {
			t.Errorf("Counts = %+v with ours in flight %v, want %+v with one on %s", got, inflight, want, where)
		}
	})
}
