package runner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// step is one message the proxy sends, after the clock moved by advance.
type step struct {
	msg     *extprocv3.ProcessingRequest
	advance time.Duration
}

// scriptedStream plays the proxy's side of one ext_proc stream: it hands out
// the steps in order, then end (io.EOF when nil), and records what is sent.
type scriptedStream struct {
	grpc.ServerStream
	steps []step
	end   error
	clock *clocktesting.FakeClock
	sent  []*extprocv3.ProcessingResponse
	// onSend, when set, sees each answer as it is sent.
	onSend func(*extprocv3.ProcessingResponse)
}

func (f *scriptedStream) Context() context.Context { return context.Background() }

func (f *scriptedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.steps) == 0 {
		if f.end != nil {
			return nil, f.end
		}
		return nil, io.EOF
	}
	st := f.steps[0]
	f.steps = f.steps[1:]
	if f.clock != nil {
		f.clock.Step(st.advance)
	}
	return st.msg, nil
}

func (f *scriptedStream) Send(r *extprocv3.ProcessingResponse) error {
	if f.onSend != nil {
		f.onSend(r)
	}
	f.sent = append(f.sent, r)
	return nil
}

// TestModelSelectionReportsTheOutcomeBeforeTheLastAnswer: the selector has the request's outcome before the EPP sends
// its answer to the message that ended the response, or its own answer to the request, so a proxy or a client that
// has that answer (and then a test that reads the outcome's metrics or the guardrail) finds the outcome counted; the
// end of the ext_proc stream may come much later.
func TestModelSelectionReportsTheOutcomeBeforeTheLastAnswer(t *testing.T) {
	request := []step{{msg: reqHeaders(false)}, {msg: reqBody(`{"model":"m"}`, true)}}
	tests := []struct {
		name   string
		steps  []step
		answer *extprocv3.ProcessingResponse
		want   ResponseOutcome
	}{
		{
			name:  "the response body ends",
			steps: append(slices.Clone(request), step{msg: respHeaders("500", false)}, step{msg: respBody(`{"error":"boom"}`, true)}),
			want:  ResponseOutcome{Status: 500, Complete: true},
		},
		{
			name:  "the response headers end the response",
			steps: append(slices.Clone(request), step{msg: respHeaders("503", true)}),
			want:  ResponseOutcome{Status: 503, Complete: true},
		},
		{
			name:   "the EPP answers the request itself",
			steps:  request,
			answer: immediate(typev3.StatusCode_TooManyRequests, "busy"),
			want:   ResponseOutcome{Status: 429, Immediate: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel := &fakeSelector{model: "canary"}
			proxy := &scriptedStream{steps: tt.steps}
			var countedAtLastAnswer []ResponseOutcome
			proxy.onSend = func(*extprocv3.ProcessingResponse) { countedAtLastAnswer = slices.Clone(sel.outcomes) }
			srv := &shapingServer{upstream: &answeringUpstream{answer: tt.answer}, selector: sel, maxBodyBytes: 1 << 20,
				clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
			if err := srv.Process(proxy); err != nil {
				t.Fatal(err)
			}
			if len(countedAtLastAnswer) != 1 || countedAtLastAnswer[0] != tt.want {
				t.Errorf("outcomes when the last answer was sent %+v, want exactly %+v", countedAtLastAnswer, tt.want)
			}
			if len(sel.outcomes) != 1 {
				t.Errorf("Done called %d times, want once", len(sel.outcomes))
			}
		})
	}
}

// answeringUpstream stands in for upstream's streaming server answering every message as it reads it: with answer
// (when set) to the request body, which ends the request, else with an empty answer of the message's kind.
type answeringUpstream struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer *extprocv3.ProcessingResponse
}

func (u *answeringUpstream) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if req.GetRequestBody() != nil && u.answer != nil {
			return s.Send(u.answer)
		}
		if err := s.Send(emptyAnswer(req)); err != nil {
			return err
		}
	}
}

// emptyAnswer is the answer to req that changes nothing: a response of req's kind, empty.
func emptyAnswer(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	resp := &extprocv3.ProcessingResponse{}
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}
	case *extprocv3.ProcessingRequest_RequestBody:
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		resp.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		resp.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}
	}
	return resp
}

// recordingUpstream stands in for upstream's streaming server: it reads the
// stream until it ends, keeping what it read, and answers the first request
// body with answer when set.
type recordingUpstream struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer *extprocv3.ProcessingResponse
	got    []*extprocv3.ProcessingRequest
	err    error
}

func (u *recordingUpstream) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			u.err = err
			return nil
		}
		// Copied, as upstream's handler copies a body: the stream puts a joined body's buffer back once upstream reads on.
		u.got = append(u.got, proto.Clone(req).(*extprocv3.ProcessingRequest))
		if req.GetRequestBody() != nil && u.answer != nil {
			return s.Send(u.answer)
		}
	}
}

// fakeSelector records its calls and answers model.
type fakeSelector struct {
	model    string
	newBody  string
	calls    int
	headers  map[string]string
	body     string
	outcomes []ResponseOutcome
}

func (f *fakeSelector) SelectModel(_ context.Context, headers map[string]string, body []byte) ModelChoice {
	f.calls++
	f.headers, f.body = headers, string(body)
	c := ModelChoice{Model: f.model, Done: func(o ResponseOutcome) { f.outcomes = append(f.outcomes, o) }}
	if f.newBody != "" {
		c.Body = []byte(f.newBody)
	}
	return c
}

func reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	r := headers(kv...)
	r.GetRequestHeaders().EndOfStream = eos
	return r
}

func reqBody(s string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: eos}}}
}

func reqTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
}

func respHeaders(status string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(status)}}}, EndOfStream: eos,
	}}}
}

func respBody(s string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: eos}}}
}

// rewriteHeaders returns every value of the rewrite header, whatever its case.
func rewriteHeaders(r *extprocv3.ProcessingRequest) []string {
	var vals []string
	for _, h := range r.GetRequestHeaders().GetHeaders().GetHeaders() {
		if strings.EqualFold(h.Key, metadata.ModelNameRewriteKey) {
			vals = append(vals, h.Key+"="+headerValue(h))
		}
	}
	return vals
}

// kinds names the messages upstream received, in order.
func kinds(reqs []*extprocv3.ProcessingRequest) []string {
	var out []string
	for _, r := range reqs {
		switch v := r.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			out = append(out, "headers")
		case *extprocv3.ProcessingRequest_RequestBody:
			out = append(out, "body:"+string(v.RequestBody.Body))
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = append(out, "trailers")
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, "response-headers")
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, "response-body")
		}
	}
	return out
}

func TestModelSelectionHoldsTheRequestUntilItsBodyIsComplete(t *testing.T) {
	broken := errors.New("proxy went away")
	tests := []struct {
		name          string
		steps         []*extprocv3.ProcessingRequest
		end           error
		model         string
		newBody       string
		wantCalls     int
		wantBody      string
		wantUpstream  []string
		wantRewrite   []string
		wantUpstreamE error
	}{
		{
			name:         "headers-only request passes untouched",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(true, ":method", "GET")},
			model:        "canary",
			wantUpstream: []string{"headers"},
		},
		{
			name:         "multi-chunk body is joined and the rewrite header set",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(false, "x-session-id", "s1"), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			model:        "canary",
			wantCalls:    1,
			wantBody:     `{"model":"m"}`,
			wantUpstream: []string{"headers", `body:{"model":"m"}`},
			wantRewrite:  []string{metadata.ModelNameRewriteKey + "=canary"},
		},
		{
			name:         "trailers end a body without end of stream",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":"m"}`, false), reqTrailers()},
			model:        "canary",
			wantCalls:    1,
			wantBody:     `{"model":"m"}`,
			wantUpstream: []string{"headers", `body:{"model":"m"}`, "trailers"},
			wantRewrite:  []string{metadata.ModelNameRewriteKey + "=canary"},
		},
		{
			name:         "a client's rewrite header is replaced by the choice",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(false, "X-Gateway-Model-Name-Rewrite", "client-pick"), reqBody(`{"model":"m"}`, true)},
			model:        "canary",
			wantCalls:    1,
			wantBody:     `{"model":"m"}`,
			wantUpstream: []string{"headers", `body:{"model":"m"}`},
			wantRewrite:  []string{metadata.ModelNameRewriteKey + "=canary"},
		},
		{
			name:         "no choice leaves a client's rewrite header alone",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(false, metadata.ModelNameRewriteKey, "client-pick"), reqBody(`{"model":"m"}`, true)},
			wantCalls:    1,
			wantBody:     `{"model":"m"}`,
			wantUpstream: []string{"headers", `body:{"model":"m"}`},
			wantRewrite:  []string{metadata.ModelNameRewriteKey + "=client-pick"},
		},
		{
			name:         "a replaced body takes the place of the chunks, before the trailers",
			steps:        []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, false), reqTrailers()},
			newBody:      `{"model":"canary"}`,
			wantCalls:    1,
			wantBody:     `{"model":"m"}`,
			wantUpstream: []string{"headers", `body:{"model":"canary"}`, "trailers"},
		},
		{
			name:          "a stream error while holding passes what arrived, then the error",
			steps:         []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"mod`, false)},
			end:           broken,
			model:         "canary",
			wantUpstream:  []string{"headers", `body:{"mod`},
			wantUpstreamE: broken,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel := &fakeSelector{model: tt.model, newBody: tt.newBody}
			proxy := &scriptedStream{end: tt.end}
			for _, m := range tt.steps {
				proxy.steps = append(proxy.steps, step{msg: m})
			}
			up := &recordingUpstream{}
			srv := &shapingServer{upstream: up, selector: sel, maxBodyBytes: 1 << 20, clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
			if err := srv.Process(proxy); err != nil {
				t.Fatal(err)
			}
			if sel.calls != tt.wantCalls || sel.body != tt.wantBody {
				t.Errorf("selector called %d times with body %q, want %d with %q", sel.calls, sel.body, tt.wantCalls, tt.wantBody)
			}
			if got := kinds(up.got); !slices.Equal(got, tt.wantUpstream) {
				t.Errorf("upstream received %v, want %v", got, tt.wantUpstream)
			}
			wantErr := tt.wantUpstreamE
			if wantErr == nil {
				wantErr = io.EOF
			}
			if !errors.Is(up.err, wantErr) {
				t.Errorf("upstream's stream ended with %v, want %v", up.err, wantErr)
			}
			if got := rewriteHeaders(up.got[0]); !slices.Equal(got, tt.wantRewrite) {
				t.Errorf("rewrite headers %v, want %v", got, tt.wantRewrite)
			}
			if tt.wantCalls > 0 && sel.headers[requestIDHeader] == "" {
				t.Errorf("selector saw headers %v without the request ID", sel.headers)
			}
			if len(sel.outcomes) != tt.wantCalls {
				t.Errorf("Done called %d times, want %d", len(sel.outcomes), tt.wantCalls)
			}
		})
	}
}

// TestModelSelectionPutsTheJoinedBodyBack: a body held in several messages is joined into a pooled buffer, which the
// stream keeps while upstream's handler holds the message that carries it and puts back when the handler reads on
// (it has copied the body by then) or returns; a body of one message is handed as it came, with no buffer.
func TestModelSelectionPutsTheJoinedBodyBack(t *testing.T) {
	tests := []struct {
		name    string
		steps   []*extprocv3.ProcessingRequest
		newBody string
		// stopAfter ends upstream's handler after it read this many messages, as one that answers the request itself
		// (a rejection) ends without reading on; 0 reads to the end.
		stopAfter int
		want      []string // what upstream's handler read, and whether a joined buffer was held when it read it (the hold joins the body before the headers are handed)
	}{
		{
			name:  "two messages",
			steps: []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			want:  []string{"headers held", `body:{"model":"m"} held`, "end"},
		},
		{
			name:  "two messages and trailers",
			steps: []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, false), reqTrailers()},
			want:  []string{"headers held", `body:{"model":"m"} held`, "trailers", "end"},
		},
		{
			name:    "two messages, the body replaced by the selector",
			steps:   []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			newBody: `{"model":"canary"}`,
			want:    []string{"headers held", `body:{"model":"canary"} held`, "end"},
		},
		{
			name:  "one message",
			steps: []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":"m"}`, true)},
			want:  []string{"headers", `body:{"model":"m"}`, "end"},
		},
		{
			name:      "two messages, upstream ends the stream after the body",
			steps:     []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			stopAfter: 2,
			want:      []string{"headers held", `body:{"model":"m"} held`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proxy := &scriptedStream{}
			for _, m := range tt.steps {
				proxy.steps = append(proxy.steps, step{msg: m})
			}
			up := &joinedBufferWatcher{stopAfter: tt.stopAfter}
			srv := &shapingServer{upstream: up, selector: &fakeSelector{model: "canary", newBody: tt.newBody}, maxBodyBytes: 1 << 20,
				clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
			if err := srv.Process(proxy); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(up.read, tt.want) {
				t.Errorf("upstream read %q, want %q", up.read, tt.want)
			}
			if up.stream.selection.joined != nil {
				t.Error("the joined buffer was not put back when the stream ended")
			}
		})
	}
}

// joinedBufferWatcher is upstream's handler noting, with each message it reads, whether the stream holds a joined
// body's buffer.
type joinedBufferWatcher struct {
	extprocv3.UnimplementedExternalProcessorServer
	stopAfter int // end after reading this many messages; 0 reads to the end
	read      []string
	stream    *shapingStream
}

func (u *joinedBufferWatcher) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	u.stream = s.(*shapingStream)
	for u.stopAfter == 0 || len(u.read) < u.stopAfter {
		req, err := s.Recv()
		read := "end"
		if err == nil {
			read = kinds([]*extprocv3.ProcessingRequest{req})[0]
		}
		if s.(*shapingStream).selection.joined != nil {
			read += " held"
		}
		u.read = append(u.read, read)
		if err != nil {
			return nil
		}
	}
	return nil
}

// TestAdmissionPutsTheJoinedBodyBack: the joined body's buffer is back in the pool by the time admission decides on
// the request (a queued request waits there), not when upstream's handler reads on after routing it; upstream's
// handler keeps the body it copied, whatever admission answers.
func TestAdmissionPutsTheJoinedBodyBack(t *testing.T) {
	refused := errors.New("queue full")
	tests := []struct {
		name     string
		steps    []*extprocv3.ProcessingRequest
		newBody  string
		admitErr error
		wantBody string
	}{
		{
			name:     "two messages",
			steps:    []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			wantBody: `{"model":"m"}`,
		},
		{
			name:     "two messages, refused by admission",
			steps:    []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			admitErr: refused,
			wantBody: `{"model":"m"}`,
		},
		{
			name:     "two messages, the body replaced by the selector",
			steps:    []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":`, false), reqBody(`"m"}`, true)},
			newBody:  `{"model":"canary"}`,
			wantBody: `{"model":"canary"}`,
		},
		{
			name:     "one message",
			steps:    []*extprocv3.ProcessingRequest{reqHeaders(false), reqBody(`{"model":"m"}`, true)},
			wantBody: `{"model":"m"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proxy := &scriptedStream{}
			for _, m := range tt.steps {
				proxy.steps = append(proxy.steps, step{msg: m})
			}
			inner := &joinedBufferAdmission{err: tt.admitErr}
			up := &admittingHandler{admission: joinedBodyReleasingAdmission{inner}}
			srv := &shapingServer{upstream: up, selector: &fakeSelector{model: "canary", newBody: tt.newBody}, maxBodyBytes: 1 << 20,
				clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
			if err := srv.Process(proxy); err != nil {
				t.Fatal(err)
			}
			if inner.calls != 1 {
				t.Fatalf("admission was asked %d times, want once", inner.calls)
			}
			if !inner.found {
				t.Fatal("admission's context carries no model selection: nothing could have put the buffer back")
			}
			if inner.held {
				t.Error("the joined buffer was still held while admission decided")
			}
			if !errors.Is(up.admitErr, tt.admitErr) {
				t.Errorf("admission answered %v, want %v", up.admitErr, tt.admitErr)
			}
			if up.body != tt.wantBody {
				t.Errorf("upstream's handler holds body %q after admission, want %q", up.body, tt.wantBody)
			}
		})
	}
}

// TestJoinedBodyReleasingAdmissionWithoutModelSelection: a context without a stream's model selection (no selector
// installed) reaches admission unchanged.
func TestJoinedBodyReleasingAdmissionWithoutModelSelection(t *testing.T) {
	refused := errors.New("queue full")
	inner := &joinedBufferAdmission{err: refused}
	if err := (joinedBodyReleasingAdmission{inner}).Admit(context.Background(), &handlers.RequestContext{}, 0); !errors.Is(err, refused) {
		t.Errorf("Admit = %v, want %v", err, refused)
	}
	if inner.calls != 1 {
		t.Errorf("admission was asked %d times, want once", inner.calls)
	}
}

// admittingHandler is upstream's handler as GIE v1.5.0's is for the request phase: it appends each body message to a
// buffer of its own and, with the body complete, asks admission in the stream's context; then it reads to the end and
// keeps the body it copied.
type admittingHandler struct {
	extprocv3.UnimplementedExternalProcessorServer
	admission requestcontrol.AdmissionController
	admitErr  error
	body      string
}

func (u *admittingHandler) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if b := req.GetRequestBody(); b != nil {
			body = append(body, b.Body...)
			if b.EndOfStream {
				u.admitErr = u.admission.Admit(s.Context(), &handlers.RequestContext{}, 0)
				u.body = string(body)
			}
		}
	}
}

// joinedBufferAdmission is an admission controller noting whether its context carried the stream's model selection,
// and whether that held a joined body's buffer, when it was asked.
type joinedBufferAdmission struct {
	err   error
	calls int
	found bool
	held  bool
}

func (a *joinedBufferAdmission) Admit(ctx context.Context, _ *handlers.RequestContext, _ int) error {
	a.calls++
	ms, ok := ctx.Value(modelSelectionKey{}).(*modelSelection)
	a.found = a.found || ok
	a.held = a.held || (ok && ms.joined != nil)
	return a.err
}

// TestFailedRequestLoggedWithoutAPutBackBody: upstream's handler, failing a request after admission took it, logs the
// message that carried the body at debug verbosity. The joined body's buffer is back in the pool by then, and another
// stream may have taken it, so that message must no longer hold it: the line shows no body, not the prompt (which it
// could only show while the buffer stays out of the pool), zeros or another request's prompt. Upstream's own handler
// runs here, with a Director that admits and then fails.
func TestFailedRequestLoggedWithoutAPutBackBody(t *testing.T) {
	const first, last = `{"model":"m","messages":[{"role":"user","content":"`, `secret"}]}`
	logged := &loggedRequestBodies{}
	ctx := log.IntoContext(context.Background(), logr.New(logged))
	proxy := contextStream{&scriptedStream{steps: []step{
		{msg: reqHeaders(false)}, {msg: reqBody(first, false)}, {msg: reqBody(last, true)},
	}}, ctx}
	director := &admitThenFail{admission: joinedBodyReleasingAdmission{&joinedBufferAdmission{}}, size: len(first + last)}
	srv := &shapingServer{upstream: handlers.NewStreamingServer(nil, director, nil), selector: &fakeSelector{model: "canary"},
		maxBodyBytes: 1 << 20, clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	if err := srv.Process(proxy); err == nil || !strings.Contains(err.Error(), errNoEndpoint.Error()) {
		t.Fatalf("the stream ended with %v, want upstream's handler to end it with the Director's error", err)
	}
	if !director.asked {
		t.Fatal("upstream's handler never asked the Director: the body was not complete")
	}
	if len(logged.bodies) != 1 {
		t.Fatalf("upstream logged %d failed requests with their message, want 1: the path this test guards was not taken", len(logged.bodies))
	}
	if got := logged.bodies[0]; got != "" {
		t.Errorf("the failed request's line shows body %q, want none: the message still held the joined buffer", got)
	}
}

// admitThenFail is a Director that asks admission, then, as another stream would, takes a joined body's buffer of the
// request's size and writes over it, and fails the request.
type admitThenFail struct {
	handlers.Director
	admission requestcontrol.AdmissionController
	size      int
	asked     bool
}

func (d *admitThenFail) HandleRequest(ctx context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	d.asked = true
	if err := d.admission.Admit(ctx, reqCtx, 0); err != nil {
		return reqCtx, err
	}
	other := joinedBuffer(d.size)
	for i := range *other {
		(*other)[i] = 'X'
	}
	return reqCtx, errNoEndpoint
}

var errNoEndpoint = errors.New("no endpoint to send the request to")

// contextStream is a scriptedStream whose context is ctx.
type contextStream struct {
	*scriptedStream
	ctx context.Context
}

func (s contextStream) Context() context.Context { return s.ctx }

// loggedRequestBodies is a logr sink at every verbosity that records, as each error line is written, the request body
// of every ext_proc message among the line's values.
type loggedRequestBodies struct{ bodies []string }

func (l *loggedRequestBodies) Init(logr.RuntimeInfo)          {}
func (l *loggedRequestBodies) Enabled(int) bool               { return true }
func (l *loggedRequestBodies) Info(int, string, ...any)       {}
func (l *loggedRequestBodies) WithValues(...any) logr.LogSink { return l }
func (l *loggedRequestBodies) WithName(string) logr.LogSink   { return l }
func (l *loggedRequestBodies) Error(_ error, _ string, kv ...any) {
	for _, v := range kv {
		if m, ok := v.(*extprocv3.ProcessingRequest); ok {
			l.bodies = append(l.bodies, string(m.GetRequestBody().GetBody()))
		}
	}
}

// TestModelSelectionKeepsTheLastBodyMessagesMetadata: the joined body reaches upstream with the metadata and
// attributes of the body message that completed it, as upstream's handler, which reads them from every message, would
// have been left with.
func TestModelSelectionKeepsTheLastBodyMessagesMetadata(t *testing.T) {
	withMetadata := func(m *extprocv3.ProcessingRequest, tag string) *extprocv3.ProcessingRequest {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{"tag": structpb.NewStringValue(tag)}}}}
		m.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{"tag": structpb.NewStringValue(tag)}}}
		return m
	}
	proxy := &scriptedStream{steps: []step{
		{msg: reqHeaders(false)},
		{msg: withMetadata(reqBody(`{"model":`, false), "first")},
		{msg: withMetadata(reqBody(`"m"}`, true), "last")},
	}}
	up := &recordingUpstream{}
	srv := &shapingServer{upstream: up, selector: &fakeSelector{model: "canary"}, maxBodyBytes: 1 << 20, clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	if err := srv.Process(proxy); err != nil {
		t.Fatal(err)
	}
	if got := kinds(up.got); !slices.Equal(got, []string{"headers", `body:{"model":"m"}`}) {
		t.Fatalf("upstream received %v, want the headers and the joined body", got)
	}
	body := up.got[1]
	if got := body.GetMetadataContext().GetFilterMetadata()["envoy.lb"].GetFields()["tag"].GetStringValue(); got != "last" {
		t.Errorf("metadata context of the body message %q, want the last body message's", got)
	}
	if got := body.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["tag"].GetStringValue(); got != "last" {
		t.Errorf("attributes of the body message %q, want the last body message's", got)
	}
}

func TestModelSelectionAnswers413ForABodyTooLargeToHold(t *testing.T) {
	sel := &fakeSelector{model: "canary"}
	proxy := &scriptedStream{steps: []step{{msg: reqHeaders(false)}, {msg: reqBody("0123456789", false)}, {msg: reqBody("0123456789", true)}}}
	up := &recordingUpstream{}
	decisions, err := decisiontrace.New(decisiontrace.Config{Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	srv := &shapingServer{upstream: up, shapers: []ResponseShaper{OpenAIErrorBody}, selector: sel, maxBodyBytes: 15,
		clock: clocktesting.NewFakeClock(time.Unix(0, 0)), decisions: decisions}
	if err := srv.Process(proxy); err != nil {
		t.Fatal(err)
	}
	if sel.calls != 0 || len(up.got) != 0 || !errors.Is(up.err, io.EOF) {
		t.Fatalf("selector calls %d, upstream got %v then %v; want nothing but the end of the stream", sel.calls, kinds(up.got), up.err)
	}
	if len(proxy.sent) != 1 {
		t.Fatalf("sent %d responses, want one immediate response", len(proxy.sent))
	}
	ir := proxy.sent[0].GetImmediateResponse()
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil || ir.GetStatus().GetCode() != typev3.StatusCode_PayloadTooLarge ||
		!strings.Contains(body.Error.Message, "15 bytes") || body.Error.Type != "invalid_request_error" {
		t.Fatalf("immediate response %d %s (%v), want 413 with an OpenAI error naming the limit", ir.GetStatus().GetCode(), ir.GetBody(), err)
	}
	// The decision trace holds the stream's own answer as it holds upstream's.
	records := decisions.Records("", 0)
	if len(records) != 1 || records[0].Outcome != decisiontrace.Answered || records[0].Status != http.StatusRequestEntityTooLarge ||
		records[0].Error != body.Error.Message {
		t.Fatalf("decision trace %+v, want one record of the 413 with its message", records)
	}
}

func TestModelSelectionReportsHowTheRequestEnded(t *testing.T) {
	const ttft = 120 * time.Millisecond
	request := []step{{msg: reqHeaders(false)}, {msg: reqBody(`{"model":"m"}`, true), advance: 5 * time.Millisecond}}
	tests := []struct {
		name   string
		steps  []step
		answer *extprocv3.ProcessingResponse
		want   ResponseOutcome
	}{
		{
			name: "streamed success",
			steps: append(slices.Clone(request),
				step{msg: respHeaders("200", false), advance: 10 * time.Millisecond},
				step{msg: respBody("", false), advance: 10 * time.Millisecond}, // empty chunks are not the first byte
				step{msg: respBody("data: 1", false), advance: ttft - 25*time.Millisecond},
				step{msg: respBody("data: [DONE]", true), advance: time.Second}),
			want: ResponseOutcome{Status: 200, FirstByte: ttft, Complete: true},
		},
		{
			name:  "server error without a body",
			steps: append(slices.Clone(request), step{msg: respHeaders("503", true)}),
			want:  ResponseOutcome{Status: 503, Complete: true},
		},
		{
			name: "client hung up after the final event",
			steps: append(slices.Clone(request),
				step{msg: respHeaders("200", false)},
				step{msg: respBody("data: 1\n\n", false), advance: ttft - 5*time.Millisecond},
				step{msg: respBody("data: [DONE]\n\n", false)}),
			want: ResponseOutcome{Status: 200, FirstByte: ttft, Complete: true},
		},
		{
			name: "cut stream",
			steps: append(slices.Clone(request),
				step{msg: respHeaders("200", false)},
				step{msg: respBody("data: 1", false), advance: ttft - 5*time.Millisecond}),
			want: ResponseOutcome{Status: 200, FirstByte: ttft},
		},
		{
			name:   "answered by the EPP",
			steps:  request,
			answer: immediate(typev3.StatusCode_TooManyRequests, "busy"),
			want:   ResponseOutcome{Status: 429, Immediate: true},
		},
		{
			name:  "no response at all",
			steps: request,
			want:  ResponseOutcome{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			sel := &fakeSelector{model: "canary"}
			proxy := &scriptedStream{steps: tt.steps, clock: clk}
			srv := &shapingServer{upstream: &recordingUpstream{answer: tt.answer}, selector: sel, maxBodyBytes: 1 << 20, clock: clk}
			if err := srv.Process(proxy); err != nil {
				t.Fatal(err)
			}
			if len(sel.outcomes) != 1 || sel.outcomes[0] != tt.want {
				t.Fatalf("outcomes %+v, want exactly %+v", sel.outcomes, tt.want)
			}
		})
	}
}
