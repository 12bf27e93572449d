package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// PromptText says how generated text (prompts, shared prefixes, multi-turn history) is written.
type PromptText string

const (
	// TextWords is 3-letter lower-case pseudo-words, each followed by a space: a JSON string without one escape. The
	// default, and what every scenario measured before PromptText existed.
	TextWords PromptText = "words"
	// TextRealistic is prose and code as real prompts carry them: line breaks (about one every 45 bytes), tabs,
	// quotation marks, backslashes, <, > and &, and some non-ASCII letters and symbols (2, 3 and 4 bytes in UTF-8).
	// Clients' JSON encoders escape the first four, so a parser meets an escape every few dozen bytes; the request body
	// carries the rest as they are, as clients' encoders write them (Go's json.Marshal would write <, > and & as
	// \u003c, \u003e and \u0026).
	TextRealistic PromptText = "realistic"
)

func (p PromptText) validate() error {
	switch p {
	case "", TextWords, TextRealistic:
		return nil
	}
	return fmt.Errorf("%q is not %s or %s", p, TextWords, TextRealistic)
}

// realisticPieces are TextRealistic's tokens, each exactly CharsPerToken bytes of valid UTF-8 once its letter slots
// ('_') are filled. Most are words; the rest put a code line's punctuation, a line break, an escape or a non-ASCII
// character in every few tokens. Their count, 64, leaves each a share of a draw's 26³ values within 0.4% of the rest.
var realisticPieces = [64]string{
	"___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ",
	"___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ",
	"___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ", "___ ",
	"___,", "___,", "___.", "__. ", "___\n", "__.\n", // prose: commas, full stops, line ends
	"\n\t__", "\t\t__", "__()", "(_) ", "_ :=", "{\n\t_", "}\n\n_", "// _", // code: indents, calls, blocks, comments
	"\"__\"", "<__>", "&& _", "\\__ ", // quoted strings, markup, operators, a path or a regular expression
	"é_ ", "€_", "— ", "🙂", // non-ASCII: 2, 3, 3 and 4 bytes
}

// realisticText returns tokens of TextRealistic: 4*tokens bytes, drawing from rng exactly what syntheticText draws
// for the same tokens (one Uint32N(26³) per token), so a mix's requests keep their classes, lengths and order
// whichever text it writes; only the text differs.
func realisticText(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	b.Grow(tokens * CharsPerToken)
	for range tokens {
		v := rng.Uint32N(26 * 26 * 26)
		// The piece comes from the draw's hash, the letters from the draw itself, as syntheticText's do.
		piece := realisticPieces[(v*2654435761)>>26]
		for i := range len(piece) {
			if piece[i] != '_' {
				b.WriteByte(piece[i])
				continue
			}
			b.WriteByte(byte('a' + v%26))
			v /= 26
		}
	}
	return b.String()
}

// text returns tokens of generated text written as p says.
func (p PromptText) text(rng *rand.Rand, tokens int) string {
	if p == TextRealistic {
		return realisticText(rng, tokens)
	}
	return syntheticText(rng, tokens)
}

// Text returns tokens of text written as p says ("" is words), the same for the same seed: what a mix with
// prompt_text p sends, for benchmarks that build a request's body themselves.
func (p PromptText) Text(seed uint64, tokens int) string {
	return p.text(rand.New(rand.NewPCG(seed, 0x7e47)), tokens)
}
