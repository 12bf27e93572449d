package plugins

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestValidJSONAsEncodingJSON(t *testing.T) {
	deep := func(n int, open, close string) string { return strings.Repeat(open, n) + strings.Repeat(close, n) }
	for _, doc := range []string{
		``, ` `, `{}`, ` { } `, `[]`, `[ ]`, `{"a":1}`, `{"a" : [1, 2.5, -0, 1e3, 1E+3, -1.5e-3, true, false, null]}`,
		`{"a":1,}`, `{,}`, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`, `{a:1}`, `{"a":1 "b":2}`, `[1 2]`, `{} {}`, `{}x`, `1 2`,
		`"s"`, `"`, `"abc`, `"a\"b"`, `"a\\"`, `"a\\\"`, `"\/\b\f\n\r\t\u00e9\uD83D\uDE00"`, `"\x"`, `"\u12"`, `"\u12g4"`,
		`"\u"`, `"` + "\x01" + `"`, `"` + "\x1f" + `"`, `"` + "\x7f\x80\xff" + `"`, "\"tab\there\"", `"é ≠ \u2028"`,
		`0`, `-`, `-0`, `01`, `-01`, `1.`, `.5`, `1.5`, `1e`, `1e+`, `1e5`, `+1`, `1.5.5`, `0x10`, `-a`, `1ee5`,
		`true`, `tru`, `truex`, `false`, `fals`, `null`, `nul`, `nulll`, `True`,
		` {"k\"ey": {"x": ["a", {"b": null}]}} `, "\t\r\n[1]\n", `[1]]`, `[[1]`, `{"a":{"b":1}`, `{"a":1}}`, `["a":1]`,
		`{"a":[}`, `{"a":"b"]`, `{"` + strings.Repeat("long string content ", 100) + `":"` + strings.Repeat("x\\n\\\"", 50) + `"}`,
		deep(maxJSONDepth, "[", "]"), deep(maxJSONDepth+1, "[", "]"), deep(maxJSONDepth-1, `{"a":`, "}") + "", // 9,999 objects
		strings.Repeat(`{"a":`, maxJSONDepth) + "1" + strings.Repeat("}", maxJSONDepth),
		strings.Repeat(`{"a":`, maxJSONDepth+1) + "1" + strings.Repeat("}", maxJSONDepth+1),
		strings.Repeat("[", maxJSONDepth) + "{}" + strings.Repeat("]", maxJSONDepth),
		// string values validJSONButLong leaves unchecked: bad content, or not closed
		`{"a":"` + strings.Repeat("x", 70) + "\x01" + `"}`, `{"a":["` + strings.Repeat("x", 70) + `\q"]}`, `["abcd\u12", 1]`,
		`["abcd\\", "ok"]`, `["abc\"`, `"abcdefgh\"`, `{"a":"abcdefgh`, `["abcdefgh\\\"]`, `["abcdefgh\\\\"]`,
		`{"` + strings.Repeat("k", 70) + "\x01" + `":1}`,
	} {
		want := json.Valid([]byte(doc))
		if got := validJSON([]byte(doc)); got != want {
			t.Errorf("validJSON(%.60q…, %d bytes) = %v, json.Valid says %v", doc, len(doc), got, want)
		}
		for _, longFrom := range []int{0, 3, 8, 64} {
			if got := validButLongThenStrings([]byte(doc), longFrom); got != want {
				t.Errorf("validJSONButLong(%.60q…, %d bytes, %d), its strings checked after, = %v, json.Valid says %v",
					doc, len(doc), longFrom, got, want)
			}
		}
	}
}

// validButLongThenStrings is validJSONButLong with the strings it left unchecked checked after by validString, as
// decodeChat does; it also fails if one of them is not a string value of longFrom bytes or more, or if the length
// it records for one (ends) is not skipString's.
func validButLongThenStrings(doc []byte, longFrom int) bool {
	unchecked, ends, ok := validJSONButLong(doc, longFrom)
	if ok && len(ends) != len(unchecked) {
		panic(fmt.Sprintf("%q: %d unchecked strings, %d ends", doc, len(unchecked), len(ends)))
	}
	for _, at := range unchecked {
		end, closed := stringEnd(doc, at)
		if doc[at] != '"' || !closed || end-at < longFrom {
			panic(fmt.Sprintf("%q: unchecked string at %d is not a closed string of %d bytes or more", doc, at, longFrom))
		}
		if n := ends[&doc[at]]; ok && n != end-at {
			panic(fmt.Sprintf("%q: string at %d ends at %d, recorded %d", doc, at, end, at+n))
		}
		if _, valid := validString(doc, at); !valid {
			ok = false
		}
	}
	return ok
}

// FuzzValidJSON holds validJSON to json.Valid. Seeds are in testdata/fuzz/FuzzValidJSON.
func FuzzValidJSON(f *testing.F) {
	for _, seed := range []string{`{"model":"m","messages":[{"role":"user","content":"hi \u00e9\n"}],"max_tokens":5}`, `[1,-2.5e3,true,null,"\\"]`, `"abcdefghijklmnopqrstuvwxyz\"0123456789"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if got, want := validJSON(doc), json.Valid(doc); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", doc, got, want)
		}
		if got, want := validButLongThenStrings(doc, 2), json.Valid(doc); got != want {
			t.Fatalf("validJSONButLong(%q, 2), its strings checked after, = %v, json.Valid says %v", doc, got, want)
		}
	})
}
