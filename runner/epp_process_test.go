package runner_test

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
	"strings"
	"sync"
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

// This file holds what the process-level tests share: the EPP binary, fake
// model servers on loopback addresses, and an ext_proc client that talks to
// the EPP exactly as Envoy's ext_proc filter does.

var (
	buildOnce sync.Once
	eppBinary string
	buildErr  error
)

// eppPath returns the EPP binary under test: $SLUICE_EPP_BINARY (the
// Makefile's freshly built bin/epp) or one built here.
func eppPath(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("SLUICE_EPP_BINARY"); p != "" {
			eppBinary = p
			return
		}
		dir, err := os.MkdirTemp("", "sluice-epp-bin")
		if err != nil {
			buildErr = err
			return
		}
		eppBinary = filepath.Join(dir, "epp")
		out, err := exec.Command("go", "build", "-o", eppBinary, "github.com/sluice-gw/sluice/cmd/epp").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building the EPP: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return eppBinary
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// eppProcess is a running EPP binary.
type eppProcess struct {
	cmd        *exec.Cmd
	grpcPort   int
	healthPort int
	output     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startEPP runs the EPP binary with args plus free ports, stops it when the
// test ends, and waits until its readiness check passes.
func startEPP(t *testing.T, env []string, args ...string) *eppProcess {
	t.Helper()
	p := &eppProcess{grpcPort: freePort(t), healthPort: freePort(t), output: &syncBuffer{}}
	args = append(args,
		fmt.Sprintf("--grpc-port=%d", p.grpcPort),
		fmt.Sprintf("--grpc-health-port=%d", p.healthPort),
		fmt.Sprintf("--metrics-port=%d", freePort(t)),
		"--tracing=false",
		"--refresh-metrics-interval=50ms",
	)
	p.cmd = exec.Command(eppPath(t), args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = p.output
	p.cmd.Stderr = p.output
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-exited
			t.Errorf("EPP did not stop on SIGINT within 20s")
		}
		if t.Failed() {
			t.Logf("EPP output:\n%s", p.output.String())
		}
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", p.healthPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("EPP exited early: %v\n%s", err, p.output.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("EPP not ready after 60s (last: %v, %v)\n%s", resp, err, p.output.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fakeModelServer serves a vLLM-style /metrics page on a loopback address, so
// the EPP's scraper sees a healthy, idle server.
func fakeModelServer(t *testing.T, ip string, port int) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="base"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="base"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="base"} 0.1
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1
`)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// extProcClient drives the EPP's ext_proc service the way Envoy's ext_proc
// filter does for one HTTP request.
type extProcClient struct {
	conn *grpc.ClientConn
}

func dialExtProc(t *testing.T, port int, useTLS bool) *extProcClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &extProcClient{conn: conn}
}

// routed is what the EPP decided for a request.
type routed struct {
	header   string // x-gateway-destination-endpoint request header mutation
	metadata string // envoy.lb dynamic metadata
	status   int    // immediate response status, 0 when routed
	body     string // immediate response body
	headers  map[string]string
}

// route sends request headers and a buffered body and returns the EPP's
// routing decision (or its immediate response).
func (c *extProcClient) route(t *testing.T, headers map[string]string, body any, subset []string) routed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(c.conn).Process(ctx)
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
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}, MetadataContext: md},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: raw, EndOfStream: true}}, MetadataContext: md},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	var r routed
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("ext_proc stream: %v", err)
		}
		if ir := resp.GetImmediateResponse(); ir != nil {
			r.status = int(ir.GetStatus().GetCode())
			r.body = string(ir.Body)
			r.headers = map[string]string{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				r.headers[strings.ToLower(h.Header.Key)] = string(h.Header.RawValue) + h.Header.Value
			}
			break
		}
		if rh := resp.GetRequestHeaders(); rh != nil {
			for _, h := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.Header.Key == "x-gateway-destination-endpoint" {
					r.header = string(h.Header.RawValue) + h.Header.Value
				}
			}
			if lb := resp.GetDynamicMetadata().GetFields()["envoy.lb"]; lb != nil {
				r.metadata = lb.GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			}
		}
		if resp.GetRequestBody() != nil && r.header != "" {
			break
		}
	}
	_ = stream.CloseSend()
	return r
}

func completion(prompt string) map[string]any {
	return map[string]any{"model": "base", "prompt": prompt, "max_tokens": 8}
}

// destinations routes n distinct requests and returns how often each
// endpoint was chosen; it fails the test on an inconsistent answer.
func destinations(t *testing.T, c *extProcClient, n int, subset []string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		r := c.route(t, nil, completion(fmt.Sprintf("prompt %d %d", i, time.Now().UnixNano())), subset)
		if r.status != 0 {
			t.Fatalf("request %d: immediate response %d: %s", i, r.status, r.body)
		}
		if r.header == "" || r.header != r.metadata {
			t.Fatalf("request %d: header %q and envoy.lb metadata %q must both name the endpoint", i, r.header, r.metadata)
		}
		seen[r.header]++
	}
	return seen
}

// eventually retries check until it returns "" or the wait runs out.
func eventually(t *testing.T, what string, check func() string) {
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
		time.Sleep(200 * time.Millisecond)
	}
}

func onlyIn(seen map[string]int, allowed ...string) string {
	for ep := range seen {
		ok := false
		for _, a := range allowed {
			ok = ok || ep == a
		}
		if !ok {
			return fmt.Sprintf("routed to %s, want only %v (all: %v)", ep, allowed, seen)
		}
	}
	return ""
}
