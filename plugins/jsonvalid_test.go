package plugins

import (
	"encoding/json"
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
	} {
		want := json.Valid([]byte(doc))
		if got := validJSON([]byte(doc)); got != want {
			t.Errorf("validJSON(%.60q…, %d bytes) = %v, json.Valid says %v", doc, len(doc), got, want)
		}
	}
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
	})
}
