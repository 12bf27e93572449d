package conformance

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/dataplane"
)

// The model server protocol (proposal 003) as the EPP consumes it: it must
// read the load metrics of every engine GIE maps, in that engine's names
// and label shapes. Two pods per engine, labelled with the engine type;
// each case restricts requests to its engine's pair with a subset hint,
// makes one busy and the other idle, and requires the idle one to get every
// request, then swaps them.

// metricsEngines are the engines of proposal 003's table, two pods each.
var metricsEngines = []Engine{VLLM, VLLM, SGLang, SGLang, TRTLLMServe, TRTLLMServe, TritonTRTLLM, TritonTRTLLM}

var modelServerMetricsGroup = Group{
	Name:    "ModelServerMetrics",
	Fixture: &FixtureSpec{Pods: len(metricsEngines), Engines: metricsEngines, Report: &Idle},
	Cases: []Case{
		loadCase("vLLM", VLLM, 0, "`vllm:num_requests_waiting`"),
		loadCase("SGLang", SGLang, 2, "`sglang:num_queue_reqs`"),
		loadCase("TRTLLMServe", TRTLLMServe, 4, "`trtllm_num_requests_waiting`"),
		loadCase("TritonTRTLLM", TritonTRTLLM, 6, "`nv_trt_llm_request_metrics{request_type=waiting}`"),
		metricsUnavailableCase("MetricsPageFailing", "fails (HTTP 500)", false, func(ep *Endpoint) { ep.FailMetrics(500) }),
		metricsUnavailableCase("MetricsMissing", "lacks every required metric", false, (*Endpoint).MissingMetrics),
		metricsUnavailableCase("NoEndpointMetrics", "fails (HTTP 500), as every other endpoint's does,", true, func(ep *Endpoint) { ep.FailMetrics(500) }),
	},
}

// metricsUnavailableCase checks what happens to requests for an endpoint
// whose metrics become unreadable (breakMetrics does that; to every
// endpoint of the pool with all), so that the EPP only has stale ones: each
// request still gets one answer.
func metricsUnavailableCase(name, what string, all bool, breakMetrics func(*Endpoint)) Case {
	return Case{
		Name: name, Profile: ModelServerProfile,
		Ref:         Ref{Path: proposal003, Line: 19, Quote: "The model servers MUST provide the following metrics via a Prometheus endpoint."},
		Requirement: "A Ready endpoint whose metrics page " + what + " still gets an answer for every request: routed to it, or an immediate 503/429 within 25s; never a hang or a broken stream.",
		Run: func(t *T, f *Fixture) {
			ep := f.Endpoints[0][0]
			broken := []*Endpoint{ep}
			if all {
				broken = nil
				for _, eps := range f.Endpoints {
					broken = append(broken, eps...)
				}
			}
			for _, b := range broken {
				breakMetrics(b)
			}
			defer func() {
				for i, eps := range f.Endpoints {
					for _, e := range eps {
						e.Report(metricsEngines[i%len(metricsEngines)], Idle)
					}
				}
			}()
			// Stale by any EPP's threshold (upstream's default is 2s).
			time.Sleep(3 * time.Second)
			ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
			defer cancel()
			d, err := f.Envoy.Exchange(ctx, Request{Body: Chat(uniquePrompt()), Subset: []string{ep.Addr()}})
			switch {
			case err != nil:
				t.Fatalf("no answer for a request to an endpoint whose metrics page %s: %v", what, err)
			case d.Immediate != nil:
				observeImmediate(t, d.Immediate)
				if d.Immediate.Status != 503 && d.Immediate.Status != 429 {
					t.Errorf("immediate response %d, want routed, 503 or 429: %s", d.Immediate.Status, d.Immediate.Body)
				}
				t.Observe("outcome", "immediate")
			case d.Destination() != ep.Addr():
				t.Errorf("routed to %s outside the subset [%s]", d.Destination(), ep.Addr())
			default:
				t.Observe("outcome", "routed")
			}
		},
	}
}

// loadCase checks that the EPP reads engine's queue and KV-cache metrics:
// of pods first and first+1, the busy one gets no request. Each phase starts
// from the opposite one, in which the EPP sent everything to the endpoint
// now busy, so a round that avoids it shows the EPP read the new metrics
// (not luck, nor prefix affinity); twenty more requests must avoid it too.
func loadCase(name string, engine Engine, first int, quote string) Case {
	return Case{
		Name: name, Profile: ModelServerProfile,
		Ref:         Ref{Path: proposal003, Line: 30, Quote: quote},
		Requirement: fmt.Sprintf("With %s metric names and labels, requests go to the idle endpoint, not the one reporting a full queue and KV cache.", engine),
		Run: func(t *T, f *Fixture) {
			a, b := f.Endpoints[first][0], f.Endpoints[first+1][0]
			subset := []string{a.Addr(), b.Addr()}
			defer b.Report(engine, Idle)
			for phase, busy := range []*Endpoint{b, a, b} {
				idle := a
				if busy == a {
					idle = b
				}
				busy.Report(engine, Busy)
				idle.Report(engine, Idle)
				runnertest.Eventually(t, fmt.Sprintf("requests avoid %s, which reports a full queue", busy.Addr()), func() string {
					for range 10 {
						d := f.exchange(t, Request{Body: Chat(uniquePrompt()), Subset: subset})
						switch {
						case d.Immediate != nil:
							return fmt.Sprintf("immediate response %d: %s", d.Immediate.Status, d.Immediate.Body)
						case splitEndpoints(d.Destination())[0] == busy.Addr():
							return "routed to " + busy.Addr()
						}
					}
					return ""
				})
				if phase == 0 {
					continue // the starting state
				}
				if seen := f.routeCounts(t, 20, subset); seen[busy.Addr()] > 0 {
					t.Errorf("%s reports a full queue but got %d of 20 requests", busy.Addr(), seen[busy.Addr()])
				}
			}
			t.Observe("load", "read")
		},
	}
}

// openAIAPIsCase sends OpenAI requests through the data plane
// (testbed/dataplane, Envoy's part) to the pool's simulated vLLM servers:
// the EPP's decision and rewritten body must reach a server that accepts
// them, and the client gets the server's answer.
var openAIAPIsCase = Case{
	Name: "OpenAIAPIsEndToEnd", Profile: ModelServerProfile,
	Ref:         Ref{Path: proposal003, Line: 13, Quote: "The model server MUST implement OpenAI’s [Completions]"},
	Requirement: "Completions and chat completions, streamed and not, sent through a proxy that follows the EPP reach a pool endpoint, which answers them (200 with the model's output).",
	Run: func(t *T, f *Fixture) {
		proxy, err := dataplane.New(dataplane.Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", f.EPP.GRPCPort), ReportServedHeader: true})
		if err != nil {
			t.Fatal(err)
		}
		defer proxy.Close()
		srv := httptest.NewServer(proxy)
		defer srv.Close()
		before := f.generations()
		bodies := map[string]func(stream bool) []byte{
			"/v1/chat/completions": func(stream bool) []byte { return ChatFor(Model, uniquePrompt(), stream) },
			"/v1/completions": func(stream bool) []byte {
				return fmt.Appendf(nil, `{"model":%q,"prompt":%q,"max_tokens":4,"stream":%v}`, Model, uniquePrompt(), stream)
			},
		}
		sent := 0
		for path, body := range bodies {
			for _, stream := range []bool{false, true} {
				b := body(stream)
				resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
				if err == nil && resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "" {
					// As exchange does, and a client would.
					resp.Body.Close()
					t.Logf("POST %s: 503 with Retry-After %s: retrying once", path, resp.Header.Get("Retry-After"))
					time.Sleep(maxRetryAfter)
					resp, err = http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
				}
				if err != nil {
					t.Fatalf("POST %s: %v", path, err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				served := resp.Header.Get("x-gateway-destination-endpoint-served")
				want := "data: [DONE]"
				if !stream {
					want = `"model":"` + Model + `"`
				}
				if resp.StatusCode != 200 || !bytes.Contains(out, []byte(want)) || !slices.Contains(f.AllAddrs(), served) {
					t.Errorf("POST %s (stream %v): %d from %q: %.300s", path, stream, resp.StatusCode, served, out)
				}
				sent++
			}
		}
		if got := f.generations() - before; got != int64(sent) {
			t.Errorf("the model servers received %d requests, want %d", got, sent)
		}
		t.Observe("answers", "200")
	},
}

// generations counts the inference requests every endpoint received.
func (f *Fixture) generations() int64 {
	var n int64
	for _, eps := range f.Endpoints {
		for _, ep := range eps {
			n += ep.Generations.Load()
		}
	}
	return n
}
