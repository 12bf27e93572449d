package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	k8stypes "k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/loraaffinity"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/queuedepth"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/lora"
)

var loraT0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// loraEndpoint builds a scheduling endpoint the way upstream's director does,
// with an optional residency attribute.
func loraEndpoint(name string, m *fwkdl.Metrics, res *LoRAResidency) fwksched.Endpoint {
	attrs := fwkdl.NewAttributes()
	if res != nil {
		attrs.Put(LoRAResidencyKey, res)
	}
	if m == nil {
		m = fwkdl.NewMetrics() // what upstream's extractor leaves when LoRA metrics are absent
	}
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{
		NamespacedName: k8stypes.NamespacedName{Namespace: "default", Name: name},
	}, m, attrs)
}

func loraMetrics(maxLoRA int, running, waiting []string, queue int) *fwkdl.Metrics {
	m := fwkdl.NewMetrics()
	m.MaxActiveModels = maxLoRA
	for _, a := range running {
		m.ActiveModels[a] = 0
	}
	for _, a := range waiting {
		m.WaitingModels[a] = 0
	}
	m.WaitingQueueSize = queue
	return m
}

func newTestLoRAAffinity(t testing.TB, raw string) (*LoRAAffinity, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(loraT0)
	p, err := NewLoRAAffinityFactory(nil, clk)("lora", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatalf("factory: %v", err)
	}
	return p.(*LoRAAffinity), clk
}

func loraScoresByName(scores map[fwksched.Endpoint]float64) map[string]float64 {
	out := make(map[string]float64, len(scores))
	for ep, v := range scores {
		out[ep.GetMetadata().NamespacedName.Name] = v
	}
	return out
}

func TestLoRAAffinityConfig(t *testing.T) {
	defaults := lora.DefaultConfig()
	tests := []struct {
		name     string
		raw      string
		want     lora.Config
		wantBase []string
		wantErr  []string
	}{
		{name: "no parameters", raw: "", want: defaults},
		{name: "null", raw: "null", want: defaults},
		{name: "empty object", raw: "{}", want: defaults},
		{
			name: "every field",
			raw:  `{"spillQueueDepth":0,"loadBound":0.5,"memoryHalfLife":"10s","memoryTTL":"1m","memoryCapacity":64,"baseModels":["llama-3-8b"]}`,
			want: lora.Config{
				SpillQueueDepth: 0, LoadBound: 0.5, MemoryHalfLife: 10 * time.Second,
				MemoryTTL: time.Minute, MemoryCapacity: 64,
			},
			wantBase: []string{"llama-3-8b"},
		},
		{
			name:    "every constraint violated, all reported",
			raw:     `{"spillQueueDepth":-1,"loadBound":0,"memoryHalfLife":"1m","memoryTTL":"1s","memoryCapacity":0,"baseModels":[""]}`,
			wantErr: []string{"spillQueueDepth", "loadBound", "memoryTTL", "memoryCapacity", "baseModels[0]"},
		},
		{name: "non-positive half-life", raw: `{"memoryHalfLife":"0s"}`, wantErr: []string{"memoryHalfLife must be > 0"}},
		{name: "misspelt field", raw: `{"spilQueueDepth":3}`, wantErr: []string{`unknown field "spilQueueDepth"`}},
		{name: "bad duration", raw: `{"memoryTTL":"soon"}`, wantErr: []string{"soon"}},
		{name: "wrong type", raw: `{"memoryCapacity":"big"}`, wantErr: []string{"memoryCapacity"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseLoRAAffinityConfig(json.RawMessage(tc.raw))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("parse succeeded, want an error mentioning %v", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				if _, ferr := LoRAAffinityFactory("x", json.RawMessage(tc.raw), nil); ferr == nil {
					t.Errorf("factory accepted the parameters")
				}
				return
			}
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if cfg.scorer != tc.want {
				t.Errorf("config = %+v, want %+v", cfg.scorer, tc.want)
			}
			if len(cfg.baseModels) != len(tc.wantBase) {
				t.Errorf("base models = %v, want %v", cfg.baseModels, tc.wantBase)
			}
			for _, m := range tc.wantBase {
				if _, ok := cfg.baseModels[m]; !ok {
					t.Errorf("base model %q missing", m)
				}
			}
		})
	}
}

func TestLoRAAffinityFactoryTypedName(t *testing.T) {
	p, err := LoRAAffinityFactory("my-lora", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.TypedName(); got.Type != LoRAAffinityType || got.Name != "my-lora" {
		t.Fatalf("TypedName = %+v", got)
	}
	if p.(*LoRAAffinity).Category() != fwksched.Affinity {
		t.Fatalf("Category = %v", p.(*LoRAAffinity).Category())
	}
}

func TestLoRAAffinityScore(t *testing.T) {
	tests := []struct {
		name      string
		params    string
		req       *fwksched.LLMRequest
		endpoints []fwksched.Endpoint
		want      map[string]float64
	}{
		{
			name: "no LoRA metrics: neutral, where upstream gives 0",
			req:  &fwksched.LLMRequest{TargetModel: "sql-lora"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("p1", nil, nil),
				loraEndpoint("p2", nil, nil),
			},
			want: map[string]float64{"p1": lora.Neutral, "p2": lora.Neutral},
		},
		{
			name:   "configured base model ignores full adapter slots",
			params: `{"baseModels":["llama"]}`,
			req:    &fwksched.LLMRequest{TargetModel: "llama"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("full", loraMetrics(1, []string{"x"}, nil, 0), nil),
				loraEndpoint("free", loraMetrics(4, nil, nil, 0), nil),
			},
			want: map[string]float64{"full": lora.Neutral, "free": lora.Neutral},
		},
		{
			name: "base model reported by the residency extractor",
			req:  &fwksched.LLMRequest{TargetModel: "llama"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("full", loraMetrics(1, []string{"x"}, nil, 0),
					&LoRAResidency{Adapters: lora.NewAdapters("x"), BaseModels: map[string]struct{}{"llama": {}}, ObservedAt: loraT0}),
				loraEndpoint("free", loraMetrics(4, nil, nil, 0), nil),
			},
			want: map[string]float64{"full": lora.Neutral, "free": lora.Neutral},
		},
		{
			name: "nil request scores neutral",
			req:  nil,
			endpoints: []fwksched.Endpoint{
				loraEndpoint("p1", loraMetrics(1, []string{"x"}, nil, 0), nil),
			},
			want: map[string]float64{"p1": lora.Neutral},
		},
		{
			name: "rewrite target: the adapter is TargetModel",
			req:  &fwksched.LLMRequest{TargetModel: "sql-lora-v2"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("v1", loraMetrics(2, []string{"sql-lora-v1"}, nil, 0), nil),
				loraEndpoint("v2", loraMetrics(2, []string{"sql-lora-v2"}, nil, 0), nil),
			},
			want: map[string]float64{"v1": 0.2, "v2": 1},
		},
		{
			name: "residency gauge: idle resident adapter",
			req:  &fwksched.LLMRequest{TargetModel: "sql-lora"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("resident", loraMetrics(2, nil, nil, 0),
					&LoRAResidency{Adapters: lora.NewAdapters("sql-lora"), ObservedAt: loraT0}),
				loraEndpoint("free", loraMetrics(2, nil, nil, 0),
					&LoRAResidency{Adapters: lora.NewAdapters(), ObservedAt: loraT0}),
			},
			want: map[string]float64{"resident": 1, "free": 0.2},
		},
		{
			name: "extractor present but server without the gauge: inference",
			req:  &fwksched.LLMRequest{TargetModel: "sql-lora"},
			endpoints: []fwksched.Endpoint{
				loraEndpoint("running", loraMetrics(2, []string{"sql-lora"}, nil, 0), &LoRAResidency{ObservedAt: loraT0}),
				loraEndpoint("full", loraMetrics(1, []string{"x"}, nil, 0), &LoRAResidency{ObservedAt: loraT0}),
			},
			want: map[string]float64{"running": 1, "full": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newTestLoRAAffinity(t, tc.params)
			got := loraScoresByName(p.Score(context.Background(), fwksched.NewCycleState(), tc.req, tc.endpoints))
			if len(got) != len(tc.want) {
				t.Fatalf("scores = %v, want %v", got, tc.want)
			}
			for name, w := range tc.want {
				if got[name] != w {
					t.Errorf("%s: score %v, want %v", name, got[name], w)
				}
			}
		})
	}

	p, _ := newTestLoRAAffinity(t, "")
	if got := p.Score(context.Background(), fwksched.NewCycleState(), &fwksched.LLMRequest{TargetModel: "a"}, nil); len(got) != 0 {
		t.Fatalf("Score(no endpoints) = %v", got)
	}
}

func loraEq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

func loraIn(lo, hi float64) func(float64) bool {
	return func(v float64) bool { return v >= lo && v < hi }
}

// loraPrimaryResult is a scheduling result whose primary profile targets ep.
func loraPrimaryResult(ep fwksched.Endpoint) *fwksched.SchedulingResult {
	return &fwksched.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{ep}}},
	}
}

func TestLoRAAffinityPreRequestRemembersSends(t *testing.T) {
	p, clk := newTestLoRAAffinity(t, `{"memoryHalfLife":"30s","memoryTTL":"2m","baseModels":["llama"]}`)
	endpoints := []fwksched.Endpoint{
		loraEndpoint("p1", loraMetrics(4, nil, nil, 0), nil),
		loraEndpoint("p2", loraMetrics(4, nil, nil, 0), nil),
	}
	req := &fwksched.LLMRequest{TargetModel: "sql-lora"}
	score := func() map[string]float64 {
		return loraScoresByName(p.Score(context.Background(), fwksched.NewCycleState(), req, endpoints))
	}

	// Cold: rendezvous picks one pod. Send the request to the other one (as
	// if other scorers outweighed us): from now on that pod holds the adapter.
	cold := score()
	sentTo, other := endpoints[0], "p2"
	if cold["p1"] == 1 {
		sentTo, other = endpoints[1], "p1"
	}
	sentName := sentTo.GetMetadata().NamespacedName.Name
	p.PreRequest(context.Background(), req, loraPrimaryResult(sentTo))

	// The requests finished (lora_requests_info no longer lists the adapter),
	// but the adapter is remembered as resident, with decaying confidence.
	const idleSlot = 0.2
	steps := []struct {
		after       time.Duration
		sent, other func(float64) bool
		explain     string
	}{
		{0, loraEq(1), loraEq(idleSlot), "fresh send: confirmed holder"},
		{30 * time.Second, loraEq(0.75), loraEq(idleSlot), "one half-life: still a confirmed holder"},
		{90 * time.Second, loraEq(0.5 + 0.5*0.125), loraEq(1), "weight 1/8: the rendezvous target is placed again"},
		{2 * time.Minute, loraIn(0.3, 0.6), loraEq(1), "TTL: forgotten"},
	}
	for _, s := range steps {
		clk.SetTime(loraT0.Add(s.after))
		got := score()
		if !s.sent(got[sentName]) || !s.other(got[other]) {
			t.Errorf("+%v (%s): scores %v (sent to %s)", s.after, s.explain, got, sentName)
		}
	}
	if n := p.scorer.Memory().Len(); n != 1 {
		t.Fatalf("memory holds %d sends, want 1", n)
	}

	// Base-model requests and empty results are not remembered.
	p.PreRequest(context.Background(), &fwksched.LLMRequest{TargetModel: "llama"}, loraPrimaryResult(endpoints[0]))
	p.PreRequest(context.Background(), req, nil)
	p.PreRequest(context.Background(), req, &fwksched.SchedulingResult{PrimaryProfileName: "missing"})
	p.PreRequest(context.Background(), nil, loraPrimaryResult(endpoints[0]))
	if n := p.scorer.Memory().Len(); n != 1 {
		t.Fatalf("memory holds %d sends after ignored PreRequests, want 1", n)
	}
}

// TestLoRAAffinityInSchedulingProfile runs the scorer with weights next to
// upstream's queue and KV-cache scorers in an upstream scheduling profile.
func TestLoRAAffinityInSchedulingProfile(t *testing.T) {
	type podSpec struct {
		name    string
		running []string
		queue   int
		kv      float64
	}
	endpointsFor := func(specs []podSpec) []fwksched.Endpoint {
		eps := make([]fwksched.Endpoint, len(specs))
		for i, s := range specs {
			m := loraMetrics(4, s.running, nil, s.queue)
			m.KVCacheUsagePercent = s.kv
			eps[i] = loraEndpoint(s.name, m, nil)
		}
		return eps
	}
	pick := func(t *testing.T, affinity fwksched.Scorer, eps []fwksched.Endpoint) string {
		t.Helper()
		profile := scheduling.NewSchedulerProfile().
			WithScorers(
				scheduling.NewWeightedScorer(queuedepth.NewQueueScorer(), 1),
				scheduling.NewWeightedScorer(kvcacheutilization.NewKVCacheUtilizationScorer(), 1),
				scheduling.NewWeightedScorer(affinity, 2),
			).
			WithPicker(picker.NewMaxScorePicker(1))
		res, err := profile.Run(context.Background(), &fwksched.LLMRequest{TargetModel: "sql-lora"}, fwksched.NewCycleState(), eps)
		if err != nil {
			t.Fatal(err)
		}
		return res.TargetEndpoints[0].GetMetadata().NamespacedName.Name
	}

	// The holder is slightly busier than an idle pod.
	warm := endpointsFor([]podSpec{
		{name: "holder", running: []string{"sql-lora"}, queue: 2, kv: 0.5},
		{name: "idle", queue: 0, kv: 0.1},
	})
	p, _ := newTestLoRAAffinity(t, "")
	if got := pick(t, p, warm); got != "holder" {
		t.Errorf("sluice picked %s, want the holder", got)
	}
	// Upstream's 1.0 vs 0.8 lets the queue scorer load the adapter again.
	if got := pick(t, loraaffinity.NewLoraAffinityScorer(), warm); got != "idle" {
		t.Errorf("upstream picked %s; this test documents that it spreads the adapter to idle", got)
	}

	// The holder is overloaded: loading on the free pod beats waiting.
	hot := endpointsFor([]podSpec{
		{name: "holder", running: []string{"sql-lora"}, queue: lora.DefaultSpillQueueDepth + 1, kv: 0.5},
		{name: "idle", queue: lora.DefaultSpillQueueDepth, kv: 0.5},
	})
	if got := pick(t, p, hot); got != "idle" {
		t.Errorf("sluice picked %s for an overloaded holder, want idle", got)
	}
}

// TestLoRAAffinityDataDependencies checks that upstream's data-dependency
// validation accepts the extractor as the producer of the scorer's attribute.
func TestLoRAAffinityDataDependencies(t *testing.T) {
	scorer, _ := newTestLoRAAffinity(t, "")
	extractor, err := LoRAResidencyExtractorFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	order, err := datalayer.ValidateAndOrderDataDependencies([]fwkplugin.Plugin{scorer, extractor})
	if err != nil {
		t.Fatalf("upstream rejects the LoRA plugins' data dependencies: %v", err)
	}
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	if pos[extractor.TypedName().String()] > pos[scorer.TypedName().String()] {
		t.Errorf("order %v runs the scorer before the extractor it consumes", order)
	}
}

func parseLoRAMetricsText(t *testing.T, text string) sourcemetrics.PrometheusMetricMap {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing metrics text: %v", err)
	}
	return families
}

func TestLoRAResidencyExtractor(t *testing.T) {
	tests := []struct {
		name         string
		params       string
		text         string
		wantAdapters []string // nil: no residency metric
		wantBase     []string
		wantErr      string
	}{
		{
			name: "simulator gauge",
			text: `# TYPE vllm:lora_adapter_loaded gauge
vllm:lora_adapter_loaded{lora_name="sql-lora"} 1
vllm:lora_adapter_loaded{lora_name="chat-lora"} 1
vllm:lora_adapter_loaded{lora_name="evicted"} 0
`,
			wantAdapters: []string{"sql-lora", "chat-lora"},
		},
		{
			name: "vLLM loaded-adapter gauge: only the GPU level holds a slot",
			text: `# TYPE vllm:lora_adapter_loaded gauge
vllm:lora_adapter_loaded{engine="0",adapter_name="alice",level="gpu",pinned="false"} 1
vllm:lora_adapter_loaded{engine="0",adapter_name="bob",level="cpu",pinned="false"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3
`,
			wantAdapters: []string{"alice"},
			wantBase:     []string{"Qwen/Qwen3-0.6B"},
		},
		{
			name: "untyped samples",
			text: `vllm:lora_adapter_loaded{lora_name="u"} 1
vllm:num_requests_running{model_name="llama"} 0
`,
			wantAdapters: []string{"u"},
			wantBase:     []string{"llama"},
		},
		{
			// The text parser drops a family without samples, so "nothing
			// resident" reads as "no gauge": the scorer falls back to
			// inference and memory rather than trusting an empty set.
			name: "declared but empty residency family",
			text: `# HELP vllm:lora_adapter_loaded Loaded adapters.
# TYPE vllm:lora_adapter_loaded gauge
`,
		},
		{
			name:     "server without the gauge",
			text:     "vllm:num_requests_running{model_name=\"llama\"} 0\n",
			wantBase: []string{"llama"},
		},
		{
			name:   "configured names",
			params: `{"metric":"sim:resident","adapterLabels":["adapter"],"baseModelMetric":"-"}`,
			text: `sim:resident{adapter="a"} 1
vllm:num_requests_running{model_name="llama"} 0
`,
			wantAdapters: []string{"a"},
		},
		{
			name: "series without an adapter label is an error; the rest is kept",
			text: `vllm:lora_adapter_loaded{lora_name="a"} 1
vllm:lora_adapter_loaded{name="b"} 1
`,
			wantAdapters: []string{"a"},
			wantErr:      "none of the adapter labels",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plugin, err := LoRAResidencyExtractorFactory("res", json.RawMessage(tc.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			ext := plugin.(*LoRAResidencyExtractor)
			ext.clock = clocktesting.NewFakePassiveClock(loraT0)
			ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Name: "p1"}}, nil)
			err = ext.Extract(context.Background(), parseLoRAMetricsText(t, tc.text), ep)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Extract: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Extract error = %v, want one containing %q", err, tc.wantErr)
			}
			v, ok := ep.GetAttributes().Get(LoRAResidencyKey)
			if !ok {
				t.Fatal("no residency attribute stored")
			}
			res := v.(*LoRAResidency)
			if !res.ObservedAt.Equal(loraT0) {
				t.Errorf("ObservedAt = %v, want %v", res.ObservedAt, loraT0)
			}
			if (res.Adapters == nil) != (tc.wantAdapters == nil) || len(res.Adapters) != len(tc.wantAdapters) {
				t.Fatalf("adapters = %v, want %v", res.Adapters, tc.wantAdapters)
			}
			for _, a := range tc.wantAdapters {
				if !res.Adapters.Has(a) {
					t.Errorf("adapter %q missing from %v", a, res.Adapters)
				}
			}
			if len(res.BaseModels) != len(tc.wantBase) {
				t.Fatalf("base models = %v, want %v", res.BaseModels, tc.wantBase)
			}
			for _, b := range tc.wantBase {
				if !res.servesBase(b) {
					t.Errorf("base model %q missing", b)
				}
			}
		})
	}
}

func TestLoRAResidencyExtractorRejects(t *testing.T) {
	for _, raw := range []string{`{"metrik":"x"}`, `{"adapterLabels":[""]}`, `[`} {
		if _, err := LoRAResidencyExtractorFactory("x", json.RawMessage(raw), nil); err == nil {
			t.Errorf("factory accepted %s", raw)
		}
	}
	plugin, err := LoRAResidencyExtractorFactory("x", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ext := plugin.(*LoRAResidencyExtractor)
	if ext.ExpectedInputType() != sourcemetrics.PrometheusMetricType {
		t.Errorf("ExpectedInputType = %v", ext.ExpectedInputType())
	}
	ep := fwkdl.NewEndpoint(nil, nil)
	if err := ext.Extract(context.Background(), "not metrics", ep); err == nil {
		t.Error("Extract accepted a string")
	}
	if _, ok := ep.GetAttributes().Get(LoRAResidencyKey); ok {
		t.Error("Extract stored an attribute for unusable input")
	}
}

// BenchmarkLoRAScore scores 64 endpoints for requests cycling over 40
// adapters, with Sluice's scorer and with upstream's, on the same endpoints.
func BenchmarkLoRAScore(b *testing.B) {
	adapters := make([]string, 40)
	for i := range adapters {
		adapters[i] = fmt.Sprintf("adapter-%02d", i)
	}
	endpoints := make([]fwksched.Endpoint, 64)
	for i := range endpoints {
		m := loraMetrics(4, []string{adapters[i%40], adapters[(i*7)%40]}, []string{adapters[(i*13)%40]}, i%9)
		m.RunningRequestsSize = i % 17
		endpoints[i] = loraEndpoint(fmt.Sprintf("vllm-%02d", i), m, nil)
	}
	reqs := make([]*fwksched.LLMRequest, len(adapters))
	for i, a := range adapters {
		reqs[i] = &fwksched.LLMRequest{TargetModel: a}
	}

	sluice, _ := newTestLoRAAffinity(b, "")
	for i, r := range reqs {
		sluice.PreRequest(context.Background(), r, loraPrimaryResult(endpoints[(i*3)%len(endpoints)]))
	}
	scorers := []struct {
		name   string
		scorer fwksched.Scorer
	}{
		{"sluice", sluice},
		{"upstream", loraaffinity.NewLoraAffinityScorer()},
	}
	for _, s := range scorers {
		b.Run(s.name, func(b *testing.B) {
			ctx, cycle := context.Background(), fwksched.NewCycleState()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.scorer.Score(ctx, cycle, reqs[i%len(reqs)], endpoints)
				i++
			}
		})
	}
}
