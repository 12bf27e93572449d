package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	k8stypes "k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/prefixcache"
)

func newTestPrefixCache(t testing.TB, raw string) *PrefixCache {
	t.Helper()
	pl, err := PrefixCacheFactory("", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	return pl.(*PrefixCache)
}

func prefixEndpoint(name string, m fwkdl.Metrics) fwksched.Endpoint {
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: name}}, &m, nil)
}

func prefixEndpoints(n int) []fwksched.Endpoint {
	eps := make([]fwksched.Endpoint, n)
	for i := range eps {
		eps[i] = prefixEndpoint(fmt.Sprintf("pod-%d", i), fwkdl.Metrics{CacheBlockSize: 16, CacheNumBlocks: 1000})
	}
	return eps
}

func chatRequest(id string, msgs ...fwksched.Message) *fwksched.LLMRequest {
	return &fwksched.LLMRequest{
		RequestId:   id,
		TargetModel: "llama",
		Body:        &fwksched.LLMRequestBody{ChatCompletions: &fwksched.ChatCompletionsRequest{Messages: msgs}},
	}
}

func chatMsg(role, text string) fwksched.Message {
	return fwksched.Message{Role: role, Content: fwksched.Content{Raw: text}}
}

func routeTo(p *PrefixCache, req *fwksched.LLMRequest, ep fwksched.Endpoint) {
	p.PreRequest(context.Background(), req, &fwksched.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{ep}}},
	})
}

func TestPrefixCacheConfig(t *testing.T) {
	p := newTestPrefixCache(t, "")
	if p.TypedName() != (fwkplugin.TypedName{Type: PrefixCacheType, Name: PrefixCacheType}) {
		t.Fatalf("typed name %v", p.TypedName())
	}
	if got := p.index.Config(); got != prefixcache.DefaultConfig() {
		t.Fatalf("defaults %+v, want %+v", got, prefixcache.DefaultConfig())
	}
	pl, err := PrefixCacheFactory("mine", json.RawMessage(`{"bytesPerToken":3.5,"overloadAbsolute":4,"pendingTTL":"30s","calibrationTolerance":0}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pl.(*PrefixCache).index.Config()
	if pl.TypedName().Name != "mine" || cfg.Tokens.BytesPerToken != 3.5 || cfg.Guard.OverloadAbsolute != 4 || cfg.PendingTTL != 30*time.Second || cfg.Calibration.Tolerance != 0 {
		t.Fatalf("parsed %+v", cfg)
	}
	for raw, want := range map[string][]string{
		`{"bytesPerTokens":4}`:                                {"unknown field"},
		`{"maxPods":0,"taperStart":1,"podSyncInterval":"0s"}`: {"maxPods", "taperStart", "podSyncInterval"},
		`{"hitsMetric":""}`:                                   {"hitsMetric"},
		`[1]`:                                                 {"cannot unmarshal"},
	} {
		_, err := PrefixCacheFactory("", json.RawMessage(raw), nil)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v does not mention %q", raw, err, w)
			}
		}
	}
}

func TestPrefixCacheScoresWhatItRouted(t *testing.T) {
	p := newTestPrefixCache(t, "")
	eps := prefixEndpoints(3)
	system := chatMsg("system", strings.Repeat("You are a careful assistant. ", 40))
	turn1 := chatRequest("r1", system, chatMsg("user", strings.Repeat("Summarise the report. ", 20)))
	for _, s := range p.Score(context.Background(), nil, turn1, eps) {
		if s != 0 {
			t.Fatalf("cold index scored %v", s)
		}
	}
	routeTo(p, turn1, eps[1])
	got := p.Score(context.Background(), nil, turn1, eps)
	if got[eps[0]] != 0 || got[eps[1]] != 1 || got[eps[2]] != 0 {
		t.Fatalf("after routing to pod-1: %v", got)
	}
	// The next turn shares its history's blocks.
	turn2 := chatRequest("r2", append(turn1.Body.ChatCompletions.Messages, chatMsg("assistant", "Done."), chatMsg("user", strings.Repeat("Now in French. ", 30)))...)
	if s := p.Score(context.Background(), nil, turn2, eps)[eps[1]]; !(s > 0.5 && s < 1) {
		t.Fatalf("second turn scored %v on pod-1, want a partial match", s)
	}
	// Another model or cache_salt shares nothing.
	other := chatRequest("r3", turn1.Body.ChatCompletions.Messages...)
	other.Body.ChatCompletions.CacheSalt = "tenant-b"
	if s := p.Score(context.Background(), nil, other, eps)[eps[1]]; s != 0 {
		t.Fatalf("other cache_salt scored %v", s)
	}
	// A completions request with no body, and an empty body, score 0.
	for _, req := range []*fwksched.LLMRequest{nil, {RequestId: "x"}, {Body: &fwksched.LLMRequestBody{}}} {
		for _, s := range p.Score(context.Background(), nil, req, eps) {
			if s != 0 {
				t.Fatalf("request %v scored %v", req, s)
			}
		}
	}
	if len(p.Score(context.Background(), nil, turn1, nil)) != 0 {
		t.Fatal("no endpoints, but scores")
	}
}

func TestPrefixCachePromptKinds(t *testing.T) {
	p := newTestPrefixCache(t, "")
	eps := prefixEndpoints(2)
	text := strings.Repeat("lorem ipsum dolor sit amet ", 30)
	reqs := []*fwksched.LLMRequest{
		{RequestId: "c", TargetModel: "m", Body: &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: text}}}},
		{RequestId: "r", TargetModel: "m", Body: &fwksched.LLMRequestBody{Responses: &fwksched.ResponsesRequest{Instructions: "be brief", Input: []any{map[string]any{"role": "user", "content": text}}}}},
		{RequestId: "v", TargetModel: "m", Body: &fwksched.LLMRequestBody{Conversations: &fwksched.ConversationsRequest{Items: []fwksched.ConversationItem{{Type: "message", Role: "user", Content: text}}}}},
		{RequestId: "e", TargetModel: "m", Body: &fwksched.LLMRequestBody{Embeddings: &fwksched.EmbeddingsRequest{Input: []any{text, text}}}},
		chatRequest("s", fwksched.Message{Role: "user", Content: fwksched.Content{Structured: []fwksched.ContentBlock{{Type: "text", Text: text}, {Type: "image_url", ImageURL: fwksched.ImageBlock{Url: "https://x/cat.png"}}}}}),
	}
	for i, req := range reqs {
		routeTo(p, req, eps[i%2])
		got := p.Score(context.Background(), nil, req, eps)
		if got[eps[i%2]] != 1 || got[eps[1-i%2]] != 0 {
			t.Errorf("request %s: scores %v", req.RequestId, got)
		}
	}
	// A different image is a different prompt from that block on.
	withImage := func(url string) *fwksched.LLMRequest {
		return chatRequest("", fwksched.Message{Role: "user", Content: fwksched.Content{Structured: []fwksched.ContentBlock{{Type: "image_url", ImageURL: fwksched.ImageBlock{Url: url}}, {Type: "text", Text: text}}}})
	}
	routeTo(p, withImage("https://x/cat.png"), eps[0])
	if s := p.Score(context.Background(), nil, withImage("https://x/dog.png"), eps)[eps[0]]; s != 0 {
		t.Errorf("different leading image scored %v", s)
	}
}

func TestPrefixCacheLearnsFromUsage(t *testing.T) {
	p := newTestPrefixCache(t, "")
	eps := prefixEndpoints(1)
	req := chatRequest("", chatMsg("user", strings.Repeat("cache me ", 200)))
	routeTo(p, req, eps[0])
	id := prefixcache.PodID{Namespace: "default", Name: "pod-0"}
	for i := range 3 {
		req.RequestId = fmt.Sprint("miss-", i)
		routeTo(p, req, eps[0])
		if n := p.index.InFlight(id); n != 1 {
			t.Fatalf("in flight %d, want 1", n)
		}
		// A non-final chunk changes nothing.
		p.ResponseBody(context.Background(), req, &fwkrc.Response{Usage: fwkrc.Usage{PromptTokens: 450}}, nil)
		p.ResponseBody(context.Background(), req, &fwkrc.Response{EndOfStream: true, Usage: fwkrc.Usage{
			PromptTokens: 450, PromptTokenDetails: &fwkrc.PromptTokenDetails{CachedTokens: 0},
		}}, nil)
		if n := p.index.InFlight(id); n != 0 {
			t.Fatalf("in flight %d after the response, want 0", n)
		}
	}
	if eff, nom := p.index.Capacity(id); eff >= nom || nom != 1000 {
		t.Fatalf("capacity %d of %d: reported misses did not shrink it", eff, nom)
	}
}

func counterFamily(name string, values ...float64) *dto.MetricFamily {
	f := &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_COUNTER.Enum()}
	for i, v := range values {
		f.Metric = append(f.Metric, &dto.Metric{
			Label:   []*dto.LabelPair{{Name: proto.String("model_name"), Value: proto.String(fmt.Sprint("m", i))}},
			Counter: &dto.Counter{Value: proto.Float64(v)},
		})
	}
	return f
}

func TestPrefixCacheExtractsCounters(t *testing.T) {
	p := newTestPrefixCache(t, `{"minCounterQueries":1}`)
	if p.ExpectedInputType() != sourcemetrics.PrometheusMetricType {
		t.Fatal("wrong extractor input type")
	}
	eps := prefixEndpoints(1)
	ep := fwkdl.NewEndpoint(eps[0].GetMetadata(), eps[0].GetMetrics())
	req := chatRequest("", chatMsg("user", strings.Repeat("counted ", 200)))
	routeTo(p, req, eps[0])
	id := prefixcache.PodID{Namespace: "default", Name: "pod-0"}
	families := func(hits, queries float64) sourcemetrics.PrometheusMetricMap {
		return sourcemetrics.PrometheusMetricMap{
			"vllm:prefix_cache_hits_total":    counterFamily("vllm:prefix_cache_hits_total", hits/2, hits/2),
			"vllm:prefix_cache_queries_total": counterFamily("vllm:prefix_cache_queries_total", queries),
		}
	}
	ctx := context.Background()
	if err := p.Extract(ctx, families(100, 1000), ep); err != nil {
		t.Fatal(err)
	}
	routeTo(p, req, eps[0])                                         // predicted a full hit
	if err := p.Extract(ctx, families(100, 1400), ep); err != nil { // 0 of 400 hit
		t.Fatal(err)
	}
	if eff, nom := p.index.Capacity(id); eff >= nom {
		t.Fatalf("counters showing no hits did not shrink capacity: %d of %d", eff, nom)
	}
	if err := p.Extract(ctx, families(0, 10), ep); err != nil { // restart
		t.Fatal(err)
	}
	if n := p.index.Entries(id); n != 0 {
		t.Fatalf("%d entries after the server restarted", n)
	}
	if err := p.Extract(ctx, sourcemetrics.PrometheusMetricMap{}, ep); err != nil {
		t.Fatalf("server without counters: %v", err)
	}
	only := sourcemetrics.PrometheusMetricMap{"vllm:prefix_cache_hits_total": counterFamily("vllm:prefix_cache_hits_total", 1)}
	if err := p.Extract(ctx, only, ep); err == nil {
		t.Fatal("one counter without the other accepted")
	}
	if err := p.Extract(ctx, 42, ep); err == nil {
		t.Fatal("wrong input type accepted")
	}
}

func TestPrefixCacheForgetsPodsThatLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		live := []k8stypes.NamespacedName{{Namespace: "default", Name: "pod-0"}, {Namespace: "default", Name: "pod-1"}}
		handle := fwkplugin.NewEppHandle(ctx, func() []k8stypes.NamespacedName { return live })
		clk := clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
		pl, err := NewPrefixCacheFactory(nil, clk)("", json.RawMessage(`{"podSyncInterval":"10s"}`), handle)
		if err != nil {
			t.Fatal(err)
		}
		p := pl.(*PrefixCache)
		eps := prefixEndpoints(2)
		req := chatRequest("r", chatMsg("user", strings.Repeat("stay ", 100)))
		routeTo(p, req, eps[0])
		routeTo(p, req, eps[1])
		live = live[1:] // pod-0 leaves
		synctest.Wait()
		clk.Step(10 * time.Second)
		synctest.Wait()
		if pods := p.index.Pods(); len(pods) != 1 || pods[0].Name != "pod-1" {
			t.Fatalf("pods after sync: %v", pods)
		}
		if s := p.Score(ctx, nil, req, eps); s[eps[0]] != 0 || s[eps[1]] != 1 {
			t.Fatalf("scores after pod-0 left: %v", s)
		}
		cancel()
		synctest.Wait()
	})
}

func TestPrefixCacheGuardInProfile(t *testing.T) {
	p := newTestPrefixCache(t, `{"overloadAbsolute":4}`)
	eps := []fwksched.Endpoint{
		prefixEndpoint("busy", fwkdl.Metrics{WaitingQueueSize: 12, CacheBlockSize: 16, CacheNumBlocks: 100}),
		prefixEndpoint("idle", fwkdl.Metrics{CacheBlockSize: 16, CacheNumBlocks: 100}),
		prefixEndpoint("full", fwkdl.Metrics{KVCacheUsagePercent: 0.99, CacheBlockSize: 16, CacheNumBlocks: 100}),
	}
	req := chatRequest("", chatMsg("user", strings.Repeat("hot prefix ", 100)))
	for _, ep := range eps {
		routeTo(p, req, ep)
	}
	got := p.Score(context.Background(), nil, req, eps)
	if got[eps[0]] != 0 || got[eps[1]] != 1 || got[eps[2]] != 0 {
		t.Fatalf("scores %v, want busy 0, idle 1, full 0", got)
	}
	for _, s := range got {
		if s < 0 || s > 1 || math.IsNaN(s) {
			t.Fatalf("score %v outside [0,1]", s)
		}
	}
}

// TestPrefixCacheHashesARequestOnce: the request's first scoring keeps its
// prompt's chains and the insert after the pick takes them, so that the
// prompt is hashed once per request; a request that is never routed does not
// keep them past chainsTTL, nor beyond maxRequestChains newer ones.
func TestPrefixCacheHashesARequestOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg, err := parsePrefixCacheConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPrefixCache("", cfg, nil, clk)
	if err != nil {
		t.Fatal(err)
	}
	eps := prefixEndpoints(3)
	req := chatRequest("r1", chatMsg("user", strings.Repeat("a long prompt ", 200)))
	ctx := context.Background()
	p.Score(ctx, nil, req, eps)
	p.Affinity(ctx, req, eps, make([]float64, len(eps)))
	p.Score(ctx, nil, req, eps)
	if n := p.heldChains(); n != 1 {
		t.Fatalf("%d requests' chains held after scoring one request three times, want 1", n)
	}
	chains := p.chains.get(clk.Now(), req, false)
	if chains.Len() != 1 {
		t.Fatalf("%d chains for one block size, want 1", chains.Len())
	}
	routeTo(p, req, eps[1])
	if n := p.heldChains(); n != 0 {
		t.Fatalf("%d requests' chains held after the insert, want 0", n)
	}
	if s := p.Score(ctx, nil, chatRequest("r2", chatMsg("user", strings.Repeat("a long prompt ", 200))), eps); s[eps[1]] != 1 || s[eps[0]] != 0 {
		t.Fatalf("scores %v after routing the prompt to pod-1", s)
	}

	// Scored, never routed: gone after chainsTTL.
	clk.Step(chainsTTL)
	p.Score(ctx, nil, chatRequest("r3", chatMsg("user", "x")), eps)
	if n := p.heldChains(); n != 1 {
		t.Fatalf("%d requests' chains held, want only the last one", n)
	}
	for i := range maxRequestChains + 10 {
		p.Score(ctx, nil, chatRequest(fmt.Sprint("n", i), chatMsg("user", "x")), eps[:1])
	}
	if n := p.heldChains(); n != maxRequestChains {
		t.Fatalf("%d requests' chains held, want at most %d", n, maxRequestChains)
	}
}
