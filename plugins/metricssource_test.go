package plugins

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
)

// metricsPages are the differential's cases and the fuzz target's seeds: the simulator's page, and a page with every
// kind of family, labels, timestamps, a summary and a series whose samples are apart.
var metricsPages = []string{
	"", // the simulator's page, read from testdata
	`# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3 1700000000000
  # TYPE lat histogram
lat_bucket{model_name="m",le="1"} 2
lat_bucket{model_name="m",le="+Inf"} 4
lat_sum{model_name="m"} 7.5
lat_count{model_name="m"} 4
lat_bucket{model_name="n",le="+Inf"} 1
# TYPE q summary
q{quantile="0.5"} 1
q_sum 3
q_count 2
# TYPE c counter
c_total 5
untyped_thing{a="b"} 1e3
# TYPE lat_created gauge
lat_created{model_name="m"} 1.7e9
lat_count{model_name="n"} 1
`,
}

// TestMetricsSourceReadsAsUpstreams polls the same page with upstream's metrics-data-source and Sluice's: every
// gauge, counter and untyped family comes out identical; every histogram and summary keeps its series, labels and
// count (see sameForExtractors).
func TestMetricsSourceReadsAsUpstreams(t *testing.T) {
	sim, err := os.ReadFile("testdata/vllm-sim-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	var page string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page) }))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{MetricsHost: u.Host}, nil)
	upstream, err := sourcemetrics.NewHTTPMetricsDataSource("http", "/metrics", "upstream")
	if err != nil {
		t.Fatal(err)
	}
	p, err := MetricsSourceFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sluice := p.(fwkdl.PollingDataSource)
	if sluice.OutputType() != upstream.OutputType() {
		t.Fatalf("output type %v, upstream's %v", sluice.OutputType(), upstream.OutputType())
	}
	for i, pg := range metricsPages {
		if pg == "" {
			pg = string(sim)
		}
		page = pg
		want, err := upstream.Poll(context.Background(), ep)
		if err != nil {
			t.Fatalf("page %d: upstream: %v", i, err)
		}
		got, err := sluice.Poll(context.Background(), ep)
		if err != nil {
			t.Fatalf("page %d: %v", i, err)
		}
		if err := sameForExtractors(got.(sourcemetrics.PrometheusMetricMap), want.(sourcemetrics.PrometheusMetricMap)); err != nil {
			t.Errorf("page %d: %v", i, err)
		}
	}
}

// TestMetricsPageLeavesOutDistributionDetail: what parseMetricsPage saves is the histogram's buckets and sums.
func TestMetricsPageLeavesOutDistributionDetail(t *testing.T) {
	sim, err := os.ReadFile("testdata/vllm-sim-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	before := strings.Count(string(sim), "\n")
	after := strings.Count(string(withoutDistributionDetail(sim)), "\n")
	if want := before - 4*22; after > want { // four histograms of at least 20 buckets and a sum each
		t.Errorf("%d of the page's %d lines kept, want at most %d", after, before, want)
	}
}

// TestMetricsPageFamilyAfterDroppedLines: a TYPE line after dropped lines is read as written, though the page is
// filtered in place over the bytes it was read from.
func TestMetricsPageFamilyAfterDroppedLines(t *testing.T) {
	page := "# TYPE a summary\na_sum 1\na_count 1\n# TYPE bb summary\nbb{quantile=\"0.5\"} 1\nbb_sum 2\nbb_count 3\n"
	want := "# TYPE a summary\na_count 1\n# TYPE bb summary\nbb_count 3\n"
	if got := string(withoutDistributionDetail([]byte(page))); got != want {
		t.Errorf("filtered page:\n%s\nwant:\n%s", got, want)
	}
}

// FuzzMetricsPage holds parseMetricsPage to upstream's parse of any page it parses (sameForExtractors).
func FuzzMetricsPage(f *testing.F) {
	sim, err := os.ReadFile("testdata/vllm-sim-metrics.txt")
	if err != nil {
		f.Fatal(err)
	}
	for _, pg := range metricsPages {
		if pg == "" {
			pg = string(sim)
		}
		f.Add([]byte(pg))
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		got, gotErr := parseMetricsPage(strings.NewReader(string(page))) // never panics
		want, err := upstreamParse(page)
		if err != nil {
			return // upstream rejects the page; Sluice may accept it when the defect is in a left-out line
		}
		if err := gotErr; err != nil {
			t.Fatalf("page %q: %v, upstream parses it", page, err)
		}
		if err := sameForExtractors(got.(sourcemetrics.PrometheusMetricMap), want); err != nil {
			t.Fatalf("page %q: %v", page, err)
		}
	})
}

// upstreamParse is upstream's parseMetrics, with its panics (expfmt's) as errors.
func upstreamParse(page []byte) (families map[string]*dto.MetricFamily, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	return parser.TextToMetricFamilies(strings.NewReader(string(page)))
}

// sameForExtractors reports how got differs from upstream's parse in what an extractor reading sample values can
// find: the same families with the same names, types and help; gauges, counters and untyped families identical;
// each histogram and summary with the same series (labels) and counts. A series upstream found without a _count
// sample (not valid exposition) may be missing.
func sameForExtractors(got, want sourcemetrics.PrometheusMetricMap) error {
	for name, w := range want {
		g := got[name]
		distribution := w.GetType() == dto.MetricType_HISTOGRAM || w.GetType() == dto.MetricType_SUMMARY
		if !distribution {
			if !proto.Equal(g, w) {
				return fmt.Errorf("family %s: %v, upstream's %v", name, g, w)
			}
			continue
		}
		wantSeries := distributionSeries(w)
		if len(wantSeries) == 0 && g == nil {
			continue
		}
		if g == nil || g.GetType() != w.GetType() || g.GetHelp() != w.GetHelp() {
			return fmt.Errorf("family %s: %v, upstream's %v", name, g, w)
		}
		if gotSeries := distributionSeries(g); strings.Join(gotSeries, "\n") != strings.Join(wantSeries, "\n") {
			return fmt.Errorf("family %s: series %q, upstream's %q", name, gotSeries, wantSeries)
		}
	}
	for name := range got {
		if want[name] == nil {
			return fmt.Errorf("family %s, which upstream does not find", name)
		}
	}
	return nil
}

// distributionSeries lists a histogram's or summary's series that have a count, as their labels and count, sorted.
func distributionSeries(mf *dto.MetricFamily) []string {
	var out []string
	for _, m := range mf.GetMetric() {
		var count *uint64
		if h := m.GetHistogram(); h != nil {
			count = h.SampleCount
		}
		if s := m.GetSummary(); s != nil {
			count = s.SampleCount
		}
		if count == nil {
			continue
		}
		out = append(out, fmt.Sprintf("%v count %d", m.GetLabel(), *count))
	}
	sort.Strings(out)
	return out
}
