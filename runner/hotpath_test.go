package runner

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
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
				ctx = withChunkCount(ctx)
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
	for _, profile := range []string{"sluice", "sluice-upstream-path"} {
		h, err := startBenchEPP(t, profile)
		if err != nil {
			t.Fatal(err)
		}
		for k, size := range sizes {
			chat := newStreamedChat(size, 8)
			// The forwarded body: on the hot path its long members are encoded without upstream's Director (what
			// encoding/json's compaction changes: whitespace, <, >, &, U+2028).
			body := chat.body.GetRequestBody()
			body.Body = bytes.Replace(body.Body, []byte(`"messages":[{`), []byte("\"messages\" : [ {\"name\": \"<a & b>\u2028\", "), 1)
			if k == 1 {
				body.Body = bytes.Replace(body.Body, []byte(`"stream":true`),
					[]byte(`"stream":true,"system":"`+strings.Repeat("<a & b>\u2028 ", 2000)+`"`), 1)
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
			}
		}
	}
	for k, size := range sizes {
		hot, upstream := answers["sluice"][k], answers["sluice-upstream-path"][k]
		if len(hot) != len(upstream) || len(hot) < 1+1+8 {
			t.Fatalf("%d bytes: %d request-body and response answers on the hot path, %d on upstream's, want as many, at least 10",
				size, len(hot), len(upstream))
		}
		for i := range hot {
			sortSetHeaders(hot[i])
			sortSetHeaders(upstream[i])
			if !proto.Equal(hot[i], upstream[i]) {
				t.Errorf("%d bytes, answer %d: hot path %.300v, upstream's path %.300v", size, i, hot[i], upstream[i])
			}
		}
	}
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
