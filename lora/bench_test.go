package lora

import (
	"fmt"
	"testing"
	"time"
)

// benchFleet is 64 pods serving 40 adapters, 4 slots each, a few adapters
// running or waiting per pod and varied queues: the shape of
// plugins.BenchmarkLoRAScore, so the pure logic's cost can be read apart from
// the adapter's.
func benchFleet() ([]PodState, []string) {
	adapters := make([]string, 40)
	for i := range adapters {
		adapters[i] = fmt.Sprintf("adapter-%02d", i)
	}
	pods := make([]PodState, 64)
	for i := range pods {
		pods[i] = PodState{
			Name:            fmt.Sprintf("vllm-%02d", i),
			MaxLoRA:         4,
			Running:         NewAdapters(adapters[i%40], adapters[(i*7)%40]),
			Waiting:         NewAdapters(adapters[(i*13)%40]),
			QueueDepth:      i % 9,
			RunningRequests: i % 17,
		}
	}
	return pods, adapters
}

func BenchmarkScore(b *testing.B) {
	pods, adapters := benchFleet()
	s, err := NewScorer(DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range adapters {
		s.Record(adapters[i], pods[(i*3)%len(pods)].Name, t0.Add(-time.Duration(i)*time.Second))
	}
	out := make([]float64, len(pods))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.ScoreInto(out, Request{Adapter: adapters[i%len(adapters)]}, pods, t0)
		i++
	}
}
