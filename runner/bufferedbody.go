package runner

import (
	"math"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The request body BUFFERED (an opt-in of the proxy, see README "Long prompts: the request body buffered").
//
// GIE's Envoy configuration sends the request body FULL_DUPLEX_STREAMED: Envoy forwards no body byte itself, so the
// EPP streams the whole body back (upstream's handler, in 62,500-byte streamed_response answers) after its answer to
// the request headers, and a 200 KB prompt crosses ext_proc twice. With the filter's request_body_mode BUFFERED (and
// request headers SEND), Envoy behaves differently, and the EPP answers accordingly:
//
//   - Envoy waits for the answer to the request headers before it sends the body (it holds the body meanwhile,
//     envoyproxy/envoy#15935), where upstream's handler answers the headers only once it has the body. The stream
//     answers the headers itself, with an empty HeadersResponse (nothing changed), and then hands upstream's handler
//     the headers as before.
//   - The body then arrives whole, in one message (with end_of_stream, unless trailers follow: recvFromProxy).
//     Upstream's handler answers it as ever (its header answer, then the streamed body); the stream holds those
//     answers back and sends one BodyResponse in their place: its CommonResponse carries the header mutation and
//     route-cache flag of upstream's header answer (header mutations in an answer to a body message "only take effect
//     if the current processing mode for the body is BUFFERED", CommonResponse.header_mutation), the
//     ProcessingResponse the dynamic metadata.
//   - No body goes back when the EPP forwards the client's body: then Envoy forwards the body it buffered, with its
//     content-length. When the EPP changed the body (a model rewrite), the BodyResponse replaces it (body_mutation)
//     and sets content-length to the new length: in BUFFERED mode with request headers SEND, Envoy keeps the
//     content-length header and rejects a body mutation whose length does not match it ("it is external processor's
//     responsibility to set the content length", ProcessingMode.BodySendMode; envoyproxy/envoy#29536).
//
// The stream learns the mode from ProcessingRequest.protocol_config, which Envoy sends on the first message of every
// ext_proc stream (the request headers): no flag has to agree with the proxy's configuration, and without BUFFERED
// there (GIE's configuration, or a proxy that sends no protocol_config) nothing here runs.
//
// Whether the EPP forwards the client's body is known on the hot path only (bodyChange): there upstream's Director
// changes nothing in the body but its model (its re-encoding aside, which changes no member), and when it keeps the
// model the hot Director skips the re-encoding, which would not be sent. Off the hot path, or when the model selector
// replaced the body, the body always goes back.

// maxExtProcMessageBytes is the largest ext_proc message the EPP's server accepts: a proxy that buffers the request
// body sends it in one message, which gRPC's 4 MiB default would refuse (the proxy then answers 500). The bound is
// the most model selection holds (maxBodyBytes, --model-selection-max-body-bytes), which answers a larger body 413,
// plus room for the message's headers and metadata; never below gRPC's default.
func maxExtProcMessageBytes(maxBodyBytes int64) int {
	const defaultMax, room = 4 << 20, 1 << 20
	return int(min(max(maxBodyBytes+room, defaultMax), math.MaxInt32))
}

// bufferedBody is the state of one request whose proxy sends the body BUFFERED: the stream has answered the request
// headers itself, and turns upstream's answers to the body into one BodyResponse.
type bufferedBody struct {
	// headers is upstream's answer to the request headers, held until its body answers are complete.
	headers *extprocv3.ProcessingResponse
	// echo: the body goes back (body_mutation); decided when upstream's header answer arrives.
	echo bool
	// body is the body upstream's streamed answers carry, when echo.
	body []byte
	// answered: the request phase is over (the BodyResponse or an immediate response went out); later answers pass.
	answered bool
}

// bufferedRequestBody reports whether req, a request's first message, says that the proxy sends the request body
// BUFFERED and that a body follows.
func bufferedRequestBody(req *extprocv3.ProcessingRequest) bool {
	h := req.GetRequestHeaders()
	return h != nil && !h.EndOfStream && req.GetProtocolConfig().GetRequestBodyMode() == filterv3.ProcessingMode_BUFFERED
}

// answerHeadersForBufferedBody answers the request headers at once, changing nothing, so that the proxy sends the
// body; upstream's handler sees the headers next, as ever.
func (s *shapingStream) answerHeadersForBufferedBody() error {
	s.buffered = &bufferedBody{}
	if s.chunks != nil {
		s.chunks.proxyHoldsBody = true
	}
	return s.ExternalProcessor_ProcessServer.Send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
	})
}

// recvFromProxy receives the proxy's next message. When the proxy buffers the request body, the one body message is
// the whole body, though its end_of_stream is false when trailers follow (Envoy sends them after the body's answer):
// it is marked the end, so that the model selection and upstream's handler answer it; and the request trailers,
// which upstream's handler leaves unanswered while the proxy waits for an answer, are answered here, changing nothing.
func (s *shapingStream) recvFromProxy() (*extprocv3.ProcessingRequest, error) {
	var req *extprocv3.ProcessingRequest
	var err error
	if s.first != nil { // read already, to tell a routing stream from an observer (responseobserver.go)
		req, s.first = s.first, nil
	} else {
		req, err = s.recvMessage()
	}
	if err != nil || s.buffered == nil {
		return req, err
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		r.RequestBody.EndOfStream = true
	case *extprocv3.ProcessingRequest_RequestTrailers:
		err = s.ExternalProcessor_ProcessServer.Send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return req, err
}

// bufferedAnswer turns upstream's answers in the request phase of a BUFFERED body into the one answer the proxy
// expects: it returns the answer to send in resp's place, or nil to send nothing yet. Every other answer passes.
func (s *shapingStream) bufferedAnswer(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	b := s.buffered
	if b == nil || b.answered {
		return resp
	}
	switch v := resp.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		b.headers = resp
		b.echo = s.bodyChange()
		return nil
	case *extprocv3.ProcessingResponse_RequestBody:
		sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || b.headers == nil {
			return resp // not upstream's streamed answer after its header answer: the proxy judges it
		}
		if b.echo {
			b.body = append(b.body, sr.Body...)
		}
		if !sr.EndOfStream {
			return nil
		}
		b.answered = true
		return bufferedBodyResponse(b.headers, b.body, b.echo)
	default:
		// An immediate response (or anything else) ends the request phase as it is.
		b.answered = true
		return resp
	}
}

// bodyChange reports whether the body the EPP forwards may differ from the client's: off the hot path always; on it
// when the model selector replaced the body or the Director forwards another model than the client asked for.
func (s *shapingStream) bodyChange() bool {
	return s.chunks == nil || !s.chunks.proxyHoldsBody || !s.chunks.forwardsClientModel
}

// bufferedBodyResponse is the answer to a BUFFERED body: the header mutation, route-cache flag and dynamic metadata
// of upstream's header answer, and, when echo, body as the new body with its content-length. Without echo the
// content-length upstream sets (the length of its re-encoded body) is dropped: the proxy forwards the client's body
// with the client's length.
func bufferedBodyResponse(headers *extprocv3.ProcessingResponse, body []byte, echo bool) *extprocv3.ProcessingResponse {
	hc := headers.GetRequestHeaders().GetResponse()
	mutation := &extprocv3.HeaderMutation{RemoveHeaders: hc.GetHeaderMutation().GetRemoveHeaders()}
	for _, h := range hc.GetHeaderMutation().GetSetHeaders() {
		if !strings.EqualFold(h.GetHeader().GetKey(), contentLength) {
			mutation.SetHeaders = append(mutation.SetHeaders, h)
		}
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: hc.GetClearRouteCache(), HeaderMutation: mutation}
	if echo {
		mutation.SetHeaders = append(mutation.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: contentLength, RawValue: []byte(strconv.Itoa(len(body)))},
		})
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	}
	return &extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
		DynamicMetadata: headers.GetDynamicMetadata(),
	}
}

// contentLength is the header name as Envoy's header maps hold it.
const contentLength = "content-length"
