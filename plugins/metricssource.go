package plugins

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
)

// MetricsSourceType is Sluice's metrics data source: upstream's metrics-data-source (the same HTTP polling, the same
// parameters and output type) building only the families its extractors read (ValidateExtractor; every family when
// one of them does not say), and of those only what an extractor can use of a histogram or a summary. It asks for
// pages without gzip (upstream's client asks for it).
//
// Why: the EPP scrapes every server every 50 ms, and upstream's source parses the whole page with expfmt. A vLLM page
// is mostly histogram buckets (four latency histograms, ~95 of the simulator's ~140 lines), and no extractor reads
// them: upstream's core-metrics-extractor takes a sample's gauge or counter value (0 for a histogram or a summary)
// and Sluice's extractors read gauges. Parsing the page was most of the EPP's background CPU (see "The EPP's own cost
// per request" in testbed/bench/scenarios/README.md).
const MetricsSourceType = "sluice-metrics-data-source"

// metricsSourceAPIConfig is the JSON schema of MetricsSourceType's parameters, upstream's metrics-data-source's.
type metricsSourceAPIConfig struct {
	Scheme             string `json:"scheme"`
	Path               string `json:"path"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify"`
}

// MetricsSourceFactory builds a MetricsSourceType data source from its parameters; unset ones take upstream's
// defaults (http, /metrics, certificates not verified).
func MetricsSourceFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	api := metricsSourceAPIConfig{Scheme: "http", Path: "/metrics", InsecureSkipVerify: true}
	if err := decodeParams(raw, &api); err != nil {
		return nil, fmt.Errorf("parsing %s parameters: %w", MetricsSourceType, err)
	}
	if name == "" {
		name = MetricsSourceType
	}
	if api.Scheme != "http" && api.Scheme != "https" {
		return nil, fmt.Errorf("unsupported scheme: %s", api.Scheme) // upstream's words
	}
	transport := &http.Transport{
		// upstream's pool: idle connections enough for every endpoint, two per endpoint
		MaxIdleConns:        5000,
		MaxIdleConnsPerHost: 2,
		// A page is a few kilobytes read on the pod network every 50 ms: gzip (which Go's client asks for unless
		// told not to) costs the server its compression and the EPP its decompression and buys nothing.
		DisableCompression: true,
	}
	if api.Scheme == "https" {
		transport.TLSClientConfig = &tls.Config{InsecureSkipVerify: api.InsecureSkipVerify} //nolint:gosec // upstream's parameter
	}
	return &metricsSource{
		typedName: fwkplugin.TypedName{Type: MetricsSourceType, Name: name},
		scheme:    api.Scheme,
		path:      api.Path,
		client:    &http.Client{Timeout: 10 * time.Second, Transport: transport},
	}, nil
}

// metricsSource polls each endpoint's metrics page as upstream's HTTP data source does (the same URL, status check,
// timeout and output type), with its own client (see DisableCompression) and parseMetricsPage.
type metricsSource struct {
	typedName    fwkplugin.TypedName
	scheme, path string
	client       *http.Client
	// read is the families Poll parses, those its extractors read (ValidateExtractor); nil: every family.
	read    atomic.Pointer[familySet]
	mu      sync.Mutex // serializes ValidateExtractor
	readAll bool       // an extractor that does not name what it reads was validated
}

var _ fwkdl.PollingDataSource = (*metricsSource)(nil)

// TypedName is the source's type and name.
func (s *metricsSource) TypedName() fwkplugin.TypedName { return s.typedName }

// OutputType is what Poll returns: metric families by name, as upstream's source.
func (s *metricsSource) OutputType() reflect.Type { return sourcemetrics.PrometheusMetricType }

// ExtractorType is the type an extractor of this source implements.
func (s *metricsSource) ExtractorType() reflect.Type { return fwkdl.ExtractorType }

// Poll reads ep's page, as upstream's HTTPDataSource.Poll and its client do (GIE v1.5.0,
// pkg/epp/framework/plugins/datalayer/source/http/datasource.go and client.go: the same URL, status check, timeout,
// connection pool and error words). Upstream's client is a package global whose transport cannot be set, hence the
// copy.
func (s *metricsSource) Poll(ctx context.Context, ep fwkdl.Endpoint) (any, error) {
	md := ep.GetMetadata()
	target := url.URL{Scheme: s.scheme, Host: md.GetMetricsHost(), Path: s.path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("failed to create request: %v", err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to fetch data from %s: %w", md.GetNamespacedName(), err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("unexpected status code from %s: %v", md.GetNamespacedName(), resp.StatusCode)
	}
	return parseMetricsPage(resp.Body, s.read.Load())
}

// ValidateExtractor implements fwkdl.ValidatingDataSource: it is how GIE shows a source the extractors configured on
// it (Runtime.Configure, once per extractor, before any poll). Poll parses only the families they read: those an
// extractor names (familiesRead); every family once one of them does not name its own.
func (s *metricsSource) ValidateExtractor(ext fwkdl.Extractor) error {
	names, ok := familiesRead(ext)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok || s.readAll {
		s.readAll = true
		s.read.Store(nil)
		return nil
	}
	read := familySet{}
	if old := s.read.Load(); old != nil {
		maps.Copy(read, *old)
	}
	for _, n := range names {
		read[n] = struct{}{}
	}
	s.read.Store(&read)
	return nil
}

// parseMetricsPage parses a Prometheus text page as upstream's metrics-data-source does, less the families read does
// not name (nil: none left out), and less the samples of each histogram and summary other than its _count: each of
// their series keeps its family, labels and timestamp, which is all an extractor reading sample values finds there. A
// page whose only defects are in the samples left out parses. The pages model servers write go through
// parseMetricsFast; any other page through expfmt, which panics on some malformed pages (a line "{}" after a comment):
// that is an error here, not the end of the process, as the page comes from a model server.
func parseMetricsPage(r io.Reader, read *familySet) (families any, err error) {
	buf := pageBuffers.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledPage {
			buf.Reset()
			pageBuffers.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, err
	}
	var set familySet
	if read != nil {
		set = *read
	}
	if mfs, ok := parseMetricsFast(buf.Bytes(), set); ok {
		return mfs, nil
	}
	mfs, err := parseMetricsExpfmt(buf.Bytes())
	if err != nil {
		return nil, err
	}
	if set != nil {
		maps.DeleteFunc(mfs, func(name string, _ *dto.MetricFamily) bool { _, ok := set[name]; return !ok })
	}
	return mfs, nil
}

// parseMetricsExpfmt is parseMetricsPage's way for any page: withoutDistributionDetail, then expfmt. It rewrites page.
func parseMetricsExpfmt(raw []byte) (families map[string]*dto.MetricFamily, err error) {
	page := withoutDistributionDetail(raw)
	defer func() {
		if p := recover(); p != nil {
			families, err = nil, fmt.Errorf("malformed metrics page: %v", p)
		}
	}()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	return parser.TextToMetricFamilies(bytes.NewReader(page))
}

// pageBuffers hold the pages being parsed: every family's strings are copies, so a page's bytes are free once it is
// parsed. A page larger than maxPooledPage is not kept.
var pageBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledPage = 1 << 20

// withoutDistributionDetail returns page without the sample lines of its histograms and summaries (as declared by
// their TYPE lines) other than the _count ones: a histogram's buckets and sum, a summary's quantiles and sum. A
// sample goes where expfmt sends it: a line is left out only when no family of its own name exists (expfmt looks that
// up first; a summary's quantile is its own family's), else kept. Every other line is kept as it is. It works in place.
// A page with a sample line without a name ("{...} value") is returned whole: expfmt reads such a line as a sample of
// the family of the line before it, which leaving out that line would change (FuzzMetricsPage found a page that
// expfmt parses whole and panics on without its histogram's _sum line).
func withoutDistributionDetail(page []byte) []byte {
	if hasNamelessSample(page) {
		return page
	}
	out := page[:0]
	var family []byte // the histogram or summary the last TYPE line declared, if any
	var summary bool
	named := map[string]bool{} // the names of comment lines and of the samples kept: families that may exist
	for rest := page; len(rest) > 0; {
		line := rest
		next := len(rest)
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, next = rest[:i], i+1
		}
		keep := rest[:next]
		rest = rest[next:]
		text := bytes.TrimLeft(line, " \t")
		switch {
		case len(text) == 0:
		case text[0] == '#':
			f := bytes.Fields(text[1:])
			if len(f) >= 2 && (string(f[0]) == "TYPE" || string(f[0]) == "HELP") {
				named[string(f[1])] = true
			}
			if len(f) >= 3 && string(f[0]) == "TYPE" {
				t := string(f[2])
				family, summary = nil, t == "summary"
				if t == "histogram" || summary {
					family = bytes.Clone(f[1]) // the page is rewritten in place: f[1] may be overwritten
				}
			}
		default:
			name := sampleName(text)
			if family != nil && isDistributionDetail(name, family, summary) && (bytes.Equal(name, family) || !named[string(name)]) {
				continue
			}
			named[string(name)] = true
		}
		out = append(out, keep...)
	}
	return out
}

// hasNamelessSample reports whether a line of page starts, after blanks, with '{'.
func hasNamelessSample(page []byte) bool {
	for rest := page; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if text := bytes.TrimLeft(line, " \t"); len(text) > 0 && text[0] == '{' {
			return true
		}
	}
	return false
}

// sampleName is the metric name a sample line starts with.
func sampleName(line []byte) []byte {
	if i := bytes.IndexAny(line, "{ \t"); i >= 0 {
		return line[:i]
	}
	return line
}

// isDistributionDetail reports whether a sample named name is one of family's other than its count: a histogram's
// _bucket or _sum, a summary's quantile (the family's own name) or _sum.
func isDistributionDetail(name, family []byte, summary bool) bool {
	if summary && bytes.Equal(name, family) {
		return true
	}
	suffix, ok := bytes.CutPrefix(name, family)
	return ok && (string(suffix) == "_sum" || !summary && string(suffix) == "_bucket")
}
