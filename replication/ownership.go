package replication

import (
	"hash/fnv"
	"slices"
)

// weight is the rendezvous weight of (member, key): FNV-1a 64 over both, length-prefixed so that no two different
// pairs hash the same bytes, then SplitMix64's finaliser, which spreads FNV's weak high bits. It must be the same on
// every replica and across restarts (hash/maphash is randomly seeded, so it cannot be used).
func weight(member, key string) uint64 {
	h := fnv.New64a()
	var n [2]byte
	n[0], n[1] = byte(len(member)>>8), byte(len(member))
	_, _ = h.Write(n[:])
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte(key))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Owner returns the member that owns key: the one with the highest rendezvous weight, names breaking ties. ok is
// false without members.
func Owner(key string, members []string) (owner string, ok bool) {
	var best uint64
	for _, m := range members {
		w := weight(m, key)
		if !ok || w > best || (w == best && m < owner) {
			owner, best, ok = m, w, true
		}
	}
	return owner, ok
}

// Partition assigns every key to its Owner: member -> its keys, in the order given. Every member has an entry, empty
// when it owns nothing.
func Partition(keys, members []string) map[string][]string {
	out := make(map[string][]string, len(members))
	for _, m := range members {
		out[m] = nil
	}
	for _, k := range keys {
		if o, ok := Owner(k, members); ok {
			out[o] = append(out[o], k)
		}
	}
	return out
}

// sortedUnique returns names sorted without duplicates.
func sortedUnique(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}
