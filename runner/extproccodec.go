package runner

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// extProcCodec is the ext_proc server's gRPC codec on Sluice's hot path (hotpath.go). Every streamed response chunk
// crosses the EPP as a ProcessingRequest carrying the proxy's filter metadata (and any attributes the filter is
// configured to send); gRPC's protobuf codec decodes them into generic structpb maps that nothing on the hot path
// reads (dropResponseBodyMetadata clears them). This codec decodes a response body message without those two fields;
// every other message, and every encoding, is gRPC's protobuf codec's.
type extProcCodec struct {
	proto encoding.CodecV2
}

var _ encoding.CodecV2 = extProcCodec{}

func newExtProcCodec() extProcCodec {
	return extProcCodec{proto: encoding.GetCodecV2(grpcproto.Name)}
}

// Name implements encoding.CodecV2: the codec speaks protobuf, as the proxy expects.
func (c extProcCodec) Name() string { return grpcproto.Name }

// Marshal implements encoding.CodecV2: a streamedChunk by hand, a request body's streamed answer of a long body by
// hand around the body (streamedBodyAnswer), anything else with gRPC's protobuf codec.
func (c extProcCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *streamedChunk:
		return m.marshal(), nil
	case *extprocv3.ProcessingResponse:
		if body, end, ok := streamedBodyAnswer(m); ok {
			return marshalStreamedBodyAnswer(body, end), nil
		}
	}
	return c.proto.Marshal(v)
}

// aliasedBodyMinBytes is the shortest body a request body's streamed answer sends without copying it: below it the
// copy costs less than the check.
const aliasedBodyMinBytes = 4 << 10

// Field numbers of a request body's streamed answer beyond streamedChunk's.
const (
	processingResponseRequestBody   protowire.Number = 3
	streamedBodyResponseEndOfStream protowire.Number = 2
)

// streamedBodyAnswer reads r when it is a request body's streamed answer as upstream's handler sends the body back to
// the proxy (envoy.GenerateRequestBodyResponses: 62,500 bytes each): a ProcessingResponse whose only field is a
// request_body whose common response's only field is a streamed body mutation of a body (of at least
// aliasedBodyMinBytes) and an end of stream, with no other field and no unknown field at any level. It returns the body and the end of
// stream.
func streamedBodyAnswer(r *extprocv3.ProcessingResponse) (body []byte, end, ok bool) {
	rb, _ := r.Response.(*extprocv3.ProcessingResponse_RequestBody)
	if rb == nil {
		return nil, false, false
	}
	common := rb.RequestBody.GetResponse()
	mutation := common.GetBodyMutation()
	sr := mutation.GetStreamedResponse()
	if len(sr.GetBody()) < aliasedBodyMinBytes {
		return nil, false, false
	}
	// Every field of the five messages is checked by name (TestRequestBodyAnswerKnowsEveryField fails when a new
	// version of the API adds one): reflection over them cost more than the copy it saves.
	if r.DynamicMetadata != nil || r.ModeOverride != nil || r.RequestDrain || r.OverrideMessageTimeout != nil ||
		common.Status != 0 || common.HeaderMutation != nil || common.Trailers != nil || common.ClearRouteCache ||
		sr.EndOfStreamWithoutMessage || sr.GrpcMessageCompressed ||
		hasUnknown(r) || hasUnknown(rb.RequestBody) || hasUnknown(common) || hasUnknown(mutation) || hasUnknown(sr) {
		return nil, false, false
	}
	return sr.Body, sr.EndOfStream, true
}

// hasUnknown reports whether m holds fields its version of the API does not know.
func hasUnknown(m proto.Message) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}

// marshalStreamedBodyAnswer encodes a request body's streamed answer of body and end as proto.Marshal encodes it, in
// three pieces: the tags and lengths before the body, the body itself, and the end of stream. The body is not copied
// into a buffer of gRPC's pool (taken, zeroed and filled: 62,500 bytes per answer, five answers for a 256 KB body);
// gRPC's transport copies it into its HTTP/2 frames, as it copies any message. That it reads the body after SendMsg
// returns (the message waits for the stream's flow control) is what gRPC's SendMsg allows: the sender must not change
// a message once it is handed to SendMsg.
func marshalStreamedBodyAnswer(body []byte, end bool) mem.BufferSlice {
	streamed := protowire.SizeTag(streamedBodyResponseBody) + protowire.SizeBytes(len(body))
	if end {
		streamed += protowire.SizeTag(streamedBodyResponseEndOfStream) + protowire.SizeVarint(1)
	}
	head := appendStreamedMutationHead(make([]byte, 0, 32), processingResponseRequestBody, streamed)
	head = protowire.AppendTag(head, streamedBodyResponseBody, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(body)))
	if !end {
		return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(body)}
	}
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(body), mem.SliceBuffer(endOfStream)}
}

// endOfStream is a StreamedBodyResponse's end_of_stream field, true.
var endOfStream = protowire.AppendVarint(protowire.AppendTag(nil, streamedBodyResponseEndOfStream, protowire.VarintType), 1)

// streamedChunk is the answer to a response chunk that upstream's handler sends and the hot path's stream sends in
// its place (answerChunk): a ProcessingResponse whose only field is a response_body whose common response's only
// field is a streamed body mutation of Body that does not end the stream. The stream hands it to gRPC's SendMsg, and
// extProcCodec encodes it by hand, byte for byte what proto.Marshal writes for that message
// (TestStreamedChunkEncodesAsProtobuf), without building the message's seven structs or protobuf's reflection.
type streamedChunk struct {
	Body []byte
}

// Field numbers of the messages a streamedChunk is.
const (
	processingResponseResponseBody protowire.Number = 4
	bodyResponseResponse           protowire.Number = 1
	commonResponseBodyMutation     protowire.Number = 3
	bodyMutationStreamedResponse   protowire.Number = 3
	streamedBodyResponseBody       protowire.Number = 1
)

// marshal encodes a as proto.Marshal encodes the ProcessingResponse it stands for, into a buffer of gRPC's pool.
func (a *streamedChunk) marshal() mem.BufferSlice {
	streamed := 0 // StreamedBodyResponse
	if len(a.Body) > 0 {
		streamed = protowire.SizeTag(streamedBodyResponseBody) + protowire.SizeBytes(len(a.Body))
	}
	size := streamedMutationSize(processingResponseResponseBody, streamed)
	var b []byte
	var buf *[]byte
	pool := mem.DefaultBufferPool()
	if mem.IsBelowBufferPoolingThreshold(size) { // as gRPC's protobuf codec: a small message in its own slice
		b = make([]byte, 0, size)
	} else {
		buf = pool.Get(size)
		b = (*buf)[:0]
	}
	b = appendStreamedMutationHead(b, processingResponseResponseBody, streamed)
	if len(a.Body) > 0 {
		b = protowire.AppendTag(b, streamedBodyResponseBody, protowire.BytesType)
		b = protowire.AppendBytes(b, a.Body)
	}
	if buf == nil {
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}
}

// streamedMutationSize is the size of a ProcessingResponse whose only field, outer (request_body or response_body), is
// a BodyResponse whose common response's only field is a streamed body mutation of size streamed.
func streamedMutationSize(outer protowire.Number, streamed int) int {
	answer, _, _ := streamedMutationSizes(streamed)
	return protowire.SizeTag(outer) + protowire.SizeBytes(answer)
}

// appendStreamedMutationHead appends to b the tags and lengths that come before the fields of that streamed body
// mutation (streamedMutationSize).
func appendStreamedMutationHead(b []byte, outer protowire.Number, streamed int) []byte {
	answer, common, mutation := streamedMutationSizes(streamed)
	b = protowire.AppendTag(b, outer, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(answer))
	b = protowire.AppendTag(b, bodyResponseResponse, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(common))
	b = protowire.AppendTag(b, commonResponseBodyMutation, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(mutation))
	b = protowire.AppendTag(b, bodyMutationStreamedResponse, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(streamed))
}

// streamedMutationSizes are the sizes of the BodyResponse, its CommonResponse and its BodyMutation around a
// StreamedBodyResponse of size streamed.
func streamedMutationSizes(streamed int) (answer, common, mutation int) {
	mutation = protowire.SizeTag(bodyMutationStreamedResponse) + protowire.SizeBytes(streamed)
	common = protowire.SizeTag(commonResponseBodyMutation) + protowire.SizeBytes(mutation)
	answer = protowire.SizeTag(bodyResponseResponse) + protowire.SizeBytes(common)
	return answer, common, mutation
}

// Unmarshal implements encoding.CodecV2.
func (c extProcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return unmarshalProcessingRequest(buf.ReadOnlyData(), req)
}

// Field numbers of envoy.service.ext_proc.v3.ProcessingRequest and HttpBody.
const (
	processingRequestResponseBody    protowire.Number = 5
	processingRequestMetadataContext protowire.Number = 8
	processingRequestAttributes      protowire.Number = 9
	processingRequestObservability   protowire.Number = 10
	httpBodyBody                     protowire.Number = 1
	httpBodyEndOfStream              protowire.Number = 2
)

// unmarshalProcessingRequest is proto.Unmarshal of b into req, except that a response body message as proxies send
// it (one response_body with its body and end of stream, the filter metadata and attributes) is decoded here, without
// its metadata_context and attributes: their bytes are skipped, not decoded, so not validated either (a response body
// message whose metadata protobuf would refuse, such as a string that is not UTF-8, is accepted). Its
// observability_mode (a response observer's chunk, responseobserver.go) is decoded. Any other message, or a response
// body with any other field, takes proto.Unmarshal.
//
// A req that holds a response body already (a chunk the stream answered itself, decoded into again: recvFromProxy)
// keeps its oneof wrapper, its HttpBody and its body's capacity: a streamed response is ~130 such messages, and the
// three allocations, with the message itself, were a third of the hot path's per chunk.
func unmarshalProcessingRequest(b []byte, req *extprocv3.ProcessingRequest) error {
	body, end, observed, ok := decodeResponseBody(b)
	if !ok {
		return proto.Unmarshal(b, req)
	}
	rb, _ := req.Request.(*extprocv3.ProcessingRequest_ResponseBody)
	if rb == nil || rb.ResponseBody == nil {
		rb = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{}}
	}
	hb := rb.ResponseBody
	// b is gRPC's buffer, reused once decoded: the body is copied. An empty body stays nil in a new HttpBody.
	*hb = extprocv3.HttpBody{Body: append(hb.Body[:0], body...), EndOfStream: end}
	*req = extprocv3.ProcessingRequest{Request: rb, ObservabilityMode: observed}
	return nil
}

// decodeResponseBody reads b when it is a well-formed ProcessingRequest of one response_body field whose HttpBody
// has only a body and an end of stream, and besides it only metadata_context, attributes and observability_mode
// fields: the body (pointing into b), its end of stream and the observability mode.
func decodeResponseBody(b []byte) (body []byte, end, observed, ok bool) {
	var httpBody []byte
	seen := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, false, false
		}
		if num == processingRequestObservability && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b[n:])
			if m < 0 {
				return nil, false, false, false
			}
			observed = protowire.DecodeBool(v)
			b = b[n+m:]
			continue
		}
		if typ != protowire.BytesType {
			return nil, false, false, false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, false, false, false
		}
		switch num {
		case processingRequestResponseBody:
			if seen { // a second one would be merged into the first
				return nil, false, false, false
			}
			httpBody, seen = v, true
		case processingRequestMetadataContext, processingRequestAttributes:
		default:
			return nil, false, false, false
		}
		b = b[n+m:]
	}
	if !seen {
		return nil, false, false, false
	}
	body, end, ok = decodeHTTPBody(httpBody)
	return body, end, observed, ok
}

// decodeHTTPBody reads an HttpBody that has only a body and an end of stream (as protobuf does, the last of a
// repeated field wins): the body points into b.
func decodeHTTPBody(b []byte) (body []byte, end, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, false
		}
		b = b[n:]
		switch {
		case num == httpBodyBody && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false, false
			}
			body = v
			b = b[m:]
		case num == httpBodyEndOfStream && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, false, false
			}
			end = protowire.DecodeBool(v)
			b = b[m:]
		default:
			return nil, false, false
		}
	}
	return body, end, true
}
