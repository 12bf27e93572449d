package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// instantWait records requested waits and returns at once, so runs need no
// real time: the arrival schedule collapses and Retry-After delays are
// observable as values.
type instantWait struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (w *instantWait) wait(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	w.waits = append(w.waits, d)
	w.mu.Unlock()
	return ctx.Err()
}

// fakeModelServer answers chat and completions requests as vLLM does,
// streaming one SSE event per token and a usage chunk.
func fakeModelServer(t *testing.T, hook func(w http.ResponseWriter, r *http.Request) bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if hook != nil && hook(w, r) {
			return
		}
		var req struct {
			MaxTokens int  `json:"max_tokens"`
			Stream    bool `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set(servedHeader, "127.0.0.1:9999")
		w.Header().Set("X-Request-Id", "id-from-the-gateway")
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":%d}}`, req.MaxTokens)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range req.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			_ = rc.Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", req.MaxTokens)
	}))
	t.Cleanup(func() {
		srv.Close()
		checkNoLeakedGoroutines(t)
	})
	return srv, &calls
}

// checkNoLeakedGoroutines fails if any goroutine still runs non-test code of
// this package: Run must have joined every goroutine it started.
func checkNoLeakedGoroutines(t *testing.T) {
	t.Helper()
	// A goroutine that has just signalled its waiter may still be running
	// its last instructions; yield (no sleeping) and look again before
	// calling it a leak.
	var leaked string
	for range 1000 {
		if leaked = ourGoroutines(); leaked == "" {
			return
		}
		runtime.Gosched()
	}
	t.Errorf("leaked goroutine:\n%s", leaked)
}

// ourGoroutines returns the stacks of goroutines running non-test code of
// this package.
func ourGoroutines() string {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	var out []string
	for g := range strings.SplitSeq(buf.String(), "\n\n") {
		for line := range strings.SplitSeq(g, "\n") {
			line = strings.TrimSpace(line)
			if strings.Contains(line, "/loadgen/") && strings.Contains(line, ".go:") && !strings.Contains(line, "_test.go") {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

const runMix = `
classes:
  - {name: s, model: m, prompt_tokens: 4, output_tokens: 5, objective: critical}
  - {name: n, model: m, prompt_tokens: 4, output_tokens: 3, stream: false, api: completions}
`

func TestRunOpenLoopMeasures(t *testing.T) {
	var objectives sync.Map
	srv, calls := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		objectives.Store(r.Header.Get(ObjectiveHeader), true)
		return false
	})
	w := &instantWait{}
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Seed: 1, Mode: ModeOpen,
		Arrival: ArrivalConfig{Kind: ArrivalPoisson, Rate: 100}, MaxRequests: 40, wait: w.wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 40 || len(res.Records) != 40 {
		t.Fatalf("%d calls, %d records, want 40", calls.Load(), len(res.Records))
	}
	if _, ok := objectives.Load("critical"); !ok {
		t.Error("objective header not sent")
	}
	seqs := map[int]bool{}
	for _, r := range res.Records {
		if !r.Final || !r.OK() || seqs[r.Seq] {
			t.Fatalf("record %+v: want one final success per seq", r)
		}
		seqs[r.Seq] = true
		if r.Endpoint != "127.0.0.1:9999" || r.RequestID != "id-from-the-gateway" {
			t.Errorf("served endpoint %q or request ID %q not recorded", r.Endpoint, r.RequestID)
		}
		switch r.Class {
		case "s":
			if r.OutputTokens != 5 || len(r.ITL) != 4 || r.TTFT <= 0 || r.E2E < r.TTFT {
				t.Errorf("streaming record %+v", r)
			}
		case "n":
			if r.OutputTokens != 3 || r.TTFT != r.E2E || len(r.ITL) != 0 {
				t.Errorf("non-streaming record %+v", r)
			}
		}
	}
	// The open loop asked to wait for each arrival, in schedule order.
	arrivals, _ := NewArrivals(ArrivalConfig{Kind: ArrivalPoisson, Rate: 100}, 1)
	prevScheduled := time.Duration(-1)
	for range 40 {
		at := arrivals.Next()
		found := false
		for _, r := range res.Records {
			if r.Scheduled == at {
				found = true
			}
		}
		if !found || at < prevScheduled {
			t.Fatalf("arrival %v missing from the records", at)
		}
		prevScheduled = at
	}
	if s := res.Summary.Overall; s.Requests != 40 || s.Succeeded != 40 || s.OutputTokensPerSecond <= 0 {
		t.Errorf("summary %+v", s)
	}
}

func TestRunHonoursRetryAfter(t *testing.T) {
	var attempts atomic.Int64
	srv, _ := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		if attempts.Add(1) <= 2 {
			w.Header().Set("Retry-After", "3")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"shed","type":"rate_limit","param":null,"code":"shed"}}`)
			return true
		}
		return false
	})
	w := &instantWait{}
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Seed: 2, Mode: ModeClosed, Users: 1, MaxRequests: 1,
		Retry: RetryPolicy{MaxAttempts: 5, MaxWait: 2 * time.Second}, wait: w.wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 3 {
		t.Fatalf("%d records, want 3 attempts: %+v", len(res.Records), res.Records)
	}
	for i, r := range res.Records {
		if r.Attempt != i+1 || r.Seq != 0 || r.Final != (i == 2) {
			t.Errorf("record %d: attempt %d final %v", i, r.Attempt, r.Final)
		}
		if i < 2 && (r.Status != 429 || !r.RetryAfterSet || r.RetryAfter != 3*time.Second || !strings.Contains(r.Error, "shed")) {
			t.Errorf("attempt %d: %+v", i+1, r)
		}
	}
	if !res.Records[2].OK() {
		t.Errorf("final attempt %+v", res.Records[2])
	}
	// Both waits were the Retry-After of 3s capped at MaxWait 2s.
	w.mu.Lock()
	defer w.mu.Unlock()
	if fmt.Sprint(w.waits) != "[2s 2s]" {
		t.Errorf("waits %v, want [2s 2s]", w.waits)
	}
	if s := res.Summary.Overall; s.Requests != 1 || s.Attempts != 3 || s.Retried != 1 || s.Succeeded != 1 {
		t.Errorf("summary %+v", s)
	}
}

func TestRunStopsRetryingAtMaxAttempts(t *testing.T) {
	srv, calls := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	w := &instantWait{}
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Mode: ModeClosed, Users: 2, MaxRequests: 3,
		Retry: RetryPolicy{MaxAttempts: 2}, wait: w.wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 6 || len(res.Records) != 6 {
		t.Fatalf("%d calls %d records, want 3 requests x 2 attempts", calls.Load(), len(res.Records))
	}
	if s := res.Summary.Overall; s.Requests != 3 || s.Failed != 3 || s.Status["503"] != 3 {
		t.Errorf("summary %+v", s)
	}
}

func TestRunNoRetryWithoutRetryAfter(t *testing.T) {
	srv, calls := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusTooManyRequests)
		return true
	})
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Mode: ModeClosed, Users: 1, MaxRequests: 2,
		Retry: RetryPolicy{MaxAttempts: 4}, wait: (&instantWait{}).wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || res.Summary.Overall.Retried != 0 {
		t.Errorf("%d calls, summary %+v", calls.Load(), res.Summary.Overall)
	}
}

func TestRunRecordsBrokenStreams(t *testing.T) {
	srv, _ := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		return true // no [DONE]
	})
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, `classes: [{name: s, model: m, prompt_tokens: 1, output_tokens: 2}]`),
		Mode: ModeClosed, Users: 1, MaxRequests: 1, wait: (&instantWait{}).wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Records[0]
	if r.OK() || !strings.Contains(r.Error, "[DONE]") || r.Status != 200 || r.TTFT <= 0 {
		t.Errorf("record %+v, want a failed but measured stream", r)
	}
}

func TestRunDurationBound(t *testing.T) {
	srv, _ := fakeModelServer(t, nil)
	// Constant arrivals 10/s over 1s of schedule: exactly 10 are issued; the
	// instant wait means no real time passes except the requests.
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Mode: ModeOpen,
		Arrival: ArrivalConfig{Kind: ArrivalConstant, Rate: 10}, Duration: time.Second, wait: (&instantWait{}).wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 10 {
		t.Errorf("%d records, want the 10 arrivals scheduled within 1s", len(res.Records))
	}
}

// TestRunInterleavesTargets: with several targets, each round of
// len(Targets) requests goes through every target once (in an order of the
// seed's), each request reaches the target its record names, and a retry
// goes where its first attempt went.
func TestRunInterleavesTargets(t *testing.T) {
	const n, rounds = 3, 20
	var mu sync.Mutex
	got := map[int][]int{} // target -> seqs it served
	retried := map[int]bool{}
	var urls []string
	for k := range n {
		srv, _ := fakeModelServer(t, func(w http.ResponseWriter, r *http.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			// The first request through target 1 is shed once, with Retry-After.
			if k == 1 && !retried[k] {
				retried[k] = true
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return true
			}
			got[k] = append(got[k], 0)
			return false
		})
		urls = append(urls, srv.URL)
	}
	res, err := Run(context.Background(), RunConfig{
		Targets: urls, Mix: mustMix(t, runMix), Seed: 5, Mode: ModeOpen,
		Arrival: ArrivalConfig{Kind: ArrivalConstant, Rate: 1}, MaxRequests: n * rounds,
		Retry: RetryPolicy{MaxAttempts: 2}, wait: (&instantWait{}).wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	bySeq := map[int]int{}
	perTarget := make([]int, n)
	for _, r := range res.Records {
		if prev, ok := bySeq[r.Seq]; ok && prev != r.Target {
			t.Errorf("request %d: attempts through targets %d and %d", r.Seq, prev, r.Target)
		}
		bySeq[r.Seq] = r.Target
		if r.Final {
			if !r.OK() {
				t.Errorf("request %d failed: %+v", r.Seq, r)
			}
			perTarget[r.Target]++
		}
	}
	for k := range n {
		if perTarget[k] != rounds || len(got[k]) != rounds {
			t.Errorf("target %d: %d requests recorded, %d served; want %d", k, perTarget[k], len(got[k]), rounds)
		}
	}
	orders := map[string]bool{}
	for round := range rounds {
		seen := make([]bool, n)
		order := ""
		for i := range n {
			k := bySeq[round*n+i]
			if seen[k] {
				t.Errorf("round %d: target %d twice", round, k)
			}
			seen[k] = true
			order += fmt.Sprint(k)
		}
		orders[order] = true
	}
	if len(orders) < 2 {
		t.Errorf("every round in the same order %v: the turns are not drawn", orders)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	m := mustMix(t, runMix)
	for _, tc := range []struct {
		name string
		cfg  RunConfig
		want string
	}{
		{"remote target", RunConfig{Target: "http://10.1.2.3:8000", Mix: m, Mode: ModeClosed, Users: 1, MaxRequests: 1}, "loopback"},
		{"named target", RunConfig{Target: "http://example.com", Mix: m, Mode: ModeClosed, Users: 1, MaxRequests: 1}, "loopback"},
		{"bad scheme", RunConfig{Target: "ftp://127.0.0.1", Mix: m, Mode: ModeClosed, Users: 1, MaxRequests: 1}, "scheme"},
		{"unbounded", RunConfig{Target: "http://127.0.0.1:1", Mix: m, Mode: ModeClosed, Users: 1}, "end by itself"},
		{"no users", RunConfig{Target: "http://127.0.0.1:1", Mix: m, Mode: ModeClosed, MaxRequests: 1}, "user"},
		{"no rate", RunConfig{Target: "http://127.0.0.1:1", Mix: m, Mode: ModeOpen, Arrival: ArrivalConfig{Kind: ArrivalPoisson}, MaxRequests: 1}, "rate"},
		{"no mix", RunConfig{Target: "http://127.0.0.1:1", Mode: ModeClosed, Users: 1, MaxRequests: 1}, "mix"},
		{"bad mode", RunConfig{Target: "http://127.0.0.1:1", Mix: m, Mode: "both", MaxRequests: 1}, "mode"},
		{"target and targets", RunConfig{Target: "http://127.0.0.1:1", Targets: []string{"http://127.0.0.1:2"}, Mix: m, Mode: ModeClosed, Users: 1, MaxRequests: 1}, "not both"},
		{"remote among targets", RunConfig{Targets: []string{"http://127.0.0.1:2", "http://10.1.2.3:8000"}, Mix: m, Mode: ModeClosed, Users: 1, MaxRequests: 1}, "loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestLoopbackClientRefusesRemoteDial(t *testing.T) {
	c := NewLoopbackClient()
	// The dialer's Control hook rejects the address before any packet is
	// sent; 192.0.2.1 is TEST-NET-1.
	req, _ := http.NewRequest(http.MethodGet, "http://192.0.2.1:80/", nil)
	_, err := c.Do(req)
	if err == nil || !strings.Contains(err.Error(), "non-loopback") {
		t.Fatalf("error %v, want a refusal", err)
	}
}

func TestWriteJSONRoundTrip(t *testing.T) {
	srv, _ := fakeModelServer(t, nil)
	res, err := Run(context.Background(), RunConfig{
		Target: srv.URL, Mix: mustMix(t, runMix), Mode: ModeClosed, Users: 2, MaxRequests: 4, wait: (&instantWait{}).wait,
	})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	if err := WriteJSON(&sb, res); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Summary Summary  `json:"summary"`
		Records []Record `json:"records"`
	}
	if err := json.Unmarshal([]byte(sb.String()), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Records) != 4 || back.Summary.Overall.Requests != 4 {
		t.Errorf("round trip lost data: %d records, summary %+v", len(back.Records), back.Summary.Overall)
	}
}

func TestParseServerTimes(t *testing.T) {
	for _, tc := range []struct {
		queue, first    string
		wantQ, wantTTFT time.Duration
	}{
		{"0.022000", "0.033000", 22 * time.Millisecond, 33 * time.Millisecond},
		{"0", "0.5", 0, 500 * time.Millisecond},
		{"", "0.5", 0, 0},              // a server that does not say
		{"0.5", "0.1", 0, 0},           // queued longer than it took to answer: not believed
		{"-1", "0.1", 0, 0},            // negative
		{"0.1", "soon", 0, 0},          // malformed
		{"0.000000", "0.000000", 0, 0}, // no first token
	} {
		h := http.Header{}
		if tc.queue != "" {
			h.Set(serverQueueHeader, tc.queue)
		}
		h.Set(serverTTFTHeader, tc.first)
		var r Record
		r.parseServerTimes(h)
		if r.ServerQueue != tc.wantQ || r.ServerTTFT != tc.wantTTFT {
			t.Errorf("%q, %q: queue %v, first token %v; want %v, %v", tc.queue, tc.first, r.ServerQueue, r.ServerTTFT, tc.wantQ, tc.wantTTFT)
		}
	}
}

func TestParseEPPTime(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"0.012500", 12500 * time.Microsecond},
		{"", 0},     // no EPP (round-robin) or a data plane that does not say
		{"-0.1", 0}, // negative
		{"fast", 0}, // malformed
		{"0", 0},
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set(eppTimeHeader, tc.value)
		}
		var r Record
		r.parseEPPTime(h)
		if r.EPPTime != tc.want {
			t.Errorf("%q: %v, want %v", tc.value, r.EPPTime, tc.want)
		}
	}
}

func TestParseRequestID(t *testing.T) {
	long := strings.Repeat("x", maxRequestIDBytes+1)
	for _, tc := range []struct {
		value, want string
	}{
		{"6f1c2d9e-0000-4000-8000-000000000001", "6f1c2d9e-0000-4000-8000-000000000001"},
		{"", ""},   // a gateway that does not say
		{long, ""}, // not a gateway's ID
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set("X-Request-Id", tc.value)
		}
		var r Record
		r.parseRequestID(h)
		if r.RequestID != tc.want {
			t.Errorf("%.20q: %q, want %q", tc.value, r.RequestID, tc.want)
		}
	}
}
