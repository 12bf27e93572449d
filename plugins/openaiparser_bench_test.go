package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
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
	for _, size := range []int{1 << 10, 8 << 10, 16 << 10, 64 << 10, 220 << 10, 256 << 10} {
		body := benchChatBody(size)
		for _, parser := range parsers {
			b.Run(fmt.Sprintf("prompt=%dKB/parser=%s", size>>10, parser.name), func(b *testing.B) {
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

// benchChatBody is a streamed chat request of about size bytes: a system prompt and a user turn of random words.
func benchChatBody(size int) []byte {
	rng := rand.New(rand.NewSource(1))
	system, _ := json.Marshal(benchText(rng, size/8))
	user, _ := json.Marshal(benchText(rng, size-size/8))
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":128,"temperature":0.7,"messages":[{"role":"system","content":` + string(system) +
		`},{"role":"user","content":` + string(user) + `}]}`)
}
