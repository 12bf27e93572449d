package runner

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

// codecDecoded is what a hot-path stream reads of a decoded message: everything but the metadata and attributes of a
// response body message, which extProcCodec may skip (dropResponseBodyMetadata clears them after any decoding).
func codecDecoded(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
	if req.GetResponseBody() != nil {
		req.MetadataContext, req.Attributes = nil, nil
	}
	return req
}

func codecTestMessages(t testing.TB) map[string][]byte {
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{metadata.DestinationEndpointNamespace: {
		Fields: map[string]*structpb.Value{metadata.DestinationEndpointServedKey: structpb.NewStringValue("10.0.0.1:8000")}}}}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {
		Fields: map[string]*structpb.Value{"request.path": structpb.NewStringValue("/v1/chat/completions")}}}
	chunk := &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n")}}
	marshal := mustMarshal
	chunkWithMetadata := marshal(&extprocv3.ProcessingRequest{Request: chunk, MetadataContext: served, Attributes: attrs,
		ObservabilityMode: true})
	reqHeaders := marshal(&extprocv3.ProcessingRequest{MetadataContext: served, Attributes: attrs,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerList(":path", "/")}}})
	unknown := protowire.AppendTag(nil, 99, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("future"))
	metadataAsVarint := protowire.AppendTag(nil, processingRequestMetadataContext, protowire.VarintType)
	metadataAsVarint = protowire.AppendVarint(metadataAsVarint, 7)
	observabilityAsBytes := protowire.AppendBytes(protowire.AppendTag(nil, processingRequestObservability, protowire.BytesType), []byte{1})
	return map[string][]byte{
		"response body with metadata, attributes and a later field": chunkWithMetadata,
		"an observer's response body, observability_mode first": append(marshal(&extprocv3.ProcessingRequest{ObservabilityMode: true}),
			marshal(&extprocv3.ProcessingRequest{Request: chunk, MetadataContext: served})...),
		"observability_mode set, then cleared": append(bytes.Clone(chunkWithMetadata), protowire.AppendVarint(
			protowire.AppendTag(nil, processingRequestObservability, protowire.VarintType), 0)...),
		"observability_mode as bytes": append(bytes.Clone(chunkWithMetadata), observabilityAsBytes...),
		"response body, metadata first": append(marshal(&extprocv3.ProcessingRequest{MetadataContext: served}),
			marshal(&extprocv3.ProcessingRequest{Request: chunk})...),
		"two response bodies merge": append(marshal(&extprocv3.ProcessingRequest{Request: chunk, MetadataContext: served}), marshal(&extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})...),
		"response body without metadata": marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: []byte("data: [DONE]\n\n"), EndOfStream: true}}}),
		"response body with unknown fields":          append(append(bytes.Clone(unknown), chunkWithMetadata...), unknown...),
		"response body, metadata as a varint":        append(bytes.Clone(chunkWithMetadata), metadataAsVarint...),
		"request headers keep metadata":              reqHeaders,
		"a later oneof member wins over the body":    append(bytes.Clone(chunkWithMetadata), reqHeaders...),
		"the body wins over an earlier oneof member": append(bytes.Clone(reqHeaders), chunkWithMetadata...),
		"response headers keep metadata": marshal(&extprocv3.ProcessingRequest{MetadataContext: served,
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}),
		"empty":            nil,
		"truncated":        chunkWithMetadata[:len(chunkWithMetadata)-3],
		"malformed body":   append(bytes.Clone(chunkWithMetadata), 0x2a, 0x05, 0x0a),
		"bad tag":          append(bytes.Clone(chunkWithMetadata), 0x00),
		"body as a varint": protowire.AppendVarint(protowire.AppendTag(bytes.Clone(chunkWithMetadata), processingRequestResponseBody, protowire.VarintType), 1),
	}
}

// TestExtProcCodecTakesObserverChunks: a response observer's chunk (observability_mode set, responseobserver.go)
// takes the fast path, with its observability_mode.
func TestExtProcCodecTakesObserverChunks(t *testing.T) {
	b := mustMarshal(&extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n")}}})
	body, end, observed, ok := decodeResponseBody(b)
	if !ok || !observed || end || string(body) != "data: {}\n\n" {
		t.Errorf("decodeResponseBody: %v, observed %v, fast path %v; want the chunk, observed, on the fast path", body, observed, ok)
	}
}

func TestExtProcCodecDecodesAsProtobuf(t *testing.T) {
	codec := newExtProcCodec()
	for name, b := range codecTestMessages(t) {
		t.Run(name, func(t *testing.T) { checkCodecDecode(t, codec, b) })
	}
}

// checkCodecDecode decodes b with codec and with proto.Unmarshal and compares what a hot-path stream reads of each,
// decoding into a new message and into one that holds a chunk decoded before (recvFromProxy's spare message).
func checkCodecDecode(t *testing.T, codec extProcCodec, b []byte) {
	t.Helper()
	want := &extprocv3.ProcessingRequest{}
	wantErr := proto.Unmarshal(b, want)
	used := &extprocv3.ProcessingRequest{}
	previous := mustMarshal(&extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {\"a chunk longer than most\":[]}\n\n")}}})
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(previous)}, used); err != nil {
		t.Fatal(err)
	}
	for _, got := range []*extprocv3.ProcessingRequest{
		{MetadataContext: &corev3.Metadata{}}, // a message with fields set is reset
		used,
	} {
		err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(b))}, got)
		switch {
		case wantErr == nil && err != nil:
			t.Fatalf("codec: %v; protobuf decodes %v", err, want)
		case wantErr != nil && err == nil && got.GetResponseBody() == nil:
			// Only the skipped fields of a response body message go unvalidated.
			t.Fatalf("codec decodes %v; protobuf: %v", got, wantErr)
		case wantErr == nil && !proto.Equal(codecDecoded(got), codecDecoded(want)):
			t.Fatalf("codec decodes\n%v\nwant\n%v", got, want)
		}
	}
}

// TestExtProcCodecSkipsChunkMetadata: a response chunk as the data plane sends it decodes without its metadata, into
// a new message in four allocations (the message, as gRPC's generated Recv allocates it, the oneof wrapper, the
// HttpBody and its body), and in none into a message that holds a chunk already (recvFromProxy's spare message).
func TestExtProcCodecSkipsChunkMetadata(t *testing.T) {
	chunk := newStreamedChat(1<<10, 2).chunks[0]
	if chunk.MetadataContext == nil {
		t.Fatal("the benchmark's chunk has no metadata")
	}
	data := mem.BufferSlice{mem.SliceBuffer(mustMarshal(chunk))}
	codec := newExtProcCodec()
	for _, tc := range []struct {
		name      string
		reuse     bool
		maxAllocs float64
	}{
		{name: "into a new message", maxAllocs: 4},
		{name: "into a message that holds a chunk", reuse: true, maxAllocs: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := &extprocv3.ProcessingRequest{}
			allocs := testing.AllocsPerRun(100, func() {
				if !tc.reuse {
					got = &extprocv3.ProcessingRequest{}
				}
				if err := codec.Unmarshal(data, got); err != nil {
					t.Fatal(err)
				}
			})
			if got.MetadataContext != nil || !proto.Equal(got.GetResponseBody(), chunk.GetResponseBody()) {
				t.Fatalf("decoded %v, want the chunk %v without metadata", got, chunk.GetResponseBody())
			}
			if allocs > tc.maxAllocs {
				t.Fatalf("%v allocations per chunk decoded, want at most %v", allocs, tc.maxAllocs)
			}
		})
	}
}

func TestExtProcCodecPassesOtherMessagesToProtobuf(t *testing.T) {
	codec := newExtProcCodec()
	in := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	data, err := codec.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out := &healthpb.HealthCheckResponse{}
	if err := codec.Unmarshal(data, out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("got %v, want %v", out, in)
	}
	if codec.Name() != "proto" {
		t.Fatalf("codec name %q: the proxy sends application/grpc+proto or application/grpc", codec.Name())
	}
}

// FuzzExtProcCodec holds extProcCodec's decoding to protobuf's on any input (the proxy's messages cross a trust
// boundary).
//
//	go test -run '^$' -fuzz FuzzExtProcCodec -fuzztime 100000x ./runner/
func FuzzExtProcCodec(f *testing.F) {
	for _, b := range codecTestMessages(f) {
		f.Add(b)
	}
	codec := newExtProcCodec()
	f.Fuzz(func(t *testing.T, b []byte) { checkCodecDecode(t, codec, b) })
}

// BenchmarkExtProcCodec decodes one streamed response chunk as the data plane sends it (with its filter metadata),
// with gRPC's protobuf codec and with Sluice's.
//
//	go test -run '^$' -bench ExtProcCodec -benchmem ./runner/
func BenchmarkExtProcCodec(b *testing.B) {
	data := mem.BufferSlice{mem.SliceBuffer(mustMarshal(newStreamedChat(1<<10, 2).chunks[0]))}
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"grpc-proto", newExtProcCodec().proto}, {"sluice", newExtProcCodec()}} {
		b.Run("codec="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.codec.Unmarshal(data, &extprocv3.ProcessingRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestStreamedChunkEncodesAsProtobuf: extProcCodec writes a streamedChunk byte for byte as proto.Marshal writes the
// ProcessingResponse it stands for, at every varint length boundary of the nested sizes.
func TestStreamedChunkEncodesAsProtobuf(t *testing.T) {
	for _, n := range []int{0, 1, 100, 115, 116, 120, 127, 128, 16371, 16372, 16383, 16384, 62000, 200000, 2100000} {
		checkStreamedChunk(t, bytes.Repeat([]byte("x"), n))
	}
}

func FuzzStreamedChunk(f *testing.F) {
	f.Add([]byte(`data: {"choices":[{"delta":{"content":"hi"}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkStreamedChunk(t, body) })
}

func checkStreamedChunk(t *testing.T, body []byte) {
	t.Helper()
	want, err := proto.Marshal(newChunkAnswer(body))
	if err != nil {
		t.Fatal(err)
	}
	data, err := newExtProcCodec().Marshal(&streamedChunk{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	if got := data.Materialize(); !bytes.Equal(got, want) {
		t.Fatalf("%d-byte body: encoded %d bytes %.64x, proto.Marshal %d bytes %.64x", len(body), len(got), got, len(want), want)
	}
}

// BenchmarkStreamedChunk prices encoding one chunk's answer: by hand (streamedChunk) against the message built and
// encoded with gRPC's protobuf codec, as upstream's handler's answer is.
func BenchmarkStreamedChunk(b *testing.B) {
	body := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764547200,"model":"base",` +
		`"choices":[{"index":0,"delta":{"content":"token "},"logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n")
	codec := newExtProcCodec()
	for _, tc := range []struct {
		name string
		msg  func() any
	}{
		{"by-hand", func() any { return &streamedChunk{Body: body} }},
		{"protobuf", func() any { return newChunkAnswer(body) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				data, err := codec.Marshal(tc.msg())
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}

// requestBodyAnswer is a request body's streamed answer as upstream's handler builds it (envoy.BuildChunkedBodyResponses).
func requestBodyAnswer(body []byte, end bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: end}}}}}}}
}

// TestRequestBodyAnswerEncodesAsProtobuf: extProcCodec writes every answer byte for byte as proto.Marshal does, and a
// request body's streamed answer of a long body (as upstream's handler sends the body back) around the body, without
// copying it: at every varint length boundary of the nested sizes, with and without the end of stream. An answer
// with any other field, at any level, goes through protobuf.
func TestRequestBodyAnswerEncodesAsProtobuf(t *testing.T) {
	for _, n := range []int{0, 1, aliasedBodyMinBytes - 1, aliasedBodyMinBytes, 16371, 16372, 16383, 16384, 62500, 200000, 2097139, 2097140, 2100000} {
		for _, end := range []bool{false, true} {
			body := bytes.Repeat([]byte("y"), n)
			checkRequestBodyAnswer(t, fmt.Sprintf("%d bytes, end %v", n, end), requestBodyAnswer(body, end), n >= aliasedBodyMinBytes)
		}
	}
	long := bytes.Repeat([]byte("z"), 62500)
	unknown := requestBodyAnswer(long, true)
	unknown.GetRequestBody().GetResponse().ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	for _, tc := range []struct {
		name   string
		answer func() *extprocv3.ProcessingResponse
	}{
		{"dynamic metadata", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, true)
			a.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStringValue("x")}}
			return a
		}},
		{"mode override", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, true)
			a.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_NONE}
			return a
		}},
		{"header mutation", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, true)
			a.GetRequestBody().Response.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}}
			return a
		}},
		{"clear route cache", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.GetRequestBody().Response.ClearRouteCache = true
			return a
		}},
		{"status", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.GetRequestBody().Response.Status = extprocv3.CommonResponse_CONTINUE_AND_REPLACE
			return a
		}},
		{"request drain", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, true)
			a.RequestDrain = true
			return a
		}},
		{"message timeout", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.OverrideMessageTimeout = durationpb.New(time.Second)
			return a
		}},
		{"trailers", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.GetRequestBody().Response.Trailers = &corev3.HeaderMap{}
			return a
		}},
		{"compressed", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GrpcMessageCompressed = true
			return a
		}},
		{"end of stream without message", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(long, false)
			a.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().EndOfStreamWithoutMessage = true
			return a
		}},
		{"unknown field", func() *extprocv3.ProcessingResponse { return unknown }},
		{"a whole body", func() *extprocv3.ProcessingResponse {
			a := requestBodyAnswer(nil, false)
			a.GetRequestBody().Response.BodyMutation.Mutation = &extprocv3.BodyMutation_Body{Body: long}
			return a
		}},
		{"a response body's answer", func() *extprocv3.ProcessingResponse { return newChunkAnswer(long) }},
	} {
		checkRequestBodyAnswer(t, tc.name, tc.answer(), false)
	}
}

// checkRequestBodyAnswer encodes answer with extProcCodec and proto.Marshal, and checks the bytes are the same and
// that the body was sent without a copy exactly when aliased says.
func checkRequestBodyAnswer(t *testing.T, name string, answer *extprocv3.ProcessingResponse, aliased bool) {
	t.Helper()
	want, err := proto.Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	data, err := newExtProcCodec().Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	if got := data.Materialize(); !bytes.Equal(got, want) {
		t.Fatalf("%s: encoded %d bytes %.64x, proto.Marshal %d bytes %.64x", name, len(got), got, len(want), want)
	}
	body := answer.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
	sharesBody := len(data) > 1 && len(body) > 0 && &data[1].ReadOnlyData()[0] == &body[0]
	if sharesBody != aliased {
		t.Errorf("%s: the encoding shares the body's memory: %v, want %v", name, sharesBody, aliased)
	}
}

// TestRequestBodyAnswerKnowsEveryField: streamedBodyAnswer checks each field of the messages an answer is made of by
// name; a version of the API with another field must add it to the check.
func TestRequestBodyAnswerKnowsEveryField(t *testing.T) {
	for _, tc := range []struct {
		msg   proto.Message
		known string
	}{
		{&extprocv3.ProcessingResponse{}, "request_headers response_headers request_body response_body request_trailers " +
			"response_trailers immediate_response streamed_immediate_response dynamic_metadata mode_override request_drain " +
			"override_message_timeout"},
		{&extprocv3.BodyResponse{}, "response"},
		{&extprocv3.CommonResponse{}, "status header_mutation body_mutation trailers clear_route_cache"},
		{&extprocv3.BodyMutation{}, "body clear_body streamed_response"},
		{&extprocv3.StreamedBodyResponse{}, "body end_of_stream end_of_stream_without_message grpc_message_compressed"},
	} {
		fields := tc.msg.ProtoReflect().Descriptor().Fields()
		var names []string
		for i := range fields.Len() {
			names = append(names, string(fields.Get(i).Name()))
		}
		if got := strings.Join(names, " "); got != tc.known {
			t.Errorf("%s has fields %q, streamedBodyAnswer checks %q", tc.msg.ProtoReflect().Descriptor().Name(), got, tc.known)
		}
	}
}

func FuzzRequestBodyAnswer(f *testing.F) {
	f.Add(bytes.Repeat([]byte(`{"model":"m"}`), 400), true, uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, end bool, extra uint8) {
		if len(body) > 0 && len(body) < aliasedBodyMinBytes { // the shapes of a long body, from a short input
			body = bytes.Repeat(body, aliasedBodyMinBytes/len(body)+1)
		}
		answer := requestBodyAnswer(body, end)
		switch extra % 4 {
		case 1:
			answer.GetRequestBody().Response.ClearRouteCache = true
		case 2:
			answer.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().EndOfStreamWithoutMessage = true
		}
		plain := extra%4 == 0 || extra%4 == 3
		checkRequestBodyAnswer(t, "fuzzed", answer, plain && len(body) >= aliasedBodyMinBytes)
	})
}

// BenchmarkRequestBodyAnswer prices encoding one of upstream's 62,000-byte answers that send a long request body back:
// around the body (extProcCodec) against gRPC's protobuf codec, which copies it into a zeroed buffer of gRPC's pool.
//
//	go test -run '^$' -bench RequestBodyAnswer -benchmem ./runner/
func BenchmarkRequestBodyAnswer(b *testing.B) {
	answer := requestBodyAnswer(bytes.Repeat([]byte("y"), 62000), false)
	codec := newExtProcCodec()
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"protobuf", codec.proto}, {"by-hand", codec}} {
		b.Run("codec="+c.name, func(b *testing.B) {
			b.SetBytes(62000)
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.codec.Marshal(answer)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}
