package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkEngineStep measures the cost of one engine step under a closed
// loop that keeps `concurrency` requests in flight (512-token prompts from 16
// shared prefix groups, 128 output tokens), so the later virtual-time fleet
// benchmark can be sized: ns/op is CPU per step, tokens/s is output tokens
// simulated per CPU second, steps/s is steps per CPU second and reqs/s
// completed requests per CPU second (all measured in wall time, so they are
// lower bounds on a shared machine).
func BenchmarkEngineStep(b *testing.B) {
	for _, bc := range []struct {
		profile     string
		concurrency int
	}{
		{"h100", 16}, {"h100", 64}, {"h100", 256}, {"h100", 512}, {"a10g", 128},
	} {
		b.Run(fmt.Sprintf("%s/inflight=%d", bc.profile, bc.concurrency), func(b *testing.B) {
			cfg, err := Profile(bc.profile)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			groups := make([][]uint64, 16)
			for g := range groups {
				groups[g] = HashBlocks(RootHash(""), tokens(100_000*g, 512), cfg.BlockSize)
			}
			var (
				id        uint64
				finished  int // not yet replaced
				completed int
				emitted   int
			)
			e, err := NewEngine(cfg, ObserverFunc(func(out *StepOutput) {
				finished += len(out.Finished)
				completed += len(out.Finished)
				emitted += len(out.Emitted)
			}))
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(0, 0)
			newReq := func() *Request {
				id++
				g := groups[rng.IntN(len(groups))]
				// Half of each prompt is shared, half unique to the request.
				hashes := append(g[:16:16], make([]uint64, 16)...)
				for i := 16; i < 32; i++ {
					hashes[i] = id<<8 | uint64(i)
				}
				return &Request{ID: id, PromptTokens: 512, BlockHashes: hashes, MaxTokens: 128}
			}
			for range bc.concurrency {
				if err := e.Submit(now, newReq()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				next, ok := e.NextEvent()
				if !ok {
					b.Fatal("engine idle in a closed loop")
				}
				now = next
				e.Advance(now)
				for ; finished > 0; finished-- {
					if err := e.Submit(now, newReq()); err != nil {
						b.Fatal(err)
					}
				}
			}
			elapsed := time.Since(start).Seconds()
			b.ReportMetric(float64(emitted)/elapsed, "tokens/s")
			b.ReportMetric(float64(b.N)/elapsed, "steps/s")
			b.ReportMetric(float64(completed)/elapsed, "reqs/s")
		})
	}
}
