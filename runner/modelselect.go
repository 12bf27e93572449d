package runner

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins"
)

// DefaultModelSelectionMaxBodyBytes bounds the request body the EPP holds to
// choose a request's model when --model-selection-max-body-bytes is not set.
const DefaultModelSelectionMaxBodyBytes = 64 << 20

// ModelSelector chooses the model a request is sent with before upstream's
// request handling sees it. It is the seam where Sluice's
// InferenceModelRewrite splitting plugs in.
//
// SelectModel gets the request's headers (lower-case names) and its complete
// raw body. It must not keep or modify them. It is called at most once per
// request, only for requests with a body, and must be safe for concurrent
// use.
type ModelSelector interface {
	SelectModel(ctx context.Context, headers map[string]string, body []byte) ModelChoice
}

// ModelChoice is a ModelSelector's answer.
type ModelChoice struct {
	// Model is the model to send the request with; "" leaves the request
	// unchanged. The client still sees the model it asked for in the
	// response (upstream rewrites the response's "model" back, streaming
	// included).
	Model string
	// Body, when not nil, replaces the request body before upstream reads
	// it. A selector that writes the chosen model into the body itself
	// (leaving Model empty) makes upstream treat it as the client's: the
	// response then names the served model.
	Body []byte
	// Done, when not nil, is called exactly once with how the request ended,
	// as soon as that is final: when the response's last message arrives (its
	// end of stream, or trailers), before the EPP answers that message; when
	// the EPP answers the request itself, before that answer is sent; else
	// when the request's ext_proc stream ends. So a proxy, and a client, that
	// has the EPP's last answer finds the outcome counted.
	Done func(ResponseOutcome)
}

// ResponseOutcome is how a request ended, as the EPP saw it over ext_proc.
type ResponseOutcome struct {
	// Status is the HTTP status of the model server's response, or of the
	// EPP's own answer when Immediate; 0 when neither arrived.
	Status int
	// Immediate reports that the EPP answered the request itself (a
	// rejection or an error): no model server was involved.
	Immediate bool
	// FirstByte is the time from the request's headers reaching the EPP to
	// the first bytes of the response body: the time to first token of a
	// streamed response. 0 when no body bytes arrived.
	FirstByte time.Duration
	// Complete reports that the response reached its end of stream, or, for
	// an OpenAI-style event stream, its final "data: [DONE]" event: clients
	// commonly hang up as soon as they read it, which can end the ext_proc
	// stream before the proxy passes on the end of the body.
	Complete bool
}

// ModelSelectorDeps is what a ModelSelectorFactory may use.
type ModelSelectorDeps struct {
	Options *Options
	// Pool is what the EPP serves: its InferencePool (static mode names a
	// synthetic one) or, with --endpoint-selector, its Deployment.
	Pool   common.GKNN
	Logger logr.Logger
}

// ModelSelectorFactory builds the ModelSelector when the EPP is assembled, in
// either mode, before the ManagerSetup Setup functions run. It may return a nil ModelSelector to install none: requests
// then pass exactly as upstream handles them.
type ModelSelectorFactory func(ctx context.Context, deps ModelSelectorDeps) (ModelSelector, error)

// WithModelSelector installs a ModelSelector built by f. With one installed,
// upstream's own InferenceModelRewrite split is switched off (the Director
// no longer sees rewrite rules), so the selector alone decides.
func (r *Runner) WithModelSelector(f ModelSelectorFactory) *Runner {
	r.modelSelector = f
	return r
}

// withoutUpstreamRewrites hides upstream's InferenceModelRewrite rules from
// the Director: with a ModelSelector installed, upstream would otherwise draw
// a second, random target after the selector chose one.
type withoutUpstreamRewrites struct {
	datastore.Datastore
}

// ModelRewriteGet reports no rule for any model.
func (withoutUpstreamRewrites) ModelRewriteGet(string) (*v1alpha2.InferenceModelRewriteRule, string) {
	return nil, ""
}

// modelSelection is the per-stream state of model selection: the request
// messages held back until the body is complete, and what is observed of the
// response for the selector's Done callback.
type modelSelection struct {
	selector     ModelSelector
	maxBodyBytes int64
	clock        clock.PassiveClock

	// queue holds messages already read from the proxy, to be handed to
	// upstream before reading on; queueErr follows them.
	queue    []*extprocv3.ProcessingRequest
	queueErr error

	// joined is the pooled buffer the held chunks were joined into (joinedbody.go), until upstream's handler has
	// copied the body of joinedMsg, the message that carries it in their place: it is put back as admission takes the
	// request, or once that handler reads past joinedMsg or returns.
	joined       *[]byte
	joinedMsg    *extprocv3.ProcessingRequest
	joinedHanded bool // joinedMsg was handed to upstream's handler

	done      func(ResponseOutcome)
	received  time.Time // when the request headers arrived
	outcome   ResponseOutcome
	firstByte bool
}

// hold reads the rest of the request (body chunks and trailers) after its
// headers, asks the selector for the model and sets the rewrite header in
// headers. It returns false when the request was answered with an immediate
// response instead (its body is too large to hold).
func (s *shapingStream) hold(headers *extprocv3.HttpHeaders) (handled bool, err error) {
	ms := s.selection
	var (
		chunks [][]byte
		size   int64
	)
	for {
		msg, err := s.recvFromProxy()
		if err != nil {
			// Upstream sees what arrived, then the error, as it would have.
			ms.queueErr = err
			return true, nil
		}
		ms.queue = append(ms.queue, msg)
		complete := false
		switch v := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			size += int64(len(v.RequestBody.Body))
			if size > ms.maxBodyBytes {
				return false, s.sendBodyTooLarge()
			}
			chunks = append(chunks, v.RequestBody.Body)
			complete = v.RequestBody.EndOfStream
		case *extprocv3.ProcessingRequest_RequestTrailers:
			complete = true
		default:
			// The proxy moved past the request (e.g. a response phase
			// message): upstream decides what that means.
			return true, nil
		}
		if complete {
			break
		}
	}
	var body []byte
	switch len(chunks) {
	case 0: // trailers without a body
	case 1:
		body = chunks[0]
	default:
		ms.joined = joinInto(chunks, int(size))
		body = *ms.joined
	}
	choice := ms.selector.SelectModel(s.Context(), headerMap(headers), body)
	ms.done = choice.Done
	if choice.Model != "" {
		setHeader(headers, metadata.ModelNameRewriteKey, choice.Model)
	}
	switch {
	case choice.Body != nil:
		if s.chunks != nil {
			s.chunks.proxyHoldsBody = false // the proxy holds the client's body, not this one
		}
		ms.joinedMsg = ms.replaceBody(choice.Body)
	case len(chunks) > 1:
		// Upstream's handler appends each body message to a buffer it grows: handed the joined body as one
		// message, it copies the body once instead of about twice.
		ms.joinedMsg = ms.replaceBody(body)
	}
	return true, nil
}

// releaseJoined puts the joined body's buffer back once upstream's handler has read past the message that carried it
// (it reads the stream again only once it has copied that message's body), and notes when that message is handed.
func (ms *modelSelection) releaseJoined(handing *extprocv3.ProcessingRequest) {
	if ms.joined == nil {
		return
	}
	if ms.joinedHanded {
		ms.putJoinedBack()
		return
	}
	ms.joinedHanded = handing != nil && handing == ms.joinedMsg
}

// releaseAtAdmission puts the joined body's buffer back as admission takes the request. Upstream's handler has its own
// copy of the body by then, but it still holds the message that carried the body to it, and logs that message when the
// request fails at debug verbosity; so the message lets go of its body first, and such a line shows it without one.
func (ms *modelSelection) releaseAtAdmission() {
	if ms.joined == nil {
		return
	}
	if b := ms.joinedMsg.GetRequestBody(); b != nil {
		b.Body = nil
	}
	ms.putJoinedBack()
}

// putJoinedBack puts the joined body's buffer back for good: once upstream's handler has returned (a request it ended
// without reading the stream again after the body, with an answer of its own or an error), or from
// releaseAtAdmission.
func (ms *modelSelection) putJoinedBack() {
	if ms.joined == nil {
		return
	}
	putJoinedBuffer(ms.joined)
	ms.joined, ms.joinedMsg, ms.joinedHanded = nil, nil, false
}

// modelSelectionKey is the context key of a stream's modelSelection, in every context upstream's handler passes to the
// Director. Only joinedBodyReleasingAdmission reads it, in Admit, which runs on the handler's goroutine as every other
// use of the modelSelection does; admission may keep the context while the request waits, but reads no value of it.
type modelSelectionKey struct{}

// joinedBodyReleasingAdmission puts the stream's joined body buffer back as admission takes the request, instead of
// when upstream's handler reads on after the request was routed. Upstream's handler copies the body before its
// Director runs, and a request may wait in admission for seconds: held until it is routed, the buffer (up to twice the
// body, a power-of-two class) would stay beside the copy, outside what the bands' byte limits count.
type joinedBodyReleasingAdmission struct {
	requestcontrol.AdmissionController
}

// Admit implements requestcontrol.AdmissionController.
func (a joinedBodyReleasingAdmission) Admit(ctx context.Context, reqCtx *handlers.RequestContext, priority int) error {
	if ms, ok := ctx.Value(modelSelectionKey{}).(*modelSelection); ok {
		ms.releaseAtAdmission()
	}
	return a.AdmissionController.Admit(ctx, reqCtx, priority)
}

// replaceBody swaps the held body chunks for one chunk holding body, keeping
// the end-of-stream flag of the last one, its metadata (upstream's handler
// keeps the metadata of the message that completes the body) and any
// trailers after it. It returns the message that carries body.
func (ms *modelSelection) replaceBody(body []byte) *extprocv3.ProcessingRequest {
	kept := make([]*extprocv3.ProcessingRequest, 0, 2)
	var replacement *extprocv3.ProcessingRequest
	joined := &extprocv3.HttpBody{Body: body}
	for _, msg := range ms.queue {
		b := msg.GetRequestBody()
		if b == nil {
			kept = append(kept, msg)
			continue
		}
		if replacement == nil {
			replacement = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: joined}}
			kept = append(kept, replacement)
		}
		joined.EndOfStream = b.EndOfStream
		replacement.MetadataContext, replacement.Attributes = msg.MetadataContext, msg.Attributes
	}
	ms.queue = kept
	return replacement
}

// sendBodyTooLarge answers 413 for a request whose body exceeds what model
// selection may hold, through the shapers like every immediate response.
func (s *shapingStream) sendBodyTooLarge() error {
	limit := s.selection.maxBodyBytes
	resp := &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_PayloadTooLarge},
		Body: plugins.OpenAIError(http.StatusRequestEntityTooLarge,
			fmt.Sprintf("request body exceeds %d bytes, the most the gateway reads to choose the model "+
				"(--model-selection-max-body-bytes)", limit), ""),
	}
	plugins.SetImmediateHeader(resp, "content-type", "application/json")
	return s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: resp}})
}

// observe records what a message tells about the response, and hands the selector the outcome once the message
// ends the response: the stream reads it before upstream's handler answers it.
func (ms *modelSelection) observe(req *extprocv3.ProcessingRequest) {
	ended := false
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		for _, h := range v.ResponseHeaders.GetHeaders().GetHeaders() {
			if h.Key == ":status" {
				ms.outcome.Status, _ = strconv.Atoi(headerValue(h))
			}
		}
		ms.outcome.Complete = v.ResponseHeaders.EndOfStream
		ended = v.ResponseHeaders.EndOfStream
	case *extprocv3.ProcessingRequest_ResponseBody:
		body := v.ResponseBody.Body
		if len(body) > 0 && !ms.firstByte {
			ms.firstByte = true
			ms.outcome.FirstByte = ms.clock.Since(ms.received)
		}
		ms.outcome.Complete = ms.outcome.Complete || v.ResponseBody.EndOfStream || bytes.Contains(body, sseDone)
		ended = v.ResponseBody.EndOfStream
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		ms.outcome.Complete = true
		ended = true
	}
	if ended {
		ms.finish()
	}
}

// answered records the EPP's own answer to the request and hands the selector the outcome, before the answer is sent.
func (ms *modelSelection) answered(ir *extprocv3.ImmediateResponse) {
	ms.outcome.Immediate = true
	ms.outcome.Status = int(ir.GetStatus().GetCode())
	ms.finish()
}

// sseDone is the final event of an OpenAI-style streamed response.
var sseDone = []byte("data: [DONE]")

// finish hands the outcome to the selector's callback, once: at the first of the response's end, the EPP's own
// answer and the end of the stream.
func (ms *modelSelection) finish() {
	if ms == nil || ms.done == nil {
		return
	}
	done := ms.done
	ms.done = nil
	done(ms.outcome)
}

// headerMap returns the headers by lower-case name, values as upstream reads
// them (raw value, else value).
func headerMap(h *extprocv3.HttpHeaders) map[string]string {
	hs := h.GetHeaders().GetHeaders()
	m := make(map[string]string, len(hs))
	for _, hv := range hs {
		m[strings.ToLower(hv.Key)] = headerValue(hv)
	}
	return m
}

func headerValue(hv *corev3.HeaderValue) string {
	if len(hv.RawValue) > 0 {
		return string(hv.RawValue)
	}
	return hv.Value
}

// setHeader replaces every header named key (case-insensitively) by one
// with value, under the lower-case name upstream matches.
func setHeader(h *extprocv3.HttpHeaders, key, value string) {
	if h.Headers == nil {
		h.Headers = &corev3.HeaderMap{}
	}
	kept := h.Headers.Headers[:0]
	for _, hv := range h.Headers.Headers {
		if !strings.EqualFold(hv.Key, key) {
			kept = append(kept, hv)
		}
	}
	h.Headers.Headers = append(kept, &corev3.HeaderValue{Key: strings.ToLower(key), RawValue: []byte(value)})
}
