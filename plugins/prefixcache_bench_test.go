package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"runtime"
	"testing"

	k8stypes "k8s.io/apimachinery/pkg/types"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/prefix"
)

// The side-by-side scenario: 64 pods of 16384 KV blocks of 16 tokens
// (4 bytes per token, both scorers' rule), each warmed with 32 distinct
// 8k-token chats (~1M indexed blocks in all), then a hot conversation
// whose history is on pods 0-3 (first 7k tokens) and 4-11 (first 4k
// tokens). The scored request is its next 8k-token turn. Both scorers hash
// the whole prompt (upstream's maxPrefixBlocksToMatch raised to 512 from its
// default 256, which would halve its hashing work and its view).
const (
	benchPods        = 64
	benchPodBlocks   = 16384
	benchBlockTokens = 16
	benchFillPerPod  = 32
	benchPromptBytes = 8192 * 4
)

func benchText(rng *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz     ,."
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.Intn(len(letters))]
	}
	return string(b)
}

// benchChat is an 8k-token chat: a 4k-token system prompt, a 3k-token
// user turn, a 0.5k-token answer and a 0.5k-token question.
func benchChat(id, system, user, answer, question string) *fwksched.LLMRequest {
	return &fwksched.LLMRequest{
		RequestId:   id,
		TargetModel: "llama-3-8b",
		Body: &fwksched.LLMRequestBody{ChatCompletions: &fwksched.ChatCompletionsRequest{Messages: []fwksched.Message{
			{Role: "system", Content: fwksched.Content{Raw: system}},
			{Role: "user", Content: fwksched.Content{Raw: user}},
			{Role: "assistant", Content: fwksched.Content{Raw: answer}},
			{Role: "user", Content: fwksched.Content{Raw: question}},
		}}},
	}
}

type benchScenario struct {
	endpoints []fwksched.Endpoint
	// route replays the warm-up: fn(request, endpoint) for every routed
	// request, oldest first, generating each prompt on the fly.
	route  func(fn func(*fwksched.LLMRequest, fwksched.Endpoint))
	scored *fwksched.LLMRequest
}

func newBenchScenario() benchScenario {
	eps := make([]fwksched.Endpoint, benchPods)
	for i := range eps {
		eps[i] = fwksched.NewEndpoint(
			&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "bench", Name: fmt.Sprintf("vllm-%02d", i)}},
			&fwkdl.Metrics{CacheBlockSize: benchBlockTokens, CacheNumBlocks: benchPodBlocks, RunningRequestsSize: 4, WaitingQueueSize: i % 3, KVCacheUsagePercent: 0.5},
			nil)
	}
	const q = benchPromptBytes / 16
	hot := rand.New(rand.NewSource(7))
	system, user, answer := benchText(hot, 8*q), benchText(hot, 6*q), benchText(hot, q)
	s := benchScenario{endpoints: eps, scored: benchChat("scored", system, user, answer, benchText(hot, q))}
	s.route = func(fn func(*fwksched.LLMRequest, fwksched.Endpoint)) {
		rng := rand.New(rand.NewSource(1))
		n := 0
		for range benchFillPerPod {
			for i := range benchPods {
				n++
				fn(benchChat(fmt.Sprint("fill-", n), benchText(rng, 8*q), benchText(rng, 6*q), benchText(rng, q), benchText(rng, q)), eps[i])
			}
		}
		hist := rand.New(rand.NewSource(2))
		for i := range 4 {
			fn(benchChat(fmt.Sprint("hot-", i), system, user, answer, benchText(hist, q)), eps[i])
		}
		for i := 4; i < 12; i++ {
			fn(benchChat(fmt.Sprint("warm-", i), system, benchText(hist, 6*q), benchText(hist, q), benchText(hist, q)), eps[i])
		}
	}
	return s
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func BenchmarkPrefixScore(b *testing.B) {
	ctx := context.Background()
	s := newBenchScenario()

	b.Run("sluice", func(b *testing.B) {
		before := heapInUse()
		p, err := newPrefixCache("bench", mustPrefixConfig(b, `{"maxPrefixTokens":8192}`), nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		s.route(func(req *fwksched.LLMRequest, ep fwksched.Endpoint) {
			routeTo(p, req, ep)
			p.ResponseBody(ctx, req, &fwkrc.Response{EndOfStream: true}, nil) // end it: nothing left in flight
		})
		entries := p.index.Stats().Entries
		bytesPerBlock := float64(heapInUse()-before) / float64(entries)
		got := p.Score(ctx, nil, s.scored, s.endpoints)
		checkBenchScores(b, got, s.endpoints)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			p.Score(ctx, nil, s.scored, s.endpoints)
		}
		b.ReportMetric(bytesPerBlock, "bytes/block")
		b.ReportMetric(float64(entries), "blocks")
		runtime.KeepAlive(p)
	})

	b.Run("upstream", func(b *testing.B) {
		bctx, cancel := context.WithCancel(ctx)
		defer cancel()
		handle := fwkplugin.NewEppHandle(bctx, func() []k8stypes.NamespacedName { return nil })
		before := heapInUse()
		raw := json.RawMessage(fmt.Sprintf(`{"autoTune":true,"blockSizeTokens":%d,"maxPrefixBlocksToMatch":512,"lruCapacityPerServer":%d}`, benchBlockTokens, benchPodBlocks))
		pl, err := approximateprefix.ApproxPrefixCacheFactory("bench", raw, handle)
		if err != nil {
			b.Fatal(err)
		}
		producer := pl.(interface {
			fwkrc.PrepareDataPlugin
			fwkrc.PreRequest
		})
		scorer, err := prefix.New(bctx)
		if err != nil {
			b.Fatal(err)
		}
		goroutines := runtime.NumGoroutine()
		perPod := map[fwksched.Endpoint]int{}
		s.route(func(req *fwksched.LLMRequest, ep fwksched.Endpoint) {
			one := []fwksched.Endpoint{ep}
			if err := producer.PrepareRequestData(ctx, req, one); err != nil {
				b.Fatal(err)
			}
			routeTo2(producer, req, ep)
			perPod[ep] += upstreamBlocks(req)
			// Upstream indexes in a goroutine per request; let them drain
			// so the index is complete and memory is not inflated.
			for runtime.NumGoroutine() > goroutines {
				runtime.Gosched()
			}
		})
		entries := 0
		for _, n := range perPod {
			entries += min(n, benchPodBlocks)
		}
		bytesPerBlock := float64(heapInUse()-before) / float64(entries)
		score := func() map[fwksched.Endpoint]float64 {
			if err := producer.PrepareRequestData(ctx, s.scored, s.endpoints); err != nil {
				b.Fatal(err)
			}
			return scorer.Score(ctx, nil, s.scored, s.endpoints)
		}
		checkBenchScores(b, score(), s.endpoints)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			score()
		}
		b.ReportMetric(bytesPerBlock, "bytes/block")
		b.ReportMetric(float64(entries), "blocks")
		runtime.KeepAlive(pl)
	})
}

func routeTo2(p fwkrc.PreRequest, req *fwksched.LLMRequest, ep fwksched.Endpoint) {
	p.PreRequest(context.Background(), req, &fwksched.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{ep}}},
	})
}

// upstreamBlocks is how many blocks upstream indexes for req: it hashes the
// JSON of the messages in 64-byte blocks, at most 512.
func upstreamBlocks(req *fwksched.LLMRequest) int {
	b, _ := json.Marshal(req.Body.ChatCompletions.Messages)
	return min(len(b)/(benchBlockTokens*4), 512)
}

// checkBenchScores verifies the warm index sees the scenario: pods 0-3 hold
// most of the prompt, 4-11 about half, the rest nothing.
func checkBenchScores(b *testing.B, got map[fwksched.Endpoint]float64, eps []fwksched.Endpoint) {
	b.Helper()
	for i, ep := range eps {
		s := got[ep]
		ok := (i < 4 && s > 0.8) || (i >= 4 && i < 12 && s > 0.4 && s < 0.6) || (i >= 12 && s == 0)
		if !ok {
			b.Fatalf("pod %d scored %v: warm index does not match the scenario", i, s)
		}
	}
}

func mustPrefixConfig(b *testing.B, raw string) prefixCacheConfig {
	cfg, err := parsePrefixCacheConfig(json.RawMessage(raw))
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}
