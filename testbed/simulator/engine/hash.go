package engine

// FNV-1a, 64 bit. It is stable across processes and releases (unlike
// hash/maphash), so a seeded run reproduces the same cache hits everywhere.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

func fnvUint64(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

// RootHash is the hash that the first block of a prompt chains from. It names
// the model or LoRA adapter, as vLLM mixes the LoRA id into its block hashes:
// the same text under two adapters shares no KV.
func RootHash(model string) uint64 {
	h := fnvOffset
	for i := 0; i < len(model); i++ {
		h ^= uint64(model[i])
		h *= fnvPrime
	}
	return h
}

// HashBlocks returns one hash per full block of tokens, each chained from the
// previous one (the first from root), exactly like vLLM's block hashes: block
// i's hash identifies the whole prefix tokens[:(i+1)*blockSize], so equal
// hashes mean equal prefixes. A partial last block gets no hash and is never
// shared.
func HashBlocks(root uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	n := len(tokens) / blockSize
	hashes := make([]uint64, n)
	parent := root
	for b := range n {
		h := fnvUint64(fnvOffset, parent)
		for _, t := range tokens[b*blockSize : (b+1)*blockSize] {
			for range 4 {
				h ^= uint64(t & 0xff)
				h *= fnvPrime
				t >>= 8
			}
		}
		hashes[b] = h
		parent = h
	}
	return hashes
}
