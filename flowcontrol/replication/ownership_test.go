package replication

import (
	"fmt"
	"maps"
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

// Seeded random member sets: Owner moves only a leaving member's keys and gives a joining one keys only from others.
func TestOwnerMovesOnlyWhatItMust(t *testing.T) {
	seed := uint64(22)
	rng := rand.New(rand.NewPCG(seed, 0))
	keys := endpoints(300)
	for round := range 50 {
		members := randomMembers(rng, round)
		gone := members[rng.IntN(len(members))]
		left := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == gone })
		joined := append(slices.Clone(members), fmt.Sprintf("epp-%d-new:9003", round))
		for _, k := range keys {
			before, _ := Owner(k, members)
			if after, _ := Owner(k, left); before != gone && after != before {
				t.Fatalf("seed %d round %d: %s moved from %s to %s, though only %s left", seed, round, k, before, after, gone)
			}
			if after, _ := Owner(k, joined); after != before && after != joined[len(joined)-1] {
				t.Fatalf("seed %d round %d: %s moved from %s to %s when a member joined", seed, round, k, before, after)
			}
		}
	}
}

func randomMembers(rng *rand.Rand, round int) []string {
	n := 2 + rng.IntN(7)
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf("epp-%d-%d:9003", round, i)
	}
	return members
}

// Seeded random member sets and fleet sizes: Partition gives every key to exactly one member, no member more than
// its even share rounded up, the same owners whatever the input order, and when members leave, moves their keys and,
// over all rounds, fewer others (bounded loads can cascade in one round).
func TestPartitionMovesLittle(t *testing.T) {
	seed := uint64(17)
	rng := rand.New(rand.NewPCG(seed, 0))
	totalLost, totalShifted := 0, 0
	for round := range 100 {
		members := randomMembers(rng, round)
		keys := endpoints(1 + rng.IntN(64))
		limit := (len(keys) + len(members) - 1) / len(members)
		before := ownersOf(t, Partition(keys, members), len(keys), limit)
		shuffled, reversed := slices.Clone(keys), slices.Clone(members)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		slices.Reverse(reversed)
		if again := ownersOf(t, Partition(shuffled, reversed), len(keys), limit); !maps.Equal(before, again) {
			t.Fatalf("seed %d round %d: owners depend on the input order", seed, round)
		}
		gone := members[rng.IntN(len(members))]
		left := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == gone })
		after := ownersOf(t, Partition(keys, left), len(keys), (len(keys)+len(left)-1)/len(left))
		lost, shifted := 0, 0
		for k, o := range before {
			switch {
			case o == gone:
				lost++
			case after[k] != o:
				shifted++
			}
		}
		totalLost, totalShifted = totalLost+lost, totalShifted+shifted
	}
	t.Logf("seed %d: leaving members took %d keys with them and %d others moved", seed, totalLost, totalShifted)
	if totalShifted > totalLost {
		t.Fatalf("seed %d: leaving members took %d keys with them, and %d others moved: more churn than the loss", seed, totalLost, totalShifted)
	}
}

// ownersOf inverts a partition, checking that it covers n keys with at most limit per member.
func ownersOf(t *testing.T, part map[string][]string, n, limit int) map[string]string {
	t.Helper()
	owners := map[string]string{}
	for m, ks := range part {
		if len(ks) > limit {
			t.Fatalf("%s owns %d keys, more than %d", m, len(ks), limit)
		}
		for _, k := range ks {
			if prev, dup := owners[k]; dup {
				t.Fatalf("%s owned by %s and %s", k, prev, m)
			}
			owners[k] = m
		}
	}
	if len(owners) != n {
		t.Fatalf("%d of %d keys owned", len(owners), n)
	}
	return owners
}

func TestPartitionListsEveryMember(t *testing.T) {
	got := Partition(nil, []string{"a:1", "b:1"})
	if len(got) != 2 || got["a:1"] != nil || got["b:1"] != nil {
		t.Fatalf("partition of no keys %v, want both members owning nothing", got)
	}
}
