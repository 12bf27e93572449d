package conformance

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// Model is the base model every simulated endpoint serves.
const Model = "conformance-model"

// Engine names a model server whose metrics proposal 003 maps, with the
// value of the pod label inference.networking.k8s.io/engine-type that
// selects that mapping in GIE's metrics extractor.
type Engine string

const (
	VLLM         Engine = "vllm"
	SGLang       Engine = "sglang"
	TRTLLMServe  Engine = "trtllm-serve"
	TritonTRTLLM Engine = "triton-tensorrt-llm"
)

// Load is what a model server reports on its metrics page.
type Load struct {
	Waiting, Running int
	// KV is the KV-cache utilisation, 0..1.
	KV float64
}

// Idle and Busy are the two loads cases contrast: Busy is saturated by any
// reading (upstream's saturation detector: 5 waiting or 80% KV; Sluice's
// admission: 2 waiting or 80% KV).
var (
	Idle = Load{}
	Busy = Load{Waiting: 50, Running: 64, KV: 0.97}
)

// MetricsPage renders l in engine's metric names and label shapes, as
// proposal 003's table lists them (TotalQueuedRequests,
// TotalRunningRequests, KVCacheUtilization, BlockSize, NumGPUBlocks).
func MetricsPage(e Engine, l Load) string {
	var b strings.Builder
	gauge := func(name, labels string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s gauge\n%s%s %s\n", name, name, labels, strconv.FormatFloat(v, 'g', -1, 64))
	}
	w, r := float64(l.Waiting), float64(l.Running)
	switch e {
	case VLLM:
		m := `{model_name="` + Model + `"}`
		gauge("vllm:num_requests_waiting", m, w)
		gauge("vllm:num_requests_running", m, r)
		gauge("vllm:kv_cache_usage_perc", m, l.KV)
		gauge("vllm:cache_config_info", `{block_size="16",num_gpu_blocks="8192"}`, 1)
	case SGLang:
		m := `{model_name="` + Model + `"}`
		gauge("sglang:num_queue_reqs", m, w)
		gauge("sglang:num_running_reqs", m, r)
		gauge("sglang:token_usage", m, l.KV)
		gauge("sglang:cache_config_info", `{page_size="16",num_pages="8192"}`, 1)
	case TRTLLMServe:
		gauge("trtllm_num_requests_waiting", "", w)
		gauge("trtllm_num_requests_running", "", r)
		gauge("trtllm_kv_cache_utilization", "", l.KV)
		gauge("trtllm_kv_cache_tokens_per_block", "", 16)
		gauge("trtllm_kv_cache_max_blocks", "", 8192)
	case TritonTRTLLM:
		fmt.Fprintf(&b, "# TYPE nv_trt_llm_request_metrics gauge\n"+
			"nv_trt_llm_request_metrics{request_type=\"waiting\"} %v\n"+
			"nv_trt_llm_request_metrics{request_type=\"scheduled\"} %v\n"+
			"# TYPE nv_trt_llm_kv_cache_block_metrics gauge\n"+
			"nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"} %v\n"+
			"nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"} 16\n"+
			"nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 8192\n", w, r, l.KV)
	default:
		panic("unknown engine " + string(e))
	}
	return b.String()
}

// metricsScript is what an endpoint's /metrics answers instead of the
// simulator's own page: a page, or an HTTP error status.
type metricsScript struct {
	page   string
	status int
}

// Endpoint is one model server endpoint (ip:port) of a pool: a simulated
// vLLM server (testbed/simulator) that answers OpenAI requests for Model,
// whose metrics page a case may replace with a scripted one.
type Endpoint struct {
	IP   string
	Port int
	// Generations counts the inference requests that reached it.
	Generations atomic.Int64

	sim    *simulator.Server
	script atomic.Pointer[metricsScript]
}

// Addr is ip:port, as the EPP names endpoints.
func (e *Endpoint) Addr() string { return net.JoinHostPort(e.IP, strconv.Itoa(e.Port)) }

// Report replaces the metrics page with l in engine e's names.
func (e *Endpoint) Report(eng Engine, l Load) {
	e.script.Store(&metricsScript{page: MetricsPage(eng, l)})
}

// FailMetrics makes /metrics answer status (e.g. 500, 404) from now on.
func (e *Endpoint) FailMetrics(status int) { e.script.Store(&metricsScript{status: status}) }

// MissingMetrics makes /metrics answer 200 with a page that has none of the
// metrics proposal 003 requires.
func (e *Endpoint) MissingMetrics() {
	e.script.Store(&metricsScript{page: "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1\n"})
}

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		if s := e.script.Load(); s != nil {
			if s.status != 0 {
				http.Error(w, http.StatusText(s.status), s.status)
				return
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte(s.page))
			return
		}
	}
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "completions") {
		e.Generations.Add(1)
	}
	e.sim.ServeHTTP(w, r)
}

// startEndpoints starts one simulated server on every ip at one port free
// on all of them and stops them when the test ends.
func startEndpoints(t testing.TB, ips []string) []*Endpoint {
	t.Helper()
	cfg, err := engine.Profile("h100")
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		port := runnertest.FreePort(t)
		listeners, err := listenAll(ips, port)
		if err != nil {
			if attempt < 20 {
				continue
			}
			t.Fatalf("no port free on all of %v: %v", ips, err)
		}
		eps := make([]*Endpoint, len(ips))
		for i, l := range listeners {
			sim, err := simulator.New(simulator.Options{Model: Model, Engine: cfg, Seed: uint64(port + i)})
			if err != nil {
				t.Fatal(err)
			}
			ep := &Endpoint{IP: ips[i], Port: port, sim: sim}
			srv := &http.Server{Handler: ep}
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() {
				_ = srv.Close()
				sim.Close()
			})
			eps[i] = ep
		}
		return eps
	}
}

func listenAll(ips []string, port int) ([]net.Listener, error) {
	var ls []net.Listener
	for _, ip := range ips {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			for _, o := range ls {
				_ = o.Close()
			}
			return nil, errors.Join(fmt.Errorf("listening on %s:%d", ip, port), err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}
