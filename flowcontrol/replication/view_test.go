package replication

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Steps at fixed instants: a replica owns everything alone, its share while its peer is heard, and everything again
// one timeout after the peer falls silent; both replicas, hearing each other, own disjoint shares covering the fleet.
func TestViewOwnershipFollowsLiveness(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	fleet := endpoints(12)
	a, err := NewView("a:9003", []string{"a:9003", "b:9003"}, 150*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewView("b:9003", []string{"a:9003", "b:9003"}, 150*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Owned(fleet, at(0)); !slices.Equal(got, fleet) {
		t.Fatalf("alone, a owns %d of %d endpoints", len(got), len(fleet))
	}
	a.Heard("b:9003", at(10))
	b.Heard("a:9003", at(10))
	ownedA, ownedB := a.Owned(fleet, at(100)), b.Owned(fleet, at(100))
	if len(ownedA) != 6 || len(ownedB) != 6 {
		t.Fatalf("two live replicas own %d and %d of 12 endpoints, want 6 each", len(ownedA), len(ownedB))
	}
	for _, e := range fleet {
		if slices.Contains(ownedA, e) == slices.Contains(ownedB, e) {
			t.Fatalf("endpoint %s owned by both or neither (a: %v, b: %v)", e, ownedA, ownedB)
		}
	}
	if got := a.Owned(fleet, at(159)); !slices.Equal(got, ownedA) {
		t.Fatalf("b heard 149ms ago: a owns %v, want its share %v", got, ownedA)
	}
	if got := a.Owned(fleet, at(160)); !slices.Equal(got, fleet) {
		t.Fatalf("b silent for the timeout: a owns %d of %d endpoints, want all", len(got), len(fleet))
	}
	if got := strings.Join(a.Live(at(160)), ","); got != "a:9003" {
		t.Fatalf("live %s, want a:9003", got)
	}
}

// A peer dropped from the list is forgotten: back in the list, it is live only once heard again; a peer kept keeps
// its last word.
func TestViewSetPeers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v, err := NewView("a:9003", []string{"b:9003", "c:9003"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	v.Heard("b:9003", t0)
	v.Heard("c:9003", t0)
	v.SetPeers([]string{"a:9003", "c:9003", "d:9003"})
	if got := strings.Join(v.Peers(), ","); got != "c:9003,d:9003" {
		t.Fatalf("peers %s, want c:9003,d:9003 (self left out)", got)
	}
	if got := strings.Join(v.Live(t0), ","); got != "a:9003,c:9003" {
		t.Fatalf("live %s, want a:9003,c:9003", got)
	}
	if v.Heard("b:9003", t0) {
		t.Fatal("a peer dropped from the list was heard")
	}
	v.SetPeers([]string{"b:9003", "c:9003"})
	if got := strings.Join(v.Live(t0), ","); got != "a:9003,c:9003" {
		t.Fatalf("b back in the list, unheard: live %s, want a:9003,c:9003", got)
	}
}

// Probes, peer-list updates and snapshots run on different goroutines.
func TestViewConcurrentUse(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v, err := NewView("a:9003", []string{"b:9003", "c:9003"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fleet := endpoints(20)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				switch g {
				case 0:
					v.Heard("b:9003", now)
				case 1:
					v.SetPeers([]string{"b:9003", "c:9003"}[:1+i%2])
				default:
					if n := len(v.Owned(fleet, now)); n < 10 {
						t.Errorf("with at most two live replicas a owns %d of 20 endpoints", n)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// More live replicas than endpoints: a replica whose share is empty shares the whole pool rather than own nothing.
func TestViewWithoutShareOwnsAll(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fleet := endpoints(1)
	owners := 0
	for _, self := range []string{"a:1", "b:1"} {
		v, err := NewView(self, []string{"a:1", "b:1"}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		v.Heard(map[string]string{"a:1": "b:1", "b:1": "a:1"}[self], t0)
		if got := v.Owned(fleet, t0); !slices.Equal(got, fleet) {
			t.Fatalf("%s owns %v of one endpoint, want it", self, got)
		}
		if len(Partition(fleet, v.Live(t0))[self]) == 1 {
			owners++
		}
	}
	if owners != 1 {
		t.Fatalf("%d replicas own the one endpoint by Partition, want 1", owners)
	}
}
