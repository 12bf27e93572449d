package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// testEngine is small and slow enough that every effect is visible: a step
// costs 10ms + 1ms per decoding sequence + 0.1ms per prompt token.
func testEngine() engine.Config {
	return engine.Config{
		MaxNumSeqs: 4, MaxNumBatchedTokens: 256, NumGPUBlocks: 256, BlockSize: 4, MaxModelLen: 512,
		MaxLoRAs: 1, LoRALoadTime: 500 * time.Millisecond,
		StepBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
	}
}

// newTestServer starts a server inside the caller's synctest bubble (or with
// the given clock) and stops it when the test ends.
func newTestServer(t *testing.T, mutate func(*Options)) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := Options{
		Model: "base", Engine: testEngine(), Seed: 1, Registry: reg,
		LoRAModules: []LoRAModule{{Name: "lora-a", Path: "/adapters/a"}, {Name: "lora-b", Path: "/adapters/b"}},
	}
	if mutate != nil {
		mutate(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(s.Close)
	return s, reg
}

type answer struct {
	status  int
	body    string
	header  http.Header
	aborted bool // the handler cut the connection (crash, drop)
}

// serve runs one request through the handler in the calling goroutine. A
// handler that aborts the connection (http.ErrAbortHandler) is reported as
// aborted, which is how net/http treats it.
func serve(ctx context.Context, s *Server, method, path, body string) (a answer) {
	req := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			a = answer{aborted: true, body: rec.Body.String()}
		}
	}()
	s.ServeHTTP(rec, req)
	return answer{status: rec.Code, body: rec.Body.String(), header: rec.Header()}
}

func post(s *Server, path, body string) answer {
	return serve(context.Background(), s, "POST", path, body)
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func checkError(t *testing.T, a answer, status int, errType, param string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	var e errorBody
	if err := json.Unmarshal([]byte(a.body), &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, a.body)
	}
	gotParam := ""
	if e.Error.Param != nil {
		gotParam = *e.Error.Param
	}
	if e.Error.Message == "" || e.Error.Type != errType || e.Error.Code != status || gotParam != param {
		t.Errorf("error %+v (param %q), want type %s code %d param %q", e.Error, gotParam, errType, status, param)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestBadRequestsGetOpenAIErrors(t *testing.T) {
	long := strings.Repeat("x", 4*600)
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		status  int
		errType string
		param   string
	}{
		{"bad JSON", "POST", "/v1/completions", `{"prompt":`, 400, "BadRequestError", ""},
		{"trailing data", "POST", "/v1/completions", `{"prompt":"a"} {}`, 400, "BadRequestError", ""},
		{"wrong type", "POST", "/v1/completions", `{"prompt":"a","max_tokens":"ten"}`, 400, "BadRequestError", "max_tokens"},
		{"missing prompt", "POST", "/v1/completions", `{"model":"base"}`, 400, "BadRequestError", "prompt"},
		{"empty prompt", "POST", "/v1/completions", `{"prompt":""}`, 400, "BadRequestError", "prompt"},
		{"batched prompt", "POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "BadRequestError", "prompt"},
		{"prompt object", "POST", "/v1/completions", `{"prompt":{"a":1}}`, 400, "BadRequestError", "prompt"},
		{"negative token id", "POST", "/v1/completions", `{"prompt":[1,-2]}`, 400, "BadRequestError", "prompt"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"base"}`, 400, "BadRequestError", "messages"},
		{"message without role", "POST", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "BadRequestError", "messages"},
		{"image content", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "BadRequestError", "messages"},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "BadRequestError", "max_tokens"},
		{"zero max_completion_tokens", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":0}`, 400, "BadRequestError", "max_completion_tokens"},
		{"n=2", "POST", "/v1/completions", `{"prompt":"a","n":2}`, 400, "BadRequestError", "n"},
		{"stream_options without stream", "POST", "/v1/completions", `{"prompt":"a","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream_options"},
		{"context too long", "POST", "/v1/completions", `{"prompt":"` + long + `","max_tokens":10}`, 400, "BadRequestError", "prompt"},
		{"prompt fills context", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "BadRequestError", "messages"},
		{"unknown model", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"a"}`, 404, "NotFoundError", "model"},
		{"unknown model chat", "POST", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"a"}]}`, 404, "NotFoundError", "model"},
		{"GET on completions", "GET", "/v1/completions", ``, 405, "MethodNotAllowedError", ""},
		{"POST on models", "POST", "/v1/models", ``, 405, "MethodNotAllowedError", ""},
		{"unknown path", "GET", "/v2/engines", ``, 404, "NotFoundError", ""},
		{"load without path", "POST", "/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "BadRequestError", ""},
		{"load twice", "POST", "/v1/load_lora_adapter", `{"lora_name":"lora-a","lora_path":"/a"}`, 400, "InvalidUserInput", ""},
		{"unload unknown", "POST", "/v1/unload_lora_adapter", `{"lora_name":"nope"}`, 404, "NotFoundError", "lora_name"},
		{"unload without name", "POST", "/v1/unload_lora_adapter", `{}`, 400, "BadRequestError", ""},
		{"faults unknown field", "POST", "/admin/faults", `{"crash":true,"typo":1}`, 400, "BadRequestError", ""},
		{"faults out of range", "POST", "/admin/faults", `{"error_rate":2}`, 400, "BadRequestError", ""},
		{"faults bad delay", "POST", "/admin/faults", `{"metrics_delay":"soon"}`, 400, "BadRequestError", ""},
		{"faults bad slowdown", "POST", "/admin/faults", `{"slowdown":0.5}`, 400, "BadRequestError", ""},
		{"faults DELETE", "DELETE", "/admin/faults", ``, 405, "MethodNotAllowedError", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, _ := newTestServer(t, nil)
				checkError(t, serve(context.Background(), s, tt.method, tt.path, tt.body), tt.status, tt.errType, tt.param)
				if st := s.Stats(); st.Running+st.Waiting != 0 || st.PromptTokens != 0 {
					t.Errorf("rejected request reached the engine: %+v", st)
				}
			})
		})
	}
}

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeResponse(t *testing.T, a answer) completionResponse {
	t.Helper()
	if a.status != 200 {
		t.Fatalf("status %d: %s", a.status, a.body)
	}
	var r completionResponse
	if err := json.Unmarshal([]byte(a.body), &r); err != nil {
		t.Fatalf("decode %q: %v", a.body, err)
	}
	return r
}

func TestNonStreamingResponses(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		body       string
		object     string
		model      string
		prompt     int
		completion int // -1: any in [1, 128]
		finish     string
	}{
		{"completion", "/v1/completions", `{"model":"base","prompt":"abcdefgh","max_tokens":5}`, "text_completion", "base", 2, 5, "length"},
		{"completion, token ids", "/v1/completions", `{"prompt":[1,2,3],"max_tokens":2}`, "text_completion", "base", 3, 2, "length"},
		{"completion, one-string array", "/v1/completions", `{"prompt":["abcd"],"max_tokens":1}`, "text_completion", "base", 1, 1, "length"},
		{"completion without max_tokens", "/v1/completions", `{"prompt":"abcd"}`, "text_completion", "base", 1, -1, "stop"},
		// "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" is 52 bytes.
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`, "chat.completion", "base", 13, 3, "length"},
		{"chat, parts, LoRA", "/v1/chat/completions", `{"model":"lora-a","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":4}`, "chat.completion", "lora-a", 13, 4, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, _ := newTestServer(t, nil)
				r := decodeResponse(t, post(s, tt.path, tt.body))
				if r.Object != tt.object || r.Model != tt.model || len(r.Choices) != 1 || r.Usage == nil {
					t.Fatalf("response %+v", r)
				}
				c, u := r.Choices[0], r.Usage
				if u.PromptTokens != tt.prompt || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
					t.Errorf("usage %+v, want %d prompt tokens", u, tt.prompt)
				}
				if tt.completion >= 0 && u.CompletionTokens != tt.completion ||
					tt.completion < 0 && (u.CompletionTokens < 1 || u.CompletionTokens > defaultDefaultMaxTokens) {
					t.Errorf("completion tokens %d, want %d", u.CompletionTokens, tt.completion)
				}
				text := c.Text
				if c.Message != nil {
					text = c.Message.Content
					if c.Message.Role != "assistant" {
						t.Errorf("role %q", c.Message.Role)
					}
				}
				if len(ApproximateTokens(text)) != u.CompletionTokens {
					t.Errorf("text %q is not %d tokens", text, u.CompletionTokens)
				}
				if c.FinishReason == nil || *c.FinishReason != tt.finish {
					t.Errorf("finish_reason %v, want %s", c.FinishReason, tt.finish)
				}
			})
		})
	}
}

// sseEvents splits a text/event-stream body into its data payloads.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, data)
	}
	return out
}

func TestStreamingFormat(t *testing.T) {
	tests := []struct {
		name         string
		path         string
		body         string
		chat         bool
		includeUsage bool
	}{
		{"completion with usage", "/v1/completions", `{"prompt":"abcdefgh","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, false, true},
		{"completion without usage", "/v1/completions", `{"prompt":"abcdefgh","max_tokens":4,"stream":true}`, false, false},
		{"chat with usage", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, true, true},
		{"chat without usage", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":false}}`, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, _ := newTestServer(t, nil)
				a := post(s, tt.path, tt.body)
				if a.status != 200 || !strings.HasPrefix(a.header.Get("Content-Type"), "text/event-stream") {
					t.Fatalf("status %d, content type %q: %s", a.status, a.header.Get("Content-Type"), a.body)
				}
				events := sseEvents(t, a.body)
				if events[len(events)-1] != "[DONE]" {
					t.Fatalf("last event %q, want [DONE]", events[len(events)-1])
				}
				events = events[:len(events)-1]
				var chunks []completionResponse
				for _, ev := range events {
					var c completionResponse
					if err := json.Unmarshal([]byte(ev), &c); err != nil {
						t.Fatalf("event %q: %v", ev, err)
					}
					chunks = append(chunks, c)
				}
				if tt.chat {
					first := chunks[0]
					if first.Object != "chat.completion.chunk" || first.Choices[0].Delta == nil ||
						first.Choices[0].Delta.Role == nil || *first.Choices[0].Delta.Role != "assistant" {
						t.Errorf("first chat chunk %s should carry the assistant role", events[0])
					}
					chunks = chunks[1:]
				}
				if tt.includeUsage {
					last := chunks[len(chunks)-1]
					if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 4 ||
						last.Usage.TotalTokens != last.Usage.PromptTokens+4 {
						t.Errorf("usage chunk %s", events[len(events)-1])
					}
					chunks = chunks[:len(chunks)-1]
				}
				if len(chunks) != 4 {
					t.Fatalf("%d token chunks, want 4", len(chunks))
				}
				ids := map[string]bool{}
				for i, c := range chunks {
					ids[c.ID] = true
					if c.Usage != nil || len(c.Choices) != 1 {
						t.Errorf("token chunk %d: %+v", i, c)
					}
					fr := c.Choices[0].FinishReason
					if (i == 3) != (fr != nil) || (fr != nil && *fr != "length") {
						t.Errorf("chunk %d finish_reason %v", i, fr)
					}
					text := c.Choices[0].Text
					if tt.chat {
						text = *c.Choices[0].Delta.Content
					}
					if len(ApproximateTokens(text)) != 1 {
						t.Errorf("chunk %d text %q is not one token", i, text)
					}
				}
				if len(ids) != 1 {
					t.Errorf("chunks carry %d ids", len(ids))
				}
			})
		})
	}
}

// gauge reads one sample of a metric family from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func mustMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := metricValue(t, reg, name, labels)
	if !ok {
		t.Fatalf("metric %s%v not exported", name, labels)
	}
	return v
}

var baseLabels = map[string]string{"model_name": "base", "engine": "0"}

func TestQueueingAndKVPressureOverHTTP(t *testing.T) {
	// Six requests of 100 prompt tokens (25 blocks) and four slots arrive at
	// once. The first starts a step alone (10ms + 100 x 0.1ms); the second
	// step decodes it (26 blocks) and admits what slots, KV and the token
	// budget allow (256 tokens: 1 decode, 100, 100, then a 55-token chunk).
	tests := []struct {
		name        string
		blocks      int
		wantRunning float64
		wantWaiting float64
		wantKV      float64
	}{
		{name: "slots full", blocks: 256, wantRunning: 4, wantWaiting: 2, wantKV: (26 + 2*25 + 14) / 256.0},
		{name: "KV full", blocks: 64, wantRunning: 2, wantWaiting: 4, wantKV: (26 + 25) / 64.0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, reg := newTestServer(t, func(o *Options) { o.Engine.NumGPUBlocks = tt.blocks; o.Engine.MaxModelLen = 256 })
				var wg sync.WaitGroup
				answers := make([]answer, 6)
				for i := range answers {
					wg.Go(func() {
						body := fmt.Sprintf(`{"prompt":%q,"max_tokens":20}`, strings.Repeat(string(rune('a'+i)), 400))
						answers[i] = post(s, "/v1/completions", body)
					})
					synctest.Wait() // submitted, in order
				}
				if got := mustMetric(t, reg, "vllm:num_requests_waiting", baseLabels); got != 5 {
					t.Errorf("waiting during the first step %v, want 5", got)
				}
				time.Sleep(20 * time.Millisecond)
				synctest.Wait() // the second step has started
				running := mustMetric(t, reg, "vllm:num_requests_running", baseLabels)
				waiting := mustMetric(t, reg, "vllm:num_requests_waiting", baseLabels)
				kv := mustMetric(t, reg, "vllm:kv_cache_usage_perc", baseLabels)
				if running != tt.wantRunning || waiting != tt.wantWaiting || kv != tt.wantKV {
					t.Errorf("running %v waiting %v kv %v, want %v %v %v", running, waiting, kv, tt.wantRunning, tt.wantWaiting, tt.wantKV)
				}
				wg.Wait()
				for i, a := range answers {
					if decodeResponse(t, a).Usage.CompletionTokens != 20 {
						t.Errorf("request %d: %s", i, a.body)
					}
				}
				if got := mustMetric(t, reg, "vllm:kv_cache_usage_perc", baseLabels); got != 0 {
					t.Errorf("kv usage after all finished %v", got)
				}
				if got := mustMetric(t, reg, "vllm:request_success_total", map[string]string{"finished_reason": "length"}); got != 6 {
					t.Errorf("request_success_total %v, want 6", got)
				}
				if got := mustMetric(t, reg, "vllm:request_queue_time_seconds", baseLabels); got != 6 {
					t.Errorf("queue time histogram has %v samples, want 6", got)
				}
			})
		})
	}
}

func TestStartHeadersTellQueueAndFirstTokenTimes(t *testing.T) {
	// One slot, two 10-token prompts of 2 output tokens arriving together: A's prefill step ends at 11ms (10ms +
	// 10 x 0.1ms), its decode step at 22ms; B waits for the slot until then and has its first token at 33ms.
	synctest.Test(t, func(t *testing.T) {
		s, _ := newTestServer(t, func(o *Options) { o.Engine.MaxNumSeqs = 1 })
		var wg sync.WaitGroup
		var a, b answer
		wg.Go(func() { a = post(s, "/v1/completions", `{"prompt":"`+strings.Repeat("a", 40)+`","max_tokens":2}`) })
		synctest.Wait()
		wg.Go(func() {
			b = post(s, "/v1/completions", `{"prompt":"`+strings.Repeat("b", 40)+`","max_tokens":2,"stream":true}`)
		})
		wg.Wait()
		for _, tc := range []struct {
			name            string
			got             answer
			queue, firstTok string
		}{
			{"A, not streamed", a, "0.000000", "0.011000"},
			{"B, streamed", b, "0.022000", "0.033000"},
		} {
			if tc.got.status != http.StatusOK {
				t.Fatalf("%s: status %d: %s", tc.name, tc.got.status, tc.got.body)
			}
			if q, f := tc.got.header.Get(QueueTimeHeader), tc.got.header.Get(FirstTokenTimeHeader); q != tc.queue || f != tc.firstTok {
				t.Errorf("%s: queue %q, first token %q; want %q, %q", tc.name, q, f, tc.queue, tc.firstTok)
			}
		}
	})
}

func TestPrefixCacheOverHTTP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A budget above the prompt length keeps each prefill in one step.
		s, reg := newTestServer(t, func(o *Options) { o.Engine.MaxNumBatchedTokens = 1024 })
		system := strings.Repeat("You are a helpful assistant. ", 40) // ~280 tokens
		body := func(q string) string {
			return fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":1}`, system, q)
		}
		timed := func(q string) (completionResponse, time.Duration) {
			start := time.Now()
			r := decodeResponse(t, post(s, "/v1/chat/completions", body(q)))
			return r, time.Since(start)
		}
		cold, coldTTFT := timed("first question")
		warm, warmTTFT := timed("second question")
		if cold.Usage.PromptTokensDetails.CachedTokens != 0 {
			t.Errorf("cold request reports %d cached tokens", cold.Usage.PromptTokensDetails.CachedTokens)
		}
		cached := warm.Usage.PromptTokensDetails.CachedTokens
		if cached < 250 || cached%4 != 0 {
			t.Errorf("warm request cached %d tokens, want the shared system prompt in whole blocks", cached)
		}
		// max_tokens 1: latency is TTFT = one step, 0.1ms per uncached token.
		if want := coldTTFT - time.Duration(cached)*100*time.Microsecond; warmTTFT != want {
			t.Errorf("warm TTFT %v, want %v (cold %v, usage %+v %+v)", warmTTFT, want, coldTTFT, cold.Usage, warm.Usage)
		}
		if hits := mustMetric(t, reg, "vllm:prefix_cache_hits_total", baseLabels); hits != float64(cached) {
			t.Errorf("prefix_cache_hits_total %v, want %d", hits, cached)
		}
		queries := mustMetric(t, reg, "vllm:prefix_cache_queries_total", baseLabels)
		if want := cold.Usage.PromptTokens + warm.Usage.PromptTokens; queries != float64(want) {
			t.Errorf("prefix_cache_queries_total %v, want %d", queries, want)
		}
		if n := mustMetric(t, reg, "vllm:time_to_first_token_seconds", baseLabels); n != 2 {
			t.Errorf("TTFT histogram has %v samples, want 2", n)
		}
	})
}

func TestLoRAOverHTTP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, reg := newTestServer(t, func(o *Options) { o.PreloadLoRAs = []string{"lora-b"} })
		request := func(model string) (answer, time.Duration) {
			start := time.Now()
			a := post(s, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"abcd","max_tokens":1}`, model))
			return a, time.Since(start)
		}
		// One step: 10ms + 0.1ms for the single prompt token.
		step := 10*time.Millisecond + 100*time.Microsecond
		tests := []struct {
			model    string
			wantTime time.Duration
			loads    float64
			resident string
		}{
			{"lora-b", step, 0, "lora-b"},                        // preloaded
			{"lora-a", step + 500*time.Millisecond, 1, "lora-a"}, // miss: evicts lora-b
			{"lora-a", step, 1, "lora-a"},                        // hit
			{"base", step, 1, "lora-a"},                          // base model needs no slot
			{"lora-b", step + 500*time.Millisecond, 2, "lora-b"}, // evicted earlier: loads again
		}
		for i, tt := range tests {
			a, took := request(tt.model)
			if decodeResponse(t, a).Model != tt.model {
				t.Errorf("request %d: model %s", i, a.body)
			}
			if took != tt.wantTime {
				t.Errorf("request %d (%s): took %v, want %v", i, tt.model, took, tt.wantTime)
			}
			if got := mustMetric(t, reg, "sluice_sim_lora_loads_total", map[string]string{"model_name": "base"}); got != tt.loads {
				t.Errorf("request %d: loads %v, want %v", i, got, tt.loads)
			}
			if _, ok := metricValue(t, reg, "vllm:lora_adapter_loaded", map[string]string{"lora_name": tt.resident}); !ok {
				t.Errorf("request %d: %s not reported resident", i, tt.resident)
			}
		}
		info := mustMetric(t, reg, "vllm:lora_requests_info", map[string]string{"max_lora": "1", "running_lora_adapters": "", "waiting_lora_adapters": ""})
		if info != float64(time.Now().UnixNano())/1e9 {
			t.Errorf("lora_requests_info value %v is not the current timestamp", info)
		}

		// Runtime registration.
		if a := post(s, "/v1/load_lora_adapter", `{"lora_name":"lora-c","lora_path":"/adapters/c"}`); a.status != 200 || !strings.Contains(a.body, "Success") {
			t.Fatalf("load: %d %s", a.status, a.body)
		}
		models := serve(context.Background(), s, "GET", "/v1/models", "")
		for _, want := range []string{`"id":"base"`, `"id":"lora-c"`, `"root":"/adapters/c"`, `"parent":"base"`} {
			if !strings.Contains(models.body, want) {
				t.Errorf("/v1/models lacks %s: %s", want, models.body)
			}
		}
		if a, _ := request("lora-c"); a.status != 200 {
			t.Errorf("request for a loaded adapter: %d %s", a.status, a.body)
		}
		if a := post(s, "/v1/unload_lora_adapter", `{"lora_name":"lora-c"}`); a.status != 200 {
			t.Fatalf("unload: %d %s", a.status, a.body)
		}
		if _, ok := metricValue(t, reg, "vllm:lora_adapter_loaded", map[string]string{"lora_name": "lora-c"}); ok {
			t.Error("unloaded adapter still reported resident")
		}
		a, _ := request("lora-c")
		checkError(t, a, 404, "NotFoundError", "model")
	})
}

func TestLoRARequestsInfoShowsWaitingAdapters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, reg := newTestServer(t, nil)
		var wg sync.WaitGroup
		for _, m := range []string{"lora-a", "lora-b"} {
			wg.Go(func() {
				post(s, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"abcd","max_tokens":3}`, m))
			})
			synctest.Wait() // submit in order
		}
		if _, ok := metricValue(t, reg, "vllm:lora_requests_info", map[string]string{
			"max_lora": "1", "running_lora_adapters": "lora-a", "waiting_lora_adapters": "lora-b"}); !ok {
			t.Error("lora_requests_info does not show lora-a running and lora-b waiting for the slot")
		}
		wg.Wait()
	})
}

func TestCacheConfigInfo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, reg := newTestServer(t, nil)
		if v := mustMetric(t, reg, "vllm:cache_config_info", map[string]string{"block_size": "4", "num_gpu_blocks": "256", "engine": "0"}); v != 1 {
			t.Errorf("cache_config_info = %v", v)
		}
		// Every metric name the EPP and benchmarks read, with its type.
		want := map[string]dto.MetricType{
			"vllm:num_requests_running": dto.MetricType_GAUGE, "vllm:num_requests_waiting": dto.MetricType_GAUGE,
			"vllm:kv_cache_usage_perc": dto.MetricType_GAUGE, "vllm:cache_config_info": dto.MetricType_GAUGE,
			"vllm:lora_requests_info": dto.MetricType_GAUGE, "vllm:prefix_cache_hits_total": dto.MetricType_COUNTER,
			"vllm:prefix_cache_queries_total": dto.MetricType_COUNTER, "vllm:num_preemptions_total": dto.MetricType_COUNTER,
			"vllm:prompt_tokens_total": dto.MetricType_COUNTER, "vllm:generation_tokens_total": dto.MetricType_COUNTER,
			"vllm:request_success_total": dto.MetricType_COUNTER, "sluice_sim_lora_loads_total": dto.MetricType_COUNTER,
			"vllm:time_to_first_token_seconds": dto.MetricType_HISTOGRAM, "vllm:inter_token_latency_seconds": dto.MetricType_HISTOGRAM,
			"vllm:e2e_request_latency_seconds": dto.MetricType_HISTOGRAM, "vllm:request_queue_time_seconds": dto.MetricType_HISTOGRAM,
		}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if typ, ok := want[f.GetName()]; ok {
				if f.GetType() != typ {
					t.Errorf("%s has type %v, want %v", f.GetName(), f.GetType(), typ)
				}
				delete(want, f.GetName())
			}
		}
		if len(want) != 0 {
			t.Errorf("metrics not exported: %v", want)
		}
		for _, name := range []string{"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds"} {
			if _, ok := metricValue(t, reg, name, baseLabels); !ok {
				t.Errorf("%s lacks the model_name/engine labels", name)
			}
		}
	})
}

func TestFaults(t *testing.T) {
	const chat = `{"messages":[{"role":"user","content":"hello"}],"max_tokens":10}`
	const stream = `{"messages":[{"role":"user","content":"hello"}],"max_tokens":10,"stream":true}`
	t.Run("error rate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, func(o *Options) { o.Faults.ErrorRate = 1 })
			checkError(t, post(s, "/v1/chat/completions", chat), 500, "InternalServerError", "")
			if a := serve(context.Background(), s, "GET", "/health", ""); a.status != 200 {
				t.Errorf("health under error_rate: %d", a.status)
			}
		})
	})
	t.Run("error rate is seeded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			run := func() string {
				s, _ := newTestServer(t, func(o *Options) { o.Faults.ErrorRate = 0.5; o.Seed = 42 })
				var pattern strings.Builder
				for range 20 {
					pattern.WriteString(fmt.Sprint(post(s, "/v1/completions", `{"prompt":"a","max_tokens":1}`).status / 100))
				}
				s.Close()
				return pattern.String()
			}
			a, b := run(), run()
			if a != b || !strings.Contains(a, "2") || !strings.Contains(a, "5") {
				t.Errorf("patterns %s and %s: want equal mixes of 2xx and 5xx", a, b)
			}
		})
	})
	t.Run("crash drops new and in-flight requests, restart clears state", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, reg := newTestServer(t, nil)
			decodeResponse(t, post(s, "/v1/chat/completions", chat)) // warms the prefix cache
			results := make(chan answer, 2)
			go func() { results <- post(s, "/v1/chat/completions", chat) }()
			go func() { results <- post(s, "/v1/chat/completions", stream) }()
			synctest.Wait()
			if a := post(s, "/admin/faults", `{"crash":true}`); a.status != 200 || !strings.Contains(a.body, `"crash":true`) {
				t.Fatalf("set crash: %d %s", a.status, a.body)
			}
			for range 2 {
				if a := <-results; !a.aborted {
					t.Errorf("in-flight request answered %d %s during a crash", a.status, a.body)
				}
			}
			for _, path := range []string{"/health", "/metrics", "/v1/models"} {
				if a := serve(context.Background(), s, "GET", path, ""); !a.aborted {
					t.Errorf("%s answered %d while crashed", path, a.status)
				}
			}
			if st := s.Stats(); st.Running+st.Waiting+st.UsedBlocks != 0 || st.PrefixQueryTokens != 0 {
				t.Errorf("engine not restarted empty: %+v", st)
			}
			post(s, "/admin/faults", `{}`)
			r := decodeResponse(t, post(s, "/v1/chat/completions", chat))
			if r.Usage.PromptTokensDetails.CachedTokens != 0 {
				t.Error("prefix cache survived the crash")
			}
			if got := mustMetric(t, reg, "vllm:num_requests_running", baseLabels); got != 0 {
				t.Errorf("running after restart %v", got)
			}
		})
	})
	t.Run("hang holds requests until cleared", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, func(o *Options) { o.Faults.Hang = true })
			health := make(chan answer, 1)
			go func() { health <- serve(context.Background(), s, "GET", "/health", "") }()
			ctx, cancel := context.WithCancel(context.Background())
			gaveUp := make(chan answer, 1)
			go func() { gaveUp <- serve(ctx, s, "POST", "/v1/chat/completions", chat) }()
			time.Sleep(time.Hour) // virtual: nothing is answered while hung
			synctest.Wait()
			if len(health) != 0 || len(gaveUp) != 0 {
				t.Fatal("a hung server answered")
			}
			cancel()
			if a := <-gaveUp; a.status != 200 || a.body != "" {
				t.Errorf("a client that gave up got %d %q", a.status, a.body)
			}
			if err := s.SetFaults(Faults{}); err != nil {
				t.Fatal(err)
			}
			if a := <-health; a.status != 200 {
				t.Errorf("health after the hang: %d", a.status)
			}
			if st := s.Stats(); st.PromptTokens != 0 {
				t.Errorf("the abandoned request reached the engine: %+v", st)
			}
		})
	})
	t.Run("slow metrics", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, nil)
			post(s, "/admin/faults", `{"metrics_delay":"3s"}`)
			start := time.Now()
			a := serve(context.Background(), s, "GET", "/metrics", "")
			if took := time.Since(start); took != 3*time.Second || a.status != 200 || !strings.Contains(a.body, "vllm:num_requests_running") {
				t.Errorf("metrics took %v, status %d", took, a.status)
			}
		})
	})
	t.Run("slowdown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, nil)
			took := func() time.Duration {
				start := time.Now()
				decodeResponse(t, post(s, "/v1/completions", `{"prompt":"abcd","max_tokens":8}`))
				return time.Since(start)
			}
			normal := took()
			post(s, "/admin/faults", `{"slowdown":10}`)
			if slow := took(); slow != 10*normal {
				t.Errorf("slowdown 10: %v, want 10 x %v", slow, normal)
			}
			post(s, "/admin/faults", `{}`)
			if again := took(); again != normal {
				t.Errorf("cleared: %v, want %v", again, normal)
			}
		})
	})
	t.Run("drop streams", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, func(o *Options) { o.Faults.DropStreamRate = 1 })
			a := post(s, "/v1/chat/completions", stream)
			if !a.aborted || strings.Contains(a.body, "[DONE]") {
				t.Fatalf("stream not dropped: %+v", a)
			}
			// Role chunk plus 5 of 10 tokens went out before the cut.
			if n := strings.Count(a.body, "data: "); n != 6 {
				t.Errorf("%d events before the drop, want 6: %s", n, a.body)
			}
			if st := s.Stats(); st.Running != 0 || st.UsedBlocks != 0 {
				t.Errorf("dropped stream still holds the engine: %+v", st)
			}
			// Non-streaming requests are not dropped.
			decodeResponse(t, post(s, "/v1/chat/completions", chat))
		})
	})
	t.Run("GET faults", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, func(o *Options) { o.Faults = Faults{ErrorRate: 0.25, MetricsDelay: time.Second} })
			a := serve(context.Background(), s, "GET", "/admin/faults", "")
			var f Faults
			if err := json.Unmarshal([]byte(a.body), &f); err != nil || f != s.Faults() {
				t.Errorf("GET /admin/faults %s (%v) != %+v", a.body, err, s.Faults())
			}
		})
	})
}

// TestCrashClosesRealConnections checks the wire effect of the crash fault:
// the client sees the connection close without a response.
func TestCrashClosesRealConnections(t *testing.T) {
	s, _ := newTestServer(t, func(o *Options) {
		o.Clock = clocktesting.NewFakeClock(time.Unix(0, 0))
		o.Faults.Crash = true
	})
	ts := httptest.NewServer(s)
	defer ts.Close()
	resp, err := ts.Client().Get(ts.URL + "/health")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("crashed server answered %d", resp.StatusCode)
	}
	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	resp, err = ts.Client().Get(ts.URL + "/health")
	if err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("health after recovery: %d", resp.StatusCode)
	}
}

func TestCloseAnswersInFlightRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newTestServer(t, func(o *Options) { o.Engine.StepBase = time.Hour })
		results := make(chan answer, 2)
		go func() { results <- post(s, "/v1/completions", `{"prompt":"a","max_tokens":5}`) }()
		go func() { results <- post(s, "/v1/completions", `{"prompt":"a","max_tokens":5,"stream":true}`) }()
		synctest.Wait()
		s.Close()
		for range 2 {
			checkError(t, <-results, 503, "ServiceUnavailableError", "")
		}
		checkError(t, serve(context.Background(), s, "GET", "/health", ""), 503, "ServiceUnavailableError", "")
		checkError(t, post(s, "/v1/completions", `{"prompt":"a"}`), 503, "ServiceUnavailableError", "")
	})
}

// TestEveryRequestEndsInOneAnswer fires a seeded random mix of valid and
// invalid, streaming and plain, patient and impatient requests at a small
// server and checks that each gets exactly one outcome and the engine ends
// empty.
func TestEveryRequestEndsInOneAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, reg := newTestServer(t, func(o *Options) { o.Engine.NumGPUBlocks = 128; o.Engine.MaxModelLen = 256 })
		rng := rand.New(rand.NewPCG(3, 4))
		type outcome struct {
			answer
			cancelled bool
		}
		const n = 200
		outcomes := make([]outcome, n)
		var wg sync.WaitGroup
		okCount := 0
		for i := range n {
			model := []string{"base", "base", "lora-a", "lora-b", "unknown"}[rng.IntN(5)]
			prompt := strings.Repeat(string(rune('a'+rng.IntN(3))), 1+rng.IntN(400))
			maxTokens := rng.IntN(40) // 0 is invalid
			streamed := rng.IntN(2) == 0
			body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"stream":%v}`, model, prompt, maxTokens, streamed)
			if rng.IntN(20) == 0 {
				body = body[:len(body)/2] // malformed
			}
			patience := time.Duration(rng.IntN(4000)) * time.Millisecond
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				defer cancel()
				a := serve(ctx, s, "POST", "/v1/completions", body)
				outcomes[i] = outcome{answer: a, cancelled: ctx.Err() != nil}
			})
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		}
		wg.Wait()
		for i, o := range outcomes {
			switch {
			case o.aborted:
				t.Errorf("request %d aborted without a fault", i)
			case o.status == 200 && !o.cancelled:
				okCount++
				if !strings.HasPrefix(o.body, "{") && !strings.HasSuffix(o.body, "data: [DONE]\n\n") {
					t.Errorf("request %d: incomplete answer %q", i, o.body)
				}
			case o.status == 200 && o.cancelled:
				// the client left: an empty or partial body, nothing else
			case o.status >= 400:
				var e errorBody
				if err := json.Unmarshal([]byte(o.body), &e); err != nil || e.Error.Code != o.status {
					t.Errorf("request %d: status %d with body %q", i, o.status, o.body)
				}
			default:
				t.Errorf("request %d: status %d", i, o.status)
			}
		}
		if okCount == 0 {
			t.Error("no request succeeded; the mix is broken")
		}
		synctest.Wait()
		st := s.Stats()
		s.mu.Lock()
		left := len(s.inflight)
		s.mu.Unlock()
		if st.Running+st.Waiting+st.UsedBlocks != 0 || left != 0 || len(st.RunningAdapters)+len(st.WaitingAdapters) != 0 {
			t.Errorf("engine not empty after every request ended: %+v, %d in flight", st, left)
		}
		finished := mustMetric(t, reg, "vllm:request_success_total", map[string]string{"finished_reason": "length"})
		if finished < float64(okCount) {
			t.Errorf("request_success_total %v < %d successful answers", finished, okCount)
		}
	})
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"no model", func(o *Options) { o.Model = "" }, "model name"},
		{"bad engine", func(o *Options) { o.Engine.BlockSize = 0 }, "block-size"},
		{"duplicate LoRA", func(o *Options) { o.LoRAModules = append(o.LoRAModules, LoRAModule{Name: "lora-a"}) }, "twice"},
		{"LoRA named like base", func(o *Options) { o.LoRAModules = []LoRAModule{{Name: "base"}} }, "base model"},
		{"preload unknown", func(o *Options) { o.PreloadLoRAs = []string{"x"} }, "not a registered"},
		{"preload too many", func(o *Options) { o.PreloadLoRAs = []string{"lora-a", "lora-b"} }, "slots"},
		{"bad faults", func(o *Options) { o.Faults.ErrorRate = -1 }, "error_rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{Model: "base", Engine: testEngine(),
				LoRAModules: []LoRAModule{{Name: "lora-a", Path: "/a"}, {Name: "lora-b", Path: "/b"}}}
			tt.mutate(&opts)
			s, err := New(opts)
			if err == nil {
				s.Close()
				t.Fatal("New accepted invalid options")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestApproximateTokens(t *testing.T) {
	tests := []struct {
		text string
		want int
	}{{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {strings.Repeat("x", 400), 100}, {"héllo", 2}}
	for _, tt := range tests {
		if got := len(ApproximateTokens(tt.text)); got != tt.want {
			t.Errorf("%q: %d tokens, want %d", tt.text, got, tt.want)
		}
	}
	a, b := ApproximateTokens("shared prefix!XYZ"), ApproximateTokens("shared prefix!ABC")
	if a[0] != b[0] || a[2] != b[2] || a[3] == b[3] {
		t.Errorf("token identities do not follow byte prefixes: %v %v", a, b)
	}
}

// TestSeedMakesRunsReproducible replays one request sequence against two
// servers with the same seed: ids, output lengths and texts match; another
// seed changes them.
func TestSeedMakesRunsReproducible(t *testing.T) {
	run := func(seed uint64) []string {
		var bodies []string
		synctest.Test(t, func(t *testing.T) {
			s, _ := newTestServer(t, func(o *Options) { o.Seed = seed })
			for i := range 5 {
				a := post(s, "/v1/completions", fmt.Sprintf(`{"prompt":"question %d"}`, i))
				bodies = append(bodies, a.body)
			}
		})
		return bodies
	}
	a, b, c := run(7), run(7), run(8)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("same seed, different answers:\n%v\n%v", a, b)
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Error("different seeds gave identical answers")
	}
}
