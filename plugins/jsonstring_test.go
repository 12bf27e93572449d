package plugins

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func TestUnquoteStringAsUnmarshal(t *testing.T) {
	long := strings.Repeat(`line one\n\t\"quoted\" <tag> & naïve \u00e9 `, 2000)
	for _, tc := range []struct{ name, token string }{
		{"empty", `""`},
		{"plain", `"hello world"`},
		{"every one-character escape", `"\" \\ \/ \b \f \n \r \t"`},
		{"escapes only", `"\n\n\n"`},
		{"escape at both ends", `"\tmiddle\t"`},
		{"u escapes", `"\u0041\u00e9\u20AC\uffff\u0000"`},
		{"surrogate pair", `"\uD83D\uDE00 and \ud83d\ude00"`},
		{"lone high surrogate", `"\uD83D"`},
		{"lone high surrogate before text", `"\uD83Dx"`},
		{"high surrogate before a non-surrogate escape", `"\uD83D\u0041"`},
		{"high surrogate before another high one", `"\uD83D\uD83D\uDE00"`},
		{"lone low surrogate", `"\uDE00"`},
		{"high surrogate before a one-character escape", `"\uD83D\n"`},
		{"valid UTF-8", `"é ≠ 😀 \u2028"`},
		{"invalid UTF-8 bytes", "\"a\xffb\xc3\x28c\xe2\x82\""},
		{"surrogate encoded in UTF-8", "\"\xed\xa0\x80x\""},
		{"truncated rune at the end", "\"abc\xe2\x82\""},
		{"invalid UTF-8 between escapes", "\"\\n\xff\\n\x80\x80\\u00e9\""},
		{"long prompt with escapes", `"` + long + `"`},
		// unquoteValid's word stores: an escape and a character at each offset of a word, a string that turns out not
		// to be valid UTF-8 after escapes were written, and the realistic text of long-prompt-text
		{"escape at each offset of a word", `"` + strings.Repeat(`\n`, 3) + `abcdefgh\tabcdefg\"abcdef\\abcde\/abcd\babc\fab\ra\u00e9"`},
		{"character at each offset of a word", `"é12345678€1234567🙂123456é12345€1234🙂123é12€1🙂\n"`},
		{"surrogates among word stores", `"12345678\ud83d\ude4212345678\ud83d12345678\ude42\ud83d\ud83d\ude42x"`},
		{"\\u escapes widening to three bytes", `"\u20ac\u2014\u2028\uffff\u0800\u07ff\u0080\u007f"`},
		{"invalid UTF-8 after escapes", "\"" + strings.Repeat(`12345678\n`, 9) + "\xe2\x82 \xff\\t\""},
		{"invalid UTF-8 at the end after an escape", "\"\\n12345678\xc3\""},
		{"valid character then a cut one", "\"\\né\xc3\""},
		{"realistic text", `"` + stringContent(loadgen.TextRealistic.Text(7, 4096)) + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !validJSON([]byte(tc.token)) {
				t.Fatalf("test token %q is not valid JSON", tc.token)
			}
			var want string
			if err := json.Unmarshal([]byte(tc.token), &want); err != nil {
				t.Fatal(err)
			}
			if got, ok := unquoteString([]byte(tc.token)); !ok || got != want {
				t.Errorf("unquoteString(%.80q) = %.80q, %v; json.Unmarshal decodes %.80q", tc.token, got, ok, want)
			}
		})
	}
}

// TestUnquoteStringRejectsWhatJSONDoes: unquoteString checks the string as it decodes it (validJSONButLong left a
// long one unchecked): a control byte or an escape JSON does not have, in a word or in the last few bytes, with and
// without escapes before it, and after a byte that is not UTF-8 (the string is then checked by validString), is not
// decoded.
func TestUnquoteStringRejectsWhatJSONDoes(t *testing.T) {
	word := "12345678"
	for _, token := range []string{
		"\"\x01\"", "\"" + word + "\x1f" + word + "\"", "\"" + word + "\n" + word + "\x00\"", "\"\\n\x1f" + word + word + "\"",
		"\"\t\"", "\"é\n\"", "\"" + word + "\xff\x01\"", "\"\xff" + word + "\\t\x02\"",
		`"\x"`, `"` + word + `\a` + word + `"`, `"\u12"`, `"\u12g4"`, `"` + word + `\u00e"`, `"\uD83D\u12"`, `"\uD83D\uDE0g"`,
		`"\uD83D\u"`, `"\u0041\u"`, `"\n\uzzzz` + word + `"`, "\"\xff\\q\"", "\"\xff" + word + "\\u12x4\"",
	} {
		if json.Valid([]byte(token)) || skipString([]byte(token), 0) != len(token) {
			t.Fatalf("test token %q is valid JSON, or not one string token", token)
		}
		if got, ok := unquoteString([]byte(token)); ok {
			t.Errorf("unquoteString(%q) = %q, ok; it is not a JSON string", token, got)
		}
	}
}

// FuzzUnquoteString holds unquoteString to json.Unmarshal into a string on every string token (a value as eachMember
// hands it over, without whitespace around it, and closed where stringEnd says): the input as a token, and the input
// between quotes. A token validJSON rejects is not decoded.
func FuzzUnquoteString(f *testing.F) {
	for _, seed := range []string{`"a\nb"`, `\uD83D\uDE00`, `\uD83D\u0041`, "\xff\\t\xe2\x82", `<&> \"x\" \/`,
		`1234567\n12345678é1234567€\ud83d\ude42`, "12345678\\n12345678\xe2\x82", stringContent(loadgen.TextRealistic.Text(8, 64))} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, token := range [][]byte{in, append(append([]byte{'"'}, in...), '"')} {
			if len(token) < 2 || token[0] != '"' {
				continue
			}
			if end, closed := stringEnd(token, 0); !closed || end != len(token) {
				continue // validJSONButLong leaves unchecked only strings a quote closes
			}
			got, ok := unquoteString(token)
			if !validJSON(token) {
				if ok {
					t.Fatalf("unquoteString(%q) = %q, ok; validJSON rejects it", token, got)
				}
				continue
			}
			var want string
			if err := json.Unmarshal(token, &want); err != nil {
				t.Fatalf("json.Unmarshal(%q): %v, though validJSON accepts it", token, err)
			}
			if !ok || got != want {
				t.Fatalf("unquoteString(%q) = %q, %v; json.Unmarshal decodes %q", token, got, ok, want)
			}
		}
	})
}

// TestUnquoteStringOnRandomTokens holds unquoteString to json.Unmarshal on seeded random string tokens drawn from
// pieces that put escapes, surrogate halves, multi-byte characters, bytes that are not UTF-8, and control bytes and
// escapes JSON does not have (the token is then not decoded) at every offset of unquoteValid's eight-byte words: a
// fixed, reproducible set that covers them all, beside FuzzUnquoteString.
func TestUnquoteStringOnRandomTokens(t *testing.T) {
	pieces := []string{"a", "bc", "defgh", "12345678", ` `, `<`, `\n`, `\t`, `\"`, `\\`, `\/`, `\b`, `\u00e9`, `\u20AC`,
		`\ud83d`, `\ude42`, `\uD800`, `\u0000`, "é", "€", "—", "🙂", "\u2028", "\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\x80"}
	bad := []string{"\x01", "\x1f", "\n", `\x`, `\u12`, `\uD83D\u`, `\uDE4g`} // each drawn once in fifty pieces
	rng := rand.New(rand.NewPCG(21, 3))
	for n := range 20000 {
		var b strings.Builder
		b.WriteByte('"')
		for range rng.IntN(40) {
			if rng.IntN(50) == 0 {
				b.WriteString(bad[rng.IntN(len(bad))])
				continue
			}
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		b.WriteByte('"')
		token := []byte(b.String())
		var want string
		err := json.Unmarshal(token, &want)
		got, ok := unquoteString(token)
		if ok != (err == nil) || ok && got != want {
			t.Fatalf("token %d: unquoteString(%q) = %q, %v; json.Unmarshal decodes %q, %v", n, token, got, ok, want, err)
		}
	}
}
