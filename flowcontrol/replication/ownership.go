package replication

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// weight is the rendezvous weight of (member, key): the first 8 bytes of SHA-256 over both, length-prefixed so
// that no two different pairs hash the same bytes. It must be the same on every replica and across restarts
// (hash/maphash is randomly seeded); it is computed only when membership or the endpoints change, so its cost does
// not matter, and its output is uniform without a mixing step.
func weight(member, key string) uint64 {
	h := sha256.New()
	_, _ = h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(member))))
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte(key))
	return binary.BigEndian.Uint64(h.Sum(nil))
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

// Partition assigns every key to a member, as evenly as counts allow: each member owns at most ceil(keys/members),
// and a key goes to the member of highest rendezvous weight that still has room, keys taken in sorted order. So it
// is a pure function of the two sets, like Owner, and equals Owner wherever loads allow; unlike Owner it never gives
// one member most of a small fleet (12 endpoints over 4 plain-rendezvous owners came out 7/2/2/1). When a member
// leaves, its keys move and some others shift to make room (see TestPartitionMovesLittle). Every member has an
// entry, empty when it owns nothing; keys keep their given order within it.
func Partition(keys, members []string) map[string][]string {
	members = sortedUnique(members)
	out := make(map[string][]string, len(members))
	for _, m := range members {
		out[m] = nil
	}
	if len(members) == 0 {
		return out
	}
	limit := (len(sortedUnique(keys)) + len(members) - 1) / len(members)
	owner := make(map[string]string, len(keys))
	count := make(map[string]int, len(members))
	for _, k := range sortedUnique(keys) {
		best, bestW, found := "", uint64(0), false
		for _, m := range members {
			if count[m] >= limit {
				continue
			}
			if w := weight(m, k); !found || w > bestW || (w == bestW && m < best) {
				best, bestW, found = m, w, true
			}
		}
		owner[k] = best
		count[best]++
	}
	for _, k := range keys {
		if o, ok := owner[k]; ok {
			out[o] = append(out[o], k)
			delete(owner, k) // a key given twice is owned once
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
