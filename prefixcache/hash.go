package prefixcache

import (
	"encoding/binary"
	"math"

	"github.com/cespare/xxhash/v2"
)

// TokenRule approximates token counts from the bytes of a rendered prompt.
// The gateway has no tokenizer; the rule only has to be consistent, because
// hashes compare prompts with each other, never with the server's tokens.
// Its error shows up as a constant factor between predicted and reported
// cached tokens, which calibration compares as fractions of the prompt and so
// does not mistake for evictions.
type TokenRule struct {
	// BytesPerToken is the average UTF-8 bytes per token; about 4 for
	// English text with BPE tokenizers.
	BytesPerToken float64
}

// BlockBytes is the number of prompt bytes that stand for one KV block of
// blockTokens tokens (at least 1).
func (r TokenRule) BlockBytes(blockTokens int) int {
	return max(1, int(math.Round(float64(blockTokens)*r.BytesPerToken)))
}

// Tokens is the approximate token count of n bytes.
func (r TokenRule) Tokens(n int) int {
	return int(math.Round(float64(n) / r.BytesPerToken))
}

// Salt isolates prefix chains the way the model server isolates its KV
// cache: two prompts share blocks only when every field is equal.
type Salt struct {
	// Model is the model the request is served by, after any rewrite.
	Model string
	// Adapter is the LoRA adapter when the caller knows it apart from
	// Model (with vLLM the request's model names the adapter, so Model
	// already covers it and Adapter may stay empty).
	Adapter string
	// CacheSalt is the request's cache_salt.
	CacheSalt string
}

// seed is the root of a chain: a hash of the salt's fields, each length
// prefixed so that ("ab","c") and ("a","bc") differ.
func (s Salt) seed() uint64 {
	var d xxhash.Digest
	d.Reset()
	var n [binary.MaxVarintLen64]byte
	for _, f := range [...]string{"sluice-prefix/1", s.Model, s.Adapter, s.CacheSalt} {
		_, _ = d.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		_, _ = d.WriteString(f)
	}
	return d.Sum64()
}

// AppendChain appends to dst the chained hashes of the full blocks of
// prompt (as rendered by AppendText or AppendChat), blockBytes bytes each, at
// most maxBlocks of them. Hash i covers bytes [0, (i+1)·blockBytes): it is
// the xxhash of block i seeded with hash i−1 (the salt's seed for i = 0), so
// equal hashes at position i mean equal prefixes, and one changed byte
// changes every later hash. A trailing partial block is not hashed: servers
// cache full blocks only. Hashes are never 0.
func AppendChain(dst []uint64, salt Salt, prompt []byte, blockBytes, maxBlocks int) []uint64 {
	var w chainWriter
	w.reset(dst, salt, blockBytes, maxBlocks)
	w.write(prompt)
	return w.chain
}
