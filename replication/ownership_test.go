package replication

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func endpoints(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
	}
	return out
}

func TestOwnerIgnoresMemberOrder(t *testing.T) {
	members := []string{"epp-0:9003", "epp-1:9003", "epp-2:9003", "epp-3:9003"}
	for _, key := range endpoints(200) {
		want, _ := Owner(key, members)
		reversed := slices.Clone(members)
		slices.Reverse(reversed)
		if got, _ := Owner(key, reversed); got != want {
			t.Fatalf("%s: owner %s in one order, %s in another", key, want, got)
		}
	}
	if _, ok := Owner("x", nil); ok {
		t.Fatal("an owner among no members")
	}
}

// Seeded random member sets: removing a member moves only its keys, adding one moves keys only to it, and every
// member owns a fair share (within 2x of even, at 1000 keys over at most 8 members).
func TestPartitionMovesOnlyWhatItMust(t *testing.T) {
	seed := uint64(22)
	rng := rand.New(rand.NewPCG(seed, 0))
	keys := endpoints(1000)
	for round := range 50 {
		n := 2 + rng.IntN(7)
		var members []string
		for i := range n {
			members = append(members, fmt.Sprintf("epp-%d-%d:9003", round, i))
		}
		before := Partition(keys, members)
		owners := map[string]string{}
		for m, ks := range before {
			if len(ks) < len(keys)/n/2 || len(ks) > 2*len(keys)/n {
				t.Fatalf("seed %d round %d: %s owns %d of %d keys over %d members", seed, round, m, len(ks), len(keys), n)
			}
			for _, k := range ks {
				owners[k] = m
			}
		}
		if len(owners) != len(keys) {
			t.Fatalf("seed %d round %d: %d of %d keys owned", seed, round, len(owners), len(keys))
		}
		gone := members[rng.IntN(n)]
		after := Partition(keys, slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == gone }))
		for m, ks := range after {
			for _, k := range ks {
				if owners[k] != m && owners[k] != gone {
					t.Fatalf("seed %d round %d: %s moved from %s to %s, though only %s left", seed, round, k, owners[k], m, gone)
				}
			}
		}
		joined := fmt.Sprintf("epp-%d-new:9003", round)
		for m, ks := range Partition(keys, append(slices.Clone(members), joined)) {
			for _, k := range ks {
				if m != joined && owners[k] != m {
					t.Fatalf("seed %d round %d: %s moved from %s to %s when %s joined", seed, round, k, owners[k], m, joined)
				}
			}
		}
	}
}

func TestPartitionListsEveryMember(t *testing.T) {
	got := Partition(nil, []string{"a:1", "b:1"})
	if len(got) != 2 || got["a:1"] != nil || got["b:1"] != nil {
		t.Fatalf("partition of no keys %v, want both members owning nothing", got)
	}
}
