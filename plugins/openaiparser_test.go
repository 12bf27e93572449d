package plugins

import (
	"bytes"
	"context"
	"reflect"
	"testing"
)

func TestOpenAIParserReadsCachedTokens(t *testing.T) {
	sse := map[string]string{"content-type": "text/event-stream"}
	tests := []struct {
		name       string
		body       string
		headers    map[string]string
		wantUsage  bool
		wantCached int // -1: no details
	}{
		{"vLLM JSON response", `{"id":"x","usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`, nil, true, 32},
		{"vLLM stream usage chunk", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"total_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n", sse, true, 16},
		{"zero cached tokens are reported", `{"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`, nil, true, 0},
		{"upstream's spelling still works", `{"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,"prompt_token_details":{"cached_tokens":3}}}`, nil, true, 3},
		{"no details", `{"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`, nil, true, -1},
		{"stream chunk without usage", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", sse, false, -1},
	}
	p, err := OpenAIParserFactory("parser", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	parser := p.(*OpenAIParser)
	if got := parser.TypedName(); got.Type != OpenAIParserType || got.Name != "parser" {
		t.Fatalf("TypedName = %+v", got)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parsed, err := parser.ParseResponse(context.Background(), []byte(tt.body), tt.headers, true)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.wantUsage {
				if parsed != nil && parsed.Usage != nil {
					t.Fatalf("usage %+v from a chunk without usage", parsed.Usage)
				}
				return
			}
			if parsed == nil || parsed.Usage == nil {
				t.Fatal("usage missing")
			}
			details := parsed.Usage.PromptTokenDetails
			switch {
			case tt.wantCached < 0 && details != nil:
				t.Fatalf("invented cached tokens %+v", details)
			case tt.wantCached >= 0 && (details == nil || details.CachedTokens != tt.wantCached):
				t.Fatalf("cached tokens = %+v, want %d", details, tt.wantCached)
			}
		})
	}
}

func FuzzCachedPromptTokens(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":7}}}`))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: [DONE]\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if _, ok := cachedPromptTokens(body); ok && !bytes.Contains(body, []byte("cached_tokens")) {
			t.Fatalf("found cached tokens in a body without any: %q", body)
		}
	})
}

// FuzzOpenAIParserStreamShortcut holds ParseResponse's shortcut for streamed chunks to the full parse: on any chunk of
// a server-sent-events response, both give the same answer.
func FuzzOpenAIParserStreamShortcut(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"total_tokens\":42,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n",
		"data: {\"USAGE\":{\"prompt_tokens\":1}}\n\n",
		"data: {\"u\\u0073age\":{\"prompt_tokens\":1}}\n\n",
		"data: {\"u\xc5\xbfage\":{\"prompt_tokens\":2}}\n\n",
		"event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":31,\"output_tokens\":3}},\"type\":\"response.completed\"}\n\n",
		"data: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"the usage of words\"}}]}\n\n",
	} {
		f.Add([]byte(s))
	}
	p, err := OpenAIParserFactory("parser", nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	parser := p.(*OpenAIParser)
	headers := map[string]string{"Content-Type": "text/event-stream; charset=utf-8"}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, gotErr := parser.ParseResponse(context.Background(), body, headers, false)
		want, wantErr := parser.parseResponse(context.Background(), body, headers, false)
		if !reflect.DeepEqual(got, want) || (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("chunk %q: shortcut %+v, %v; full parse %+v, %v", body, got, gotErr, want, wantErr)
		}
	})
}

func TestMayNameUsage(t *testing.T) {
	for body, want := range map[string]bool{
		`{"choices":[{"delta":{"content":"token "}}]}`: false,
		`{"usage":{}}`:           true,
		`{"UsAgE":{}}`:           true,
		"{\"u\xc5\xbfage\":{}}":  true,
		`{"\u0075sage":{}}`:      true,
		`{"content":"a\u00e9b"}`: true, // any \u escape could spell a key
		`{"content":"us age"}`:   false,
		`{"content":"a\nb\"c"}`:  false,
		`usag`:                   false,
		"":                       false,
	} {
		if got := mayNameUsage([]byte(body)); got != want {
			t.Errorf("mayNameUsage(%q) = %v, want %v", body, got, want)
		}
	}
}

// mayNameUsageByteLoop is mayNameUsage as one loop over every byte, the definition it is held to.
func mayNameUsageByteLoop(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '\\' && i+1 < len(b) && b[i+1] == 'u':
			return true
		case c|0x20 == 'u' && foldsToSage(b[i+1:]):
			return true
		}
	}
	return false
}

func FuzzMayNameUsage(f *testing.F) {
	for _, s := range []string{`{"usage":{}}`, `{"UsAgE":{}}`, "{\"u\xc5\xbfage\":{}}", `\u`, `u`, `uU`, `usag`, `Usage`, `xxu`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := mayNameUsage(b), mayNameUsageByteLoop(b); got != want {
			t.Fatalf("mayNameUsage(%q) = %v, the byte loop says %v", b, got, want)
		}
	})
}

// BenchmarkMayNameUsage is the screen every streamed chunk crosses, on a chunk as vLLM streams it.
func BenchmarkMayNameUsage(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764547200,"model":"meta-llama/Llama-3.1-8B-Instruct",` +
		`"choices":[{"index":0,"delta":{"content":"token "},"logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n")
	for _, impl := range []struct {
		name string
		f    func([]byte) bool
	}{{"indexbyte", mayNameUsage}, {"byteloop", mayNameUsageByteLoop}} {
		b.Run(impl.name, func(b *testing.B) {
			for range b.N {
				if impl.f(chunk) {
					b.Fatal("names usage")
				}
			}
		})
	}
}
