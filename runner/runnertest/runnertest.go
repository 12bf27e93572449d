package runnertest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// EPPPath returns the EPP binary under test: $SLUICE_EPP_BINARY (the
// Makefile's freshly built bin/epp) or one built here.
func EPPPath(t *testing.T) string {
	t.Helper()
	return sluiceEPP.path(t)
}

// UpstreamEPPPath returns upstream's EPP at the version go.mod pins, for
// side-by-side tests: $SLUICE_UPSTREAM_EPP_BINARY (the Makefile's
// bin/upstream-epp) or one built here.
func UpstreamEPPPath(t *testing.T) string {
	t.Helper()
	return upstreamEPP.path(t)
}

var (
	sluiceEPP   = &binary{env: "SLUICE_EPP_BINARY", pkg: "github.com/sluice-gw/sluice/cmd/epp"}
	upstreamEPP = &binary{env: "SLUICE_UPSTREAM_EPP_BINARY", pkg: "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"}
)

// binary is a command the tests run: the file $env names, or pkg built once
// per test process.
type binary struct {
	env, pkg string
	once     sync.Once
	file     string
	err      error
}

func (b *binary) path(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		if b.file = os.Getenv(b.env); b.file != "" {
			return
		}
		dir, err := os.MkdirTemp("", "sluice-test-bin")
		if err != nil {
			b.err = err
			return
		}
		b.file = filepath.Join(dir, filepath.Base(b.pkg))
		if out, err := exec.Command("go", "build", "-o", b.file, b.pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s ($%s is unset): %v\n%s", b.pkg, b.env, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.file
}

// handedOut holds every port FreePort has returned in this test binary: the
// kernel may hand a just-closed port out again, and a process given the same
// port for two listeners exits on the second bind.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago and
// that no earlier call in this test binary returned.
func FreePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
	t.Fatal("no free port the kernel offered was unused by this test binary")
	return 0
}

// Process is a running EPP binary.
type Process struct {
	cmd *exec.Cmd
	// path, env and args (ports included) start it again (Restart).
	path      string
	env, args []string
	// exited closes when the process has ended; waitErr is its exit status.
	exited  chan struct{}
	waitErr error
	// GRPCPort serves ext_proc; HealthPort serves gRPC health.
	GRPCPort, HealthPort, MetricsPort int
	// Output collects the process's stdout and stderr.
	Output *SyncBuffer
}

// Stop interrupts the process, as Kubernetes stops a pod, and waits up to
// 20s for it to end.
func (p *Process) Stop() error {
	_, err := p.Interrupt(20 * time.Second)
	return err
}

// Exited reports whether the process has ended (e.g. crashed).
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartEPP runs the EPP binary with args plus free ports, stops it when the
// test ends, and waits until its readiness check passes.
func StartEPP(t *testing.T, env []string, args ...string) *Process {
	t.Helper()
	return StartBinary(t, EPPPath(t), env, "readiness", args...)
}

// StartUpstreamEPP is StartEPP for upstream's EPP binary, for tests that
// show Sluice behaves as upstream does.
func StartUpstreamEPP(t *testing.T, env []string, args ...string) *Process {
	t.Helper()
	return StartBinary(t, UpstreamEPPPath(t), env, "readiness", args...)
}

// StartEPPUnready is StartEPP for a replica that is not meant to become
// ready (a follower under leader election): it waits for liveness only.
func StartEPPUnready(t *testing.T, env []string, args ...string) *Process {
	t.Helper()
	return StartBinary(t, EPPPath(t), env, "liveness", args...)
}

// Serving reports whether the EPP's gRPC health service says service (e.g.
// "readiness", "liveness") is serving.
func Serving(t testing.TB, p *Process, service string) bool {
	t.Helper()
	status, err := HealthStatus(p, service)
	return err == nil && status == healthpb.HealthCheckResponse_SERVING
}

// HealthStatus asks the EPP's gRPC health service about service.
func HealthStatus(p *Process, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", p.HealthPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, err
	}
	return resp.Status, nil
}

// StartBinary runs the EPP binary at path (any EPP that takes upstream's
// flags) with args plus free ports, stops it when the test ends, and waits
// until the health service waitFor is serving, or, with waitFor "", until
// the health server answers at all. A --grpc-health-port=N among args is
// kept (replicas name each other by it before they start).
func StartBinary(t testing.TB, path string, env []string, waitFor string, args ...string) *Process {
	t.Helper()
	healthPort := 0
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--grpc-health-port="); ok {
			port, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: %v", a, err)
			}
			healthPort = port
		}
	}
	for attempt := 1; ; attempt++ {
		p := &Process{GRPCPort: FreePort(t), MetricsPort: FreePort(t), HealthPort: healthPort, Output: &SyncBuffer{}}
		if p.HealthPort == 0 {
			p.HealthPort = FreePort(t)
		}
		p.path, p.env = path, env
		p.args = append(slices.Clip(args),
			fmt.Sprintf("--grpc-port=%d", p.GRPCPort),
			fmt.Sprintf("--grpc-health-port=%d", p.HealthPort),
			fmt.Sprintf("--metrics-port=%d", p.MetricsPort),
			"--tracing=false",
			"--refresh-metrics-interval=50ms",
		)
		if started := p.run(t, waitFor, attempt < startAttempts); started != nil {
			return started
		}
		t.Logf("EPP exited: another process took a port FreePort handed out; starting it again on others (attempt %d)", attempt)
	}
}

// startAttempts bounds StartBinary's starts: a port FreePort hands out is free only until another process (another
// package's test binary, run at the same time) binds it.
const startAttempts = 3

// Restart starts the EPP again with the same environment, flags and ports,
// its output appended to the same Output, once this process has exited (it
// must have been stopped: Interrupt, Terminate or Kill), and waits until its
// readiness check passes. The returned Process is the new one.
func (p *Process) Restart(t testing.TB) *Process {
	t.Helper()
	select {
	case <-p.exited:
	default:
		t.Fatal("Restart of an EPP that is still running")
	}
	q := &Process{path: p.path, env: p.env, args: p.args, GRPCPort: p.GRPCPort, HealthPort: p.HealthPort, MetricsPort: p.MetricsPort, Output: p.Output}
	return q.run(t, "readiness", false)
}

// run starts the process and waits for its waitFor health check. With portTakenAgain, a process that exits because a
// port it was given is in use returns nil (the caller starts it again on other ports) instead of failing t.
func (p *Process) run(t testing.TB, waitFor string, portTakenAgain bool) *Process {
	t.Helper()
	p.exited = make(chan struct{})
	p.cmd = exec.Command(p.path, p.args...)
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Stdout = p.Output
	p.cmd.Stderr = p.Output
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if _, err := p.Interrupt(20 * time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("EPP output:\n%s", p.Output.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.exited:
			if portTakenAgain && strings.Contains(p.Output.String(), "address already in use") {
				return nil
			}
			t.Fatalf("EPP exited early: %v\n%s", p.waitErr, p.Output.String())
		default:
		}
		if status, err := HealthStatus(p, waitFor); err == nil && (waitFor == "" || status == healthpb.HealthCheckResponse_SERVING) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("EPP %s check not serving after 60s\n%s", waitFor, p.Output.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Metrics returns the EPP's /metrics page (the process runs with
// --metrics-endpoint-auth off or in static mode, where it needs no token).
func (p *Process) Metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(page)
}

// Interrupt sends the EPP SIGINT, as Kubernetes stops a pod, and waits up to
// limit for it to exit. It returns the EPP's exit status (nil for 0), or err
// if the EPP did not exit in time and was killed. Once the EPP has exited it
// returns the same status without signalling again.
func (p *Process) Interrupt(limit time.Duration) (exit, err error) {
	return p.stop(os.Interrupt, limit)
}

// Terminate is Interrupt with SIGTERM, which is how Kubernetes stops a pod.
func (p *Process) Terminate(limit time.Duration) (exit, err error) {
	return p.stop(syscall.SIGTERM, limit)
}

// Kill ends the EPP with SIGKILL, as an OOM kill or a lost node would, and
// returns once it has exited.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

func (p *Process) stop(sig os.Signal, limit time.Duration) (exit, err error) {
	select {
	case <-p.exited:
		return p.waitErr, nil
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return p.waitErr, nil
	case <-time.After(limit):
		// SIGQUIT makes the Go runtime write every goroutine's stack to the output the test logs: where it hung.
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		return p.waitErr, fmt.Errorf("EPP did not stop on %v within %s (its goroutines, from SIGQUIT, end its output)", sig, limit)
	}
}

// ModelServer serves a vLLM-style /metrics page on a loopback address, so the
// EPP's scraper sees a healthy server whose waiting queue the test sets.
type ModelServer struct {
	// Addr is the host:port the server listens on.
	Addr string
	// Waiting is the reported vllm:num_requests_waiting.
	Waiting atomic.Int64
}

// StartModelServer listens on hostPort (port 0 picks one) until the test ends,
// serving the base model "base".
func StartModelServer(t testing.TB, hostPort string) *ModelServer {
	t.Helper()
	return StartModelServerOf(t, hostPort, "base")
}

// StartModelServerOf is StartModelServer for a server whose metrics name
// model as its base model (vLLM's model_name label).
func StartModelServerOf(t testing.TB, hostPort, model string) *ModelServer {
	t.Helper()
	l, err := net.Listen("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	s := &ModelServer{Addr: l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=%[2]q} %[1]d
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name=%[2]q} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name=%[2]q} 0.1
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1
`, s.Waiting.Load(), model)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// Answer is the EPP's decision for one request: a destination, or an
// immediate response.
type Answer struct {
	// Destination is the x-gateway-destination-endpoint header mutation;
	// Metadata the envoy.lb dynamic metadata value.
	Destination, Metadata string
	// SetHeaders are all the headers the EPP's request-headers answer
	// sets, by lower-case name, values in order.
	SetHeaders map[string][]string
	// Status, Headers and Body describe an immediate response; Status is 0
	// when the request was routed.
	Status  int
	Headers map[string]string
	Body    string
}

// Route sends one request to the EPP's ext_proc service on port the way
// Envoy's ext_proc filter does (request headers, then the buffered body, with
// an optional subset hint) and returns its answer.
func Route(t *testing.T, port int, useTLS bool, headers map[string]string, body any, subset []string) Answer {
	t.Helper()
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(creds))
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
	var md *corev3.Metadata
	if subset != nil {
		vals := make([]any, len(subset))
		for i, s := range subset {
			vals[i] = s
		}
		inner, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-subset": vals})
		if err != nil {
			t.Fatal(err)
		}
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb.subset_hint": inner}}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}, MetadataContext: md},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: raw, EndOfStream: true}}, MetadataContext: md},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	var a Answer
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("ext_proc stream: %v", err)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			a.Status, a.Body, a.Headers = int(ir.GetStatus().GetCode()), string(ir.Body), map[string]string{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				a.Headers[strings.ToLower(h.Header.Key)] = string(h.Header.RawValue) + h.Header.Value
			}
			break
		}
		if rh := resp.GetRequestHeaders(); rh != nil {
			a.SetHeaders = map[string][]string{}
			for _, h := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
				key, value := strings.ToLower(h.Header.Key), string(h.Header.RawValue)+h.Header.Value
				a.SetHeaders[key] = append(a.SetHeaders[key], value)
				if key == "x-gateway-destination-endpoint" {
					a.Destination = value
				}
			}
			if lb := resp.GetDynamicMetadata().GetFields()["envoy.lb"]; lb != nil {
				a.Metadata = lb.GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			}
		}
		if resp.GetRequestBody() != nil && a.Destination != "" {
			break
		}
	}
	_ = stream.CloseSend()
	return a
}

// Eventually retries check until it returns "" or 30s pass: the EPP needs a
// scrape or a watch event to see a change. The wait bounds a real process,
// it is not a timing assertion.
func Eventually(t testing.TB, what string, check func() string) {
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

// Reply is the response Exchange plays back as the model server.
type Reply struct {
	// Status is the HTTP status; 0 means 200.
	Status int
	// ContentType is the response's content type, e.g. text/event-stream
	// for a streamed response.
	ContentType string
	// Chunks are the body chunks, sent in order; the last ends the stream.
	Chunks []string
}

// Exchanged is what the EPP did with one request and the response to it.
type Exchanged struct {
	// Answer is the routing decision (or immediate response).
	Answer
	// RequestBody is the body the EPP has the proxy forward.
	RequestBody string
	// ResponseChunks are the response body chunks the EPP has the proxy send
	// to the client, in order; empty chunks are left out.
	ResponseChunks []string
}

// Exchange sends one request to the EPP's ext_proc service on port the way
// Envoy's ext_proc filter does and, when the EPP routes it, plays reply as
// the model server's response through the EPP, as Envoy does in full-duplex
// streamed mode. It returns what the proxy would forward and send back.
func Exchange(t *testing.T, port int, headers map[string]string, body any, reply Reply) Exchanged {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	defer func() { _ = stream.CloseSend() }()
	hm := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": "/v1/chat/completions", ":authority": "gateway", "content-type": "application/json"} {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for k, v := range headers {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatalf("ext_proc send: %v", err)
		}
	}
	recv := func() *extprocv3.ProcessingResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ext_proc stream: %v", err)
		}
		return resp
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}})
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: raw, EndOfStream: true}}})

	var x Exchanged
	var forwarded []byte
	mutated := false
	for done := false; !done; {
		resp := recv()
		switch v := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			ir := v.ImmediateResponse
			x.Status, x.Body, x.Headers = int(ir.GetStatus().GetCode()), string(ir.Body), map[string]string{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				x.Headers[strings.ToLower(h.Header.Key)] = string(h.Header.RawValue) + h.Header.Value
			}
			return x
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, h := range v.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.Header.Key == "x-gateway-destination-endpoint" {
					x.Destination = string(h.Header.RawValue) + h.Header.Value
				}
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				done = true
				break
			}
			mutated = true
			forwarded = append(forwarded, sr.Body...)
			done = sr.EndOfStream
		default:
			t.Fatalf("unexpected ext_proc answer %T during the request", v)
		}
	}
	x.RequestBody = string(raw)
	if mutated {
		x.RequestBody = string(forwarded)
	}

	status := reply.Status
	if status == 0 {
		status = 200
	}
	rh := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(fmt.Sprint(status))}}}
	if reply.ContentType != "" {
		rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: "content-type", RawValue: []byte(reply.ContentType)})
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: rh, EndOfStream: len(reply.Chunks) == 0,
	}}})
	if resp := recv(); resp.GetResponseHeaders() == nil {
		t.Fatalf("answer to the response headers: %T, want response headers", resp.Response)
	}
	for i, c := range reply.Chunks {
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(c), EndOfStream: i == len(reply.Chunks)-1,
		}}})
	}
	for done := len(reply.Chunks) == 0; !done; {
		resp := recv()
		sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			t.Fatalf("answer to the response body: %T, want a streamed body", resp.Response)
		}
		if len(sr.Body) > 0 {
			x.ResponseChunks = append(x.ResponseChunks, string(sr.Body))
		}
		done = sr.EndOfStream
	}
	return x
}
