package plugins

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// BenchmarkPrefixRequest is the prefix cache's whole cost for one request as
// the EPP runs it: Score over four endpoints, then PreRequest's insert into
// the picked one, for a chat of 2k, 16k and 64k tokens (4 bytes each; issue
// 21's long prompts). SetBytes is the prompt, so ns/op over bytes is the cost
// per prompt byte (cpu-ns/op: the process's CPU, which a loaded machine
// disturbs less than wall time). Every iteration is a new request with the same prompt, so
// the index's state is the same each time.
func BenchmarkPrefixRequest(b *testing.B) {
	for _, tokens := range []int{2048, 16384, 65536} {
		b.Run(fmt.Sprintf("tokens=%dk", tokens/1024), func(b *testing.B) {
			p := newTestPrefixCache(b, "")
			eps := prefixEndpoints(4)
			rng := rand.New(rand.NewSource(1))
			body := chatRequest("warm", chatMsg("system", benchText(rng, 1024)), chatMsg("user", benchText(rng, tokens*4-1024))).Body
			ctx := context.Background()
			b.SetBytes(int64(tokens * 4))
			b.ReportAllocs()
			b.ResetTimer()
			stop := runnertest.CPUPerOp(b)
			for i := range b.N {
				req := &fwksched.LLMRequest{RequestId: fmt.Sprint("r", i), TargetModel: "llama", Body: body}
				p.Score(ctx, nil, req, eps)
				routeTo(p, req, eps[i%len(eps)])
			}
			stop()
		})
	}
}
