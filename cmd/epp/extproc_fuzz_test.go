package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// FuzzExtProcStream plays arbitrary ext_proc message sequences, as a misbehaving or hostile proxy could send them,
// into the Sluice EPP running in this process exactly as cmd/epp assembles it (static mode, Sluice admission with a
// tenant policy, objectives and a model rewrite, the default profile) and checks, for every stream:
//
//   - the EPP does not crash (a panic in any handler ends the process, which the fuzzer reports);
//   - the stream ends once the proxy has sent everything and half-closed it (no request left hanging);
//   - at most one immediate response, nothing after it, and its body is an OpenAI-style JSON error;
//   - every destination the EPP names is one of the pool's endpoints, named once, whatever the request's headers say.
//
// The input is a sequence of messages, each an op byte, a 2-byte little-endian length and that many payload bytes;
// see decodeExtProc. Seeds are in testdata/fuzz/FuzzExtProcStream.
func FuzzExtProcStream(f *testing.F) {
	epp := startInProcessEPP(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs := decodeExtProc(data)
		if len(msgs) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stream, err := extprocv3.NewExternalProcessorClient(epp.conn).Process(ctx)
		if err != nil {
			t.Fatalf("opening a stream: %v", err)
		}
		for _, m := range msgs {
			if stream.Send(m) != nil {
				break // the EPP ended the stream; Recv below says how
			}
		}
		_ = stream.CloseSend()
		immediate := 0
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("the stream did not end within 20s of the proxy half-closing it (%d messages sent)", len(msgs))
				}
				return // an error status ends the stream: the proxy answers the client itself
			}
			if immediate > 0 {
				t.Fatalf("a message after the immediate response: %v", resp)
			}
			if ir := resp.GetImmediateResponse(); ir != nil {
				immediate++
				checkOpenAIError(t, ir)
			}
			epp.checkDestinations(t, resp)
		}
	})
}

// checkOpenAIError fails unless ir's body is an OpenAI-style error object.
func checkOpenAIError(t *testing.T, ir *extprocv3.ImmediateResponse) {
	t.Helper()
	var body struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.Body, &body); err != nil || body.Error == nil || body.Error.Message == "" || body.Error.Type == "" {
		t.Fatalf("immediate response %d with body %q, want an OpenAI-style error", ir.GetStatus().GetCode(), ir.Body)
	}
}

// inProcessEPP is the EPP under fuzz and a connection to its ext_proc port.
type inProcessEPP struct {
	conn      *grpc.ClientConn
	endpoints map[string]bool
}

// checkDestinations fails if resp names a destination outside the pool, or names one twice.
func (e *inProcessEPP) checkDestinations(t *testing.T, resp *extprocv3.ProcessingResponse) {
	t.Helper()
	var named []string
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), "x-gateway-destination-endpoint") {
			named = append(named, string(h.GetHeader().GetRawValue())+h.GetHeader().GetValue())
		}
	}
	if len(named) > 1 {
		t.Fatalf("destination header set %d times: %q", len(named), named)
	}
	if lb := resp.GetDynamicMetadata().GetFields()["envoy.lb"]; lb != nil {
		if v := lb.GetStructValue().GetFields()["x-gateway-destination-endpoint"]; v != nil {
			named = append(named, v.GetStringValue())
		}
	}
	for _, list := range named {
		for _, ep := range strings.Split(list, ",") {
			if !e.endpoints[ep] {
				t.Fatalf("destination %q is not a pool endpoint (%v)", ep, e.endpoints)
			}
		}
	}
}

var (
	fuzzEPPOnce sync.Once
	fuzzEPP     *inProcessEPP
	fuzzEPPErr  error
)

// startInProcessEPP runs the EPP in this process once (it registers process-wide metrics) over two fake model servers
// and waits until it routes a well-formed request.
func startInProcessEPP(f *testing.F) *inProcessEPP {
	f.Helper()
	fuzzEPPOnce.Do(func() { fuzzEPP, fuzzEPPErr = runInProcessEPP(f) })
	if fuzzEPPErr != nil {
		f.Fatal(fuzzEPPErr)
	}
	return fuzzEPP
}

func runInProcessEPP(f *testing.F) (*inProcessEPP, error) {
	a := runnertest.StartModelServer(f, "127.0.0.2:0")
	b := runnertest.StartModelServer(f, "127.0.0.3:0")
	dir := f.TempDir()
	files := map[string]string{
		"policy.yaml": `tenantHeader: x-auth-tenant
aboveMaxBand: Reject
tenants: [{name: gold}]
defaultTenant: {maxBand: Standard}
endpoint: {metricsStalenessThreshold: 10s}
`,
		"objectives.yaml": `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: static}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: static}}
`,
		"rewrites.yaml": `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: canary}
spec:
  poolRef: {name: static}
  rules:
  - matches: [{model: {value: llama}}]
    targets: [{modelRewrite: base, weight: 90}, {modelRewrite: base-canary, weight: 10}]
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	grpcPort := runnertest.FreePort(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- newRunner().WithOutput(io.Discard).Run(ctx, []string{
			"--static-endpoints=" + a.Addr + "," + b.Addr,
			"--flow-control-config=" + filepath.Join(dir, "policy.yaml"),
			"--inference-objectives-file=" + filepath.Join(dir, "objectives.yaml"),
			"--model-rewrites-file=" + filepath.Join(dir, "rewrites.yaml"),
			"--secure-serving=false", "--tracing=false", "--zap-log-level=error", "--refresh-metrics-interval=1s",
			fmt.Sprintf("--grpc-port=%d", grpcPort),
			fmt.Sprintf("--grpc-health-port=%d", runnertest.FreePort(f)),
			fmt.Sprintf("--metrics-port=%d", runnertest.FreePort(f)),
		})
	}()
	f.Cleanup(func() {
		cancel()
		<-done
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	f.Cleanup(func() { _ = conn.Close() })
	epp := &inProcessEPP{conn: conn, endpoints: map[string]bool{a.Addr: true, b.Addr: true}}
	probe := encodeExtProc(
		extProcOp{kind: opRequestHeaders, headers: []string{":method", "POST", ":path", "/v1/completions", "content-type", "application/json"}},
		extProcOp{kind: opRequestBody, eos: true, payload: `{"model":"base","prompt":"ready?"}`},
	)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			return nil, fmt.Errorf("the EPP stopped: %v", err)
		default:
		}
		if epp.routes(probe) {
			return epp, nil
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the in-process EPP does not route a well-formed request after 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// routes reports whether the EPP answers the messages encoded in data with a destination.
func (e *inProcessEPP) routes(data []byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(e.conn).Process(ctx)
	if err != nil {
		return false
	}
	for _, m := range decodeExtProc(data) {
		if stream.Send(m) != nil {
			return false
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil || resp.GetImmediateResponse() != nil {
			return false
		}
		if resp.GetRequestHeaders() != nil {
			return true
		}
	}
}

// The message kinds of the fuzz input: the low 3 bits of the op byte.
const (
	opRequestHeaders = iota
	opRequestBody
	opRequestTrailers
	opResponseHeaders
	opResponseBody
	opResponseTrailers
	opMetadata // sets the filter metadata of the messages that follow
	opEmpty    // a ProcessingRequest with no request set
)

// Flags of the op byte.
const (
	flagEndOfStream = 0x10 // end_of_stream on headers and bodies; on opMetadata, envoy.lb (served) instead of the subset hint
	flagValue       = 0x20 // header values in value rather than raw_value
)

// maxFuzzMessages bounds one stream, so one input cannot make an iteration slow.
const maxFuzzMessages = 64

// decodeExtProc turns fuzz input into ext_proc messages: each message is an op byte, a little-endian uint16 length
// and the payload. Header payloads are NUL-separated name, value pairs; a metadata payload is a comma-separated
// endpoint list. A truncated tail is dropped.
func decodeExtProc(data []byte) []*extprocv3.ProcessingRequest {
	var (
		msgs []*extprocv3.ProcessingRequest
		md   *corev3.Metadata
	)
	for len(data) >= 3 && len(msgs) < maxFuzzMessages {
		op := data[0]
		n := int(binary.LittleEndian.Uint16(data[1:3]))
		data = data[3:]
		if n > len(data) {
			n = len(data)
		}
		payload := data[:n]
		data = data[n:]
		eos := op&flagEndOfStream != 0
		req := &extprocv3.ProcessingRequest{MetadataContext: md}
		switch op & 0x07 {
		case opRequestHeaders:
			req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(payload, op), EndOfStream: eos}}
		case opRequestBody:
			req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: payload, EndOfStream: eos}}
		case opRequestTrailers:
			req.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: headerMap(payload, op)}}
		case opResponseHeaders:
			req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(payload, op), EndOfStream: eos}}
		case opResponseBody:
			req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: payload, EndOfStream: eos}}
		case opResponseTrailers:
			req.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: headerMap(payload, op)}}
		case opMetadata:
			md = metadataOf(string(payload), eos)
			continue
		case opEmpty:
		}
		msgs = append(msgs, req)
	}
	return msgs
}

func headerMap(payload []byte, op byte) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	parts := strings.Split(string(payload), "\x00")
	for i := 0; i+1 < len(parts); i += 2 {
		hv := &corev3.HeaderValue{Key: parts[i]}
		if op&flagValue != 0 {
			hv.Value = parts[i+1]
		} else {
			hv.RawValue = []byte(parts[i+1])
		}
		hm.Headers = append(hm.Headers, hv)
	}
	return hm
}

// metadataOf is the filter metadata Envoy forwards: the subset hint, or with served the served endpoint.
func metadataOf(list string, served bool) *corev3.Metadata {
	ns, key := "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset"
	var value any = list
	if served {
		ns, key = "envoy.lb", "x-gateway-destination-endpoint-served"
	} else {
		var items []any
		for _, ep := range strings.Split(list, ",") {
			items = append(items, ep)
		}
		value = items
	}
	s, err := structpb.NewStruct(map[string]any{key: value})
	if err != nil {
		return nil // not valid UTF-8: Envoy could not have sent it either
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{ns: s}}
}

// extProcOp is one message of a fuzz input, for writing seeds.
type extProcOp struct {
	kind    byte
	eos     bool
	value   bool
	headers []string // name, value pairs
	payload string
}

// encodeExtProc is decodeExtProc's inverse, for seeds.
func encodeExtProc(ops ...extProcOp) []byte {
	var out []byte
	for _, o := range ops {
		op := o.kind
		if o.eos {
			op |= flagEndOfStream
		}
		if o.value {
			op |= flagValue
		}
		payload := o.payload
		if o.headers != nil {
			payload = strings.Join(o.headers, "\x00")
		}
		out = append(out, op)
		out = binary.LittleEndian.AppendUint16(out, uint16(len(payload)))
		out = append(out, payload...)
	}
	return out
}
