package plugins_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-gw/sluice/plugins"
)

// These tests run the real EPP binary in static mode against fake model servers and drive its ext_proc service as
// Envoy does, so Sluice admission is checked through upstream's request path: the Director, errcommon's mapping to
// an immediate response, the runner's response shapers, the scheduler with the headroom filter, and /metrics.
// Waiting here is on real processes (startup, scrapes), never a stand-in for logic.

var (
	fcBuildOnce sync.Once
	fcBinary    string
	fcBuildErr  error
)

// fcEPPBinary returns $SLUICE_EPP_BINARY or builds cmd/epp once.
func fcEPPBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process test: runs the EPP binary")
	}
	fcBuildOnce.Do(func() {
		if p := os.Getenv("SLUICE_EPP_BINARY"); p != "" {
			fcBinary = p
			return
		}
		dir, err := os.MkdirTemp("", "sluice-fc-epp")
		if err != nil {
			fcBuildErr = err
			return
		}
		fcBinary = filepath.Join(dir, "epp")
		if out, err := exec.Command("go", "build", "-o", fcBinary, "github.com/sluice-gw/sluice/cmd/epp").CombinedOutput(); err != nil {
			fcBuildErr = fmt.Errorf("building the EPP: %v\n%s", err, out)
		}
	})
	if fcBuildErr != nil {
		t.Fatal(fcBuildErr)
	}
	return fcBinary
}

func fcFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// fcModelServer serves vLLM-style metrics whose waiting queue the test sets.
type fcModelServer struct {
	addr    string
	waiting atomic.Int64
}

func newFCModelServer(t *testing.T, ip string) *fcModelServer {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &fcModelServer{addr: l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="base"} %d
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="base"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="base"} 0.1
`, s.waiting.Load())
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

type fcEPP struct {
	grpcPort, metricsPort int
	output                *fcBuffer
}

type fcBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *fcBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *fcBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startFCEPP runs the EPP with args and waits for readiness; it stops the EPP with SIGINT when the test ends.
func startFCEPP(t *testing.T, args ...string) *fcEPP {
	t.Helper()
	e := &fcEPP{grpcPort: fcFreePort(t), metricsPort: fcFreePort(t), output: &fcBuffer{}}
	healthPort := fcFreePort(t)
	args = append(args, "--secure-serving=false", "--tracing=false", "--refresh-metrics-interval=50ms",
		fmt.Sprintf("--grpc-port=%d", e.grpcPort), fmt.Sprintf("--grpc-health-port=%d", healthPort),
		fmt.Sprintf("--metrics-port=%d", e.metricsPort))
	cmd := exec.Command(fcEPPBinary(t), args...)
	cmd.Stdout, cmd.Stderr = e.output, e.output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("EPP did not stop on SIGINT within 30s")
		}
		if t.Failed() {
			t.Logf("EPP output:\n%s", e.output.String())
		}
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", healthPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("EPP exited early: %v\n%s", err, e.output.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("EPP not ready after 90s: %v\n%s", err, e.output.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fcAnswer is the EPP's answer to one request: a destination, or an immediate response.
type fcAnswer struct {
	destination string
	status      int
	headers     map[string]string
	body        string
}

// send runs one request through ext_proc as Envoy does (headers, then a buffered body).
func (e *fcEPP) send(t *testing.T, headers map[string]string, body map[string]any) fcAnswer {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", e.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": "/v1/completions", ":authority": "gateway", "content-type": "application/json"} {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for k, v := range headers {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: raw, EndOfStream: true}}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	var a fcAnswer
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("ext_proc stream: %v", err)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			a.status, a.body, a.headers = int(ir.GetStatus().GetCode()), string(ir.Body), map[string]string{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				a.headers[strings.ToLower(h.Header.Key)] = string(h.Header.RawValue) + h.Header.Value
			}
			break
		}
		for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.Header.Key == "x-gateway-destination-endpoint" {
				a.destination = string(h.Header.RawValue) + h.Header.Value
			}
		}
		if resp.GetRequestBody() != nil && a.destination != "" {
			break
		}
	}
	_ = stream.CloseSend()
	return a
}

var fcPrompt atomic.Int64

func fcCompletion() map[string]any {
	return map[string]any{"model": "base", "prompt": fmt.Sprintf("prompt %d", fcPrompt.Add(1)), "max_tokens": 16}
}

// fcEventually retries check until it returns "" or 30s pass (the EPP needs a scrape to see a change).
func fcEventually(t *testing.T, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkShed verifies a Sluice rejection: status, Retry-After in whole seconds, the reason header and an OpenAI error
// whose code is the reason.
func checkShed(t *testing.T, a fcAnswer, status int, errType string, reasons ...string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("answer %+v, want status %d", a, status)
	}
	if s, err := strconv.Atoi(a.headers["retry-after"]); err != nil || s < 1 {
		t.Errorf("Retry-After = %q, want whole seconds >= 1", a.headers["retry-after"])
	}
	reason := a.headers[plugins.ShedReasonHeader]
	known := false
	for _, r := range reasons {
		known = known || r == reason
	}
	if !known {
		t.Errorf("%s = %q, want one of %v", plugins.ShedReasonHeader, reason, reasons)
	}
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &body); err != nil || body.Error.Type != errType || body.Error.Code != reason || body.Error.Message == "" {
		t.Errorf("body %q: want an OpenAI error of type %s and code %s (%v)", a.body, errType, reason, err)
	}
	if a.headers["content-type"] != "application/json" {
		t.Errorf("content-type = %q", a.headers["content-type"])
	}
}

func TestFlowControlProcessShedsWithRetryAfter(t *testing.T) {
	server := newFCModelServer(t, "127.0.0.1")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`
bands:
  standard:
    maxQueueTime: 1s
tenants:
- name: batch
  maxBand: Sheddable
endpoint:
  metricsStalenessThreshold: 3s # scrapes on a busy test machine can lag
`), 0o600); err != nil {
		t.Fatal(err)
	}
	epp := startFCEPP(t, "--static-endpoints="+server.addr, "--flow-control-config="+policy)
	batch := map[string]string{"x-gateway-inference-fairness-id": "batch"}

	fcEventually(t, "an idle endpoint admits and routes", func() string {
		if a := epp.send(t, batch, fcCompletion()); a.destination != server.addr {
			return fmt.Sprintf("answer %+v, want routed to %s", a, server.addr)
		}
		return ""
	})

	server.waiting.Store(50) // the model server's queue is full
	var shed fcAnswer
	fcEventually(t, "a Sheddable request on a full pool is shed", func() string {
		shed = epp.send(t, batch, fcCompletion())
		if shed.status == 0 {
			return "still routed: the EPP has not scraped the full queue yet"
		}
		return ""
	})
	checkShed(t, shed, 429, "rate_limit_error", "saturated")

	// A Standard request waits for its band's maximum queue time (1s), then is shed.
	checkShed(t, epp.send(t, nil, fcCompletion()), 429, "rate_limit_error", "queue_timeout", "predicted_wait")

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_flowcontrol_shed_total{band="Sheddable",outcome="rejected",reason="saturated"`, "inference_pool_"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestFlowControlProcessUnavailableWithoutFreshEndpoints(t *testing.T) {
	// Nothing listens on the endpoint, so its metrics are never fresh.
	epp := startFCEPP(t, fmt.Sprintf("--static-endpoints=127.0.0.1:%d", fcFreePort(t)), "--sluice-admission")
	checkShed(t, epp.send(t, nil, fcCompletion()), 503, "service_unavailable_error", "no_endpoints")
}

func TestFlowControlProcessOffKeepsUpstreamAdmission(t *testing.T) {
	server := newFCModelServer(t, "127.0.0.1")
	server.waiting.Store(50)
	epp := startFCEPP(t, "--static-endpoints="+server.addr)
	// Upstream's legacy admission sheds only negative priorities; a full queue does not stop a default request.
	fcEventually(t, "routed as upstream does", func() string {
		a := epp.send(t, map[string]string{"x-gateway-inference-fairness-id": "batch"}, fcCompletion())
		if a.destination != server.addr {
			return fmt.Sprintf("answer %+v", a)
		}
		return ""
	})
}
