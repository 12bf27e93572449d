package simulator

import (
	"encoding/json"
	"testing"
)

// FuzzParseRequest checks that the request parsers never panic and that
// whatever they accept is usable: a non-empty prompt, a valid output length
// and stream options only with streaming.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"hello","max_tokens":5}`,
		`{"prompt":["hello"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"n":1}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"messages":[{"role":"assistant","content":null}],"max_tokens":1e3}`,
		`{"prompt":"a","max_tokens":-1}`, `{"prompt":`, `[]`, `null`, `{"prompt":"a"} x`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		parse := parseCompletion
		if chat {
			parse = parseChat
		}
		g, aerr := parse(body)
		if aerr != nil {
			if g != nil || aerr.status != 400 || aerr.message == "" || aerr.errType != "BadRequestError" {
				t.Fatalf("bad rejection: %+v %+v", g, aerr)
			}
			if _, err := json.Marshal(aerr.message); err != nil {
				t.Fatalf("unencodable message: %v", err)
			}
			return
		}
		if len(g.prompt) == 0 || g.maxTokens < 0 || (g.includeUsage && !g.stream) || g.chat != chat {
			t.Fatalf("accepted an unusable request: %+v", g)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
	})
}

// FuzzApproximateTokens checks the approximation rule: ceil(len/4) tokens,
// and equal byte prefixes give equal token prefixes.
func FuzzApproximateTokens(f *testing.F) {
	f.Add("hello world", "hello there")
	f.Add("", "x")
	f.Add("héllo wörld", "héllo")
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := ApproximateTokens(a), ApproximateTokens(b)
		if len(ta) != (len(a)+3)/4 {
			t.Fatalf("%q: %d tokens", a, len(ta))
		}
		common := 0
		for common < len(a) && common < len(b) && a[common] == b[common] {
			common++
		}
		for i := range common / 4 {
			if ta[i] != tb[i] {
				t.Fatalf("token %d differs although %d bytes are shared", i, common)
			}
		}
	})
}
