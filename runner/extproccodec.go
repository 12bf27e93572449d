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

// Marshal implements encoding.CodecV2.
func (c extProcCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

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

// Field numbers of envoy.service.ext_proc.v3.ProcessingRequest.
const (
	processingRequestResponseBody    protowire.Number = 5
	processingRequestMetadataContext protowire.Number = 8
	processingRequestAttributes      protowire.Number = 9
)

// unmarshalProcessingRequest is proto.Unmarshal of b into req, except that a message that decodes as a response body
// leaves out its metadata_context and attributes (their bytes are skipped, not decoded, so not validated either: a
// response body message whose metadata protobuf would refuse, such as a string that is not UTF-8, is accepted).
func unmarshalProcessingRequest(b []byte, req *extprocv3.ProcessingRequest) error {
	if !skipsResponseBodyExtras(b) {
		return proto.Unmarshal(b, req)
	}
	proto.Reset(req)
	merge := proto.UnmarshalOptions{Merge: true}
	// A message is the merge of its fields: the runs of fields between the skipped ones decode one after the other
	// into req as the whole message would.
	run := 0
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		next := off + n + m // skipsResponseBodyExtras checked every field
		if skippedField(num, typ) {
			if err := merge.Unmarshal(b[run:off], req); err != nil {
				return err
			}
			run = next
		}
		off = next
	}
	if err := merge.Unmarshal(b[run:], req); err != nil {
		return err
	}
	if req.GetResponseBody() == nil {
		// The oneof's last member was not the response body after all (a malformed or unusual message): decode all.
		return proto.Unmarshal(b, req)
	}
	return nil
}

// skipsResponseBodyExtras reports whether b is a well-formed protobuf message with a response_body field and a
// metadata_context or attributes field to skip.
func skipsResponseBodyExtras(b []byte) bool {
	body, extras := false, false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return false
		}
		body = body || num == processingRequestResponseBody && typ == protowire.BytesType
		extras = extras || skippedField(num, typ)
		b = b[n+m:]
	}
	return body && extras
}

// skippedField reports whether a field is one the codec skips in a response body message: metadata_context or
// attributes, encoded as such (with another wire type protobuf keeps it as an unknown field, and so does the codec).
func skippedField(num protowire.Number, typ protowire.Type) bool {
	return typ == protowire.BytesType && (num == processingRequestMetadataContext || num == processingRequestAttributes)
}
