package runner

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBoundedLabels registers upstream-style vectors labelled by model name
// through a registry bounded to 2 values: the first two models keep their
// series, every later one (and the value "other" itself) is summed under
// "other", and the folded children leave the vectors, so neither the page
// nor the EPP's memory grows with the number of models clients send.
func TestBoundedLabels(t *testing.T) {
	inner := prometheus.NewPedanticRegistry()
	reg := newBoundedRegistry(inner, 2)
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "request_total", Help: "h"}, []string{"model_name", "target_model_name"})
	running := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "running_requests", Help: "h"}, []string{"model_name"})
	sizes := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "request_sizes", Help: "h", Buckets: []float64{10, 100}}, []string{"model_name"})
	pool := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pool_ready", Help: "h"}, []string{"name"})
	reg.MustRegister(requests, running, sizes, pool)

	serve := func(model string, size float64) {
		requests.WithLabelValues(model, model).Inc()
		running.WithLabelValues(model).Inc()
		sizes.WithLabelValues(model).Observe(size)
	}
	finish := func(model string) { running.WithLabelValues(model).Dec() }
	// A scrape between requests admits and folds what came so far; values new to the same scrape are admitted in
	// the vectors' (random) order.
	scrape := func() {
		t.Helper()
		if _, err := inner.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	pool.WithLabelValues("vllm").Set(3)
	serve("llama", 5)
	scrape()
	serve("qwen", 50)
	scrape()
	serve("llama", 5)
	for i, m := range []string{"junk-1", "junk-2", "other", "junk-3"} {
		serve(m, float64(500*(i+1)))
		scrape()
	}
	finish("junk-1") // back to zero after its series was folded
	finish("qwen")

	const want = `
# HELP request_total h
# TYPE request_total counter
request_total{model_name="llama",target_model_name="llama"} 2
request_total{model_name="other",target_model_name="other"} 4
request_total{model_name="qwen",target_model_name="qwen"} 1
# HELP running_requests h
# TYPE running_requests gauge
running_requests{model_name="llama"} 2
running_requests{model_name="other"} 3
running_requests{model_name="qwen"} 0
# HELP request_sizes h
# TYPE request_sizes histogram
request_sizes_bucket{model_name="llama",le="10"} 2
request_sizes_bucket{model_name="llama",le="100"} 2
request_sizes_bucket{model_name="llama",le="+Inf"} 2
request_sizes_sum{model_name="llama"} 10
request_sizes_count{model_name="llama"} 2
request_sizes_bucket{model_name="other",le="10"} 0
request_sizes_bucket{model_name="other",le="100"} 0
request_sizes_bucket{model_name="other",le="+Inf"} 4
request_sizes_sum{model_name="other"} 5000
request_sizes_count{model_name="other"} 4
request_sizes_bucket{model_name="qwen",le="10"} 0
request_sizes_bucket{model_name="qwen",le="100"} 1
request_sizes_bucket{model_name="qwen",le="+Inf"} 1
request_sizes_sum{model_name="qwen"} 50
request_sizes_count{model_name="qwen"} 1
# HELP pool_ready h
# TYPE pool_ready gauge
pool_ready{name="vllm"} 3
`
	for range 2 { // folding is idempotent: a second scrape reads the same
		if err := testutil.GatherAndCompare(inner, strings.NewReader(want)); err != nil {
			t.Fatal(err)
		}
	}
	// The vectors hold the admitted models' children only (and a gauge still counting): memory stays bounded.
	for _, c := range []struct {
		name string
		vec  prometheus.Collector
		want int
	}{{"requests", requests, 2}, {"sizes", sizes, 2}, {"running", running, 2 + 3}} {
		if n := testutil.CollectAndCount(c.vec); n != c.want {
			t.Errorf("%s vector holds %d series, want %d", c.name, n, c.want)
		}
	}
	scrape()
	if n := testutil.CollectAndCount(running); n != 2+3 {
		t.Errorf("running vector holds %d series after the zeros were folded, want the 2 admitted and 3 non-zero", n)
	}
	if !reg.Unregister(pool) || reg.Unregister(pool) {
		t.Error("Unregister of a wrapped collector: want true once, then false")
	}
}
