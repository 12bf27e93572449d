package plugins

import (
	"encoding/json"
	"strings"
	"testing"
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !validJSON([]byte(tc.token)) {
				t.Fatalf("test token %q is not valid JSON", tc.token)
			}
			var want string
			if err := json.Unmarshal([]byte(tc.token), &want); err != nil {
				t.Fatal(err)
			}
			if got := unquoteString([]byte(tc.token)); got != want {
				t.Errorf("unquoteString(%.80q) = %.80q, json.Unmarshal decodes %.80q", tc.token, got, want)
			}
		})
	}
}

// FuzzUnquoteString holds unquoteString to json.Unmarshal into a string on every string token validJSON accepts (a
// value as eachMember hands it over, without whitespace around it): the input as a token, and the input between
// quotes.
func FuzzUnquoteString(f *testing.F) {
	for _, seed := range []string{`"a\nb"`, `\uD83D\uDE00`, `\uD83D\u0041`, "\xff\\t\xe2\x82", `<&> \"x\" \/`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, token := range [][]byte{in, append(append([]byte{'"'}, in...), '"')} {
			if len(token) < 2 || token[0] != '"' || skipString(token, 0) != len(token) || !validJSON(token) {
				continue
			}
			var want string
			if err := json.Unmarshal(token, &want); err != nil {
				t.Fatalf("json.Unmarshal(%q): %v, though validJSON accepts it", token, err)
			}
			if got := unquoteString(token); got != want {
				t.Fatalf("unquoteString(%q) = %q, json.Unmarshal decodes %q", token, got, want)
			}
		}
	})
}
