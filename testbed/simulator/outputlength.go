package simulator

import (
	"fmt"
	"math/rand/v2"
)

// OutputLength says how long an answer to a request that sets max_tokens is. Both the real-time simulator and the
// virtual-time engine (testbed/virtualbench) draw it here, so the two give the same lengths for the same seed.
type OutputLength string

const (
	// OutputExact answers with exactly max_tokens tokens (finish_reason "length", as with ignore_eos): the
	// default, which every benchmark scenario used until the option existed.
	OutputExact OutputLength = "exact"
	// OutputCeiling treats max_tokens as the ceiling real clients set it as: the answer stops at a length uniform in
	// [1, max_tokens] (finish_reason "stop", "length" when it reaches max_tokens), drawn from the server's seeded
	// random source.
	OutputCeiling OutputLength = "ceiling"
)

// ParseOutputLength reads an OutputLength; "" is OutputExact.
func ParseOutputLength(s string) (OutputLength, error) {
	switch OutputLength(s) {
	case "", OutputExact:
		return OutputExact, nil
	case OutputCeiling:
		return OutputCeiling, nil
	}
	return "", fmt.Errorf("output length %q: want %q or %q", s, OutputExact, OutputCeiling)
}

// Draw is the length of an answer to a request that set max_tokens (at least 1), and whether it stops before
// max_tokens (finish_reason "stop"). OutputExact draws nothing from rng, so the random sequence of a server answering
// exactly is the one it had before the option existed.
func (l OutputLength) Draw(rng *rand.Rand, maxTokens int) (n int, stopped bool) {
	if l != OutputCeiling || maxTokens <= 1 {
		return maxTokens, false
	}
	n = 1 + rng.IntN(maxTokens)
	return n, n < maxTokens
}
