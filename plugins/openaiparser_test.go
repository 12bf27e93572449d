package plugins

import (
	"bytes"
	"context"
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
