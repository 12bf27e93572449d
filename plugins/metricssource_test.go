package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/runner/runnertest"
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

// FuzzMetricsPage holds parseMetricsPage to upstream's parse of any page it parses (sameForExtractors), and its parse
// of only some families (those of Sluice's default profile's extractors, and some of the seed page's) to its parse of
// every family: the same error or none, and the same families read.
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
	for _, pg := range modelServerPages(f) {
		f.Add([]byte(pg))
	}
	read := familySet{"lat": {}, "q": {}, "c_total": {}, "a": {}, "h": {}, "s": {}}
	for _, names := range [][]string{{"vllm:lora_adapter_loaded", "vllm:num_requests_running"}, defaultCoreFamilies(f)} {
		for _, n := range names {
			read[n] = struct{}{}
		}
	}
	f.Fuzz(func(t *testing.T, page []byte) {
		if err := readsAsEveryFamily(page, read); err != nil {
			t.Fatalf("page %q: %v", page, err)
		}
		got, gotErr := parseMetricsPage(strings.NewReader(string(page)), nil) // never panics
		if fast, ok := parseMetricsFast(page, nil); ok {
			filtered := withoutDistributionDetail(bytes.Clone(page))
			exact, err := upstreamParse(filtered)
			if err != nil {
				t.Fatalf("page %q: the fast parse takes it, expfmt: %v", page, err)
			}
			if err := sameFamilies(fast, exact); err != nil {
				t.Fatalf("page %q: %v", page, err)
			}
		}
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

// readsAsEveryFamily reports how parseMetricsPage's parse of the families read differs from its parse of every family
// less the others: an error where the other has none (or none where it has one), or a family.
func readsAsEveryFamily(page []byte, read familySet) error {
	all, errAll := parseMetricsPage(bytes.NewReader(page), nil)
	some, errSome := parseMetricsPage(bytes.NewReader(page), &read)
	if (errAll == nil) != (errSome == nil) {
		return fmt.Errorf("reading some families: error %v; reading every family: error %v", errSome, errAll)
	}
	if errAll != nil {
		return nil
	}
	want := all.(map[string]*dto.MetricFamily)
	maps.DeleteFunc(want, func(name string, _ *dto.MetricFamily) bool { _, ok := read[name]; return !ok })
	return sameFamilies(some.(map[string]*dto.MetricFamily), want)
}

// defaultCoreFamilies are the families upstream's core extractor reads with its defaults.
func defaultCoreFamilies(t testing.TB) []string {
	t.Helper()
	p, err := extractormetrics.CoreMetricsExtractorFactory("core", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	names, ok := familiesRead(p.(fwkdl.Extractor))
	if !ok {
		t.Fatal("cannot tell which families upstream's extractor reads")
	}
	return names
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

// TestMetricsFastParseAsExpfmt holds the fast parse to expfmt's on the pages it takes, family for family
// (proto.Equal), and checks which pages it takes: a vLLM page (testdata/vllm-metrics.txt, as vLLM's Python client
// writes it), the simulator's and the seed pages must not fall back to expfmt, or the saving is gone.
func TestMetricsFastParseAsExpfmt(t *testing.T) {
	pages := map[string]string{}
	for _, f := range []string{"vllm-metrics.txt", "vllm-sim-metrics.txt"} {
		b, err := os.ReadFile("testdata/" + f)
		if err != nil {
			t.Fatal(err)
		}
		pages[f] = string(b)
	}
	cases := []struct {
		name string
		page string
		fast bool // taken by the fast parse
	}{
		{"vLLM", pages["vllm-metrics.txt"], true},
		{"simulator", pages["vllm-sim-metrics.txt"], true},
		{"seed page (an indented line)", metricsPages[1], false},
		{"empty", "", true},
		{"blank lines", "\n  \n\t\na 1\n", true},
		{"no type, then help", "a{b=\"c\"} 1\n# HELP a text\n", true},
		{"help only", "# HELP a text\n", true},
		{"other comments", "# hello there\n#\n# HELP\n# TYPE\na 1\n", true},
		{"trailing comma, empty labels", "a{b=\"c\",} 1\nb{} 2 -5\n", true},
		{"special values", "a NaN\na +Inf\na -Inf\na 1e-3\na Inf\n", true},
		{"summary count", "# TYPE s summary\ns_count{x=\"y\"} 3\ns_count{x=\"z\"} 4 100\n", true},
		{"empty label value", "a{b=\"\"} 1\n", true},
		{"help with spaces", "# HELP a   two  words \na 1\n", true},
		{"family of a suffix", "# TYPE x gauge\nx_count 1\n# TYPE h histogram\nh_bucket_count 2\n", true},
		// Left to expfmt (same result or same error there).
		{"no final newline", "a 1", false},
		{"escaped help", "# HELP a a\\nb\na 1\n", false},
		{"escaped label", "a{b=\"c\\\"d\"} 1\n", false},
		{"second HELP", "# HELP a x\n# HELP a y\na 1\n", false},
		{"TYPE after samples", "a 1\n# TYPE a gauge\n", false},
		{"unknown type", "# TYPE a foo\na 1\n", false},
		{"upper-case type", "# TYPE a GAUGE\na 1\n", false},
		{"bad value", "a x\n", false},
		{"hex value", "a 0x1p3\n", false},
		{"underscore value", "a 1_000\n", false},
		{"bad timestamp", "a 1 2.5\n", false},
		{"trailing blank", "a 1 \n", false},
		{"two spaces", "a  1\n", false},
		{"duplicate label", "a{b=\"c\",b=\"d\"} 1\n", false},
		{"reserved label", "a{__name__=\"c\"} 1\n", false},
		{"quoted name", "{\"a\"} 1\n", false},
		{"unterminated labels", "a{b=\"c\" 1\n", false},
		{"bucket kept", "# TYPE h histogram\n# HELP h_bucket x\nh_bucket{le=\"1\"} 1\n", false},
		{"histogram count twice", "# TYPE h histogram\nh_count 1\nh_count 2\n", false},
		{"float count", "# TYPE h histogram\nh_count 1.5\n", false},
		{"panics expfmt", "#0000000\n{}", false},
		{"invalid utf-8 label", "a{b=\"\xff\"} 1\n", false},
		{"leading blank", " a 1\n", false},
		{"carriage return", "a 1\r\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := parseMetricsFast([]byte(c.page), nil)
			page := withoutDistributionDetail([]byte(c.page))
			if ok != c.fast {
				t.Fatalf("fast parse took the page: %v, want %v", ok, c.fast)
			}
			if !ok {
				return
			}
			want, err := upstreamParse(page)
			if err != nil {
				t.Fatalf("fast parse took a page expfmt rejects: %v", err)
			}
			if err := sameFamilies(got, want); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestMetricsPageMalformed: a malformed page is an error that says so, never a panic.
func TestMetricsPageMalformed(t *testing.T) {
	for _, page := range []string{"#0000000\n{}", "a{b=\"c\" 1\n", "a 1", "a x\n", "# TYPE a foo\n", "a{b=\"\\q\"} 1\n",
		"# TYPE h histogram\nh_count -1\n", "\x00\n"} {
		_, err := parseMetricsPage(strings.NewReader(page), nil)
		if err == nil {
			t.Errorf("page %q parsed", page)
		}
	}
}

// sameFamilies reports how got differs from want, family for family.
func sameFamilies(got, want map[string]*dto.MetricFamily) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d families, expfmt's %d", len(got), len(want))
	}
	for name, w := range want {
		if !proto.Equal(got[name], w) {
			return fmt.Errorf("family %s: %v, expfmt's %v", name, got[name], w)
		}
	}
	return nil
}

func BenchmarkMetricsPage(b *testing.B) {
	for _, f := range []string{"vllm-metrics.txt", "vllm-sim-metrics.txt"} {
		page, err := os.ReadFile("testdata/" + f)
		if err != nil {
			b.Fatal(err)
		}
		// path=read is the source's parse as the EPP runs it with Sluice's default profile (the families its
		// extractors read); path=fast the parse of every family (a source with an extractor that does not say what it
		// reads); path=expfmt the way every page took before (the read into a fresh buffer,
		// withoutDistributionDetail and expfmt), which any other page still takes.
		read := familySet{}
		for _, n := range append(defaultCoreFamilies(b), DefaultLoRAResidencyMetric, DefaultLoRABaseModelMetric) {
			read[n] = struct{}{}
		}
		b.Run("page="+f+"/path=read", func(b *testing.B) {
			b.ReportAllocs()
			defer runnertest.CPUPerOp(b)()
			for b.Loop() {
				if _, err := parseMetricsPage(bytes.NewReader(page), &read); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("page="+f+"/path=fast", func(b *testing.B) {
			b.ReportAllocs()
			defer runnertest.CPUPerOp(b)()
			for b.Loop() {
				if _, err := parseMetricsPage(bytes.NewReader(page), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("page="+f+"/path=expfmt", func(b *testing.B) {
			b.ReportAllocs()
			defer runnertest.CPUPerOp(b)()
			for b.Loop() {
				raw, err := io.ReadAll(bytes.NewReader(page))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := parseMetricsExpfmt(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMetricsSourceAsksNoGzip: the source asks for the page uncompressed (Go's client asks for gzip unless told not
// to, and a server that honours it compresses every page the EPP then decompresses).
func TestMetricsSourceAsksNoGzip(t *testing.T) {
	page := simulatorPage(t)
	encodings := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		encodings <- r.Header.Get("Accept-Encoding")
		_, _ = w.Write(page)
	}))
	defer srv.Close()
	got, err := pollOnce(t, "", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.(sourcemetrics.PrometheusMetricMap)) == 0 {
		t.Error("no families")
	}
	if enc := <-encodings; enc != "" {
		t.Errorf("Accept-Encoding %q, want none", enc)
	}
}

// simulatorPage is the simulator's metrics page from testdata.
func simulatorPage(t *testing.T) []byte {
	t.Helper()
	page, err := os.ReadFile("testdata/vllm-sim-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	return page
}

// pollOnce builds the source from params (JSON, "" for none) and polls the endpoint whose metrics are at serverURL.
func pollOnce(t *testing.T, params, serverURL string) (any, error) {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := MetricsSourceFactory("", raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{MetricsHost: u.Host}, nil)
	return p.(fwkdl.PollingDataSource).Poll(context.Background(), ep)
}

// TestMetricsSourceHTTPS: with scheme https the source reads a page served with a certificate it cannot verify only
// when insecureSkipVerify is on (upstream's default), and otherwise fails with the certificate error.
func TestMetricsSourceHTTPS(t *testing.T) {
	page := simulatorPage(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) }))
	defer srv.Close()
	for _, tc := range []struct {
		name    string
		params  string
		wantErr string
	}{
		{name: "default skips verification", params: `{"scheme": "https"}`},
		{name: "verification on", params: `{"scheme": "https", "insecureSkipVerify": false}`, wantErr: "certificate"},
		{name: "plain http to a TLS server", params: `{"scheme": "http"}`, wantErr: "unexpected status code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pollOnce(t, tc.params, srv.URL)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Poll error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.(sourcemetrics.PrometheusMetricMap)) == 0 {
				t.Error("no families")
			}
		})
	}
}

// TestMetricsPageTakesTheFastPath: the source's parse of the vLLM and simulator pages goes the fast way, which
// allocates about a third of what the expfmt way does (allocation counts, not time: they do not vary with the load).
func TestMetricsPageTakesTheFastPath(t *testing.T) {
	for _, f := range []string{"vllm-metrics.txt", "vllm-sim-metrics.txt"} {
		page, err := os.ReadFile("testdata/" + f)
		if err != nil {
			t.Fatal(err)
		}
		source := testing.AllocsPerRun(20, func() {
			if _, err := parseMetricsPage(bytes.NewReader(page), nil); err != nil {
				t.Fatal(err)
			}
		})
		slow := testing.AllocsPerRun(20, func() {
			if _, err := parseMetricsExpfmt(bytes.Clone(page)); err != nil {
				t.Fatal(err)
			}
		})
		if source > slow/2 {
			t.Errorf("%s: %.0f allocations, the expfmt way %.0f", f, source, slow)
		}
	}
}
