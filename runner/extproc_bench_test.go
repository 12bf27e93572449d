package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/envoy"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// BenchmarkExtProcStream drives the EPP's ext_proc handler in process as Envoy drives it in FULL_DUPLEX_STREAMED
// mode, for one streamed chat per operation: request headers, the body (in 32 KiB messages), the model server's response headers, then
// the response body in chunks (one SSE event each, the usage event and [DONE] in the last), every message carrying
// the filter metadata the data plane forwards, and reads every answer. The EPP is the whole request path the binary
// runs (Director, parser, scheduling, admission, model selection hold), on four endpoints whose metrics pages say
// they are idle, and the codec its gRPC server decodes and encodes the messages with; only the transport (HTTP/2
// framing, the socket) is left out. Upstream's EPP and Sluice's run side by side in one run: the ratio
// at each size is the figure (testbed/bench/scenarios/README.md), in cpu-ns/op (the process's CPU time per operation,
// which a shared machine's load disturbs far less than ns/op). With -benchmem, allocs/op against chunks is the cost
// per response chunk, cpu-ns/op and B/op against prompt the cost of a long prompt. epp=sluice-buffered is Sluice's
// EPP with the proxy sending the request body BUFFERED (bufferedbody.go): one body message, no body sent back.
// epp=sluice-observed is Sluice's EPP with the response observer (responseobserver.go): the routing stream carries the
// request phase and ends, an observer stream carries the response (observability_mode), and no chunk is answered.
//
// The codec takes its buffers from gRPC's process-wide pool, which the binary sets to GRPCBufferPool; so does this
// package's test binary (init below): with gRPC's default tiers each long-prompt message above 32 KiB took and zeroed
// a 1 MiB buffer, about a tenth of epp=sluice's CPU at 256 KB, which the binary does not pay.
//
//	go test -run '^$' -bench ExtProcStream -benchmem -count 6 ./runner/
func BenchmarkExtProcStream(b *testing.B) {
	quietLogs(b)
	shapes := []struct {
		promptBytes, chunks int
		text                promptText
	}{
		{2 << 10, 16, plainPrompt}, {2 << 10, 128, plainPrompt}, {2 << 10, 1024, plainPrompt}, // a 512-token chat, answers of 16 to 1024 tokens
		{1 << 10, 16, plainPrompt}, {8 << 10, 16, plainPrompt}, {16 << 10, 16, plainPrompt}, {64 << 10, 16, plainPrompt},
		{220 << 10, 16, plainPrompt}, {256 << 10, 16, plainPrompt}, // prompts of 256 to 64k tokens
		{8 << 10, 16, escapedPrompt}, {64 << 10, 16, escapedPrompt}, {256 << 10, 16, escapedPrompt}, // the same as a real prompt is written
		{8 << 10, 16, loadgenText}, {64 << 10, 16, loadgenText}, {256 << 10, 16, loadgenText}, // long-prompt-text's text
	}
	for _, profile := range []string{"upstream-default", "sluice", "sluice-buffered", "sluice-observed"} {
		buffered := profile == "sluice-buffered" // the proxy sends the request body BUFFERED (bufferedbody.go)
		observed := profile == "sluice-observed" // the proxy shows the response to an observer (responseobserver.go)
		h, err := startBenchEPP(b, strings.TrimSuffix(profile, "-buffered"))
		if err != nil {
			b.Fatal(err)
		}
		for _, shape := range shapes {
			b.Run(fmt.Sprintf("prompt=%dKB%s/chunks=%d/epp=%s", shape.promptBytes>>10, shape.text, shape.chunks, profile), func(b *testing.B) {
				ex := newStreamedChatOf(shape.promptBytes, shape.chunks, shape.text)
				ex.buffered, ex.observed = buffered, observed
				b.ReportAllocs()
				b.ResetTimer()
				stop := runnertest.CPUPerOp(b)
				for i := range b.N {
					if err := ex.run(h, fmt.Sprintf("bench-%s-%d-%d-%d", profile, shape.promptBytes, shape.chunks, i)); err != nil {
						b.Fatal(err)
					}
				}
				stop()
			})
		}
	}
}

// The test binary's gRPC buffer pool is the EPP binary's (cmd/epp sets it in its init, before any gRPC use).
func init() {
	experimental.SetDefaultBufferPool(GRPCBufferPool())
}

// quietLogs sends the process's standard error, where the EPP logs (three lines per request at the default
// verbosity, as in production), to the null device until the benchmark ends: the logging is still paid for.
func quietLogs(b testing.TB) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = null
	b.Cleanup(func() {
		os.Stderr = stderr
		_ = null.Close()
	})
}

// startBenchEPP starts an EPP in static mode on servers (four idle ones when none are given), until b ends, and
// returns its ext_proc handler: profile "upstream-default" is the EPP without configuration, "sluice" the EPP with
// --sluice-admission (Sluice's default profile and admission) on Sluice's hot path, as cmd/epp runs it, and
// "sluice-upstream-path" the same without the hot path; all with a model selector installed, as the binary has in
// either mode.
func startBenchEPP(b testing.TB, profile string, servers ...*runnertest.ModelServer) (benchEPP, error) {
	return startBenchEPPWith(b, profile, keepModel{}, servers...)
}

// startBenchEPPWith is startBenchEPP with the given model selector.
func startBenchEPPWith(b testing.TB, profile string, selector ModelSelector, servers ...*runnertest.ModelServer) (benchEPP, error) {
	if len(servers) == 0 {
		for range 4 {
			servers = append(servers, runnertest.StartModelServer(b, "127.0.0.1:0"))
		}
	}
	var endpoints []string
	for _, s := range servers {
		endpoints = append(endpoints, s.Addr)
	}
	args := []string{
		"--static-endpoints=" + strings.Join(endpoints, ","),
		fmt.Sprintf("--grpc-port=%d", runnertest.FreePort(b)),
		fmt.Sprintf("--grpc-health-port=%d", runnertest.FreePort(b)),
		fmt.Sprintf("--metrics-port=%d", runnertest.FreePort(b)),
		"--secure-serving=false", "--tracing=false", "--refresh-metrics-interval=" + benchRefresh().String(),
	}
	if observed := strings.TrimSuffix(profile, "-observed"); observed != profile {
		profile = observed
		args = append(args, "--response-observer-wait=10s")
	}
	if strings.HasPrefix(profile, "sluice") {
		// Sluice admission dispatches only onto endpoints scraped within the staleness threshold; a loaded machine
		// can delay the scrapes of idle endpoints past the default 200ms, and this benchmark measures the request
		// path, not the scraper.
		policy := filepath.Join(b.TempDir(), "policy.yaml")
		if err := os.WriteFile(policy, []byte("endpoint: {metricsStalenessThreshold: 1h}\n"), 0o600); err != nil {
			return benchEPP{}, err
		}
		args = append(args, "--flow-control-config="+policy)
	}
	admission := plugins.NewFlowControlCommand()
	handlers := make(chan benchEPP, 1)
	r := New().WithOutput(io.Discard).
		WithFlags(admission.AddFlags, func(opts *Options) error { return admission.Complete(opts.Options) }).
		WithAdmission(func(ctx context.Context, deps AdmissionDeps) (requestcontrol.AdmissionController, error) {
			if !admission.Enabled() {
				return UpstreamAdmission(ctx, deps)
			}
			return admission.Start(ctx, plugins.FlowControlEnv{Endpoints: deps.Datastore, Plugins: deps.Plugins,
				RefreshInterval: deps.Options.RefreshMetricsInterval, Logger: deps.Logger})
		}).
		WithResponseShapers(admission).
		WithHotPath(func(*Options) bool { return profile == "sluice" && admission.Enabled() }).
		WithModelSelector(func(context.Context, ModelSelectorDeps) (ModelSelector, error) { return selector, nil })
	r.extProcHandler = func(h extprocv3.ExternalProcessorServer, codec encoding.CodecV2) { handlers <- benchEPP{h, codec} }
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	failed := make(chan error, 1)
	go func() { failed <- r.Run(ctx, args) }()
	var h benchEPP
	select {
	case h = <-handlers:
	case err := <-failed:
		return h, fmt.Errorf("the EPP stopped: %v", err)
	}
	// Wait for the first scrapes: Sluice admission answers 503 until an endpoint has fresh metrics.
	ex := newStreamedChat(1<<10, 1)
	ex.observed = strings.Contains(strings.Join(args, " "), "--response-observer-wait")
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		err := ex.run(h, fmt.Sprintf("warmup-%s-%d", profile, i))
		if err == nil {
			return h, nil
		}
		if time.Now().After(deadline) {
			return h, fmt.Errorf("the EPP does not route: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// benchEPP is an EPP's ext_proc handler and the codec its gRPC server uses.
type benchEPP struct {
	extprocv3.ExternalProcessorServer
	codec encoding.CodecV2
}

// benchRefreshInterval is the benchmark EPPs' metrics refresh interval.
const benchRefreshInterval = 50 * time.Millisecond

// benchRefresh is benchRefreshInterval, or SLUICE_BENCH_REFRESH_INTERVAL when set: the EPP's scrapes run in the
// benchmark's process, and their CPU counts in cpu-ns/op in proportion to the wall time of an operation, which a
// loaded machine stretches; a longer interval takes most of that background work out of a per-request figure.
func benchRefresh() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SLUICE_BENCH_REFRESH_INTERVAL")); err == nil && d > 0 {
		return d
	}
	return benchRefreshInterval
}

// keepModel is a ModelSelector that leaves every request's model as it is: with one installed the stream holds the
// request until its body is complete, as the binary's does.
type keepModel struct{}

func (keepModel) SelectModel(context.Context, map[string]string, []byte) ModelChoice {
	return ModelChoice{}
}

// streamedChat is one request and its streamed response, as the proxy's messages; the body messages are encoded
// once, on the first run, and shared by every run, the headers are built and encoded per run with its request ID.
type streamedChat struct {
	body, respHeaders *extprocv3.ProcessingRequest
	chunks            []*extprocv3.ProcessingRequest
	wire              [][]byte // body (in requestChunkBytes chunks), respHeaders and chunks, encoded
	bodyMessages      int      // how many of wire carry the request body
	stream            benchStream
	// buffered plays the proxy with request_body_mode BUFFERED (bufferedbody.go): the request headers announce it, the
	// body goes in one message, and only once the headers are answered.
	buffered bool
	// observed plays the proxy with the response observer (responseobserver.go): the routing stream's response body
	// mode is NONE and it ends once routed; a second stream in observability mode carries the response.
	observed     bool
	observer     benchStream
	observerWire [][]byte // the response headers (without the request ID's attribute) and chunks, as the observer sends them
}

// requestChunkBytes is the largest request body message the proxy sends: Envoy hands ext_proc the body as its
// buffers fill, and the test bed's data plane sends 32 KiB chunks.
const requestChunkBytes = 32 << 10

// promptText is how a benchmark chat's prompt is written.
type promptText string

const (
	// plainPrompt is words of lower-case letters and spaces, a JSON string without escapes.
	plainPrompt promptText = ""
	// escapedPrompt is lines of code and prose, as a real prompt is written: a line break ("\n") every ~50 bytes,
	// quotation marks ("\""), tabs, <, & and non-ASCII letters, the last three as they are (as clients' JSON
	// encoders write them, which do not escape HTML).
	escapedPrompt promptText = "-escaped"
	// loadgenText is the load generator's realistic text (loadgen.TextRealistic), which the long-prompt-text scenario
	// sends: prose and code with a line break about every 45 bytes, tabs, quotation marks, backslashes, <, > and &,
	// é, €, an em dash and an emoji, JSON-encoded without HTML escapes.
	loadgenText promptText = "-text"
)

func newStreamedChat(promptBytes, chunks int) *streamedChat {
	return newStreamedChatOf(promptBytes, chunks, plainPrompt)
}

// promptLines are escapedPrompt's lines, in turn.
var promptLines = []string{
	"func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {",
	"\tif err := s.check(r); err != nil && !errors.Is(err, ErrSkip) {",
	"\t\treturn fmt.Errorf(\"check %q: %w\", r.URL.Path, err)",
	"Le café coûte 3 € & la réunion est à 14h <salle B>.",
	"The model answered: \"see the table below\", then listed three items.",
}

// newStreamedChatOf is a streamed chat of chunks response chunks whose prompt of about promptBytes is written as
// text says.
func newStreamedChatOf(promptBytes, chunks int, text promptText) *streamedChat {
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{metadata.DestinationEndpointNamespace: {
		Fields: map[string]*structpb.Value{metadata.DestinationEndpointServedKey: structpb.NewStringValue("127.0.0.1:8000")}}}}
	words := strings.Fields("tell me more about gateways, endpoint pickers and the queues in front of model servers")
	var prompt strings.Builder
	if text == loadgenText {
		prompt.WriteString(loadgen.TextRealistic.Text(1, promptBytes/loadgen.CharsPerToken))
	}
	for i := 0; prompt.Len() < promptBytes; i++ {
		if text == escapedPrompt {
			prompt.WriteString(promptLines[i%len(promptLines)] + "\n")
			continue
		}
		prompt.WriteString(words[i*7%len(words)] + " ")
	}
	var content bytes.Buffer
	enc := json.NewEncoder(&content)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(prompt.String()); err != nil {
		panic(err)
	}
	x := &streamedChat{
		body: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(`{"model":"base","stream":true,"stream_options":{"include_usage":true},"max_tokens":` +
				strconv.Itoa(chunks) + `,"messages":[{"role":"user","content":` + strings.TrimSuffix(content.String(), "\n") + `}]}`),
			EndOfStream: true}}},
		respHeaders: &extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerList(":status", "200", "content-type", "text/event-stream; charset=utf-8")}}},
	}
	const event = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764547200,"model":"base",` +
		`"choices":[{"index":0,"delta":{"content":"token "},"logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n"
	for i := range chunks {
		body := event
		if i == chunks-1 {
			body += `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764547200,"model":"base","choices":[],` +
				`"usage":{"prompt_tokens":512,"total_tokens":` + strconv.Itoa(512+chunks) + `,"completion_tokens":` +
				strconv.Itoa(chunks) + `,"prompt_tokens_details":{"cached_tokens":0}}}` + "\n\ndata: [DONE]\n\n"
		}
		x.chunks = append(x.chunks, &extprocv3.ProcessingRequest{MetadataContext: served,
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: i == chunks-1}}})
	}
	return x
}

func headerList(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// run plays the exchange through h with request ID id and checks that every chunk came back in order.
func (x *streamedChat) run(h benchEPP, id string) error {
	return x.runRecording(h, id, nil)
}

// runRecording is run, handing record (when not nil) every answer the handler sends.
func (x *streamedChat) runRecording(h benchEPP, id string, record func(*extprocv3.ProcessingResponse)) error {
	if x.observed {
		return x.runObserved(h, id)
	}
	if x.wire == nil {
		body := x.body.GetRequestBody().GetBody()
		chunk := requestChunkBytes
		if x.buffered {
			chunk = len(body)
		}
		for off := 0; off == 0 || off < len(body); off += chunk {
			end := min(off+chunk, len(body))
			x.wire = append(x.wire, mustMarshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}))
		}
		x.bodyMessages = len(x.wire)
		for _, m := range append([]*extprocv3.ProcessingRequest{x.respHeaders}, x.chunks...) {
			x.wire = append(x.wire, mustMarshal(m))
		}
	}
	s := &x.stream
	s.reset()
	s.codec, s.record, s.responsePhase = h.codec, record, 1+x.bodyMessages
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerList(":method", "POST", ":path", "/v1/chat/completions",
			":authority", "gateway", "content-type", "application/json", "x-request-id", id)}}}
	if x.buffered {
		headers.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
		s.bodyPhase = 1
	}
	s.in = append(s.in, mustMarshal(headers))
	s.in = append(s.in, x.wire...)
	if err := h.Process(s); err != nil {
		return err
	}
	return s.check(x)
}

// runObserved plays the exchange with the response observer: the routing stream (request headers and body) on its
// own goroutine, as gRPC runs each stream, and the observer stream here, which starts once the request was routed (the
// response comes after it). Nothing may answer the observer, and the routing stream answers only the request phase.
func (x *streamedChat) runObserved(h benchEPP, id string) error {
	if x.observerWire == nil {
		body := x.body.GetRequestBody().GetBody()
		for off := 0; off == 0 || off < len(body); off += requestChunkBytes {
			end := min(off+requestChunkBytes, len(body))
			x.wire = append(x.wire, mustMarshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}))
		}
		for _, m := range x.chunks {
			o := proto.Clone(m).(*extprocv3.ProcessingRequest)
			o.ObservabilityMode = true
			x.observerWire = append(x.observerWire, mustMarshal(o))
		}
	}
	s := &x.stream
	s.reset()
	s.codec, s.responsePhase = h.codec, -1
	s.in = append(s.in, mustMarshal(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerList(
			":method", "POST", ":path", "/v1/chat/completions", ":authority", "gateway", "content-type", "application/json",
			"x-request-id", id)}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_NONE}}))
	s.in = append(s.in, x.wire...)
	routed := make(chan struct{})
	s.routedSignal = routed
	routingDone := make(chan error, 1)
	go func() { routingDone <- h.Process(s) }()
	select {
	case <-routed:
	case err := <-routingDone: // answered without routing (s.failure says how)
		if s.failure != "" {
			return fmt.Errorf("%s", s.failure)
		}
		return fmt.Errorf("the routing stream ended unrouted: %v", err)
	}

	o := &x.observer
	o.reset()
	o.codec, o.responsePhase = h.codec, -1
	headers := proto.Clone(x.respHeaders).(*extprocv3.ProcessingRequest)
	headers.ObservabilityMode = true
	headers.Attributes = map[string]*structpb.Struct{extProcAttributesKey: {Fields: map[string]*structpb.Value{
		requestIDAttribute: structpb.NewStringValue(id)}}}
	o.in = append(o.in, mustMarshal(headers))
	o.in = append(o.in, x.observerWire...)
	err := h.Process(o)
	if rerr := <-routingDone; err == nil {
		err = rerr
	}
	switch {
	case err != nil:
		return err
	case s.failure != "" || o.failure != "":
		return fmt.Errorf("%s%s", s.failure, o.failure)
	case !s.routed || s.headers != 0 || s.chunks != 0:
		return fmt.Errorf("routing stream: routed %v, %d response-header and %d chunk answers, want routed and none", s.routed, s.headers, s.chunks)
	case o.routed || o.headersAnswered || o.headers != 0 || o.chunks != 0 || o.next != len(o.in):
		return fmt.Errorf("observer stream: %d response-header and %d chunk answers, %d of %d messages read; want no answer, all read",
			o.headers, o.chunks, o.next, len(o.in))
	}
	return nil
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// benchStream is the proxy's side of one ext_proc stream: it hands the handler the request messages in order (the
// response phase only after the request phase was answered, as Envoy sends it), decoded with the EPP's codec, and
// keeps what the handler sent, which it encodes with that codec as the gRPC server would.
type benchStream struct {
	grpc.ServerStream
	codec encoding.CodecV2
	in    [][]byte
	next  int
	// responsePhase is the index in in of the first response-phase message, which waits for the request phase's answer.
	responsePhase int
	// bodyPhase, when not 0, is the index in in of the request body, which waits for the request headers' answer (a
	// BUFFERED body).
	bodyPhase       int
	headersAnswered bool
	routed          bool
	headers         int // response-header answers
	chunks          int // streamed response-body answers
	handEncoded     int // answers sent as a streamedChunk (the hot path's own, SendMsg)
	done            bool
	failure         string
	record          func(*extprocv3.ProcessingResponse) // nil: answers are only checked
	// routedSignal (when not nil) is closed once the request is routed: the response observer's stream starts then.
	routedSignal chan struct{}
}

func (s *benchStream) reset() {
	clear(s.in)
	*s = benchStream{in: s.in[:0]}
}

func (s *benchStream) Context() context.Context { return context.Background() }

func (s *benchStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m := &extprocv3.ProcessingRequest{}
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// RecvMsg decodes the next message into m with the codec, as gRPC's stream does (the generated Recv calls it with a
// new message; the hot path's stream with the message of a chunk it answered itself).
func (s *benchStream) RecvMsg(m any) error {
	if s.next == s.responsePhase && !s.routed || s.bodyPhase > 0 && s.next == s.bodyPhase && !s.headersAnswered || s.next >= len(s.in) {
		return io.EOF
	}
	if err := s.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(s.in[s.next])}, m); err != nil {
		return err
	}
	s.next++
	return nil
}

// SendMsg encodes m with the codec as gRPC's SendMsg would; a streamedChunk (what the hot path sends for the chunks it
// answers itself) is checked as the ProcessingResponse it stands for.
func (s *benchStream) SendMsg(m any) error {
	a, ok := m.(*streamedChunk)
	if !ok {
		return fmt.Errorf("SendMsg of a %T", m)
	}
	s.handEncoded++
	data, err := s.codec.Marshal(a)
	if err != nil {
		return err
	}
	defer data.Free()
	if s.record == nil {
		s.chunks++ // a chunk's answer that does not end the stream, by construction
		return nil
	}
	// Recorded answers are compared: the bytes the proxy would receive, decoded.
	r := &extprocv3.ProcessingResponse{}
	if err := proto.Unmarshal(data.Materialize(), r); err != nil {
		return err
	}
	return s.sent(r)
}

func (s *benchStream) Send(r *extprocv3.ProcessingResponse) error {
	data, err := s.codec.Marshal(r)
	if err != nil {
		return err
	}
	data.Free()
	return s.sent(r)
}

// sent checks an answer the handler sent.
func (s *benchStream) sent(r *extprocv3.ProcessingResponse) error {
	if s.record != nil {
		s.record(r)
	}
	switch v := r.Response.(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		s.failure = fmt.Sprintf("immediate response %d: %s", v.ImmediateResponse.GetStatus().GetCode(), v.ImmediateResponse.GetBody())
	case *extprocv3.ProcessingResponse_RequestHeaders:
		s.headersAnswered = true
	case *extprocv3.ProcessingResponse_RequestBody:
		if sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse(); (sr == nil || sr.EndOfStream) && !s.routed {
			s.routed = true
			if s.routedSignal != nil {
				close(s.routedSignal)
			}
		}
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		s.headers++
	case *extprocv3.ProcessingResponse_ResponseBody:
		sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			s.failure = "a response body answer without a streamed body"
			break
		}
		s.chunks++
		s.done = s.done || sr.EndOfStream
	}
	return nil
}

func (s *benchStream) check(x *streamedChat) error {
	answers := 0 // one per chunk, or one per envoy.BodyByteLimit bytes of a longer one
	for _, c := range x.chunks {
		answers += max(1, (len(c.GetResponseBody().GetBody())+envoy.BodyByteLimit-1)/envoy.BodyByteLimit)
	}
	switch {
	case s.failure != "":
		return fmt.Errorf("%s", s.failure)
	case !s.routed || s.headers != 1 || s.chunks != answers || !s.done:
		return fmt.Errorf("routed %v, %d response-header answers, %d of %d chunk answers, end %v", s.routed, s.headers,
			s.chunks, answers, s.done)
	}
	return nil
}
