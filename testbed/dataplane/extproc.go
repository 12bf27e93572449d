package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

// requestChunkSize is the largest request body chunk sent to the EPP. It
// equals per_connection_buffer_limit_bytes in GIE's reference Envoy config,
// which bounds the chunks Envoy itself would send.
const requestChunkSize = 32 << 10

// errProtocol marks an EPP answer that violates the ext_proc protocol for
// FULL_DUPLEX_STREAMED processing.
var errProtocol = errors.New("ext_proc protocol violation")

// errMessageTimeout marks an EPP that did not answer within MessageTimeout.
var errMessageTimeout = errors.New("EPP did not answer within the message timeout")

// subsetHint is the endpoint subset sent to the EPP. set distinguishes "no
// hint" (EPP picks from the whole pool) from an empty hint (EPP must answer
// 503).
type subsetHint struct {
	endpoints []string
	set       bool
}

// metadataContext is MetadataContext for a request with hint.
func metadataContext(hint subsetHint, served string) *corev3.Metadata {
	subset := hint.endpoints
	if hint.set && subset == nil {
		subset = []string{}
	}
	return MetadataContext(subset, served)
}

// MetadataContext builds the filter metadata Envoy forwards on every ext_proc
// message: the subset hint under envoy.lb.subset_hint (nil sends none, an
// empty non-nil slice an empty list, which the EPP must answer with 503) and,
// once the upstream answered, the served endpoint under envoy.lb (the EPP
// protocol's "Destination Endpoint Served"). The upstream EPP re-reads the
// metadata of each message, so every message carries all of it.
func MetadataContext(subset []string, served string) *corev3.Metadata {
	fm := map[string]*structpb.Struct{}
	if subset != nil {
		values := make([]*structpb.Value, 0, len(subset))
		for _, ep := range subset {
			values = append(values, structpb.NewStringValue(ep))
		}
		fm[metadata.SubsetFilterNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{
			metadata.SubsetFilterKey: structpb.NewListValue(&structpb.ListValue{Values: values}),
		}}
	}
	if served != "" {
		fm[metadata.DestinationEndpointNamespace] = &structpb.Struct{Fields: map[string]*structpb.Value{
			metadata.DestinationEndpointServedKey: structpb.NewStringValue(served),
		}}
	}
	if len(fm) == 0 {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: fm}
}

// requestDecision is what the EPP decided in the request phase.
type requestDecision struct {
	immediate *extprocv3.ImmediateResponse
	body      []byte
	dynamic   map[string]*structpb.Struct // namespace -> fields
}

// destinations returns the endpoints to try in order: the
// x-gateway-destination-endpoint header (what GIE's reference Envoy config
// routes on), else the envoy.lb dynamic metadata entry.
func (d *requestDecision) destinations(head *requestHead) []string {
	if v := head.header.Get(metadata.DestinationEndpointKey); v != "" {
		return SplitEndpointList(v)
	}
	if ns, ok := d.dynamic[metadata.DestinationEndpointNamespace]; ok {
		if v := ns.GetFields()[metadata.DestinationEndpointKey].GetStringValue(); v != "" {
			return SplitEndpointList(v)
		}
	}
	return nil
}

func (d *requestDecision) mergeDynamic(s *structpb.Struct) {
	for ns, v := range s.GetFields() {
		inner := v.GetStructValue()
		if inner == nil {
			continue
		}
		if d.dynamic == nil {
			d.dynamic = map[string]*structpb.Struct{}
		}
		cur, ok := d.dynamic[ns]
		if !ok {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			d.dynamic[ns] = cur
		}
		for k, fv := range inner.GetFields() {
			cur.Fields[k] = fv
		}
	}
}

// viaEPP runs one request through the EPP: request headers and body out,
// mutations and routing back, upstream call, response headers and body
// through the EPP to the client.
func (ex *exchange) viaEPP(head *requestHead, body []byte, hint subsetHint) Outcome {
	p := ex.p
	orig := &requestHead{method: head.method, path: head.path, authority: head.authority, scheme: head.scheme, header: head.header.Clone()}

	streamCtx, cancelStream := context.WithCancel(ex.r.Context())
	defer cancelStream()
	timer := newMessageTimer(p.cfg.MessageTimeout, cancelStream)
	opened := time.Now()
	stream, err := p.epps.pick().Process(streamCtx)
	if err != nil {
		timer.stop()
		return ex.eppFailed(EPPFailureRequest, err, orig, body)
	}
	defer func() { _ = stream.CloseSend() }()

	phase := requestPhase
	if p.cfg.RequestBodyMode == BodyBuffered {
		phase = requestPhaseBuffered
	}
	dec, err := phase(stream, head, body, hint, p.protocolConfig)
	ex.eppTime = time.Since(opened)
	if timer.stop() {
		err = errMessageTimeout
	}
	if err != nil {
		if ex.r.Context().Err() != nil {
			return OutcomeAborted
		}
		phase := EPPFailureRequest
		if errors.Is(err, errMessageTimeout) {
			phase = EPPFailureTimeout
		}
		return ex.eppFailed(phase, err, orig, body)
	}
	if dec.immediate != nil {
		ex.writeImmediate(dec.immediate)
		return OutcomeImmediate
	}

	upCtx, upCancel := context.WithCancel(ex.r.Context())
	defer upCancel()
	resp, served, outcome := ex.dispatch(upCtx, head, dec.body, dec.destinations(head))
	if resp == nil {
		return outcome
	}
	defer func() { _ = resp.Body.Close() }()
	if p.cfg.ResponseObserver {
		closeRouting := func() {
			_ = stream.CloseSend()
			cancelStream()
		}
		return ex.responseObserved(closeRouting, resp, served, hint, head.method, head.header.Get("X-Request-Id"))
	}
	return ex.responsePhase(stream, cancelStream, upCancel, resp, served, hint, head.method)
}

// requestPhase sends the request headers and body the way Envoy's
// FULL_DUPLEX_STREAMED mode does (headers, then body chunks without waiting
// for an answer, end_of_stream on the last) and collects the EPP's answers:
// a headers response, then streamed body chunks up to end_of_stream, or an
// ImmediateResponse at any point. head is mutated in place.
func requestPhase(stream extprocv3.ExternalProcessor_ProcessClient, head *requestHead, body []byte, hint subsetHint,
	protocol func(filterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration) (*requestDecision, error) {
	md := metadataContext(hint, "")
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     head.toHeaderMap(),
			EndOfStream: len(body) == 0,
		}},
		MetadataContext: md,
		ProtocolConfig:  protocol(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED),
	}
	err := stream.Send(first)
	for off := 0; err == nil && off < len(body); off += requestChunkSize {
		end := min(off+requestChunkSize, len(body))
		err = stream.Send(&extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body:        body[off:end],
				EndOfStream: end == len(body),
			}},
			MetadataContext: md,
		})
	}
	// io.EOF means the EPP ended the stream; its answer (often an
	// ImmediateResponse) is still readable.
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("sending request to EPP: %w", err)
	}

	dec := &requestDecision{}
	gotHeaders, bodyDone := false, len(body) == 0
	var newBody []byte
	for !gotHeaders || !bodyDone {
		msg, done, err := recvAnswer(stream, dec, "request decision")
		if err != nil {
			return nil, err
		}
		if done {
			return dec, nil
		}
		switch v := msg.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if gotHeaders {
				return nil, fmt.Errorf("%w: second request headers response", errProtocol)
			}
			gotHeaders = true
			applyRequestMutation(head, v.RequestHeaders.GetResponse().GetHeaderMutation())
		case *extprocv3.ProcessingResponse_RequestBody:
			if !gotHeaders || bodyDone {
				return nil, fmt.Errorf("%w: request body response out of order", errProtocol)
			}
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return nil, fmt.Errorf("%w: request body response without streamed_response", errProtocol)
			}
			newBody = append(newBody, sr.GetBody()...)
			bodyDone = sr.GetEndOfStream()
		default:
			return nil, fmt.Errorf("%w: unexpected %T in the request phase", errProtocol, v)
		}
	}
	dec.body = body
	if len(body) > 0 {
		dec.body = newBody
	}
	return dec, nil
}

// requestPhaseBuffered sends the request headers and body the way Envoy's
// BUFFERED request body mode does (request headers SEND) and applies the
// EPP's answers as Envoy does: the headers alone first, and only once the EPP
// answered them the whole body in one message with end_of_stream. The answer
// to the body may mutate headers (Envoy applies a body answer's header
// mutation only in this mode) and replace or clear the body; without a body
// mutation the body goes upstream as the client sent it. As in Envoy with
// request headers SEND, content-length is the EPP's to keep right: a
// content-length that does not match the body forwarded fails the request
// (Envoy rejects such a body mutation with a local reply). An
// ImmediateResponse may answer either message. head is mutated in place.
func requestPhaseBuffered(stream extprocv3.ExternalProcessor_ProcessClient, head *requestHead, body []byte, hint subsetHint,
	protocol func(filterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration) (*requestDecision, error) {
	md := metadataContext(hint, "")
	err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     head.toHeaderMap(),
			EndOfStream: len(body) == 0,
		}},
		MetadataContext: md,
		ProtocolConfig:  protocol(filterv3.ProcessingMode_BUFFERED),
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("sending request headers to EPP: %w", err)
	}
	dec := &requestDecision{body: body}
	msg, done, err := recvAnswer(stream, dec, "the request headers' answer")
	if err != nil {
		return nil, err
	}
	if done {
		return dec, nil
	}
	switch v := msg.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		if v.RequestHeaders.GetResponse().GetBodyMutation() != nil {
			return nil, fmt.Errorf("%w: a body mutation in the request headers' answer (not implemented here)", errProtocol)
		}
		applyRequestMutation(head, v.RequestHeaders.GetResponse().GetHeaderMutation())
	default:
		return nil, fmt.Errorf("%w: expected the request headers' answer, got %T", errProtocol, v)
	}
	if len(body) == 0 {
		return dec, nil
	}

	err = stream.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}},
		MetadataContext: md,
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("sending request body to EPP: %w", err)
	}
	msg, done, err = recvAnswer(stream, dec, "the request body's answer")
	if err != nil {
		return nil, err
	}
	if done {
		return dec, nil
	}
	switch v := msg.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestBody:
		common := v.RequestBody.GetResponse()
		applyRequestMutation(head, common.GetHeaderMutation())
		switch m := common.GetBodyMutation().GetMutation().(type) {
		case nil:
		case *extprocv3.BodyMutation_Body:
			dec.body = m.Body
		case *extprocv3.BodyMutation_ClearBody:
			if m.ClearBody {
				dec.body = nil
			}
		default:
			return nil, fmt.Errorf("%w: %T answers a BUFFERED body", errProtocol, m)
		}
	default:
		return nil, fmt.Errorf("%w: expected the request body's answer, got %T", errProtocol, v)
	}
	if cl := head.header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(dec.body)) {
		return nil, fmt.Errorf("%w: content-length %s does not match the %d-byte body forwarded", errProtocol, cl, len(dec.body))
	}
	return dec, nil
}

// recvAnswer receives the EPP's next answer in the request phase (what names it in an error) and keeps its dynamic
// metadata in dec; an ImmediateResponse goes to dec too, and done reports that it ended the request phase.
func recvAnswer(stream extprocv3.ExternalProcessor_ProcessClient, dec *requestDecision, what string) (msg *extprocv3.ProcessingResponse, done bool, err error) {
	msg, err = stream.Recv()
	if err != nil {
		return nil, false, fmt.Errorf("receiving %s from EPP: %w", what, err)
	}
	dec.mergeDynamic(msg.GetDynamicMetadata())
	if ir := msg.GetImmediateResponse(); ir != nil {
		dec.immediate = ir
		return msg, true, nil
	}
	return msg, false, nil
}

// eppFailed handles an EPP failure before anything reached the client:
// fail-open sends the original request round-robin, fail-closed answers
// 500 (504 on timeout) as Envoy does.
func (ex *exchange) eppFailed(phase EPPFailure, err error, orig *requestHead, body []byte) Outcome {
	p := ex.p
	p.cfg.Recorder.RecordEPPFailure(phase)
	p.cfg.Logger.Warn("EPP failed", "phase", phase, "error", err, "failOpen", p.cfg.FailureModeAllow)
	if p.cfg.FailureModeAllow {
		ex.failedOpen = true
		return ex.passthrough(orig, body, p.rotation())
	}
	if phase == EPPFailureTimeout {
		writeError(ex.w, http.StatusGatewayTimeout, errTypeServer, codeEPPTimeout, err.Error())
	} else {
		ex.writeEPPUnavailable(err)
	}
	return OutcomeEPPError
}

// writeEPPUnavailable answers a request the EPP failed, failing closed: 500 as Envoy's ext_proc filter answers by
// default, or its status_on_error with Config.EPPFailureRetryAfter (503, through the local reply mapping).
func (ex *exchange) writeEPPUnavailable(err error) {
	status := http.StatusInternalServerError
	if ex.p.cfg.EPPFailureRetryAfter > 0 {
		status = http.StatusServiceUnavailable
	}
	ex.p.cfg.localReply(status, ex.w.Header())
	writeError(ex.w, status, errTypeServer, codeEPPUnavailable, "endpoint picker failed: "+err.Error())
}

// localReply applies to the headers h of an answer of status the gateway gives itself (an EPP failure's, an EPP's
// ImmediateResponse, no endpoint picked) the local reply mapping of examples/envoy/epp-failure-503.yaml, with
// Config.EPPFailureRetryAfter: a 503 without a Retry-After gets one, in whole seconds rounded up. The status stays.
func (c Config) localReply(status int, h http.Header) {
	if status == http.StatusServiceUnavailable && c.EPPFailureRetryAfter > 0 && h.Get("Retry-After") == "" {
		h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(c.EPPFailureRetryAfter.Seconds())), 10))
	}
}

// writeImmediate sends an EPP ImmediateResponse to the client: its status
// (200 if unset, as Envoy does; 500 if out of range), its header mutation
// applied over Envoy's default text/plain content type, and its body.
func (ex *exchange) writeImmediate(ir *extprocv3.ImmediateResponse) {
	code := http.StatusOK
	if ir.GetStatus() != nil {
		code = int(ir.GetStatus().GetCode())
	}
	if code < 200 || code > 599 {
		code = http.StatusInternalServerError
	}
	rh := &responseHead{status: code, header: http.Header{"Content-Type": {"text/plain"}}}
	applyResponseMutation(rh, ir.GetHeaders())
	ex.p.cfg.localReply(rh.status, rh.header)
	rh.header.Set("Content-Length", strconv.Itoa(len(ir.GetBody())))
	ex.writeHead(rh, "")
	_, _ = ex.w.Write(ir.GetBody())
}

// responsePhase sends the upstream response through the EPP: headers first,
// then body chunks as they arrive (full duplex: a forwarder goroutine sends
// while this goroutine receives and writes to the client, flushing every
// chunk). It returns when the EPP sent the last body chunk or something
// failed.
func (ex *exchange) responsePhase(stream extprocv3.ExternalProcessor_ProcessClient, cancelStream, cancelUpstream context.CancelFunc,
	resp *http.Response, served string, hint subsetHint, method string) Outcome {
	p := ex.p
	rh := &responseHead{status: resp.StatusCode, header: resp.Header}
	removeHopByHop(rh.header)
	original := &responseHead{status: rh.status, header: rh.header.Clone()}
	noBody := resp.ContentLength == 0 || method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	md := metadataContext(hint, served)

	sent := time.Now()
	err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers:     rh.toHeaderMap(),
			EndOfStream: noBody,
		}},
		MetadataContext: md,
	})
	var fw *forwarder
	if err == nil && !noBody {
		fw = startForwarder(stream, resp.Body, md, cancelStream)
		defer fw.finish(cancelUpstream)
	}

	var msg *extprocv3.ProcessingResponse
	if err == nil || errors.Is(err, io.EOF) {
		msg, err = stream.Recv()
	}
	ex.eppTime += time.Since(sent)
	if err == nil {
		switch v := msg.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			ex.writeImmediate(v.ImmediateResponse)
			return OutcomeImmediate
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			applyResponseMutation(rh, v.ResponseHeaders.GetResponse().GetHeaderMutation())
		default:
			err = fmt.Errorf("%w: expected a response headers answer, got %T", errProtocol, v)
		}
	}
	if err != nil {
		return ex.responseHeadersFailed(err, fw, resp.Body, original, served)
	}
	if fw != nil {
		fw.ack()
	}
	if !noBody {
		// The EPP may rewrite the body, so the upstream length no longer holds.
		rh.header.Del("Content-Length")
	}
	ex.writeHead(rh, served)
	if noBody {
		return OutcomeProxied
	}

	rc := http.NewResponseController(ex.w)
	for {
		msg, err := stream.Recv()
		if err != nil {
			fw.abandonEPP()
			if uerr := fw.upstreamErr(); uerr != nil {
				p.cfg.Logger.Warn("upstream response body failed", "endpoint", served, "error", uerr)
			} else if ex.r.Context().Err() == nil {
				p.cfg.Recorder.RecordEPPFailure(EPPFailureResponse)
				p.cfg.Logger.Warn("EPP failed during the response body", "error", err)
			}
			return OutcomeAborted
		}
		switch v := msg.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_ResponseBody:
			sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				p.cfg.Recorder.RecordEPPFailure(EPPFailureResponse)
				p.cfg.Logger.Warn("EPP response body answer without streamed_response")
				return OutcomeAborted
			}
			if len(sr.GetBody()) > 0 {
				if _, werr := ex.w.Write(sr.GetBody()); werr != nil {
					return OutcomeAborted
				}
				_ = rc.Flush()
			}
			if sr.GetEndOfStream() {
				return OutcomeProxied
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
			// Only sent for trailers the proxy never forwards; nothing to do.
		default:
			// An ImmediateResponse or anything else cannot replace a response
			// whose headers are already out.
			p.cfg.Recorder.RecordEPPFailure(EPPFailureResponse)
			p.cfg.Logger.Warn("unexpected EPP answer during the response body", "type", fmt.Sprintf("%T", v))
			return OutcomeAborted
		}
	}
}

// responseHeadersFailed handles a failure before the response headers reached
// the client. An upstream failure is a 502. An EPP failure fails open by
// replaying the unmodified upstream response, including the body chunks
// already handed to the EPP, or fails closed with 500.
func (ex *exchange) responseHeadersFailed(err error, fw *forwarder, body io.Reader, original *responseHead, served string) Outcome {
	p := ex.p
	var pending [][]byte
	if fw != nil {
		fw.abandonEPP()
		if uerr := fw.upstreamErr(); uerr != nil {
			writeError(ex.w, http.StatusBadGateway, errTypeServer, codeUpstreamFailed,
				fmt.Sprintf("upstream %s failed: %v", served, uerr))
			return OutcomeUpstreamError
		}
		pending = fw.pending
	}
	if ex.r.Context().Err() != nil {
		return OutcomeAborted
	}
	p.cfg.Recorder.RecordEPPFailure(EPPFailureResponse)
	p.cfg.Logger.Warn("EPP failed on the response headers", "error", err, "failOpen", p.cfg.FailureModeAllow)
	if !p.cfg.FailureModeAllow {
		ex.writeEPPUnavailable(err)
		return OutcomeEPPError
	}
	ex.failedOpen = true
	ex.writeHead(original, served)
	rc := http.NewResponseController(ex.w)
	for _, c := range pending {
		if _, werr := ex.w.Write(c); werr != nil {
			return OutcomeAborted
		}
	}
	_ = rc.Flush()
	if fw == nil {
		return ex.copyBody(body)
	}
	return ex.copyBody(fw.remaining())
}

// messageTimer cancels the EPP stream when the request phase takes longer
// than the message timeout.
type messageTimer struct{ t *time.Timer }

func newMessageTimer(d time.Duration, cancel context.CancelFunc) *messageTimer {
	return &messageTimer{t: time.AfterFunc(d, cancel)}
}

// stop stops the timer and reports whether it had already fired.
func (m *messageTimer) stop() bool { return !m.t.Stop() }

// forwarder streams the upstream response body to the EPP. A reader
// goroutine owns the upstream body (a blocked Read can only be interrupted by
// cancelling the upstream request); the forwarder goroutine sends each chunk
// to the EPP. Until the EPP answers the response headers, chunks are also
// kept in pending so that a fail-open replay loses nothing.
type forwarder struct {
	chunks      chan []byte   // reader -> forwarder/remaining; closed at end of body
	readErr     error         // written before chunks is closed
	abandon     chan struct{} // closed by finish: the reader stops delivering
	readerDone  chan struct{}
	stop        chan struct{} // closed by halt: the forwarder stops sending
	stopOnce    sync.Once
	senderDone  chan struct{}
	abandonOnce sync.Once
	cancel      context.CancelFunc // cancels the EPP stream
	failed      error              // upstream read error seen by the sender; read after halt

	mu      sync.Mutex
	acked   bool
	pending [][]byte
}

func startForwarder(stream extprocv3.ExternalProcessor_ProcessClient, body io.Reader, md *corev3.Metadata, cancelStream context.CancelFunc) *forwarder {
	f := &forwarder{
		chunks:     make(chan []byte),
		abandon:    make(chan struct{}),
		readerDone: make(chan struct{}),
		stop:       make(chan struct{}),
		senderDone: make(chan struct{}),
		cancel:     cancelStream,
	}
	go f.read(body)
	go f.send(stream, md)
	return f
}

func (f *forwarder) read(body io.Reader) {
	defer close(f.readerDone)
	defer close(f.chunks)
	buf := make([]byte, copyBufferSize)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			select {
			case f.chunks <- bytes.Clone(buf[:n]):
			case <-f.abandon:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				f.readErr = err
			}
			return
		}
	}
}

func (f *forwarder) send(stream extprocv3.ExternalProcessor_ProcessClient, md *corev3.Metadata) {
	defer close(f.senderDone)
	for {
		select {
		case <-f.stop:
			return
		case c, ok := <-f.chunks:
			if !ok {
				if f.readErr != nil {
					// Like Envoy resetting the stream when the upstream fails:
					// the receiver sees the EPP stream end and finds failed.
					f.failed = f.readErr
					f.cancel()
					return
				}
				_ = stream.Send(&extprocv3.ProcessingRequest{
					Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}},
					MetadataContext: md,
				})
				return
			}
			f.mu.Lock()
			if !f.acked {
				f.pending = append(f.pending, c)
			}
			f.mu.Unlock()
			if err := stream.Send(&extprocv3.ProcessingRequest{
				Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: c}},
				MetadataContext: md,
			}); err != nil {
				// The receiver learns about the broken stream from Recv.
				return
			}
		}
	}
}

// ack records that the EPP answered the response headers: from now on the
// EPP's body answers are what the client gets, so nothing is kept for replay.
func (f *forwarder) ack() {
	f.mu.Lock()
	f.acked, f.pending = true, nil
	f.mu.Unlock()
}

// halt stops the sender goroutine and waits for it. Afterwards pending and
// the rest of chunks belong to the caller.
func (f *forwarder) halt() {
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.senderDone
}

// abandonEPP cancels the EPP stream, so a Send blocked on flow control
// returns, and halts the sender.
func (f *forwarder) abandonEPP() {
	f.cancel()
	f.halt()
}

// upstreamErr returns the upstream read error that ended the exchange, if
// the sender saw one. Call after halt.
func (f *forwarder) upstreamErr() error { return f.failed }

// remaining returns a reader over the body chunks the sender did not take.
// Call after halt.
func (f *forwarder) remaining() io.Reader {
	return &chunkReader{f: f}
}

// finish stops both goroutines and waits for them: the EPP stream is
// cancelled so a blocked Send returns (after a complete exchange the EPP has
// nothing left to do on it), and the upstream request is cancelled so a
// blocked Read returns.
func (f *forwarder) finish(cancelUpstream context.CancelFunc) {
	f.abandonEPP()
	f.abandonOnce.Do(func() { close(f.abandon) })
	cancelUpstream()
	<-f.readerDone
}

type chunkReader struct {
	f   *forwarder
	cur []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		c, ok := <-r.f.chunks
		if !ok {
			if r.f.readErr != nil {
				return 0, r.f.readErr
			}
			return 0, io.EOF
		}
		r.cur = c
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}
