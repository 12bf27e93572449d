package conformance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/testbed/dataplane"
)

// This file plays Envoy's ext_proc filter as GIE's recommended configuration
// sets it up (examples/envoy/envoy.yaml; GIE v1.5.0 config/charts): request
// and response headers SEND, bodies FULL_DUPLEX_STREAMED, metadata forwarded
// in the envoy.lb and envoy.lb.subset_hint namespaces and received in
// envoy.lb. Unlike the data plane (testbed/dataplane), which acts on the
// EPP's answers, it records them verbatim, so a case can check what the
// protocol says about each one.

// envoyChunkSize is the largest body chunk sent in one message: Envoy's
// per_connection_buffer_limit_bytes in GIE's reference configuration.
const envoyChunkSize = 32 << 10

// errProtocol marks an EPP answer that breaks the ext_proc protocol in
// FULL_DUPLEX_STREAMED mode (an answer out of order, or a missing one).
var errProtocol = errors.New("ext_proc protocol violation")

// Envoy is one proxy's gRPC connection to an EPP's ext_proc service.
type Envoy struct {
	conn *grpc.ClientConn
}

// DialEnvoy connects to the ext_proc server at addr, over TLS without
// verifying the EPP's certificate when useTLS (GIE's reference Envoy
// configuration accepts the EPP's self-signed certificate the same way),
// else in plaintext (the suite's standard flags include
// --secure-serving=false).
func DialEnvoy(addr string, useTLS bool) (*Envoy, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as Envoy's empty validation_context
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	return &Envoy{conn: conn}, nil
}

// Close releases the connection.
func (e *Envoy) Close() error { return e.conn.Close() }

// Stream opens a raw ext_proc stream, for cases that send what Envoy never
// would.
func (e *Envoy) Stream(ctx context.Context) (extprocv3.ExternalProcessor_ProcessClient, error) {
	return extprocv3.NewExternalProcessorClient(e.conn).Process(ctx)
}

// Request is one HTTP request as the proxy hands it to the EPP.
type Request struct {
	// Method and Path default to POST /v1/chat/completions.
	Method, Path string
	// Headers are the client's headers (lower case). x-request-id and
	// content-length are added as Envoy adds them unless given.
	Headers map[string]string
	// Body is the request body; nil sends headers with end_of_stream.
	Body []byte
	// Subset is the endpoint subset hint (envoy.lb.subset_hint); nil sends
	// none, an empty non-nil slice sends an empty list.
	Subset []string
	// Response, when set, is played back as the model server's answer once
	// the EPP routed the request.
	Response *Reply
}

// Reply is a model server's response as the proxy passes it to the EPP.
type Reply struct {
	// Status defaults to 200.
	Status int
	// Headers are the response headers (content-type etc.).
	Headers map[string]string
	// Chunks are the body chunks in arrival order; none means no body.
	Chunks [][]byte
	// Served is the endpoint that answered, sent in envoy.lb metadata
	// (x-gateway-destination-endpoint-served); "" sends no envoy.lb.
	Served string
}

// Immediate is an ImmediateResponse from the EPP.
type Immediate struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Decision is everything the EPP answered for one request.
type Decision struct {
	// Immediate is set when the EPP answered the request itself.
	Immediate *Immediate
	// SetHeaders are the request header mutation's set headers, keys in
	// lower case; RemovedHeaders its removals.
	SetHeaders     map[string]string
	RemovedHeaders []string
	// Metadata is the dynamic metadata of the request headers answer:
	// namespace -> key -> value.
	Metadata map[string]map[string]any
	// Body is the body the proxy forwards: the EPP's streamed mutation when
	// there is one (BodyMutated), else the original.
	Body        []byte
	BodyMutated bool

	// ResponseHeaders are the response header mutation's set headers (lower
	// case keys); ResponseBody the body the client receives and
	// ResponseChunks its chunks as the EPP sent them (empty ones left out).
	ResponseHeaders map[string]string
	ResponseBody    []byte
	ResponseChunks  int
}

// Destination is the x-gateway-destination-endpoint header value.
func (d *Decision) Destination() string { return d.SetHeaders[metadata.DestinationEndpointKey] }

// MetadataDestination is envoy.lb/x-gateway-destination-endpoint.
func (d *Decision) MetadataDestination() string {
	v, _ := d.Metadata[metadata.DestinationEndpointNamespace][metadata.DestinationEndpointKey].(string)
	return v
}

// Exchange sends req on a new ext_proc stream exactly as Envoy does and
// returns the EPP's answers. An error means the EPP broke the stream or the
// protocol (or ctx ended first: a hang).
func (e *Envoy) Exchange(ctx context.Context, req Request) (*Decision, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := e.Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.CloseSend() }()
	d, err := requestPhase(stream, req)
	if err != nil || d.Immediate != nil || req.Response == nil {
		return d, err
	}
	return d, responsePhase(stream, d, *req.Response)
}

func (r Request) headerMap() *corev3.HeaderMap {
	method, path := r.Method, r.Path
	if method == "" {
		method = "POST"
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	hm := &corev3.HeaderMap{}
	add := func(k, v string) {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	add(":method", method)
	add(":path", path)
	add(":authority", "gateway.conformance")
	add(":scheme", "http")
	if _, ok := r.Headers["x-request-id"]; !ok {
		add("x-request-id", uuid.NewString())
	}
	if _, ok := r.Headers["content-length"]; !ok && r.Body != nil {
		add("content-length", strconv.Itoa(len(r.Body)))
	}
	if _, ok := r.Headers["content-type"]; !ok && r.Body != nil {
		add("content-type", "application/json")
	}
	for k, v := range r.Headers {
		add(k, v)
	}
	return hm
}

// chunks splits body into Envoy-sized chunks (one empty chunk for an empty
// body).
func chunks(body []byte) [][]byte {
	var out [][]byte
	for off := 0; off < len(body); off += envoyChunkSize {
		out = append(out, body[off:min(off+envoyChunkSize, len(body))])
	}
	if len(out) == 0 {
		out = [][]byte{{}}
	}
	return out
}

// requestPhase sends the headers and body chunks without waiting (full
// duplex) and reads the answers: a headers response then the streamed body
// up to end_of_stream, or an ImmediateResponse at any point.
func requestPhase(stream extprocv3.ExternalProcessor_ProcessClient, req Request) (*Decision, error) {
	md := dataplane.MetadataContext(req.Subset, "")
	msgs := []*extprocv3.ProcessingRequest{{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: req.headerMap(), EndOfStream: req.Body == nil,
		}},
		MetadataContext: md,
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}}
	if req.Body != nil {
		cs := chunks(req.Body)
		for i, c := range cs {
			msgs = append(msgs, &extprocv3.ProcessingRequest{
				Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
					Body: c, EndOfStream: i == len(cs)-1,
				}},
				MetadataContext: md,
			})
		}
	}
	sent := sendAll(stream, msgs)

	d := &Decision{SetHeaders: map[string]string{}, Metadata: map[string]map[string]any{}}
	gotHeaders, bodyDone := false, req.Body == nil
	var mutated []byte
	for !gotHeaders || !bodyDone {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: stream ended before the request was answered", errProtocol)
			}
			return d, err
		}
		mergeMetadata(d.Metadata, resp.GetDynamicMetadata())
		switch v := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			d.Immediate = immediate(v.ImmediateResponse)
			return d, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if gotHeaders {
				return d, fmt.Errorf("%w: a second request headers answer", errProtocol)
			}
			gotHeaders = true
			hm := v.RequestHeaders.GetResponse().GetHeaderMutation()
			for _, h := range hm.GetSetHeaders() {
				d.SetHeaders[strings.ToLower(h.GetHeader().GetKey())] = headerValue(h.GetHeader())
			}
			d.RemovedHeaders = hm.GetRemoveHeaders()
		case *extprocv3.ProcessingResponse_RequestBody:
			if !gotHeaders || bodyDone {
				return d, fmt.Errorf("%w: a request body answer before the headers answer or after end_of_stream", errProtocol)
			}
			sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return d, fmt.Errorf("%w: a request body answer without streamed_response in FULL_DUPLEX_STREAMED mode", errProtocol)
			}
			d.BodyMutated = true
			mutated = append(mutated, sr.GetBody()...)
			bodyDone = sr.GetEndOfStream()
		default:
			return d, fmt.Errorf("%w: %T during the request phase", errProtocol, v)
		}
	}
	if err := <-sent; err != nil {
		return d, fmt.Errorf("sending the request: %w", err)
	}
	d.Body = req.Body
	if d.BodyMutated {
		d.Body = mutated
	}
	return d, nil
}

// responsePhase plays the model server's answer: headers, then every body
// chunk without waiting, and collects the EPP's header mutation and
// streamed body.
func responsePhase(stream extprocv3.ExternalProcessor_ProcessClient, d *Decision, r Reply) error {
	md := dataplane.MetadataContext(nil, r.Served)
	status := r.Status
	if status == 0 {
		status = 200
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(status))}}}
	for k, v := range r.Headers {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	msgs := []*extprocv3.ProcessingRequest{{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: hm, EndOfStream: len(r.Chunks) == 0,
		}},
		MetadataContext: md,
	}}
	for i, c := range r.Chunks {
		msgs = append(msgs, &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
				Body: c, EndOfStream: i == len(r.Chunks)-1,
			}},
			MetadataContext: md,
		})
	}
	sent := sendAll(stream, msgs)

	d.ResponseHeaders = map[string]string{}
	gotHeaders, bodyDone := false, len(r.Chunks) == 0
	for !gotHeaders || !bodyDone {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: stream ended before the response was answered", errProtocol)
			}
			return err
		}
		switch v := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			if gotHeaders {
				return fmt.Errorf("%w: a second response headers answer", errProtocol)
			}
			gotHeaders = true
			for _, h := range v.ResponseHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				d.ResponseHeaders[strings.ToLower(h.GetHeader().GetKey())] = headerValue(h.GetHeader())
			}
		case *extprocv3.ProcessingResponse_ResponseBody:
			if !gotHeaders || bodyDone {
				return fmt.Errorf("%w: a response body answer before the headers answer or after end_of_stream", errProtocol)
			}
			sr := v.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return fmt.Errorf("%w: a response body answer without streamed_response in FULL_DUPLEX_STREAMED mode", errProtocol)
			}
			if len(sr.GetBody()) > 0 {
				d.ResponseChunks++
				d.ResponseBody = append(d.ResponseBody, sr.GetBody()...)
			}
			bodyDone = sr.GetEndOfStream()
		case *extprocv3.ProcessingResponse_ResponseTrailers:
		default:
			return fmt.Errorf("%w: %T during the response phase", errProtocol, v)
		}
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("sending the response: %w", err)
	}
	return nil
}

// sendAll sends msgs in a goroutine of its own, as Envoy streams a body
// while the EPP may already answer (or reject) it, and reports the first
// error (nil once all are sent) on the channel.
func sendAll(stream extprocv3.ExternalProcessor_ProcessClient, msgs []*extprocv3.ProcessingRequest) <-chan error {
	sent := make(chan error, 1)
	go func() {
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	return sent
}

func immediate(ir *extprocv3.ImmediateResponse) *Immediate {
	im := &Immediate{Status: int(ir.GetStatus().GetCode()), Headers: map[string]string{}, Body: ir.GetBody()}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		im.Headers[strings.ToLower(h.GetHeader().GetKey())] = headerValue(h.GetHeader())
	}
	return im
}

// headerValue reads a header as Envoy does: raw_value, else value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func mergeMetadata(into map[string]map[string]any, s *structpb.Struct) {
	for ns, v := range s.AsMap() {
		inner, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if into[ns] == nil {
			into[ns] = map[string]any{}
		}
		for k, fv := range inner {
			into[ns][k] = fv
		}
	}
}
