package plugins

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	dto "github.com/prometheus/client_model/go"
)

// parseMetricsFast parses a page as expfmt's TextParser (legacy name validation) parses the page
// withoutDistributionDetail(page), for the pages model servers write: HELP and TYPE comments, samples with plain
// labels, a value and an optional timestamp, one space apart; it leaves out the lines withoutDistributionDetail
// leaves out, and of a histogram or a summary takes only _count samples. ok is false for a page with anything else in
// it (escapes, quoted names, other spacing, a second HELP or TYPE, an invalid line): the caller parses that page with
// expfmt, which gives its result or its error. What it returns when ok is what expfmt returns, family for family
// (TestMetricsFastParseAsExpfmt, FuzzMetricsPage). It does not modify page.
//
// Why: expfmt reads a page byte by byte through a state machine, copies every token twice and allocates a map per
// label, and the EPP parses a page of every server every scrape interval (figures in testbed/bench/scenarios/README.md,
// "The EPP's own cost per request").
func parseMetricsFast(page []byte) (families map[string]*dto.MetricFamily, ok bool) {
	if len(page) > 0 && page[len(page)-1] != '\n' {
		return nil, false
	}
	p := fastParser{families: make(map[string]*dto.MetricFamily, 32), named: make(map[string]bool, 64)}
	for rest := page; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		line := rest[:i]
		rest = rest[i+1:]
		if !p.line(line) {
			return nil, false
		}
	}
	for name, mf := range p.families {
		if len(mf.Metric) == 0 {
			delete(p.families, name) // as expfmt: a family of comments only is not one
		}
	}
	return p.families, true
}

// fastParser is parseMetricsFast's state over one page.
type fastParser struct {
	families map[string]*dto.MetricFamily
	// withoutDistributionDetail's state: the histogram or summary the last TYPE line declared, and the names of the
	// comment lines and of the samples kept so far (keys point into the page, which outlives the parse).
	family  []byte
	summary bool
	named   map[string]bool
	// counted are the label sets of the distribution series seen (family and sorted labels): expfmt merges a second
	// _count of a series into the first; the fast parse leaves such a page to expfmt.
	counted map[string]bool
	// strs shares the strings of one page: label names and values repeat on most lines.
	strs map[string]*string
}

// str returns a shared pointer to the string of b.
func (p *fastParser) str(b []byte) *string {
	if s, ok := p.strs[string(b)]; ok {
		return s
	}
	if p.strs == nil {
		p.strs = make(map[string]*string, 64)
	}
	s := string(b)
	p.strs[s] = &s
	return &s
}

// resolved is the family a name resolves to among the families so far, as expfmt's setOrCreateCurrentMF finds it.
type resolved struct {
	mf    *dto.MetricFamily
	count bool // the _count of a histogram or summary
	other bool // another sample of a histogram or summary (its sum, or its own name)
}

// resolve finds the family a sample or comment named name belongs to, as expfmt does: its own family, or a histogram's
// or summary's that it is a _count, _sum or _bucket of; with create, a new untyped family of that name otherwise.
func (p *fastParser) resolve(name []byte, create bool) resolved {
	if mf := p.families[string(name)]; mf != nil {
		return resolved{mf: mf}
	}
	base, suffix := splitSuffix(name)
	if suffix != "" {
		if mf := p.families[string(base)]; mf != nil {
			t := mf.GetType()
			if mf.Type != nil && (t == dto.MetricType_SUMMARY && suffix != "_bucket" || t == dto.MetricType_HISTOGRAM ||
				t == dto.MetricType_GAUGE_HISTOGRAM) {
				return resolved{mf: mf, count: suffix == "_count", other: suffix != "_count"}
			}
		}
	}
	if !create {
		return resolved{}
	}
	n := string(name)
	mf := &dto.MetricFamily{Name: &n}
	p.families[n] = mf
	return resolved{mf: mf}
}

// splitSuffix splits a name ending in _count, _sum or _bucket (with something before it) into the two.
func splitSuffix(name []byte) ([]byte, string) {
	for _, s := range [...]string{"_count", "_sum", "_bucket"} {
		if len(name) > len(s) && string(name[len(name)-len(s):]) == s {
			return name[:len(name)-len(s)], s
		}
	}
	return name, ""
}

func (p *fastParser) line(line []byte) bool {
	if len(line) == 0 {
		return true
	}
	switch line[0] {
	case '#':
		return p.comment(line)
	case ' ', '\t':
		return len(bytes.Trim(line, " \t")) == 0 // a blank line; anything else after blanks goes to expfmt
	}
	return p.sample(line)
}

// comment handles a comment line: HELP and TYPE as "# HELP name text" and "# TYPE name type", one space apart; any
// other comment is skipped, as expfmt does.
func (p *fastParser) comment(line []byte) bool {
	rest := bytes.TrimLeft(line[1:], " \t")
	word := rest
	if i := bytes.IndexAny(rest, " \t"); i >= 0 {
		word = rest[:i]
	}
	if len(word) == len(rest) || string(word) != "HELP" && string(word) != "TYPE" {
		return true // expfmt skips it
	}
	if !bytes.HasPrefix(line, []byte("# HELP ")) && !bytes.HasPrefix(line, []byte("# TYPE ")) {
		return false
	}
	rest = line[len("# HELP "):]
	n := metricNameLen(rest)
	if n == 0 || n == len(rest) || rest[n] != ' ' {
		return false
	}
	text := bytes.TrimLeft(rest[n:], " \t")
	if len(text) == 0 || bytes.ContainsAny(text, " \t") && string(word) == "TYPE" {
		return false
	}
	p.named[unsafe.String(&rest[0], n)] = true
	if string(word) == "TYPE" {
		p.family, p.summary = nil, string(text) == "summary"
		if p.summary || string(text) == "histogram" {
			p.family = rest[:n]
		}
	}
	r := p.resolve(rest[:n], true)
	if string(word) == "HELP" {
		if r.mf.Help != nil || bytes.IndexByte(text, '\\') >= 0 {
			return false
		}
		h := string(text)
		r.mf.Help = &h
		return true
	}
	if r.mf.Type != nil {
		return false
	}
	var t dto.MetricType
	switch string(text) {
	case "counter":
		t = dto.MetricType_COUNTER
	case "gauge":
		t = dto.MetricType_GAUGE
	case "histogram":
		t = dto.MetricType_HISTOGRAM
	case "summary":
		t = dto.MetricType_SUMMARY
	case "untyped":
		t = dto.MetricType_UNTYPED
	default:
		return false
	}
	r.mf.Type = t.Enum()
	return true
}

// metricNameLen is the length of the legacy metric name b starts with, 0 if none; a name followed by a quote is none.
func metricNameLen(b []byte) int {
	i := legacyNameLen(b, true)
	if i < len(b) && b[i] == '"' {
		return 0
	}
	return i
}

// labelNameLen is the length of the legacy label name b starts with, 0 if none.
func labelNameLen(b []byte) int { return legacyNameLen(b, false) }

// legacyNameLen is the length of the legacy name b starts with: [a-zA-Z_] then [a-zA-Z0-9_], and ':' anywhere in a
// metric name (colon).
func legacyNameLen(b []byte, colon bool) int {
	i := 0
	for ; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || colon && c == ':' || i > 0 && c >= '0' && c <= '9') {
			break
		}
	}
	return i
}

// sample handles a sample line: name[{label="value",...}] value[ timestamp].
func (p *fastParser) sample(line []byte) bool {
	n := metricNameLen(line)
	if n == 0 || n == len(line) || line[n] != '{' && line[n] != ' ' {
		return false
	}
	name := unsafe.String(&line[0], n)
	if p.family != nil && isDistributionDetail(line[:n], p.family, p.summary) &&
		(name == string(p.family) || !p.named[name]) {
		return true // withoutDistributionDetail leaves it out
	}
	p.named[name] = true
	r := p.resolve(line[:n], true)
	if r.other {
		return false
	}
	mf := r.mf
	if mf.Type == nil {
		mf.Type = dto.MetricType_UNTYPED.Enum()
	}
	distribution := mf.GetType() == dto.MetricType_HISTOGRAM || mf.GetType() == dto.MetricType_SUMMARY ||
		mf.GetType() == dto.MetricType_GAUGE_HISTOGRAM
	if distribution && !r.count {
		return false // the family's own name in a histogram: expfmt keeps an empty series; not worth the fast path
	}
	m := &dto.Metric{}
	rest := line[n:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			if len(rest) > 0 && rest[0] == '}' {
				rest = rest[1:]
				break
			}
			ln := labelNameLen(rest)
			if ln == 0 || len(rest) < ln+2 || rest[ln] != '=' || rest[ln+1] != '"' {
				return false
			}
			name := rest[:ln]
			if string(name) == "__name__" || distribution && (string(name) == "le" || string(name) == "quantile") {
				return false
			}
			for _, l := range m.Label {
				if *l.Name == string(name) {
					return false // expfmt's error
				}
			}
			rest = rest[ln+2:]
			end := bytes.IndexByte(rest, '"')
			if end < 0 {
				return false
			}
			value := rest[:end]
			if bytes.IndexByte(value, '\\') >= 0 || !utf8.Valid(value) {
				return false
			}
			m.Label = append(m.Label, &dto.LabelPair{Name: p.str(name), Value: p.str(value)})
			rest = rest[end+1:]
			if len(rest) > 0 && rest[0] == ',' {
				rest = rest[1:]
			} else if len(rest) == 0 || rest[0] != '}' {
				return false
			}
		}
	}
	if len(rest) < 2 || rest[0] != ' ' {
		return false
	}
	rest = rest[1:]
	tok := rest
	var ts []byte
	if i := bytes.IndexAny(rest, " \t"); i >= 0 {
		tok, ts = rest[:i], rest[i+1:]
		if len(ts) == 0 {
			return false
		}
	}
	if len(tok) == 0 || bytes.ContainsAny(tok, "pP_") {
		return false
	}
	v, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return false
	}
	if ts != nil {
		t, err := strconv.ParseInt(string(ts), 10, 64)
		if err != nil {
			return false
		}
		m.TimestampMs = &t
	}
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		m.Counter = &dto.Counter{Value: &v}
	case dto.MetricType_GAUGE:
		m.Gauge = &dto.Gauge{Value: &v}
	case dto.MetricType_UNTYPED:
		m.Untyped = &dto.Untyped{Value: &v}
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM, dto.MetricType_SUMMARY:
		if !(v >= 0 && v < 1<<53 && v == math.Trunc(v)) || !p.firstCount(mf, m.Label) {
			return false
		}
		c := uint64(v)
		if mf.GetType() == dto.MetricType_SUMMARY {
			m.Summary = &dto.Summary{SampleCount: &c}
		} else {
			m.Histogram = &dto.Histogram{SampleCount: &c}
		}
	default:
		return false
	}
	mf.Metric = append(mf.Metric, m)
	return true
}

// firstCount reports whether this is the first _count of the series of mf with labels (expfmt merges a second one
// into the first).
func (p *fastParser) firstCount(mf *dto.MetricFamily, labels []*dto.LabelPair) bool {
	pairs := make([]string, 0, len(labels))
	for _, l := range labels {
		pairs = append(pairs, *l.Name+"\xff"+*l.Value)
	}
	slices.Sort(pairs)
	key := mf.GetName() + "\xfe" + strings.Join(pairs, "\xfe")
	if p.counted[key] {
		return false
	}
	if p.counted == nil {
		p.counted = map[string]bool{}
	}
	p.counted[key] = true
	return true
}
