package runner

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// upstreamLikeHandler answers a request's body as upstream's handler does in FULL_DUPLEX_STREAMED mode (nothing until
// the body ends, then its header answer, with the destination, a content-length and dynamic metadata, and the body it
// forwards streamed back in two answers), or with an immediate response; it sets the hot path's forwardsClientModel
// as the hot Director would.
type upstreamLikeHandler struct {
	forward             []byte // the body upstream forwards; nil: the body it received
	forwardsClientModel bool
	reject              *extprocv3.ImmediateResponse // answer the body with this instead
	received            []*extprocv3.ProcessingRequest
}

func (u *upstreamLikeHandler) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		req, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		u.received = append(u.received, req)
		if h := req.GetRequestHeaders(); h != nil && h.EndOfStream {
			if err := s.Send(upstreamHeaderAnswer(0)); err != nil {
				return err
			}
			continue
		}
		b := req.GetRequestBody()
		if b == nil {
			continue
		}
		body = append(body, b.Body...)
		if !b.EndOfStream {
			continue
		}
		if u.reject != nil {
			return s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: u.reject}})
		}
		if c := chunkCountOf(s.Context()); c != nil {
			c.forwardsClientModel = u.forwardsClientModel
		}
		forward := body
		if u.forward != nil {
			forward = u.forward
		}
		answers := []*extprocv3.ProcessingResponse{upstreamHeaderAnswer(len(forward))}
		half := len(forward) / 2
		for i, part := range [][]byte{forward[:half], forward[half:]} {
			answers = append(answers, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
						Body: part, EndOfStream: i == 1}}}}}}})
		}
		for _, a := range answers {
			if err := s.Send(a); err != nil {
				return err
			}
		}
	}
}

// upstreamHeaderAnswer is upstream's answer to the request headers (generateRequestHeaderResponse): the destination,
// Content-Length of the forwarded body when it has one, the route cache cleared, the destination in dynamic metadata.
func upstreamHeaderAnswer(size int) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: metadata.DestinationEndpointKey, RawValue: []byte("10.0.0.1:8000")}}}
	if size > 0 {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "Content-Length", RawValue: []byte(strconv.Itoa(size))}})
	}
	set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-request-id", RawValue: []byte("r1")}})
	md, _ := structpb.NewStruct(map[string]any{metadata.DestinationEndpointNamespace: map[string]any{metadata.DestinationEndpointKey: "10.0.0.1:8000"}})
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}}},
		DynamicMetadata: md,
	}
}

// bufferedHeaders is a request's headers as a proxy that buffers the request body sends them.
func bufferedHeaders(eos bool) *extprocv3.ProcessingRequest {
	r := reqHeaders(eos, "x-request-id", "r1")
	r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	return r
}

// bodyAnswer is the answer to a BUFFERED body the EPP should send: upstream's header mutation (less its
// content-length), the route cache cleared, the dynamic metadata, and, when body is not nil, body with its length.
func bodyAnswer(body []byte) *extprocv3.ProcessingResponse {
	want := upstreamHeaderAnswer(0)
	common := want.GetRequestHeaders().GetResponse()
	if body != nil {
		common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, &corev3.HeaderValueOption{
			Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}})
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	}
	want.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	return want
}

var trailersAnswer = &extprocv3.ProcessingResponse{
	Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}

var emptyHeadersAnswer = &extprocv3.ProcessingResponse{
	Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}

// TestBufferedBodyAnswers: with protocol_config announcing a BUFFERED request body, the stream answers the request
// headers itself at once and turns upstream's header answer and streamed body into one BodyResponse carrying the
// header mutation and dynamic metadata, the body only when it changed (with its content-length); immediate responses
// and everything without BUFFERED pass as before.
func TestBufferedBodyAnswers(t *testing.T) {
	const client = `{"model":"base","messages":[{"role":"user","content":"hi"}]}`
	rewritten := []byte(`{"messages":[{"content":"hi","role":"user"}],"model":"served"}`)
	reencoded := []byte(`{"messages":[{"content":"hi","role":"user"}],"model":"base"}`)
	streamed := func(forward []byte) []*extprocv3.ProcessingResponse {
		var out []*extprocv3.ProcessingResponse
		out = append(out, upstreamHeaderAnswer(len(forward)))
		half := len(forward) / 2
		for i, part := range [][]byte{forward[:half], forward[half:]} {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
						Body: part, EndOfStream: i == 1}}}}}}})
		}
		return out
	}
	tooMany := &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: []byte("shed")}
	tests := []struct {
		name     string
		in       []*extprocv3.ProcessingRequest
		upstream *upstreamLikeHandler
		hot      bool
		selector ModelSelector
		maxBody  int64 // the most the model selection holds; 0: 1 MiB
		want     []*extprocv3.ProcessingResponse
		// wantImmediate, when set, is the status of the last answer, an immediate response with an OpenAI-style body.
		wantImmediate int
	}{
		{
			name:     "streamed body: upstream's answers pass unchanged",
			in:       []*extprocv3.ProcessingRequest{reqHeaders(false, "x-request-id", "r1"), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			hot:      true,
			want:     streamed(reencoded),
		},
		{
			name:     "buffered, hot path, client's model: headers and metadata, no body, no content-length",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			hot:      true,
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(nil)},
		},
		{
			name:     "buffered, hot path, model rewritten: the new body with its content-length",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: rewritten},
			hot:      true,
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(rewritten)},
		},
		{
			name:     "buffered, hot path, model selector: the body is held, then answered once",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			hot:      true,
			selector: &fakeSelector{},
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(nil)},
		},
		{
			name:     "buffered, hot path, the selector replaced the body: it goes back",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: rewritten, forwardsClientModel: true},
			hot:      true,
			selector: bodyReplacer(rewritten),
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(rewritten)},
		},
		{
			name:     "buffered, upstream's path: the body always goes back",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(reencoded)},
		},
		{
			name:     "buffered, trailers follow: the body (end_of_stream false) is the whole body, the trailers answered",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, false), reqTrailers()},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			hot:      true,
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(nil), trailersAnswer},
		},
		{
			name:     "buffered, trailers follow, model selector: the hold ends at the body",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, false), reqTrailers()},
			upstream: &upstreamLikeHandler{forward: reencoded, forwardsClientModel: true},
			hot:      true,
			selector: &fakeSelector{},
			want:     []*extprocv3.ProcessingResponse{emptyHeadersAnswer, bodyAnswer(nil), trailersAnswer},
		},
		{
			name:          "buffered, rejected: the immediate response follows the headers' answer, shaped",
			in:            []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream:      &upstreamLikeHandler{reject: tooMany},
			hot:           true,
			wantImmediate: 429,
		},
		{
			name:          "buffered, a body too large for the model selection to hold: 413 after the headers' answer",
			in:            []*extprocv3.ProcessingRequest{bufferedHeaders(false), reqBody(client, true)},
			upstream:      &upstreamLikeHandler{},
			hot:           true,
			selector:      &fakeSelector{},
			maxBody:       8,
			wantImmediate: 413,
		},
		{
			name:     "buffered announced, no body: upstream answers the headers",
			in:       []*extprocv3.ProcessingRequest{bufferedHeaders(true)},
			upstream: &upstreamLikeHandler{},
			hot:      true,
			want:     []*extprocv3.ProcessingResponse{upstreamHeaderAnswer(0)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			maxBody := tt.maxBody
			if maxBody == 0 {
				maxBody = 1 << 20
			}
			decisions, err := decisiontrace.New(decisiontrace.Config{Size: 4})
			if err != nil {
				t.Fatal(err)
			}
			srv := &shapingServer{upstream: tt.upstream, shapers: []ResponseShaper{OpenAIErrorBody}, hot: tt.hot,
				selector: tt.selector, maxBodyBytes: maxBody, decisions: decisions}
			// The decision trace records the answer the proxy gets, whatever the body mode.
			defer func() {
				records := decisions.Records("", 0)
				if len(records) != 1 {
					t.Fatalf("decision trace %+v, want one record", records)
				}
				r := records[0]
				if tt.wantImmediate != 0 && (r.Outcome != decisiontrace.Answered || r.Status != tt.wantImmediate) {
					t.Errorf("decision trace %+v, want the %d answer", r, tt.wantImmediate)
				}
				if tt.wantImmediate == 0 && (r.Outcome != decisiontrace.Routed || r.Endpoint != "10.0.0.1:8000") {
					t.Errorf("decision trace %+v, want the request routed to 10.0.0.1:8000", r)
				}
			}()
			if tt.selector != nil {
				srv.clock = clocktesting.NewFakeClock(time.Unix(0, 0))
			}
			stream := &fakeProxyStream{ctx: context.Background(), in: tt.in}
			if err := srv.Process(stream); err != nil {
				t.Fatal(err)
			}
			if tt.wantImmediate != 0 {
				if len(stream.sent) != 2 || !proto.Equal(stream.sent[0], emptyHeadersAnswer) {
					t.Fatalf("answers %v, want the headers' empty answer and an immediate response", stream.sent)
				}
				ir := stream.sent[1].GetImmediateResponse()
				if int(ir.GetStatus().GetCode()) != tt.wantImmediate || !bytes.HasPrefix(ir.GetBody(), []byte(`{"error":`)) {
					t.Fatalf("last answer %v, want %d with an OpenAI-style body", stream.sent[1], tt.wantImmediate)
				}
				return
			}
			if len(stream.sent) != len(tt.want) {
				t.Fatalf("%d answers %v, want %d: %v", len(stream.sent), stream.sent, len(tt.want), tt.want)
			}
			for i := range tt.want {
				if !proto.Equal(stream.sent[i], tt.want[i]) {
					t.Errorf("answer %d:\n got %v\nwant %v", i, stream.sent[i], tt.want[i])
				}
			}
			// Upstream's handler sees the proxy's messages as ever.
			if len(tt.upstream.received) != len(tt.in) {
				t.Errorf("upstream received %d messages, want %d", len(tt.upstream.received), len(tt.in))
			}
		})
	}
}

// bodyReplacer is a ModelSelector that writes its choice into the body itself.
type bodyReplacer []byte

func (b bodyReplacer) SelectModel(context.Context, map[string]string, []byte) ModelChoice {
	return ModelChoice{Body: b}
}

// TestBufferedBodyThroughTheEPP plays one chat through a whole EPP as a proxy with a BUFFERED request body does, and
// compares the answer with the FULL_DUPLEX_STREAMED exchange of the same chat: the same routing headers and metadata;
// on the hot path no body when the model is the client's, and on every path the very body the streamed exchange
// forwards, with its length, when the model is rewritten (the selector serves another model) or off the hot path.
func TestBufferedBodyThroughTheEPP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts EPPs")
	}
	quietLogs(t)
	for _, tc := range []struct {
		profile  string
		selector ModelSelector
		echo     bool
	}{
		{"sluice", keepModel{}, false},
		{"sluice", servedAs("served"), true},
		{"upstream-default", keepModel{}, true},
	} {
		t.Run(fmt.Sprintf("%s/%T", tc.profile, tc.selector), func(t *testing.T) {
			h, err := startBenchEPPWith(t, tc.profile, tc.selector)
			if err != nil {
				t.Fatal(err)
			}
			answers := map[bool][]*extprocv3.ProcessingResponse{}
			for _, buffered := range []bool{false, true} {
				chat := newStreamedChat(100<<10, 4)
				chat.buffered = buffered
				record := func(r *extprocv3.ProcessingResponse) {
					switch r.Response.(type) {
					case *extprocv3.ProcessingResponse_RequestHeaders, *extprocv3.ProcessingResponse_RequestBody:
						answers[buffered] = append(answers[buffered], r)
					}
				}
				if err := chat.runRecording(h, fmt.Sprintf("buffered-%v-%s", buffered, t.Name()), record); err != nil {
					t.Fatalf("buffered %v: %v", buffered, err)
				}
			}
			streamed, buffered := answers[false], answers[true]
			if len(buffered) != 2 || !proto.Equal(buffered[0], emptyHeadersAnswer) {
				t.Fatalf("buffered answers %v, want the headers' empty answer and one body answer", buffered)
			}
			var forwarded []byte
			for _, a := range streamed[1:] {
				forwarded = append(forwarded, a.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
			got := buffered[1].GetRequestBody().GetResponse()
			body := got.GetBodyMutation().GetBody()
			if tc.echo != (got.GetBodyMutation() != nil) || tc.echo && !bytes.Equal(body, forwarded) {
				t.Fatalf("body mutation %.200v, want echo %v of the %d bytes the streamed exchange forwards", got.GetBodyMutation(), tc.echo, len(forwarded))
			}
			if tc.echo && tc.selector != (keepModel{}) && !bytes.Contains(body, []byte(`"model":"served"`)) {
				t.Errorf("the forwarded body does not name the served model")
			}
			// The routing: upstream's header answer, content-length aside.
			want := streamed[0].GetRequestHeaders().GetResponse()
			if !proto.Equal(buffered[1].GetDynamicMetadata(), streamed[0].GetDynamicMetadata()) || got.GetClearRouteCache() != want.GetClearRouteCache() {
				t.Errorf("metadata %v, route cache %v; streamed: %v, %v", buffered[1].GetDynamicMetadata(), got.GetClearRouteCache(),
					streamed[0].GetDynamicMetadata(), want.GetClearRouteCache())
			}
			headers := func(m *extprocv3.HeaderMutation) map[string]string {
				out := map[string]string{}
				for _, h := range m.GetSetHeaders() {
					out[strings.ToLower(h.GetHeader().GetKey())] = string(h.GetHeader().GetRawValue())
				}
				return out
			}
			gotHeaders, wantHeaders := headers(got.GetHeaderMutation()), headers(want.GetHeaderMutation())
			if tc.echo {
				wantHeaders["content-length"] = strconv.Itoa(len(forwarded))
			} else {
				delete(wantHeaders, "content-length")
			}
			delete(gotHeaders, "x-request-id")
			delete(wantHeaders, "x-request-id")
			if fmt.Sprint(gotHeaders) != fmt.Sprint(wantHeaders) {
				t.Errorf("headers set %v, want %v", gotHeaders, wantHeaders)
			}
		})
	}
}
