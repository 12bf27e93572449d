package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/envoy"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins"
)

// chunkRecorder is a response-body plugin of a given type that records the chunks it is handed (the test numbers
// them in the usage's completion tokens) and the request IDs it is given.
type chunkRecorder struct {
	typ  string
	seen []int
	ids  map[string]int
}

func (r *chunkRecorder) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: r.typ, Name: r.typ}
}

func (r *chunkRecorder) ResponseBody(_ context.Context, _ *fwksched.LLMRequest, resp *fwkrc.Response, _ *fwkdl.EndpointMetadata) {
	r.seen = append(r.seen, resp.Usage.CompletionTokens)
	if r.ids == nil {
		r.ids = map[string]int{}
	}
	r.ids[resp.RequestId]++
}

// notResponseBody is a plugin without the response-body hook.
type notResponseBody struct{}

func (notResponseBody) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: "scorer-x", Name: "x"}
}

func TestChunkInterestOf(t *testing.T) {
	rec := func(typ string) fwkplugin.Plugin { return &chunkRecorder{typ: typ} }
	for _, tc := range []struct {
		name          string
		plugins       []fwkplugin.Plugin
		want          chunkInterest
		wantObservers int
	}{
		{"no plugins", nil, chunksNone, 0},
		{"plugins without the hook", []fwkplugin.Plugin{notResponseBody{}}, chunksNone, 0},
		{"end-only plugins", []fwkplugin.Plugin{rec(plugins.PrefixCacheType), rec(plugins.InFlightScorerType)}, chunksNone, 0},
		{"Sluice admission", []fwkplugin.Plugin{rec(plugins.PrefixCacheType), rec(plugins.FlowControlType)}, chunksFirst, 0},
		{"the outlier filter observes every chunk", []fwkplugin.Plugin{rec(plugins.FlowControlType), rec(plugins.OutlierFilterType)},
			chunksFirst, 1},
		{"an unknown plugin", []fwkplugin.Plugin{rec(plugins.FlowControlType), rec("someone-elses-plugin")}, chunksEvery, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, observers := chunkInterestOf(tc.plugins)
			if got != tc.want || len(observers) != tc.wantObservers {
				t.Errorf("chunkInterestOf = %d with %d observers, want %d with %d", got, len(observers), tc.want, tc.wantObservers)
			}
		})
	}
}

// TestHotDirectorRunsResponsePluginsOnlyOnChunksTheyActOn drives upstream's Director behind the hot one through a
// streamed response of four chunks and the end, and checks which the plugins were handed.
func TestHotDirectorRunsResponsePluginsOnlyOnChunksTheyActOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interest chunkInterest
		stream   bool  // the context is a hot-path stream's
		want     []int // the chunks handed to the plugin; 4 is the end
	}{
		{"end only", chunksNone, true, []int{4}},
		{"first chunk and end", chunksFirst, true, []int{0, 4}},
		{"every chunk", chunksEvery, true, []int{0, 1, 2, 3, 4}},
		{"outside a hot-path stream", chunksNone, false, []int{0, 1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &chunkRecorder{typ: "recorder"}
			observer := &chunkRecorder{typ: plugins.OutlierFilterType}
			cfg := requestcontrol.NewConfig()
			cfg.AddPlugins(p, observer)
			d := &hotDirector{Director: requestcontrol.NewDirectorWithConfig(nil, nil, nil, nil, nil, cfg), chunks: tc.interest,
				observers: []fwkrc.ResponseBody{observer}}
			ctx := context.Background()
			if tc.stream {
				ctx, _ = withChunkCount(ctx)
			}
			reqCtx := &handlers.RequestContext{Request: &handlers.Request{Headers: map[string]string{"x-request-id": "r1"}},
				Response: &handlers.Response{}}
			for i := range 5 {
				// A plugin's metadata from an earlier chunk does not outlive a skipped one, as with upstream's Director.
				reqCtx.Response.DynamicMetadata = &structpb.Struct{}
				reqCtx.Usage.CompletionTokens = i
				reqCtx = d.HandleResponseBody(ctx, reqCtx, i == 4)
				if reqCtx.Response.DynamicMetadata != nil {
					t.Errorf("chunk %d: dynamic metadata %v left from an earlier chunk", i, reqCtx.Response.DynamicMetadata)
				}
			}
			if fmt.Sprint(p.seen) != fmt.Sprint(tc.want) {
				t.Errorf("the plugin saw chunks %v, want %v", p.seen, tc.want)
			}
			if want := []int{0, 1, 2, 3, 4}; fmt.Sprint(observer.seen) != fmt.Sprint(want) {
				t.Errorf("the chunk observer saw chunks %v, want each once: %v", observer.seen, want)
			}
			if want := map[string]int{"r1": 5}; !maps.Equal(observer.ids, want) {
				t.Errorf("the chunk observer was given request IDs %v, want %v", observer.ids, want)
			}
		})
	}
}

func TestDropResponseBodyMetadata(t *testing.T) {
	md := func() *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {}}}
	}
	for _, tc := range []struct {
		name string
		req  *extprocv3.ProcessingRequest
		kept bool
	}{
		{"request headers", &extprocv3.ProcessingRequest{MetadataContext: md(),
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}, true},
		{"request body", &extprocv3.ProcessingRequest{MetadataContext: md(),
			Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}}, true},
		{"response headers (the plugins read them)", &extprocv3.ProcessingRequest{MetadataContext: md(),
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}, true},
		{"response body", &extprocv3.ProcessingRequest{MetadataContext: md(),
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dropResponseBodyMetadata(tc.req)
			if kept := tc.req.MetadataContext != nil; kept != tc.kept {
				t.Errorf("metadata kept %v, want %v", kept, tc.kept)
			}
		})
	}
}

// TestHotPathAnswersAsUpstreamPath plays the same streamed chats through the Sluice EPP with and without the hot
// path: the proxy must get the same forwarded request body and response-phase answers, chunk for chunk, and every request must be admitted (a
// request whose reservation Sluice admission never released would hold its endpoint's capacity).
func TestHotPathAnswersAsUpstreamPath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two EPPs")
	}
	quietLogs(t)
	// A 2 KB body (one message) and a 100 KB one (four messages from the proxy, which the model-selection hold joins;
	// a long prompt with something to escape in it and a long one without).
	sizes := []int{2 << 10, 100 << 10}
	answers := map[string][][]*extprocv3.ProcessingResponse{}
	var clientBodies [][]byte // by size
	for _, profile := range []string{"sluice", "sluice-upstream-path"} {
		// The selector sends every request with another model, whose name upstream writes back into each chunk.
		h, err := startBenchEPPWith(t, profile, servedAs("served"))
		if err != nil {
			t.Fatal(err)
		}
		for k, size := range sizes {
			chat := newStreamedChat(size, 8)
			for i, c := range chat.chunks {
				b := c.GetResponseBody()
				b.Body = bytes.ReplaceAll(b.Body, []byte(`"model":"base"`), []byte(`"model":"served"`))
				if i == 2 {
					// A chunk longer than upstream's limit for one answer (envoy.BodyByteLimit): three answers.
					b.Body = bytes.Repeat(b.Body, 130<<10/len(b.Body))
				}
			}
			// The forwarded body: on the hot path its long members are encoded without upstream's Director (what
			// encoding/json's compaction changes: whitespace, <, >, &, U+2028).
			body := chat.body.GetRequestBody()
			body.Body = bytes.Replace(body.Body, []byte(`"messages":[{`), []byte("\"messages\" : [ {\"name\": \"<a & b>\u2028\", "), 1)
			if k == 1 {
				body.Body = bytes.Replace(body.Body, []byte(`"stream":true`),
					[]byte(`"stream":true,"system":"`+strings.Repeat("<a & b>\u2028 ", 2000)+`"`), 1)
			}
			if profile == "sluice" {
				clientBodies = append(clientBodies, body.Body)
			}
			answers[profile] = append(answers[profile], nil)
			for i := range 20 {
				record := func(r *extprocv3.ProcessingResponse) {
					switch r.Response.(type) {
					case *extprocv3.ProcessingResponse_RequestBody, *extprocv3.ProcessingResponse_ResponseHeaders, *extprocv3.ProcessingResponse_ResponseBody:
						if i == 0 {
							answers[profile][k] = append(answers[profile][k], r)
						}
					}
				}
				if err := chat.runRecording(h, fmt.Sprintf("hot-%s-%d-%d", profile, size, i), record); err != nil {
					t.Fatalf("%s, %d bytes, request %d: %v", profile, size, i, err)
				}
				// The hot path answers the plain chunks itself; upstream's path never does.
				if hand := chat.stream.handEncoded; (profile == "sluice") != (hand > 0) {
					t.Fatalf("%s, %d bytes, request %d: %d chunks answered by the stream itself", profile, size, i, hand)
				}
			}
		}
	}
	for k, size := range sizes {
		hot, upstream := answers["sluice"][k], answers["sluice-upstream-path"][k]
		if len(hot) != len(upstream) || len(hot) < 1+1+8+2 {
			t.Fatalf("%d bytes: %d request-body and response answers on the hot path, %d on upstream's, want as many, at least 12",
				size, len(hot), len(upstream))
		}
		if last := hot[len(hot)-2].GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); !bytes.Contains(last, []byte(`"model":"base"`)) {
			t.Errorf("%d bytes: a chunk's answer %q does not name the model the client asked for", size, last)
		}
		for i := range hot {
			sortSetHeaders(hot[i])
			sortSetHeaders(upstream[i])
			if !proto.Equal(hot[i], upstream[i]) {
				t.Errorf("%d bytes, answer %d: hot path %.300v, upstream's path %.300v", size, i, hot[i], upstream[i])
			}
		}
		// The forwarded body is the client's, whichever buffers held it on the way (the joined body's is put back
		// before the request is scheduled, and cleared then in race builds).
		var forwarded []byte
		for _, r := range hot {
			forwarded = append(forwarded, r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
		type chat struct{ Messages []struct{ Content string } }
		var sent, got chat
		if err := json.Unmarshal(clientBodies[k], &sent); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(forwarded, &got); err != nil || !reflect.DeepEqual(got, sent) {
			t.Errorf("%d bytes: the forwarded body is not the client's (%v): %.300q", size, err, forwarded)
		}
	}
}

// servedAs is a ModelSelector that sends every request with the given model.
type servedAs string

func (m servedAs) SelectModel(context.Context, map[string]string, []byte) ModelChoice {
	return ModelChoice{Model: string(m)}
}

// sortSetHeaders orders the headers an answer sets by name: upstream's handler sets response headers from a map, so
// their order differs from one answer to the next on either path.
func sortSetHeaders(r *extprocv3.ProcessingResponse) {
	for _, m := range []*extprocv3.HeaderMutation{
		r.GetResponseHeaders().GetResponse().GetHeaderMutation(),
		r.GetResponseBody().GetResponse().GetHeaderMutation(),
	} {
		if m != nil {
			slices.SortFunc(m.SetHeaders, func(a, b *corev3.HeaderValueOption) int {
				return strings.Compare(a.GetHeader().GetKey(), b.GetHeader().GetKey())
			})
		}
	}
}

// wireProxyStream is the proxy's side of one ext_proc stream as gRPC's server shows it with extProcCodec: RecvMsg
// decodes the next message into the one it is given, SendMsg encodes the answer at once. It records every message it
// decoded into.
type wireProxyStream struct {
	grpc.ServerStream
	ctx      context.Context
	codec    extProcCodec
	in       [][]byte
	into     []*extprocv3.ProcessingRequest
	answered []string // the bodies of the streamed chunks answered
}

func (f *wireProxyStream) Context() context.Context { return f.ctx }

func (f *wireProxyStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m := &extprocv3.ProcessingRequest{}
	return m, f.RecvMsg(m)
}

func (f *wireProxyStream) RecvMsg(m any) error {
	if len(f.in) == 0 {
		return io.EOF
	}
	req := m.(*extprocv3.ProcessingRequest)
	f.into = append(f.into, req)
	if err := f.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(f.in[0]))}, req); err != nil {
		return err
	}
	f.in = f.in[1:]
	return nil
}

func (f *wireProxyStream) Send(r *extprocv3.ProcessingResponse) error { return f.SendMsg(r) }

func (f *wireProxyStream) SendMsg(m any) error {
	data, err := f.codec.Marshal(m)
	if err != nil {
		return err
	}
	defer data.Free()
	r := &extprocv3.ProcessingResponse{}
	if err := proto.Unmarshal(data.Materialize(), r); err != nil {
		return err
	}
	f.answered = append(f.answered, string(r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()))
	return nil
}

// TestStreamDecodesIntoAnsweredChunks: on gRPC's stream (wireChunks) a chunk the stream answered itself is the message
// the next one is decoded into, and a message handed to upstream's handler never is; the answers carry each chunk's
// own bytes.
func TestStreamDecodesIntoAnsweredChunks(t *testing.T) {
	parser, err := plugins.OpenAIParserFactory("p", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunk := func(body string, end bool) []byte {
		return mustMarshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: end}}})
	}
	plain := func(content string) string {
		return `data: {"choices":[{"delta":{"content":"` + content + `"}}]}` + "\n\n"
	}
	usage := `data: {"choices":[],"usage":{"prompt_tokens":3}}` + "\n\n"
	in := [][]byte{chunk(plain("a longer first chunk"), false), chunk(plain("b"), false), chunk(usage, false),
		chunk(plain("c"), false), chunk(plain("d"), false), chunk("", true)}
	d := &hotDirector{chunks: chunksFirst, screen: parser.(usageScreen)}
	ctx := context.Background()
	reqCtx := &handlers.RequestContext{RequestState: handlers.HeaderResponseResponseComplete,
		Request:  &handlers.Request{Headers: map[string]string{"x-request-id": "r1"}},
		Response: &handlers.Response{Headers: map[string]string{"content-type": "text/event-stream"}}}
	proxy := &wireProxyStream{ctx: ctx, codec: newExtProcCodec(), in: in}
	s := &shapingStream{ExternalProcessor_ProcessServer: proxy, ctx: ctx, hot: true, wireChunks: true}
	ctx, s.chunks = withChunkCount(ctx)
	d.prepareShortcut(ctx, s.chunks, reqCtx)
	s.armShortcut(newChunkAnswer([]byte("first")))
	var upstream []*extprocv3.ProcessingRequest // what upstream's handler got
	for {
		m, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		upstream = append(upstream, m)
	}
	if got := []string{string(upstream[0].GetResponseBody().GetBody()), fmt.Sprint(upstream[1].GetResponseBody().GetEndOfStream())}; len(upstream) != 2 || got[0] != usage || got[1] != "true" {
		t.Fatalf("upstream's handler got %v, want the usage chunk and the end", upstream)
	}
	if want := []string{plain("a longer first chunk"), plain("b"), plain("c"), plain("d")}; !slices.Equal(proxy.answered, want) {
		t.Errorf("the stream answered %q, want %q", proxy.answered, want)
	}
	// Decoded into: a new message (a), again (b, answered), again (the usage, handed to upstream's handler, whose
	// message then stays as it got it: checked above, after every decode), a new one (c), again (d), again (the end).
	if runs := len(slices.Compact(slices.Clone(proxy.into))); len(proxy.into) != len(in) || runs != 2 {
		t.Errorf("%d messages decoded into %d runs of one message, want %d into 2", len(proxy.into), runs, len(in))
	}
}

// fakeProxyStream is the proxy's side of one ext_proc stream: Recv hands out in, Send keeps the answers.
type fakeProxyStream struct {
	grpc.ServerStream
	ctx  context.Context
	in   []*extprocv3.ProcessingRequest
	sent []*extprocv3.ProcessingResponse
}

func (f *fakeProxyStream) Context() context.Context { return f.ctx }

func (f *fakeProxyStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.in) == 0 {
		return nil, io.EOF
	}
	req := f.in[0]
	f.in = f.in[1:]
	return req, nil
}

func (f *fakeProxyStream) Send(r *extprocv3.ProcessingResponse) error {
	f.sent = append(f.sent, r)
	return nil
}

// TestStreamAnswersPlainChunksItself: once armed, a hot-path stream answers a streamed response's chunks that name no
// usage itself, as upstream's handler would (the chunk's size counted, the chunk observers told, the client's model
// name written back, one answer per envoy.BodyByteLimit bytes), and hands upstream's handler every other message.
func TestStreamAnswersPlainChunksItself(t *testing.T) {
	parser, err := plugins.OpenAIParserFactory("p", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunk := func(body string, end bool) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: end}}}
	}
	const plain = `data: {"model":"served","choices":[{"delta":{"content":"hi"}}]}` + "\n\n"
	long := strings.Repeat("x", envoy.BodyByteLimit+10)
	for _, tc := range []struct {
		name     string
		msg      *extprocv3.ProcessingRequest
		unarmed  bool   // upstream's handler has not answered a chunk as a streamed one
		contentT string // the response's content type
		state    handlers.StreamRequestState
		cancel   bool
		answers  []string // what the stream answers itself; none: upstream's handler gets the message
	}{
		{name: "a plain chunk", msg: chunk(plain, false), answers: []string{strings.Replace(plain, "served", "base", 1)}},
		{name: "a chunk longer than one answer", msg: chunk(long, false), answers: []string{long[:envoy.BodyByteLimit], long[envoy.BodyByteLimit:]}},
		{name: "a usage", msg: chunk(`data: {"choices":[],"usage":{"prompt_tokens":3}}`+"\n\n", false)},
		{name: "a usage, escaped", msg: chunk(`data: {"\u0075sage":{}}`+"\n\n", false)},
		{name: "the end of the stream", msg: chunk(plain, true)},
		{name: "an empty chunk", msg: chunk("", false)},
		{name: "not armed", msg: chunk(plain, false), unarmed: true},
		{name: "not an event stream", msg: chunk(plain, false), contentT: "application/json"},
		{name: "the response headers not answered", msg: chunk(plain, false), state: handlers.ResponseReceived},
		{name: "the stream's context ended", msg: chunk(plain, false), cancel: true},
		{name: "not a response chunk", msg: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			observer := &chunkRecorder{typ: plugins.OutlierFilterType}
			d := &hotDirector{chunks: chunksFirst, observers: []fwkrc.ResponseBody{observer}, screen: parser.(usageScreen)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			if tc.contentT == "" {
				tc.contentT = "text/event-stream"
			}
			if tc.state == 0 {
				tc.state = handlers.HeaderResponseResponseComplete
			}
			reqCtx := &handlers.RequestContext{RequestState: tc.state, IncomingModelName: "base", TargetModelName: "served",
				Request:  &handlers.Request{Headers: map[string]string{"x-request-id": "r1"}},
				Response: &handlers.Response{Headers: map[string]string{"content-type": tc.contentT}}}
			next := chunk("next", true) // the end: upstream's handler's
			proxy := &fakeProxyStream{ctx: ctx, in: []*extprocv3.ProcessingRequest{tc.msg, next}}
			s := &shapingStream{ExternalProcessor_ProcessServer: proxy, ctx: ctx, hot: true}
			ctx, s.chunks = withChunkCount(ctx)
			d.prepareShortcut(ctx, s.chunks, reqCtx)
			if !tc.unarmed {
				s.armShortcut(newChunkAnswer([]byte("first")))
			}
			got, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			var answered []string
			for _, r := range proxy.sent {
				answered = append(answered, string(r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()))
			}
			if len(tc.answers) == 0 {
				if got != tc.msg || len(proxy.sent) != 0 || reqCtx.ResponseSize != 0 || len(observer.seen) != 0 {
					t.Errorf("the stream answered %q, counted %d bytes, told the observer %d times; upstream's handler got %v, want the message itself",
						answered, reqCtx.ResponseSize, len(observer.seen), got)
				}
				return
			}
			if got != next {
				t.Errorf("upstream's handler got %v, want the message after the chunk", got)
			}
			if !slices.Equal(answered, tc.answers) {
				t.Errorf("the stream answered %.80q, want %.80q", answered, tc.answers)
			}
			for _, r := range proxy.sent {
				if r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() || r.DynamicMetadata != nil {
					t.Errorf("answer %v ends the stream or carries metadata", r)
				}
			}
			if want := len(tc.msg.GetResponseBody().GetBody()); reqCtx.ResponseSize != want {
				t.Errorf("response size %d, want %d", reqCtx.ResponseSize, want)
			}
			if len(observer.seen) != 1 || observer.ids["r1"] != 1 {
				t.Errorf("the chunk observer saw %v with IDs %v, want the chunk once, for r1", observer.seen, observer.ids)
			}
		})
	}
}

// namedChunkRecorder is a chunk observer that takes chunks by their endpoint's name (chunkObserver) and records, for
// each call either way, the request ID and the endpoint's name it was given.
type namedChunkRecorder struct {
	calls []string
}

func (r *namedChunkRecorder) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: plugins.OutlierFilterType, Name: "outlier"}
}

func (r *namedChunkRecorder) ResponseBody(_ context.Context, req *fwksched.LLMRequest, resp *fwkrc.Response, target *fwkdl.EndpointMetadata) {
	id := resp.RequestId
	if req != nil && req.RequestId != "" {
		id = req.RequestId
	}
	r.calls = append(r.calls, "body "+id+" "+plugins.EndpointName(target))
}

func (r *namedChunkRecorder) ObserveChunk(_ context.Context, id, endpoint string) {
	r.calls = append(r.calls, "named "+id+" "+endpoint)
}

// TestChunkObserversTakeTheStreamsEndpoint: the hot Director hands a chunk observer that takes chunks by name
// (chunkObserver) the request ID and endpoint name its ResponseBody would have read (the scheduling request's ID
// first, the endpoint named again when the target changes), and hands it the chunk itself when there is no target.
func TestChunkObserversTakeTheStreamsEndpoint(t *testing.T) {
	a := &fwkdl.EndpointMetadata{Address: "10.0.0.1", Port: "8000"}
	b := &fwkdl.EndpointMetadata{Address: "fd00::2", Port: "8001"}
	for _, tc := range []struct {
		name    string
		sched   *fwksched.LLMRequest
		targets []*fwkdl.EndpointMetadata
		want    []string
	}{
		{name: "the response's request ID", targets: []*fwkdl.EndpointMetadata{a, a},
			want: []string{"named r1 10.0.0.1:8000", "named r1 10.0.0.1:8000"}},
		{name: "the scheduling request's ID", sched: &fwksched.LLMRequest{RequestId: "s1"}, targets: []*fwkdl.EndpointMetadata{a},
			want: []string{"named s1 10.0.0.1:8000"}},
		{name: "the scheduling request without an ID", sched: &fwksched.LLMRequest{}, targets: []*fwkdl.EndpointMetadata{a},
			want: []string{"named r1 10.0.0.1:8000"}},
		{name: "another target", targets: []*fwkdl.EndpointMetadata{a, b, a},
			want: []string{"named r1 10.0.0.1:8000", "named r1 [fd00::2]:8001", "named r1 10.0.0.1:8000"}},
		{name: "no target", targets: []*fwkdl.EndpointMetadata{nil, a},
			want: []string{"body r1 ", "named r1 10.0.0.1:8000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &namedChunkRecorder{}
			d := &hotDirector{chunks: chunksFirst, observers: []fwkrc.ResponseBody{rec}}
			_, c := withChunkCount(context.Background())
			for _, target := range tc.targets {
				reqCtx := &handlers.RequestContext{SchedulingRequest: tc.sched, TargetPod: target,
					Request:  &handlers.Request{Headers: map[string]string{"x-request-id": "r1"}},
					Response: &handlers.Response{Headers: map[string]string{}}}
				d.skip(context.Background(), c, reqCtx)
			}
			if !slices.Equal(rec.calls, tc.want) {
				t.Errorf("the observer was called %q, want %q", rec.calls, tc.want)
			}
		})
	}
}

// sendCounter is gRPC's stream as the hot path's answers see it, counting the answers it is sent.
type sendCounter struct {
	fakeProxyStream
	n int
}

func (s *sendCounter) SendMsg(m any) error {
	if _, ok := m.(*streamedChunk); !ok {
		return fmt.Errorf("sent %T, want a *streamedChunk", m)
	}
	s.n++
	return nil
}

// TestStreamAnswersChunksWithoutAllocating: a plain chunk the stream answers itself (answerChunk), with the outlier
// filter timing it, costs the stream no allocation (what gRPC's SendMsg and the codec allocate for the answer is
// theirs): the answer handed to SendMsg is the stream's own, and the chunk's endpoint is named once per stream.
func TestStreamAnswersChunksWithoutAllocating(t *testing.T) {
	parser, err := plugins.OpenAIParserFactory("p", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	outlierFilter, err := plugins.OutlierFilterFactory("outlier", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		observers []fwkrc.ResponseBody
	}{
		{name: "no chunk observer"},
		{name: "the outlier filter", observers: []fwkrc.ResponseBody{outlierFilter.(fwkrc.ResponseBody)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &hotDirector{chunks: chunksFirst, observers: tc.observers, screen: parser.(usageScreen)}
			ctx := context.Background()
			chunk := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: []byte(`data: {"model":"m","choices":[{"delta":{"content":"hi"}}]}` + "\n\n")}}}
			reqCtx := &handlers.RequestContext{RequestState: handlers.HeaderResponseResponseComplete,
				IncomingModelName: "m", TargetModelName: "m",
				TargetPod: &fwkdl.EndpointMetadata{Address: "10.0.0.1", Port: "8000"},
				Request:   &handlers.Request{Headers: map[string]string{"x-request-id": "r1"}},
				Response:  &handlers.Response{Headers: map[string]string{"content-type": "text/event-stream"}}}
			proxy := &sendCounter{fakeProxyStream: fakeProxyStream{ctx: ctx}}
			s := &shapingStream{ExternalProcessor_ProcessServer: proxy, ctx: ctx, hot: true, wireChunks: true}
			ctx, s.chunks = withChunkCount(ctx)
			d.prepareShortcut(ctx, s.chunks, reqCtx)
			s.armShortcut(newChunkAnswer([]byte("first")))
			answer := func() {
				if answered, err := s.answerChunk(chunk); !answered || err != nil {
					t.Fatalf("answered %v, %v; want the chunk answered", answered, err)
				}
			}
			answer() // the stream's first chunk: the outlier filter starts timing it
			if allocs := testing.AllocsPerRun(100, answer); allocs != 0 {
				t.Errorf("%v allocations per chunk answered, want 0", allocs)
			}
			if proxy.n != 102 {
				t.Errorf("%d answers sent, want 102", proxy.n)
			}
		})
	}
}
