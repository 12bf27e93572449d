package runner

import (
	"context"
	"encoding/json"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// DecisionTracePath is where the metrics server serves the decision trace (--decision-trace), behind the same
// authentication and authorization as /metrics.
const DecisionTracePath = "/debug/sluice/decisions"

// maxTracedErrorBytes bounds the error message a record keeps of the EPP's own answer.
const maxTracedErrorBytes = 512

// newDecisionRecorder returns the decision trace's recorder, or nil when --decision-trace is off.
func newDecisionRecorder(opts *Options) (*decisiontrace.Recorder, error) {
	if opts.DecisionTrace == 0 {
		return nil, nil
	}
	return decisiontrace.New(decisiontrace.Config{
		Size:   opts.DecisionTrace,
		Header: opts.DecisionTraceHeader,
		Rate:   opts.DecisionTraceRate,
		Logger: ctrl.Log.WithName("decisions"),
	})
}

// tracedStream is the ext_proc stream of one request whose decision may be traced: its context carries the
// request's decisiontrace.Trace to upstream's hooks (admission, the scheduler's plugins), Recv begins the trace with
// the request's headers, and Send commits it with the EPP's answer: where it routed the request, or the immediate
// response it sent. Only the EPP with --decision-trace wraps its streams in one.
type tracedStream struct {
	*shapingStream
	ctx   context.Context
	trace *decisiontrace.Trace
	// header is the opt-in header (--decision-trace-header), or "".
	header string
}

func newTracedStream(s *shapingStream, rec *decisiontrace.Recorder) *tracedStream {
	ctx, t := rec.Start(s.Context())
	return &tracedStream{shapingStream: s, ctx: ctx, trace: t, header: rec.Header()}
}

// Context returns the shaping stream's context (its logger, request ID and hot-path state) with the request's trace.
func (s *tracedStream) Context() context.Context { return s.ctx }

func (s *tracedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	req, err := s.shapingStream.Recv()
	if h := req.GetRequestHeaders(); err == nil && h != nil {
		s.trace.Begin(s.requestID, s.header != "" && carries(h, s.header))
	}
	return req, err
}

// Send commits the trace before the answer leaves, so a client that reads the trace once it has its answer finds the
// record.
func (s *tracedStream) Send(resp *extprocv3.ProcessingResponse) error {
	if resp = s.bufferedAnswer(resp); resp == nil {
		return nil
	}
	s.shape(resp) // the record holds the immediate response as the client gets it
	if s.trace.Active() {
		s.commit(resp)
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

// commit records the EPP's answer in resp: the immediate response, or the endpoint the request was routed to.
func (s *tracedStream) commit(resp *extprocv3.ProcessingResponse) {
	if ir := resp.GetImmediateResponse(); ir != nil {
		s.trace.Answered(int(ir.GetStatus().GetCode()), immediateHeader(ir, plugins.ShedReasonHeader),
			immediateHeader(ir, "retry-after"), errorMessage(ir.GetBody()))
		return
	}
	routing := resp.GetRequestHeaders().GetResponse().GetHeaderMutation()
	if b := resp.GetRequestBody().GetResponse(); b.GetBodyMutation().GetStreamedResponse() == nil && b.GetHeaderMutation() != nil {
		routing = b.GetHeaderMutation() // the answer to a BUFFERED body (bufferedbody.go)
	}
	for _, h := range routing.GetSetHeaders() {
		if h.GetHeader().GetKey() == metadata.DestinationEndpointKey {
			s.trace.Routed(headerValue(h.GetHeader()))
		}
	}
}

// end commits the trace of a request that ended without an answer (the client went away).
func (s *tracedStream) end() { s.trace.End() }

// carries reports whether h has header name (any case) with a value.
func carries(h *extprocv3.HttpHeaders, name string) bool {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) && headerValue(hv) != "" {
			return true
		}
	}
	return false
}

// immediateHeader returns the value an immediate response sets for key.
func immediateHeader(ir *extprocv3.ImmediateResponse, key string) string {
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), key) {
			return headerValue(h.GetHeader())
		}
	}
	return ""
}

// errorMessage is the message of an OpenAI-style error body (the shapers make every immediate response one), or
// the body itself, at most maxTracedErrorBytes of it.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if len(msg) > maxTracedErrorBytes {
		msg = msg[:maxTracedErrorBytes]
	}
	return msg
}
