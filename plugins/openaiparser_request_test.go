package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/prefixcache"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// requestPaths are the request paths the differential runs every body through: one per API upstream's parser
// tells apart, and none (upstream defaults to completions).
var requestPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/conversations", "/v1/embeddings", ""}

// requestBodies are the differential's cases and the fuzz target's seeds.
var requestBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
	`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`,
	` { "model" : "m" , "prompt" : ["a", "b\"}"] , "stream" : false, "seed": 12345678901234567890, "x": [1, {"y": null}] } `,
	`{"model":"m","prompt":"once","cache_salt":"s","logit_bias":{"50256":-100}}`,
	`{"model":"m","input":[{"role":"user","content":"x"}],"instructions":"be kind","tools":[]}`,
	`{"model":"m","items":[{"type":"message","role":"user","content":"hi"}],"metadata":{"k":"v"}}`,
	`{"model":"m","input":"embed me"}`,
	`{"model":"first","model":"last","stream":true,"stream":"yes","prompt":"p"}`,
	`{"mod\u0065l":"escaped key","MODEL":"other key","prompt":"p \u00e9 \ud83d\ude00 </script>"}`,
	`{"model":7,"prompt":"p"}`,
	`{"prompt":"no model"}`,
	`{"model":"m","prompt":"p","big":1e400}`,
	`{"model":"m","messages":[]}`,
	`{"model":"m"}`,
	`{"model":"m","prompt":"unterminated"`,
	`[{"model":"m"}]`,
	`null`,
	``,
	"{\"model\":\"m\xff\",\"prompt\":\"bad utf-8 \xfe\"}",
	// chats the byte scanners split and encoding/json would read otherwise
	`{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[{"content":"b"}]}`,
	`{"model":"m","MESSAGES":[{"role":"user","content":"a"}]}`,
	`{"model":"m","messages":[{"ROLE":"user","content":"a"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"a","content":[{"type":"text","text":"b"}]}]}`,
	`{"model":"m","messages":[{"role":"user","name":"n","content":"ends in a backslash \\","x":"\\\"q"}]}`,
	`{"model":"m","messages":[null,{"role":null,"content":null},{}]}`,
	`{"model":"m","messages":[{"role":7,"content":"a"}]}`,
	`{"model":"m","messages":[{"role":"user","content":7}]}`,
	`{"model":"m","messages":["user"]}`,
	`{"model":"m","messages":{"role":"user"}}`,
	`{"model":"m","messages":[{"role":"user","content":"a"}],"chat_template":7}`,
	`{"model":"m","m\u0065ssages":[{"role":"user","content":"escaped key"}],"tools":[{"type":"function"}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"bad utf-8 \xfe\"}]}",
	"{\"model\":\"m\",\"me\u017f\u017fages\":[{\"role\":\"user\",\"content\":\"folded key\"}]}",
	// long prompts written as the long-prompt-text scenario writes them (the parsed contents are what the prefix
	// cache hashes; the forwarded body escapes their <, > and &)
	`{"model":"m","stream":true,"messages":[{"role":"system","content":"` + stringContent(loadgen.TextRealistic.Text(3, 300)) +
		`"},{"role":"user","content":"` + stringContent(loadgen.TextRealistic.Text(4, 16<<10)) + `"}]}`,
	`{"model":"m","prompt":"` + stringContent(loadgen.TextRealistic.Text(5, 4<<10)) + `","max_tokens":9}`,
	// long strings the validation leaves to the content's decoding (validJSONButLong): not JSON in the content, in
	// another member, in a content part, in a message member no decoding reads; a content that is not UTF-8, with and
	// without a bad escape after it
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("x\\n", 700) + "\x01\"}]}",
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x\n", 700) + `\x"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("é\"", 500) + `\uD83D\u12zz"}],"max_tokens":3}`,
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("ok ", 500) + `"}],"metadata":{"note":"` +
		strings.Repeat("y\t", 600) + `\q"}}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("z\n", 600) + "\x1f" + `"}]}]}`,
	`{"model":"m","messages":[{"role":"user","name":"` + strings.Repeat("n\t", 600) + `\q","content":"hi"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":"` + strings.Repeat(`a\n`, 600) +
		`"},{"role":"user","content":"` + strings.Repeat(`b\n`, 600) + `"}],"metadata":{"note":"` + strings.Repeat(`c\t`, 600) +
		`\q"}}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("\\n\xff", 600) + "\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("\\n\xff", 600) + "\\q\"}]}",
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("w", 1500) + "\t\"}]}",
}

// TestOpenAIParserRequestMatchesUpstream is the differential of ParseRequest against upstream's parser: see
// sameParse.
func TestOpenAIParserRequestMatchesUpstream(t *testing.T) {
	parser := newTestOpenAIParser(t)
	for _, path := range requestPaths {
		for _, body := range requestBodies {
			if err := sameParse(parser, path, []byte(body)); err != nil {
				t.Errorf("path %q, body %q: %v", path, body, err)
			}
		}
	}
}

// FuzzOpenAIParserRequest holds ParseRequest to upstream's parser on any body, for every API, and the body a
// ForwardedBody encodes to upstream's Director's encoding (sameForwardedBody, every member left out).
func FuzzOpenAIParserRequest(f *testing.F) {
	for _, body := range requestBodies {
		f.Add([]byte(body))
	}
	parser := newTestOpenAIParser(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range requestPaths {
			if err := sameParse(parser, path, body); err != nil {
				t.Fatalf("path %q, body %q: %v", path, body, err)
			}
			if err := sameForwardedBody(parser, path, body, 0); err != nil {
				t.Fatalf("path %q, body %q: %v", path, body, err)
			}
		}
	})
}

// longStringBodies are chat bodies with L where a string of at least longMember bytes goes: in the content, in other
// members, as keys, repeated, and in documents that do not close.
var longStringBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":L}]}`,
	`{"model":"m","messages":[{"role":"user","content":L},{"role":"assistant","content":L}],"x":L}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":L}]}],"tools":[L,{"a":L}]}`,
	`{"model":L,"messages":[{"role":L,"content":"x"}],"user":L}`,
	`{"model":"m",L:L,"messages":[{"role":"user","content":"x",L:L}]}`,
	`{"model":"m","messages":[{"role":"user","content":L,"content":L}],"messages":[{"role":"user","content":L}]}`,
	` { "messages" : [ { "content" : L , "role" : "user" } ] , "model" : "m" , "stream" : L } `,
	`{"model":"m","messages":[{"role":"user","content":L}]`,
	`{"model":"m","messages":[{"role":"user","content":L]}`,
}

// FuzzOpenAIParserRequestLongStrings is FuzzOpenAIParserRequest for strings long enough that the validation records
// their ends and the scans after it look them up (stringEnds): the fuzzer's bytes end each string of one of
// longStringBodies, which a random body seldom makes that long.
func FuzzOpenAIParserRequestLongStrings(f *testing.F) {
	for _, tail := range []string{``, `a\"b`, `\\`, `\`, `"`, `\u00e9\ud83d\ude00`, "\x01", "\xff<&>", `\u12`, `"},{"`} {
		for which := range longStringBodies {
			f.Add([]byte(tail), uint8(which))
		}
	}
	parser := newTestOpenAIParser(f)
	f.Fuzz(func(t *testing.T, tail []byte, which uint8) {
		long := `"` + strings.Repeat("p", longMember) + string(tail) + `"`
		body := []byte(strings.ReplaceAll(longStringBodies[int(which)%len(longStringBodies)], "L", long))
		for _, path := range requestPaths {
			if err := sameParse(parser, path, body); err != nil {
				t.Fatalf("path %q, body %.300q: %v", path, body, err)
			}
			for _, longFrom := range []int{0, longMember} {
				if err := sameForwardedBody(parser, path, body, longFrom); err != nil {
					t.Fatalf("path %q, body %.300q, long from %d: %v", path, body, longFrom, err)
				}
			}
		}
	})
}

func newTestOpenAIParser(tb testing.TB) *OpenAIParser {
	p, err := OpenAIParserFactory("parser", nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return p.(*OpenAIParser)
}

// sameParse parses body as a request to path with p and with upstream's parser, and reports how they differ in what
// the EPP reads or forwards: an error where the other has none, a different error, API type, stream flag or model,
// or a forwarded body (the payload as upstream's Director encodes it, after rewriting the model) that decodes to a
// different value. The one difference allowed is the one ParseRequest documents: a body upstream rejects only for a
// number beyond float64's range.
func sameParse(p *OpenAIParser, path string, body []byte) error {
	headers := map[string]string{}
	if path != "" {
		headers[":path"] = path
	}
	got, gotErr := p.ParseRequest(context.Background(), body, headers)
	want, wantErr := p.OpenAIParser.ParseRequest(context.Background(), body, headers)
	var rangeErr *json.UnmarshalTypeError
	switch {
	case wantErr != nil && gotErr == nil && errors.As(wantErr, &rangeErr) && strings.HasPrefix(rangeErr.Value, "number"):
		return nil
	case gotErr != nil || wantErr != nil:
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			return fmt.Errorf("error %v, upstream's %v", gotErr, wantErr)
		}
		return nil
	}
	if got.Stream != want.Stream {
		return fmt.Errorf("stream %v, upstream's %v", got.Stream, want.Stream)
	}
	typed := func(b *scheduling.LLMRequestBody) scheduling.LLMRequestBody {
		c := *b
		c.Payload, c.Stream = nil, false
		return c
	}
	if g, w := typed(got), typed(want); !reflect.DeepEqual(g, w) {
		return fmt.Errorf("request %+v, upstream's %+v", g, w)
	}
	gotMap, ok1 := got.Payload.(scheduling.PayloadMap)
	wantMap, ok2 := want.Payload.(scheduling.PayloadMap)
	if !ok1 || !ok2 {
		return fmt.Errorf("payload %T, upstream's %T", got.Payload, want.Payload)
	}
	if !reflect.DeepEqual(gotMap["model"], wantMap["model"]) {
		return fmt.Errorf("model %#v, upstream's %#v", gotMap["model"], wantMap["model"])
	}
	gotBody, wantBody, err := forwarded(gotMap), forwarded(wantMap), error(nil)
	if !reflect.DeepEqual(gotBody, wantBody) {
		err = fmt.Errorf("forwarded body %v, upstream's %v", gotBody, wantBody)
	}
	return err
}

// forwarded is the body upstream's Director forwards for a payload whose model it rewrites, decoded.
func forwarded(payload scheduling.PayloadMap) any {
	if _, ok := payload["model"].(string); ok {
		payload["model"] = "rewritten"
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return fmt.Sprintf("encoding error: %v", err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Sprintf("decoding error: %v", err)
	}
	return v
}

// TestRealisticPromptHashesAsUpstreamParse checks that the prefix cache keys a long realistic prompt (long-prompt-text's
// text, with every escape that text has) the same from Sluice's parse as from upstream's, whose contents are
// encoding/json's decoding: the rendered chat's block hashes, at two block sizes, are equal. Sluice's content
// decoding (unquoteString) is the only step between the body and the hashed strings that differs, so equal hashes
// here are the prefix-cache scores of the base unchanged.
func TestRealisticPromptHashesAsUpstreamParse(t *testing.T) {
	parser := newTestOpenAIParser(t)
	for seed := range uint64(3) {
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + stringContent(loadgen.TextRealistic.Text(seed, 200)) +
			`"},{"role":"user","content":"` + stringContent(loadgen.TextRealistic.Text(seed+10, 20<<10)) + `"}]}`)
		headers := map[string]string{":path": "/v1/chat/completions"}
		got, err := parser.ParseRequest(context.Background(), body, headers)
		if err != nil {
			t.Fatal(err)
		}
		want, err := parser.OpenAIParser.ParseRequest(context.Background(), body, headers)
		if err != nil {
			t.Fatal(err)
		}
		chains := func(b *scheduling.LLMRequestBody) [][]uint64 {
			var msgs []prefixcache.Message
			for _, m := range b.ChatCompletions.Messages {
				msgs = append(msgs, prefixcache.Message{Role: m.Role, Parts: []prefixcache.Part{{Kind: "text", Value: m.Content.Raw}}})
			}
			rendered, err := prefixcache.AppendChat(nil, prefixcache.Chat{Messages: msgs})
			if err != nil {
				t.Fatal(err)
			}
			var out [][]uint64
			for _, block := range []int{64, 256} {
				out = append(out, prefixcache.AppendChain(nil, prefixcache.Salt{Model: "m"}, rendered, block, 1<<20))
			}
			return out
		}
		g, w := chains(got), chains(want)
		if len(g[0]) < 1000 || !reflect.DeepEqual(g, w) {
			t.Errorf("seed %d: %d and %d blocks of 64 bytes; equal: %v", seed, len(g[0]), len(w[0]), reflect.DeepEqual(g, w))
		}
	}
}
