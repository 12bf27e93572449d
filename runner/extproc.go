package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// requestIDHeader is the header Envoy and upstream's EPP use to correlate a
// request across its ext_proc messages.
const requestIDHeader = "x-request-id"

// ResponseShaper adjusts an immediate response (a rejection or an error the
// EPP answers itself) before it is sent to the proxy. requestID is the
// request's x-request-id, which admission plugins can use to attach
// per-request details such as a computed Retry-After.
type ResponseShaper interface {
	ShapeImmediateResponse(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse)
}

// ResponseShaperFunc adapts a function to ResponseShaper.
type ResponseShaperFunc func(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse)

// ShapeImmediateResponse calls f.
func (f ResponseShaperFunc) ShapeImmediateResponse(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse) {
	f(ctx, requestID, resp)
}

var _ ResponseShaper = ResponseShaperFunc(nil)

// shapingServer serves ext_proc with upstream's streaming server, passes
// every immediate response through the shapers, in order, and, when a
// ModelSelector is installed, lets it choose each request's model first.
type shapingServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	upstream extprocv3.ExternalProcessorServer
	shapers  []ResponseShaper

	// selector (may be nil) chooses request models; bodies larger than
	// maxBodyBytes are answered 413 instead. clock times the responses.
	selector     ModelSelector
	maxBodyBytes int64
	clock        clock.PassiveClock

	// decisions (nil when --decision-trace is off) traces requests' decisions.
	decisions *decisiontrace.Recorder
	// requestIDs puts each stream's request ID in its context (plugins.WithRequestID).
	requestIDs bool
	// hot takes Sluice's hot path (hotpath.go): each stream's context counts its chunks for the hotDirector, and
	// response body messages lose the metadata upstream's handler would convert unread.
	hot bool
	// wireChunks: the server's codec is extProcCodec, which encodes the streamedChunk answers the hot path's streams
	// send (answerChunk).
	wireChunks bool
	// observers (nil without --response-observer-wait) joins routing streams whose response the proxy shows an
	// observer stream instead (responseobserver.go).
	observers *observerJoin
}

func (s *shapingServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ss := &shapingStream{ExternalProcessor_ProcessServer: stream, shapers: s.shapers, ctx: stream.Context(), hot: s.hot,
		wireChunks: s.wireChunks}
	if s.observers != nil {
		// An observer stream says so on every message; the first tells which kind of stream this is.
		first, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil // upstream's handler's answer to a stream that ends before its first message
			}
			return status.Errorf(codes.Unknown, "cannot receive stream request: %v", err) // upstream's words
		}
		if first.GetObservabilityMode() {
			return s.observers.serveObserver(stream, first, s.hot, s.wireChunks)
		}
		ss.first, ss.join = first, s.observers
		var stop func()
		ss.ctx, stop = observedContext(stream.Context(), ss.awaitObserver.Load)
		defer stop()
		defer func() {
			if ss.observed != nil {
				ss.observed.release()
			}
		}()
	}
	if s.hot {
		ss.ctx, ss.chunks = withChunkCount(ss.ctx)
	}
	if shedders := shedders(s.shapers); len(shedders) > 0 || s.hot {
		var shed func() bool
		if len(shedders) > 0 {
			shed = func() bool {
				for _, sh := range shedders {
					if sh.Shed(ss.requestID) {
						return true
					}
				}
				return false
			}
		}
		ss.ctx = withShedQuietLogger(ss.ctx, shed, s.hot)
	}
	if s.requestIDs {
		ss.ctx = plugins.WithRequestID(ss.ctx, func() string { return ss.requestID })
	}
	if s.selector != nil {
		ss.selection = &modelSelection{selector: s.selector, maxBodyBytes: s.maxBodyBytes, clock: s.clock}
		ss.ctx = context.WithValue(ss.ctx, modelSelectionKey{}, ss.selection)
		defer ss.selection.finish()
		defer ss.selection.putJoinedBack()
	}
	if s.decisions != nil {
		ss.ctx, ss.trace = s.decisions.Start(ss.ctx)
		ss.traceHeader = s.decisions.Header()
		defer ss.trace.End() // a request that ended without an answer (the client went away)
	}
	return s.upstream.Process(ss)
}

// shedders returns the shapers that shed by design.
func shedders(shapers []ResponseShaper) []Shedder {
	var out []Shedder
	for _, sh := range shapers {
		if s, ok := sh.(Shedder); ok {
			out = append(out, s)
		}
	}
	return out
}

// shapingStream wraps one ext_proc stream (one HTTP request). Recv learns the
// request ID, adding one when the proxy sent none so that upstream and the
// shapers agree on it; Send shapes immediate responses; Context carries a
// logger that keeps designed shedding out of the error log (Shedder).
//
// With a decision trace, the context carries the request's trace to
// upstream's hooks (admission, the scheduler's plugins), the request's headers
// begin it, and every answer commits it (decisiontrace.go), the stream's own
// answers included.
//
// With model selection, Recv holds a request's headers back until its body
// is complete (upstream answers nothing before that either), asks the
// selector, sets the x-gateway-model-name-rewrite header upstream reads, and
// then hands upstream the headers and the held body messages in order.
// Headers that end the stream (no body) pass unchanged.
type shapingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	shapers   []ResponseShaper
	ctx       context.Context
	requestID string
	selection *modelSelection // nil without a ModelSelector
	hot       bool            // Sluice's hot path (hotpath.go)
	chunks    *chunkCount     // on the hot path, the stream's state the hot Director shares
	// wireChunks: the stream is gRPC's with extProcCodec, which encodes a streamedChunk (answerChunk sends them) and
	// decodes a chunk into the message given to RecvMsg reusing what it holds (recvMessage).
	wireChunks bool
	// spare (with wireChunks) is the message of the last chunk the stream answered itself (answerChunk), which nobody
	// keeps: the next message is decoded into it (recvMessage). Nil once handed out.
	spare *extprocv3.ProcessingRequest
	// answer (with wireChunks) is the answer answerChunk hands gRPC's SendMsg, one per stream: the codec encodes it
	// before SendMsg returns, so nothing keeps it, and a chunk's answer costs no allocation of its own.
	answer streamedChunk
	// buffered is set when the proxy sends the request body BUFFERED (bufferedbody.go), else nil.
	buffered *bufferedBody
	// trace (nil without --decision-trace) is the request's decision trace; traceHeader its opt-in header, or "".
	trace       *decisiontrace.Trace
	traceHeader string

	// The response observer (responseobserver.go); all zero without --response-observer-wait. first is the proxy's
	// first message, read to tell a routing stream from an observer one; join pairs them; observed is this request's
	// side of the join when the proxy skips the response on this stream; awaitObserver is set once the request was
	// routed (read by the context's watcher); observing once upstream's handler reads the observer's messages.
	first         *extprocv3.ProcessingRequest
	join          *observerJoin
	observed      *observedResponse
	awaitObserver atomic.Bool
	observing     bool
}

// Context is the stream's context, with the shed-quiet logger when a shaper
// is a Shedder: upstream's handler logs through it.
func (s *shapingStream) Context() context.Context { return s.ctx }

// Recv hands upstream's handler the next message, but for the response chunks the stream answers itself on the hot
// path (answerChunk).
func (s *shapingStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.observing {
		return s.nextObserved()
	}
	for {
		req, err := s.recv()
		if err != nil && s.observed.awaits(err, s.awaitObserver.Load()) {
			s.observing = true
			return s.nextObserved()
		}
		if err != nil || s.chunks == nil {
			return req, err
		}
		answered, err := s.answerChunk(req)
		if err != nil {
			return nil, err
		}
		if !answered {
			return req, nil
		}
		if s.wireChunks {
			s.spare = req // answered here: upstream's handler never saw it, and nothing kept it
		}
	}
}

// recvMessage receives the proxy's next message, decoded into the spare message when there is one (recvInto).
func (s *shapingStream) recvMessage() (*extprocv3.ProcessingRequest, error) {
	spare := s.spare
	s.spare = nil
	return recvInto(s.ExternalProcessor_ProcessServer, spare)
}

// nextObserved is the observer's next message for upstream's handler; the model selection sees it as recv shows it
// the routing stream's, so that a rewritten request's outcome (status, first byte, end) reaches its selector.
func (s *shapingStream) nextObserved() (*extprocv3.ProcessingRequest, error) {
	m, err := s.observed.next()
	if err == nil && s.selection != nil {
		s.selection.observe(m)
	}
	return m, err
}

func (s *shapingStream) recv() (*extprocv3.ProcessingRequest, error) {
	ms := s.selection
	if ms != nil && len(ms.queue) > 0 {
		req := ms.queue[0]
		ms.queue[0] = nil
		ms.queue = ms.queue[1:]
		ms.releaseJoined(req)
		ms.observe(req)
		return req, nil
	}
	if ms != nil {
		ms.releaseJoined(nil)
	}
	if ms != nil && ms.queueErr != nil {
		return nil, ms.queueErr
	}
	req, err := s.recvFromProxy()
	if err != nil {
		return req, err
	}
	prepareFromProxy(req, s.hot)
	h := req.GetRequestHeaders()
	if h != nil {
		s.requestID = ensureRequestID(h)
		if s.join != nil && expectsObserver(req) {
			s.observed = s.join.expect(s.requestID, s.observeChunk)
		}
		s.trace.Begin(s.requestID, s.traceHeader != "" && carries(h, s.traceHeader))
		// Before the model-selection hold reads the body: a proxy that buffers the body sends it only once the
		// headers are answered.
		if bufferedRequestBody(req) {
			if err := s.answerHeadersForBufferedBody(); err != nil {
				return nil, err
			}
		}
	}
	if ms == nil {
		return req, nil
	}
	if h != nil {
		ms.received = ms.clock.Now()
		if !h.EndOfStream {
			handled, err := s.hold(h)
			if err != nil {
				return nil, err
			}
			if !handled {
				// Answered already: upstream sees the request end.
				ms.queue, ms.queueErr = nil, io.EOF
				return nil, io.EOF
			}
		}
	}
	ms.observe(req)
	return req, nil
}

// Send shapes resp and commits the trace before the answer leaves, so a client that reads the trace once it has its
// answer finds the record (which holds the immediate response as the client gets it).
func (s *shapingStream) Send(resp *extprocv3.ProcessingResponse) error {
	if s.observing {
		// Upstream's answer to an observer's message: the proxy takes none. The chunk shortcut still arms on it.
		if s.chunks != nil {
			s.armShortcut(resp)
		}
		return nil
	}
	if resp = s.bufferedAnswer(resp); resp == nil {
		return nil
	}
	if s.observed != nil {
		switch resp.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders, *extprocv3.ProcessingResponse_RequestBody:
			s.awaitObserver.Store(true) // routed: from now on the routing stream's end is not the request's
		}
	}
	s.shape(resp)
	if s.trace.Active() {
		s.commitTrace(resp)
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

// shape readies resp to be sent: the shapers rewrite an immediate response in place, and model selection hands its
// selector the outcome of a request the EPP answers itself; the chunk shortcut is armed once the response headers go
// back.
func (s *shapingStream) shape(resp *extprocv3.ProcessingResponse) {
	if ir := resp.GetImmediateResponse(); ir != nil {
		for _, shaper := range s.shapers {
			shaper.ShapeImmediateResponse(s.Context(), s.requestID, ir)
		}
		if s.selection != nil {
			s.selection.answered(ir)
		}
	}
	if s.chunks != nil {
		s.armShortcut(resp)
	}
}

// prepareFromProxy readies a proxy's message, on the routing stream or an observer's, for upstream's handler: header
// values made valid UTF-8, and on the hot path a response body's metadata dropped.
func prepareFromProxy(req *extprocv3.ProcessingRequest, hot bool) {
	validHeaderValues(req)
	if hot {
		dropResponseBodyMetadata(req)
	}
}

// validHeaderValues replaces the bytes of req's header and trailer values
// that are not UTF-8 with U+FFFD. Clients choose header values, and some end
// up as Prometheus label values (upstream's target model from
// x-gateway-model-name-rewrite, Sluice's tenant): a label value that is not
// UTF-8 makes the Prometheus client panic, which would end the EPP. Only
// raw_value can hold such bytes; protobuf refuses them in value.
func validHeaderValues(req *extprocv3.ProcessingRequest) {
	var hm *corev3.HeaderMap
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		hm = r.RequestHeaders.GetHeaders()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hm = r.ResponseHeaders.GetHeaders()
	case *extprocv3.ProcessingRequest_RequestTrailers:
		hm = r.RequestTrailers.GetTrailers()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		hm = r.ResponseTrailers.GetTrailers()
	}
	for _, hv := range hm.GetHeaders() {
		if !utf8.Valid(hv.RawValue) {
			hv.RawValue = bytes.ToValidUTF8(hv.RawValue, []byte(string(utf8.RuneError)))
		}
	}
}

// ensureRequestID returns the request's x-request-id, adding a fresh one to
// the headers when there is none (upstream would generate one too, but then
// only upstream would know it).
func ensureRequestID(h *extprocv3.HttpHeaders) string {
	if h.Headers == nil {
		h.Headers = &corev3.HeaderMap{}
	}
	for _, hv := range h.Headers.Headers {
		if strings.EqualFold(hv.Key, requestIDHeader) {
			if v := string(hv.RawValue); v != "" {
				return v
			}
			if hv.Value != "" {
				return hv.Value
			}
		}
	}
	id := uuid.NewString()
	h.Headers.Headers = append(h.Headers.Headers, &corev3.HeaderValue{Key: requestIDHeader, RawValue: []byte(id)})
	return id
}

// OpenAIErrorBody is a ResponseShaper that turns the plain-text body of an
// immediate response into an OpenAI-style JSON error, so HTTP clients and
// SDKs can parse every error the gateway answers itself. It leaves bodies that
// are already JSON alone.
var OpenAIErrorBody ResponseShaper = ResponseShaperFunc(openAIErrorBody)

func openAIErrorBody(_ context.Context, _ string, resp *extprocv3.ImmediateResponse) {
	if json.Valid(resp.Body) && len(resp.Body) > 0 && resp.Body[0] == '{' {
		return
	}
	code := http.StatusInternalServerError
	if resp.Status != nil && resp.Status.Code != 0 {
		code = int(resp.Status.Code)
	}
	message := strings.TrimSpace(string(resp.Body))
	if message == "" {
		message = http.StatusText(code)
	}
	resp.Body = plugins.OpenAIError(code, message, "")
	plugins.SetImmediateHeader(resp, "content-type", "application/json")
}
