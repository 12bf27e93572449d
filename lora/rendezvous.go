package lora

import "math"

// FNV-1a 64-bit parameters. The hash must be identical on every EPP replica
// and across restarts, which rules out hash/maphash (randomly seeded).
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// rendezvousWeight returns the highest-random-weight hash of (adapter, pod).
// The adapter's length is mixed in before the pod name so that no two
// different pairs hash the same input bytes; the final avalanche (SplitMix64's
// finaliser) spreads FNV's weak high bits, which the ordering depends on.
func rendezvousWeight(adapter, pod string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(adapter); i++ {
		h ^= uint64(adapter[i])
		h *= fnvPrime64
	}
	for n := uint64(len(adapter)); ; n >>= 8 {
		h ^= n & 0xff
		h *= fnvPrime64
		if n < 0x100 {
			break
		}
	}
	for i := 0; i < len(pod); i++ {
		h ^= uint64(pod[i])
		h *= fnvPrime64
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// boundedCapacity is the most load a placement target may carry after taking
// one more request: ceil((1+epsilon)·(totalLoad+1)/candidates). Some candidate
// always fits it, because the least loaded one carries at most
// floor(totalLoad/candidates) ≤ ceil((totalLoad+1)/candidates) - 1.
func boundedCapacity(totalLoad, candidates int, epsilon float64) int {
	return int(math.Ceil((1 + epsilon) * float64(totalLoad+1) / float64(candidates)))
}

// preferred reports whether a pod with weight w and name beats the current
// best (bestW, bestName) in rendezvous order. Names break the (improbable)
// weight ties so the order is total and independent of input order.
func preferred(w uint64, name string, bestW uint64, bestName string) bool {
	return w > bestW || (w == bestW && name < bestName)
}
