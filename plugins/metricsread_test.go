package plugins

import (
	"context"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
)

// TestCoreExtractorFamilies: the families upstream's core-metrics-extractor reads are its Specs' metric names, of
// every engine it knows: the four built-in ones (GIE v1.5.0's defaultEngineConfigs) and any configured.
func TestCoreExtractorFamilies(t *testing.T) {
	builtIn := []string{
		"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:lora_requests_info",
		"vllm:cache_config_info",
		"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info",
		"trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization",
		"trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_max_blocks",
		"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics",
	}
	tests := []struct {
		name   string
		params string
		want   []string
	}{
		{name: "defaults", want: builtIn},
		{name: "an engine configured", params: `{"engineConfigs": [{"name": "mine", "queuedRequestsSpec": "my_queue{a=\"b\"}",
			"runningRequestsSpec": "my_running", "loraSpec": "my_lora"}]}`,
			want: append([]string{"my_queue", "my_running", "my_lora"}, builtIn...)},
		{name: "vLLM's LoRA spec disabled", params: `{"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting"}]}`,
			want: append([]string{"vllm:num_requests_waiting"}, builtIn[5:]...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var raw []byte
			if tt.params != "" {
				raw = []byte(tt.params)
			}
			p, err := extractormetrics.CoreMetricsExtractorFactory("core", raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := familiesRead(p.(fwkdl.Extractor))
			if !ok {
				t.Fatal("cannot tell which families upstream's extractor reads")
			}
			if g, w := uniqueSorted(got), uniqueSorted(tt.want); !slices.Equal(g, w) {
				t.Errorf("families %q, want %q", g, w)
			}
		})
	}
}

func uniqueSorted(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// otherExtractor is an extractor of metric families that does not say which it reads.
type otherExtractor struct{ *LoRAResidencyExtractor }

func (otherExtractor) MetricFamiliesRead() {}

// TestMetricsSourceReadsWhatItsExtractorsRead: configured with extractors that name what they read, the source
// parses those families; with one that does not (or none), every family.
func TestMetricsSourceReadsWhatItsExtractorsRead(t *testing.T) {
	core, lora := defaultProfileExtractors(t)
	tests := []struct {
		name       string
		extractors []fwkdl.Extractor
		want       []string // nil: every family
	}{
		{name: "none"},
		{name: "Sluice's default profile", extractors: []fwkdl.Extractor{core, lora},
			want: append([]string{"vllm:lora_adapter_loaded"}, mustFamilies(t, core)...)},
		{name: "one that does not tell", extractors: []fwkdl.Extractor{core, otherExtractor{lora.(*LoRAResidencyExtractor)}, lora}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newMetricsSource(t, tt.extractors...)
			read := src.read.Load()
			if tt.want == nil {
				if read != nil {
					t.Errorf("reads %q, want every family", slices.Sorted(maps.Keys(*read)))
				}
				return
			}
			if read == nil {
				t.Fatal("reads every family")
			}
			if g, w := slices.Sorted(maps.Keys(*read)), uniqueSorted(tt.want); !slices.Equal(g, w) {
				t.Errorf("reads %q, want %q", g, w)
			}
		})
	}
}

// TestMetricsSourceLearnsItsExtractorsFromGIE: GIE's data layer runtime shows the source its extractors
// (Runtime.Configure calls ValidateExtractor), so the EPP's source parses only what they read.
func TestMetricsSourceLearnsItsExtractorsFromGIE(t *testing.T) {
	core, lora := defaultProfileExtractors(t)
	src := newMetricsSource(t)
	cfg := &datalayer.Config{Sources: []datalayer.DataSourceConfig{{Plugin: src, Extractors: []fwkdl.Extractor{core, lora}}}}
	if err := datalayer.NewRuntime(time.Second).Configure(cfg, true, "", logr.Discard()); err != nil {
		t.Fatal(err)
	}
	read := src.read.Load()
	if read == nil {
		t.Fatal("reads every family")
	}
	if g, w := slices.Sorted(maps.Keys(*read)), uniqueSorted(append(mustFamilies(t, core), mustFamilies(t, lora)...)); !slices.Equal(g, w) {
		t.Errorf("reads %q, want %q", g, w)
	}
}

func mustFamilies(t *testing.T, ext fwkdl.Extractor) []string {
	t.Helper()
	names, ok := familiesRead(ext)
	if !ok {
		t.Fatalf("%s: cannot tell", ext.TypedName())
	}
	return names
}

// defaultProfileExtractors are the extractors of Sluice's default profile on the metrics source: upstream's core
// extractor and the LoRA residency extractor (on a fixed clock).
func defaultProfileExtractors(t *testing.T) (core, lora fwkdl.Extractor) {
	t.Helper()
	c, err := extractormetrics.CoreMetricsExtractorFactory("core", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := LoRAResidencyExtractorFactory("", nil, clockHandle{clock: clocktesting.NewFakePassiveClock(fcT0)})
	if err != nil {
		t.Fatal(err)
	}
	return c.(fwkdl.Extractor), l.(fwkdl.Extractor)
}

// newMetricsSource builds the source and validates extractors on it, as GIE's data layer runtime does.
func newMetricsSource(t *testing.T, extractors ...fwkdl.Extractor) *metricsSource {
	t.Helper()
	p, err := MetricsSourceFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := p.(*metricsSource)
	for _, ext := range extractors {
		if err := src.ValidateExtractor(ext); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// modelServerPages are pages of each engine upstream's core extractor knows, as the servers write them: vLLM's
// (testdata/vllm-metrics.txt), the test bed simulator's with and without LoRA adapters, SGLang's, trtllm-serve's and
// Triton's TensorRT-LLM backend's.
func modelServerPages(t testing.TB) map[string]string {
	t.Helper()
	pages := map[string]string{}
	for _, f := range []string{"vllm-metrics.txt", "vllm-sim-metrics.txt", "sglang-metrics.txt", "trtllm-serve-metrics.txt",
		"triton-trtllm-metrics.txt"} {
		b, err := os.ReadFile("testdata/" + f)
		if err != nil {
			t.Fatal(err)
		}
		pages[f] = string(b)
	}
	pages["vllm-sim-metrics.txt with adapters"] = pages["vllm-sim-metrics.txt"] + `# HELP vllm:lora_adapter_loaded Whether a LoRA adapter is loaded.
# TYPE vllm:lora_adapter_loaded gauge
vllm:lora_adapter_loaded{lora_name="sql-lora",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1
vllm:lora_adapter_loaded{lora_name="tweet-summary",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0
`
	return pages
}

// TestMetricsSourceExtractsAsTheFullParse is the differential that holds the source's parse of only the families
// its extractors read to the parse of every family: on each model server's page, for each engine label, each
// extractor of Sluice's default profile (and Sluice's prefix-cache scorer's calibration) stores the same metrics and
// attributes, and returns the same error, from either; the families read are the full parse's, family for family; the
// pages still take the fast parse; and the parse builds fewer families than the page has.
func TestMetricsSourceExtractsAsTheFullParse(t *testing.T) {
	core, lora := defaultProfileExtractors(t)
	prefix, err := PrefixCacheFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	extractors := []fwkdl.Extractor{core, lora, prefix.(fwkdl.Extractor)}
	src := newMetricsSource(t, extractors...)
	read := *src.read.Load()
	for name, page := range modelServerPages(t) {
		t.Run(name, func(t *testing.T) {
			all, err := parseMetricsPage(strings.NewReader(page), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseMetricsPage(strings.NewReader(page), &read)
			if err != nil {
				t.Fatal(err)
			}
			full, some := all.(map[string]*dto.MetricFamily), got.(map[string]*dto.MetricFamily)
			if _, ok := parseMetricsFast([]byte(page), read); !ok {
				t.Error("the page left the fast parse")
			}
			want := maps.Clone(full)
			maps.DeleteFunc(want, func(name string, _ *dto.MetricFamily) bool { _, ok := read[name]; return !ok })
			if err := sameFamilies(some, want); err != nil {
				t.Error(err)
			}
			if len(some) == 0 || len(some) >= len(full) {
				t.Errorf("%d families read of the page's %d", len(some), len(full))
			}
			for _, engine := range []string{"", "vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"} {
				for _, ext := range extractors {
					if diff := extractsAlike(ext, engine, full, some); diff != "" {
						t.Errorf("engine %q, %s: %s", engine, ext.TypedName(), diff)
					}
				}
			}
		})
	}
}

// extractsAlike runs ext on the families of the full parse and on those of the parse of what is read, each onto a
// new endpoint labelled engine, and tells how the two differ: error, metrics (but their update time) or attributes.
func extractsAlike(ext fwkdl.Extractor, engine string, full, some sourcemetrics.PrometheusMetricMap) string {
	run := func(families sourcemetrics.PrometheusMetricMap) (fwkdl.Endpoint, string) {
		md := &fwkdl.EndpointMetadata{Address: "10.0.0.1", Port: "8000", PodName: "p", Labels: map[string]string{}}
		if engine != "" {
			md.Labels[extractormetrics.DefaultEngineTypeLabelKey] = engine
		}
		ep := fwkdl.NewEndpoint(md, nil)
		err := ext.Extract(context.Background(), families, ep)
		return ep, fmt.Sprint(err)
	}
	a, errA := run(full)
	b, errB := run(some)
	if errA != errB {
		return fmt.Sprintf("error %s, from every family %s", errB, errA)
	}
	ma, mb := a.GetMetrics(), b.GetMetrics()
	ma.UpdateTime, mb.UpdateTime = time.Time{}, time.Time{}
	if !reflect.DeepEqual(ma, mb) {
		return fmt.Sprintf("metrics %+v, from every family %+v", mb, ma)
	}
	for _, key := range a.GetAttributes().Keys() {
		va, _ := a.GetAttributes().Get(key)
		vb, _ := b.GetAttributes().Get(key)
		if !reflect.DeepEqual(va, vb) {
			return fmt.Sprintf("attribute %s %+v, from every family %+v", key, vb, va)
		}
	}
	if len(a.GetAttributes().Keys()) != len(b.GetAttributes().Keys()) {
		return fmt.Sprintf("attributes %v, from every family %v", b.GetAttributes().Keys(), a.GetAttributes().Keys())
	}
	return ""
}
