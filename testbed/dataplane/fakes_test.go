package dataplane

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	envoytypev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	envoyhdr "sigs.k8s.io/gateway-api-inference-extension/pkg/common/envoy"
)

// seenExchange is what the fake EPP observed for one ext_proc stream.
type seenExchange struct {
	protocolConfig   *extprocv3.ProtocolConfiguration
	requestHeaders   map[string]string
	headersEOS       bool
	requestBody      []byte
	bodyMessages     int
	requestMetadata  map[string]any // metadata_context of the last request-phase message
	responseHeaders  map[string]string
	responseMetadata map[string]any // metadata_context of the response headers message
	responseChunks   [][]byte
	// observed: every message of the stream said observability_mode; observedID is the request.id attribute of its
	// response headers; responseEnd: a response message ended the response.
	observed, notObserved bool
	observedID            string
	responseEnd           bool
}

// eppBehaviour scripts the fake EPP. Zero fields mean: route to nothing,
// pass everything through unchanged.
type eppBehaviour struct {
	// decide returns the messages answering the request phase, given what was
	// received. Nil means a plain header response.
	decide func(s *seenExchange) []*extprocv3.ProcessingResponse
	// failRequest makes the stream fail with this error once the request body
	// (or headers without body) is complete.
	failRequest error
	// stallRequest makes the EPP never answer the request phase.
	stallRequest bool
	// failResponseHeaders makes the stream fail on the response headers.
	failResponseHeaders error
	// responseHeadersAnswer, when set, replaces the response headers answer.
	responseHeadersAnswer *extprocv3.ProcessingResponse
	// responseMutation is applied to the response headers answer.
	responseMutation *extprocv3.HeaderMutation
	// bufferResponse buffers the response body until end_of_stream, as GIE
	// does for non-streaming responses; otherwise each chunk is echoed.
	bufferResponse bool
	// transform rewrites response chunks.
	transform func([]byte) []byte
	// With a BUFFERED request body announced (protocol_config), the fake
	// answers the request headers at once with headersAnswer (nil: an empty
	// HeadersResponse), or never when stallHeaders; decide then answers the
	// body.
	headersAnswer *extprocv3.ProcessingResponse
	stallHeaders  bool
}

type fakeEPP struct {
	addr string
	b    eppBehaviour

	mu   sync.Mutex
	seen []*seenExchange
	// ended counts the streams whose Process returned; endedChange (made when first waited on) is closed and
	// dropped at each.
	ended       int
	endedChange chan struct{}
}

// startFakeEPP serves the fake on 127.0.0.1:0 until the test ends.
func startFakeEPP(t *testing.T, b eppBehaviour) *fakeEPP {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEPP{addr: l.Addr().String(), b: b}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return f
}

// endedExchanges waits until n streams have ended (the proxy closed them, or the fake returned) and returns every
// exchange seen; a stream the proxy opens without waiting for it (an observer's) may end after the client has its
// answer.
func (f *fakeEPP) endedExchanges(t *testing.T, n int) []*seenExchange {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		if f.endedChange == nil {
			f.endedChange = make(chan struct{})
		}
		ended, change := f.ended, f.endedChange
		f.mu.Unlock()
		if ended >= n {
			return f.exchanges()
		}
		select {
		case <-change:
		case <-timeout:
			t.Fatalf("%d of %d ext_proc streams ended", ended, n)
		}
	}
}

func (f *fakeEPP) exchanges() []*seenExchange {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*seenExchange(nil), f.seen...)
}

func headerMap(hm *corev3.HeaderMap) map[string]string {
	out := map[string]string{}
	for _, h := range hm.GetHeaders() {
		out[h.GetKey()] = envoyhdr.GetHeaderValue(h)
	}
	return out
}

func metadataMap(md *corev3.Metadata) map[string]any {
	out := map[string]any{}
	for k, v := range md.GetFilterMetadata() {
		out[k] = v.AsMap()
	}
	return out
}

func (f *fakeEPP) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s := &seenExchange{}
	f.mu.Lock()
	f.seen = append(f.seen, s)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.ended++
		if f.endedChange != nil {
			close(f.endedChange)
			f.endedChange = nil
		}
		f.mu.Unlock()
	}()
	answerRequest := func() error {
		if f.b.failRequest != nil {
			return f.b.failRequest
		}
		if f.b.stallRequest {
			<-srv.Context().Done()
			return srv.Context().Err()
		}
		msgs := []*extprocv3.ProcessingResponse{headersResponse(nil)}
		if f.b.decide != nil {
			msgs = f.b.decide(s)
		}
		for _, m := range msgs {
			if err := srv.Send(m); err != nil {
				return err
			}
		}
		return nil
	}
	var buffered []byte
	for {
		req, err := srv.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		f.mu.Lock()
		if req.GetObservabilityMode() {
			s.observed = true
		} else {
			s.notObserved = true
		}
		f.mu.Unlock()
		switch v := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			f.mu.Lock()
			s.protocolConfig = req.GetProtocolConfig()
			s.requestHeaders = headerMap(v.RequestHeaders.GetHeaders())
			s.headersEOS = v.RequestHeaders.GetEndOfStream()
			s.requestMetadata = metadataMap(req.GetMetadataContext())
			f.mu.Unlock()
			if v.RequestHeaders.GetEndOfStream() {
				if err := answerRequest(); err != nil {
					return err
				}
			} else if req.GetProtocolConfig().GetRequestBodyMode() == filterv3.ProcessingMode_BUFFERED && !f.b.stallHeaders {
				answer := f.b.headersAnswer
				if answer == nil {
					answer = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
						RequestHeaders: &extprocv3.HeadersResponse{}}}
				}
				if err := srv.Send(answer); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			f.mu.Lock()
			s.bodyMessages++
			s.requestBody = append(s.requestBody, v.RequestBody.GetBody()...)
			s.requestMetadata = metadataMap(req.GetMetadataContext())
			f.mu.Unlock()
			if v.RequestBody.GetEndOfStream() {
				if err := answerRequest(); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			f.mu.Lock()
			s.responseHeaders = headerMap(v.ResponseHeaders.GetHeaders())
			s.responseMetadata = metadataMap(req.GetMetadataContext())
			s.observedID = req.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["request.id"].GetStringValue()
			s.responseEnd = s.responseEnd || v.ResponseHeaders.GetEndOfStream()
			f.mu.Unlock()
			if f.b.failResponseHeaders != nil {
				return f.b.failResponseHeaders
			}
			answer := f.b.responseHeadersAnswer
			if answer == nil {
				answer = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
					ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: f.b.responseMutation}},
				}}
			}
			if err := srv.Send(answer); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			chunk, eos := v.ResponseBody.GetBody(), v.ResponseBody.GetEndOfStream()
			f.mu.Lock()
			if len(chunk) > 0 {
				s.responseChunks = append(s.responseChunks, bytes.Clone(chunk))
			}
			s.responseEnd = s.responseEnd || eos
			f.mu.Unlock()
			if f.b.bufferResponse {
				buffered = append(buffered, chunk...)
				if !eos {
					continue
				}
				chunk = buffered
			}
			if f.b.transform != nil {
				chunk = f.b.transform(chunk)
			}
			for _, m := range envoyhdr.BuildChunkedBodyResponses(chunk, eos) {
				if err := srv.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
					ResponseBody: &extprocv3.BodyResponse{Response: m},
				}}); err != nil {
					return err
				}
			}
		}
	}
}

// headersResponse answers request headers with a mutation.
func headersResponse(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: m, ClearRouteCache: true}},
	}}
}

// bodyResponses answers the request body with a (possibly rewritten) body.
func bodyResponses(body []byte) []*extprocv3.ProcessingResponse {
	return envoyhdr.GenerateRequestBodyResponses(body)
}

func setHeaders(kv ...string) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])}})
	}
	return out
}

// routeTo is the GIE answer: destination header plus envoy.lb metadata, body
// echoed (or replaced when body != nil).
func routeTo(dest string, body []byte) func(s *seenExchange) []*extprocv3.ProcessingResponse {
	return func(s *seenExchange) []*extprocv3.ProcessingResponse {
		r := headersResponse(&extprocv3.HeaderMutation{SetHeaders: setHeaders("x-gateway-destination-endpoint", dest)})
		r.DynamicMetadata = lbMetadata(dest)
		out := []*extprocv3.ProcessingResponse{r}
		if !s.headersEOS {
			b := s.requestBody
			if body != nil {
				b = body
			}
			out = append(out, bodyResponses(b)...)
		}
		return out
	}
}

func lbMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"envoy.lb": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint": structpb.NewStringValue(dest),
		}}),
	}}
}

func immediate(code envoytypev3.StatusCode, body string, kv ...string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &envoytypev3.HttpStatus{Code: code},
			Headers: &extprocv3.HeaderMutation{SetHeaders: setHeaders(kv...)},
			Body:    []byte(body),
		},
	}}
}

// backend is an httptest model server that records what it received.
type backend struct {
	srv  *httptest.Server
	name string

	mu       sync.Mutex
	bodies   []string
	headers  []http.Header
	requests int
}

func (b *backend) addr() string { return b.srv.Listener.Addr().String() }

func (b *backend) received() (int, []string, []http.Header) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.requests, append([]string(nil), b.bodies...), append([]http.Header(nil), b.headers...)
}

// startBackend serves handler (or a JSON echo naming the backend) until the
// test ends.
func startBackend(t *testing.T, name string, handler http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.requests++
		b.bodies = append(b.bodies, string(body))
		b.headers = append(b.headers, r.Header.Clone())
		b.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Backend", name)
		_, _ = io.WriteString(w, `{"backend":"`+name+`","model":"m"}`)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// refusedAddr returns a loopback address where nothing listens.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// countingRecorder checks the exactly-one-answer invariant.
type countingRecorder struct {
	mu          sync.Mutex
	changed     chan struct{} // closed and replaced on every RecordRequest
	outcomes    []Outcome
	failedOpen  []bool
	eppFailures []EPPFailure
}

func (c *countingRecorder) RecordRequest(o Outcome, failedOpen bool, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outcomes = append(c.outcomes, o)
	c.failedOpen = append(c.failedOpen, failedOpen)
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *countingRecorder) RecordEPPFailure(p EPPFailure) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eppFailures = append(c.eppFailures, p)
}

// snapshot waits until n requests were recorded (a handler records after its
// client may already have the whole response) and returns the records.
func (c *countingRecorder) snapshot(n int) ([]Outcome, []bool, []EPPFailure) {
	for {
		c.mu.Lock()
		if len(c.outcomes) >= n {
			break
		}
		ch := c.changed
		c.mu.Unlock()
		<-ch
	}
	defer c.mu.Unlock()
	return append([]Outcome(nil), c.outcomes...), append([]bool(nil), c.failedOpen...), append([]EPPFailure(nil), c.eppFailures...)
}

// startProxy starts a Proxy behind an httptest server. Cleanup closes the
// server (waiting for handlers), closes the proxy and then checks that no
// goroutine is left running code of this package.
func startProxy(t *testing.T, cfg Config) (*httptest.Server, *countingRecorder) {
	t.Helper()
	rec := &countingRecorder{changed: make(chan struct{})}
	cfg.Recorder = rec
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		_ = p.Close()
		checkNoLeakedGoroutines(t)
	})
	return srv, rec
}

// checkNoLeakedGoroutines fails if any goroutine runs non-test code of this
// package. Handlers join their helper goroutines before returning and
// httptest.Server.Close waits for handlers, so none may remain.
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
			if strings.Contains(line, "/dataplane/") && strings.Contains(line, ".go:") && !strings.Contains(line, "_test.go") {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

// post sends a JSON body through the proxy and returns status, headers and
// body.
func post(t *testing.T, url, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}
