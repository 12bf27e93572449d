package dataplane

import (
	"bytes"
	"context"
	"net/http"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The response observer (Config.ResponseObserver, --response-observer): Envoy with the routing ext_proc filter's
// response phase skipped (response_header_mode SKIP, response_body_mode NONE) and a second ext_proc filter in
// observability mode that sends only the response (examples/envoy/envoy-response-observer.yaml).
//
//   - The routing stream announces response_body_mode NONE in its protocol_config, carries the request phase as
//     ever, and is closed as the upstream's response headers arrive (Envoy closes an ext_proc stream with nothing
//     left to process in the encoding path: a half-close, then a reset).
//   - The observer stream opens at the response headers. Its messages carry observability_mode and the filter
//     metadata; the response headers carry the attribute request.id (the filter's response_attributes: the
//     request's x-request-id) under the filter's name. Nothing waits for the EPP: the client gets the response
//     headers and each body chunk as they come, unchanged, and each is sent to the EPP as it goes (body mode
//     STREAMED), the last as an empty end_of_stream message. Envoy closes the stream deferred_close_timeout after
//     the HTTP stream ends unless the EPP ends it first; so does this proxy (ObserverCloseTimeout).
//
// Failures on the observer stream never reach the client (observability mode ignores the EPP's answers and errors).

// ObserverCloseTimeout is Envoy's deferred_close_timeout default: how long an observer stream stays open after the
// response ended, for the EPP to end it.
const ObserverCloseTimeout = 5 * time.Second

// extProcFilterName is the name Envoy groups an ext_proc filter's attributes under.
const extProcFilterName = "envoy.filters.http.ext_proc"

// protocolConfig is what the routing stream's first message announces: the request body mode, and the response
// body mode, NONE when the response goes to an observer.
func (p *Proxy) protocolConfig(requestBody filterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration {
	response := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if p.cfg.ResponseObserver {
		response = filterv3.ProcessingMode_NONE
	}
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: requestBody, ResponseBodyMode: response}
}

// responseObserved sends the upstream response to the client unchanged, showing it to the EPP on an observer stream
// as it goes. The routing stream is closed first, as Envoy closes it at the response headers.
func (ex *exchange) responseObserved(closeRouting func(), resp *http.Response, served string, hint subsetHint, method, requestID string) Outcome {
	closeRouting()
	rh := &responseHead{status: resp.StatusCode, header: resp.Header}
	removeHopByHop(rh.header)
	noBody := resp.ContentLength == 0 || method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	md := metadataContext(hint, served)

	obs := ex.openObserver()
	obs.send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: rh.toHeaderMap(), EndOfStream: noBody}},
		MetadataContext:   md,
		Attributes:        map[string]*structpb.Struct{extProcFilterName: {Fields: map[string]*structpb.Value{"request.id": structpb.NewStringValue(requestID)}}},
		ObservabilityMode: true,
	})
	defer obs.close()
	ex.writeHead(rh, served)
	if noBody {
		return OutcomeProxied
	}

	outcome := ex.copyBodyShowing(resp.Body, func(part []byte) {
		obs.send(&extprocv3.ProcessingRequest{
			Request:           &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(part)}},
			MetadataContext:   md,
			ObservabilityMode: true,
		})
	})
	if outcome == OutcomeProxied {
		obs.send(&extprocv3.ProcessingRequest{
			Request:           &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}},
			MetadataContext:   md,
			ObservabilityMode: true,
		})
	}
	// Aborted (the client went away, or the upstream failed): the observer stream ends without the response's end.
	return outcome
}

// observerStream is one observer stream; a nil stream (the EPP could not be reached) sends nothing.
type observerStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	failed bool
}

// openObserver opens an observer stream to one of the EPP's replicas, as Envoy's cluster picks one per stream. Its
// context is not the client's: Envoy keeps the stream open after the HTTP stream ends (deferred close).
func (ex *exchange) openObserver() *observerStream {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ex.r.Context()))
	stream, err := ex.p.epps.pick().Process(ctx)
	if err != nil {
		cancel()
		ex.p.cfg.Logger.Warn("EPP observer stream failed", "error", err)
		return &observerStream{failed: true}
	}
	return &observerStream{stream: stream, cancel: cancel}
}

// send sends m without waiting for the EPP; after a failure it sends nothing more.
func (o *observerStream) send(m *extprocv3.ProcessingRequest) {
	if o.failed {
		return
	}
	if err := o.stream.Send(m); err != nil {
		o.failed = true // the EPP ended the stream (it needs no more), or it failed: the client does not notice
	}
}

// close half-closes the stream and leaves it to the EPP to end, for at most ObserverCloseTimeout.
func (o *observerStream) close() {
	if o.stream == nil {
		return
	}
	_ = o.stream.CloseSend()
	go func() {
		defer o.cancel()
		timer := time.AfterFunc(ObserverCloseTimeout, o.cancel)
		defer timer.Stop()
		for {
			if _, err := o.stream.Recv(); err != nil {
				return
			}
		}
	}()
}
