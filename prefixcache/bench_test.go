package prefixcache

import (
	"fmt"
	"math/rand"
	"runtime"
	"testing"
	"time"
)

// BenchmarkScore scores an 8k-token prompt (4 bytes per token, 16-token
// blocks: 512 blocks) against 64 pods whose index holds 16384 blocks each
// (1M in all); the prompt's first 7k tokens are on 4 pods, its first 4k on 8
// more. It reports the index's heap per (pod, block) entry.
func BenchmarkScore(b *testing.B) {
	const pods, podBlocks, promptBytes = 64, 16384, 8192 * 4
	c := DefaultConfig()
	c.DefaultPodBlocks = podBlocks
	before := heapAlloc()
	ix, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	cs := make([]Candidate, pods)
	for i := range cs {
		cs[i] = Candidate{Pod: PodID{Namespace: "bench", Name: fmt.Sprint("vllm-", i)}, Load: Load{Running: 4, Queued: i % 3}}
	}
	rng := rand.New(rand.NewSource(1))
	text := func(n int) []byte {
		buf := make([]byte, n)
		rng.Read(buf)
		return buf
	}
	now := time.Unix(0, 0)
	for range 32 {
		for i := range cs {
			ix.Route(now, "", Prompt{Salt: testSalt, Rendered: text(promptBytes)}, cs[i])
		}
	}
	hot := text(promptBytes)
	for i := range 12 {
		shared := 7 * promptBytes / 8
		if i >= 4 {
			shared = promptBytes / 2
		}
		p := append(append([]byte(nil), hot[:shared]...), text(promptBytes-shared)...)
		ix.Route(now, "", Prompt{Salt: testSalt, Rendered: p}, cs[i])
	}
	st := ix.Stats()
	perBlock := float64(heapAlloc()-before) / float64(st.Entries)
	scores := make([]float64, pods)
	pr := Prompt{Salt: testSalt, Rendered: hot}
	ix.Score(pr, cs, scores)
	if scores[0] < 0.85 || scores[4] != 0.5 || scores[20] != 0 {
		b.Fatalf("warm index does not match the scenario: %v", scores)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ix.Score(pr, cs, scores)
	}
	b.ReportMetric(perBlock, "bytes/block")
	b.ReportMetric(float64(st.Entries), "blocks")
	runtime.KeepAlive(ix)
}

// BenchmarkRoute records an 8k-token prompt on one of 64 warm pods.
func BenchmarkRoute(b *testing.B) {
	c := DefaultConfig()
	c.DefaultPodBlocks = 4096
	ix, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	prompts := make([]Prompt, 256)
	for i := range prompts {
		buf := make([]byte, 8192*4)
		rng.Read(buf)
		prompts[i] = Prompt{Salt: testSalt, Rendered: buf}
	}
	now := time.Unix(0, 0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ix.Route(now, "", prompts[i%len(prompts)], Candidate{Pod: PodID{Name: fmt.Sprint(i % 64)}})
		i++
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
