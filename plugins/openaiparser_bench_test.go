package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// BenchmarkOpenAIParserRequest is the EPP's work on a request body before scheduling, side by side for upstream's
// parser and Sluice's, at prompt sizes from 1 KB to 256 KB (8, 64 and 256 KB: about 2k, 16k and 64k tokens):
// ParseRequest, then what upstream's Director does with its payload (the model rewritten, the payload encoded as the
// forwarded body), in a context with a ForwardedBody as Sluice's hot path calls the Director (upstream's parser
// ignores it). The ratio of the two at each size is the figure (see testbed/bench/scenarios/README.md), in cpu-ns/op
// (the process's CPU time per operation, which a shared machine's load disturbs far less than ns/op); -benchmem gives
// the allocations.
//
//	go test -run '^$' -bench OpenAIParserRequest -benchmem -count 6 ./plugins/
func BenchmarkOpenAIParserRequest(b *testing.B) {
	p := newTestOpenAIParser(b)
	parsers := []struct {
		name  string
		parse func(ctx context.Context, body []byte, headers map[string]string) (*fwksched.LLMRequestBody, error)
	}{
		{"upstream", p.OpenAIParser.ParseRequest},
		{"sluice", p.ParseRequest},
	}
	headers := map[string]string{":path": "/v1/chat/completions"}
	shapes := []struct {
		size    int
		escaped string // "" for words of lower-case letters, "-escaped" for text as a real prompt is written
	}{{1 << 10, ""}, {8 << 10, ""}, {16 << 10, ""}, {64 << 10, ""}, {220 << 10, ""}, {256 << 10, ""},
		{8 << 10, "-escaped"}, {64 << 10, "-escaped"}, {256 << 10, "-escaped"}}
	for _, shape := range shapes {
		size := shape.size
		body := benchChatBody(size)
		if shape.escaped != "" {
			body = benchEscapedChatBody(size)
		}
		for _, parser := range parsers {
			b.Run(fmt.Sprintf("prompt=%dKB%s/parser=%s", size>>10, shape.escaped, parser.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				stop := runnertest.CPUPerOp(b)
				for b.Loop() {
					ctx, forwarded := WithForwardedBody(context.Background()) // as the hot path calls the Director
					parsed, err := parser.parse(ctx, body, headers)
					if err != nil {
						b.Fatal(err)
					}
					payload := parsed.Payload.(fwksched.PayloadMap)
					payload["model"] = "rewritten"
					if _, err := json.Marshal(payload); err != nil {
						b.Fatal(err)
					}
					if _, _, err := forwarded.Encode(); err != nil {
						b.Fatal(err)
					}
				}
				stop()
			})
		}
	}
}

// benchEscapedChatBody is benchChatBody with the prompt written as a real one is: lines of code and prose with a line
// break ("\n") every ~50 bytes, quotation marks, tabs, <, & and non-ASCII letters, JSON-encoded as clients do
// (without HTML escapes).
func benchEscapedChatBody(size int) []byte {
	lines := []string{
		"func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {",
		"\tif err := s.check(r); err != nil && !errors.Is(err, ErrSkip) {",
		"\t\treturn fmt.Errorf(\"check %q: %w\", r.URL.Path, err)",
		"Le café coûte 3 € & la réunion est à 14h <salle B>.",
		"The model answered: \"see the table below\", then listed three items.",
	}
	text := func(n int) string {
		var sb strings.Builder
		for i := 0; sb.Len() < n; i++ {
			sb.WriteString(lines[i%len(lines)] + "\n")
		}
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(sb.String()); err != nil {
			panic(err)
		}
		return strings.TrimSuffix(out.String(), "\n")
	}
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":128,"temperature":0.7,"messages":[{"role":"system","content":` + text(size/8) +
		`},{"role":"user","content":` + text(size-size/8) + `}]}`)
}

// benchChatBody is a streamed chat request of about size bytes: a system prompt and a user turn of random words.
func benchChatBody(size int) []byte {
	rng := rand.New(rand.NewSource(1))
	system, _ := json.Marshal(benchText(rng, size/8))
	user, _ := json.Marshal(benchText(rng, size-size/8))
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":128,"temperature":0.7,"messages":[{"role":"system","content":` + string(system) +
		`},{"role":"user","content":` + string(user) + `}]}`)
}
