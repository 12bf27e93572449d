package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/status"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// Hostile sequences: what a broken or malicious proxy, or a client that
// misbehaves behind a correct one, can send. An EPP may reject any of them,
// but afterwards it must still be running and serving, must route another
// request correctly, and must be back to the goroutines it had before (no
// leak), read from go_goroutines on its metrics port or Go's pprof.

// concurrentStreams is how many requests the flood case keeps open at once.
const concurrentStreams = 2000

// goroutineSlack is how many goroutines above its baseline an EPP may keep
// after a hostile case: background work that happened to start. A leak of
// one per stream shows up as hundreds or thousands.
const goroutineSlack = 25

var hostileGroup = Group{
	Name:    "Hostile",
	Fixture: &FixtureSpec{Pods: 2},
	Cases: []Case{
		hostileCase("BodyBeforeHeaders", "A request body with no request headers before it.", func(t *T, f *Fixture) {
			t.Observe("answer", "%s", rawExchange(t, f, &extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: Chat(uniquePrompt()), EndOfStream: true}},
			}))
		}),
		hostileCase("ResponseForUnknownRequest", "Response headers and body on a stream that carried no request.", func(t *T, f *Fixture) {
			t.Observe("answer", "%s", rawExchange(t, f,
				&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}},
				}}},
				&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
					Body: []byte(`{"model":"x"}`), EndOfStream: true,
				}}},
			))
		}),
		hostileCase("StreamClosedMidBody", "100 streams cancelled after the headers and half the body.", func(t *T, f *Fixture) {
			body := Chat(strings.Repeat("long prompt ", 20000))
			for range 100 {
				ctx, cancel := context.WithCancel(t.Context())
				stream, err := f.Envoy.Stream(ctx)
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				half := body[:len(body)/2]
				_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
					Headers: Request{Body: body}.headerMap(),
				}}})
				_ = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: half}}})
				cancel()
			}
			t.Observe("answer", "survived")
		}),
		hostileCase("ThousandsOfConcurrentStreams", fmt.Sprintf("%d requests open at once; every one gets one answer (routed to a pool member, or 429/503).", concurrentStreams), func(t *T, f *Fixture) {
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var mu sync.Mutex
			outcomes := map[string]int{}
			start := make(chan struct{})
			for range concurrentStreams {
				wg.Go(func() {
					<-start
					d, err := f.Envoy.Exchange(ctx, Request{Body: Chat(uniquePrompt())})
					var o string
					switch {
					case err != nil:
						o = "no answer: " + err.Error()
					case d.Immediate != nil:
						o = fmt.Sprintf("immediate %d", d.Immediate.Status)
					case slices.Contains(f.AllAddrs(), splitEndpoints(d.Destination())[0]) && d.Destination() == d.MetadataDestination():
						o = "routed"
					default:
						o = fmt.Sprintf("misrouted to %q/%q", d.Destination(), d.MetadataDestination())
					}
					mu.Lock()
					outcomes[o]++
					mu.Unlock()
				})
			}
			close(start)
			probeWhile(t, f, func() bool { return ctx.Err() == nil && sum(outcomes, &mu) < concurrentStreams })
			wg.Wait()
			t.Logf("outcomes of %d concurrent requests: %v", concurrentStreams, outcomes)
			for o, n := range outcomes {
				if o != "routed" && o != "immediate 429" && o != "immediate 503" {
					t.Errorf("%d requests: %s", n, o)
				}
			}
			t.Observe("answers", "all")
		}),
		hostileCase("ClientNeverReads", "A stream whose client sends a long streamed response and never reads the EPP's answers; other requests go on meanwhile.", func(t *T, f *Fixture) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stream, err := f.Envoy.Stream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := requestPhase(stream, Request{Body: ChatFor(Model, uniquePrompt(), true)}); err != nil {
				t.Fatalf("routing the request: %v", err)
			}
			sent := make(chan int, 1)
			go func() {
				n := 0
				defer func() { sent <- n }()
				if stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")}}},
				}}}) != nil {
					return
				}
				chunk := []byte("data: " + strings.Repeat("x", 16<<10) + "\n\n")
				for ; n < 256; n++ {
					if stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk}}}) != nil {
						return
					}
				}
			}()
			// The EPP's answers pile up unread until flow control stops it.
			deadline := time.Now().Add(3 * time.Second)
			probeWhile(t, f, func() bool { return time.Now().Before(deadline) })
			cancel()
			t.Logf("the never-reading client got %d chunks of 16 KiB in before its stream ended", <-sent)
			t.Observe("others", "served")
		}),
	},
}

// hostileCase wraps run with the checks every hostile case ends with: the
// EPP process still runs and serves, routes a request correctly, and its
// goroutine count returns to (near) what it was before.
func hostileCase(name, what string, run func(t *T, f *Fixture)) Case {
	return Case{
		Name: name, Profile: EPPProfile,
		Ref:         Ref{Path: proposal004, Line: 14, Quote: "The EPP MUST implement the Envoy"},
		Requirement: what + " The EPP may reject it but must not crash, hang, leak goroutines or misroute another request.",
		Run: func(t *T, f *Fixture) {
			before, err := goroutines(t.Context(), f.EPP)
			if err != nil {
				t.Fatalf("the EPP's goroutine count is not observable: %v", err)
			}
			run(t, f)
			if f.EPP.Exited() {
				t.Fatalf("the EPP process exited")
			}
			if !runnertest.Serving(t, f.EPP, "readiness") {
				t.Errorf("the EPP no longer reports ready")
			}
			recovered(t, f)
			var after int
			runnertest.Eventually(t, "the EPP's goroutines return to their number before the case", func() string {
				if after, err = goroutines(t.Context(), f.EPP); err != nil {
					return err.Error()
				}
				if after > before+goroutineSlack {
					return fmt.Sprintf("%d goroutines, %d before", after, before)
				}
				return ""
			})
			t.Logf("goroutines: %d before, %d after", before, after)
		},
	}
}

// rawExchange sends msgs on a fresh stream, then half-closes it, and
// describes what the EPP did within 10s: an immediate response, another
// answer, a stream error (with its gRPC status), or nothing.
func rawExchange(t *T, f *Fixture, msgs ...*extprocv3.ProcessingRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := f.Envoy.Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break
		}
	}
	_ = stream.CloseSend()
	resp, err := stream.Recv()
	switch {
	case err == nil && resp.GetImmediateResponse() != nil:
		return fmt.Sprintf("immediate %d", resp.GetImmediateResponse().GetStatus().GetCode())
	case err == nil:
		return fmt.Sprintf("answer %T", resp.Response)
	case ctx.Err() != nil:
		return "no answer within 10s"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	default:
		return "stream ended: " + grpcCode(err)
	}
}

func grpcCode(err error) string {
	if errors.Is(err, io.EOF) {
		return "EOF"
	}
	return status.Code(err).String()
}

// probeOnce routes a request restricted to ep. It returns "" when the EPP
// routed it there, "rejected: ..." for an immediate 429 or 503 (admission
// may shed it while the EPP is overloaded), and any other answer, a
// misroute or a broken stream, as an error.
func probeOnce(t *T, f *Fixture, ep string) (rejected string, err error) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, err := f.Envoy.Exchange(ctx, Request{Body: Chat(uniquePrompt()), Subset: []string{ep}})
	switch {
	case err != nil:
		return "", fmt.Errorf("probe for %s: %w", ep, err)
	case d.Immediate != nil && (d.Immediate.Status == 429 || d.Immediate.Status == 503):
		return fmt.Sprintf("rejected: %d %s", d.Immediate.Status, d.Immediate.Body), nil
	case d.Immediate != nil:
		return "", fmt.Errorf("probe for %s: immediate response %d: %s", ep, d.Immediate.Status, d.Immediate.Body)
	case d.Destination() != ep || d.MetadataDestination() != ep:
		return "", fmt.Errorf("probe restricted to %s routed to %q/%q", ep, d.Destination(), d.MetadataDestination())
	}
	return "", nil
}

// probeWhile probes every endpoint while more returns true (at least
// once): another request must never be misrouted, though it may be shed.
func probeWhile(t *T, f *Fixture, more func() bool) {
	t.Helper()
	for first := true; first || more(); first = false {
		for _, ep := range f.AllAddrs() {
			if _, err := probeOnce(t, f, ep); err != nil {
				t.Error(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// recovered waits until a request restricted to each endpoint is routed
// there again.
func recovered(t *T, f *Fixture) {
	t.Helper()
	for _, ep := range f.AllAddrs() {
		runnertest.Eventually(t, "the EPP routes again after the case", func() string {
			rejected, err := probeOnce(t, f, ep)
			if err != nil {
				t.Fatal(err)
			}
			return rejected
		})
	}
}

func sum(m map[string]int, mu *sync.Mutex) int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// goroutines reads the EPP's goroutine count from go_goroutines on its
// metrics port, or else from Go's goroutine profile there.
func goroutines(ctx context.Context, p *runnertest.Process) (int, error) {
	base := fmt.Sprintf("http://127.0.0.1:%d", p.MetricsPort)
	body, err := get(ctx, base+"/metrics")
	if err == nil {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if fams, perr := parser.TextToMetricFamilies(strings.NewReader(body)); perr == nil {
			if g, ok := fams["go_goroutines"]; ok && len(g.GetMetric()) == 1 {
				return int(g.GetMetric()[0].GetGauge().GetValue()), nil
			}
		}
	}
	prof, perr := get(ctx, base+"/debug/pprof/goroutine?debug=1")
	if perr != nil {
		return 0, errors.Join(fmt.Errorf("no go_goroutines on /metrics (%v)", err), perr)
	}
	first, _, _ := bufio.NewReader(strings.NewReader(prof)).ReadLine()
	var n int
	if _, err := fmt.Sscanf(string(first), "goroutine profile: total %d", &n); err != nil {
		return 0, fmt.Errorf("no go_goroutines on /metrics and an unreadable goroutine profile %q", first)
	}
	return n, nil
}

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b.String(), nil
}
