package simulator

import "strings"

// bytesPerToken is the token-approximation rule: one token per 4 bytes of
// UTF-8 text, the usual rule of thumb for English with BPE tokenizers. Each
// token's identity is its 4 bytes, so two texts share a token prefix exactly
// when they share a byte prefix of that length: prefix caching behaves as
// with a real tokenizer on shared system prompts and conversation histories.
const bytesPerToken = 4

// ApproximateTokens returns the simulated tokens of text: ceil(len(text)/4)
// tokens, token i packing bytes [4i, 4i+4) little-endian (the last one
// zero-padded).
func ApproximateTokens(text string) []uint32 {
	out := make([]uint32, (len(text)+bytesPerToken-1)/bytesPerToken)
	for i := range out {
		var t uint32
		for j := range bytesPerToken {
			if k := i*bytesPerToken + j; k < len(text) {
				t |= uint32(text[k]) << (8 * j)
			}
		}
		out[i] = t
	}
	return out
}

// renderChat applies a ChatML-style template, the way vLLM applies the
// model's chat template before tokenizing:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//
// so a conversation that extends an earlier one shares its token prefix.
func renderChat(messages []chatMessage) string {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.text)
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

// vocabulary holds the simulated output tokens: 4 bytes each, so generated
// text obeys the same approximation rule, and JSON-safe, so streamed chunks
// need no escaping.
var vocabulary = [...]string{
	" the", " and", " for", " you", " not", " are", " was", " all",
	" can", " had", " her", " one", " our", " out", " day", " get",
	" has", " him", " his", " how", " man", " new", " now", " old",
	" see", " two", " way", " who", " did", " its", " let", " say",
}

// outputToken is the text of output token i of a request: a deterministic
// function of the server seed, the request id and i.
func outputToken(seed, id uint64, i int) string {
	x := seed ^ id*0x9E3779B97F4A7C15 ^ uint64(i)*0xBF58476D1CE4E5B9
	x ^= x >> 31
	x *= 0x94D049BB133111EB
	x ^= x >> 29
	return vocabulary[x%uint64(len(vocabulary))]
}
