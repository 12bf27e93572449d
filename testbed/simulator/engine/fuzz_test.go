package engine

import (
	"encoding/binary"
	"testing"
)

// FuzzHashBlocks checks the prefix property of block hashes: two token
// sequences get equal hashes for block i exactly when (barring collisions)
// their first (i+1)*blockSize tokens and roots are equal.
func FuzzHashBlocks(f *testing.F) {
	f.Add([]byte("abcdefghijklmnop"), []byte("abcdefghijklmnoq"), uint8(2), "m", "m")
	f.Add([]byte("abcdefgh"), []byte("abcdefgh"), uint8(1), "m", "lora")
	f.Fuzz(func(t *testing.T, a, b []byte, bs uint8, rootA, rootB string) {
		blockSize := int(bs%8) + 1
		ta, tb := toTokens(a), toTokens(b)
		ha := HashBlocks(RootHash(rootA), ta, blockSize)
		hb := HashBlocks(RootHash(rootB), tb, blockSize)
		if len(ha) != len(ta)/blockSize {
			t.Fatalf("%d hashes for %d tokens in blocks of %d", len(ha), len(ta), blockSize)
		}
		for i := range min(len(ha), len(hb)) {
			samePrefix := rootA == rootB
			for j := 0; samePrefix && j < (i+1)*blockSize; j++ {
				samePrefix = ta[j] == tb[j]
			}
			if samePrefix != (ha[i] == hb[i]) {
				t.Fatalf("block %d: same prefix %v but hashes %x vs %x", i, samePrefix, ha[i], hb[i])
			}
		}
	})
}

func toTokens(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}
