package plugins

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	dto "github.com/prometheus/client_model/go"
)

// parseMetricsFast parses a page as expfmt's TextParser (legacy name validation) parses the page
// withoutDistributionDetail(page), for the pages model servers write: HELP and TYPE comments, samples with plain
// labels, a value and an optional timestamp, one space apart; it leaves out the lines withoutDistributionDetail
// leaves out, and of a histogram or a summary takes only _count samples. ok is false for a page with anything else in
// it (escapes, quoted names, other spacing, a second HELP or TYPE, an invalid line): the caller parses that page with
// expfmt, which gives its result or its error. What it returns when ok is what expfmt returns, family for family,
// less the families read does not name (read nil: none left out) (TestMetricsFastParseAsExpfmt, FuzzMetricsPage).
// Every line of a family left out is checked as any other (a page expfmt rejects is not taken), but builds nothing.
// It does not modify page.
//
// Why: expfmt reads a page byte by byte through a state machine, copies every token twice and allocates a map per
// label, and the EPP parses a page of every server every scrape interval (figures in testbed/bench/scenarios/README.md,
// "The EPP's own cost per request"); the extractors read five to seven of a vLLM page's ~40 families.
func parseMetricsFast(page []byte, read familySet) (families map[string]*dto.MetricFamily, ok bool) {
	if len(page) > 0 && page[len(page)-1] != '\n' {
		return nil, false
	}
	p := fastParsers.Get().(*fastParser)
	defer p.release()
	p.read = read
	for rest := page; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		line := rest[:i]
		rest = rest[i+1:]
		if !p.line(line) {
			return nil, false
		}
	}
	n := 0
	for i := range p.states {
		if mf := p.states[i].mf; mf != nil && len(mf.Metric) > 0 {
			n++
		}
	}
	families = make(map[string]*dto.MetricFamily, n)
	for i := range p.states {
		if mf := p.states[i].mf; mf != nil && len(mf.Metric) > 0 { // as expfmt: a family of comments only is not one
			families[mf.GetName()] = mf
		}
	}
	return families, true
}

// familySet names the metric families a page's reader reads; nil is every family.
type familySet map[string]struct{}

// has reports whether the family name is read.
func (s familySet) has(name []byte) bool {
	if s == nil {
		return true
	}
	_, ok := s[string(name)]
	return ok
}

// fastParser is parseMetricsFast's state over one page. Parsers are pooled (fastParsers): the maps keyed by the
// page's bytes are cleared after each page (release), and kept for the next one.
type fastParser struct {
	read familySet
	// states and index hold every family of the page so far, in order, by name (keys point into the page): what
	// expfmt's checks need of a family, and the family itself for one that is read.
	states []familyState
	index  map[string]int
	// withoutDistributionDetail's state: the histogram or summary the last TYPE line declared, and the names of the
	// comment lines and of the samples kept so far (keys point into the page).
	family  []byte
	summary bool
	named   map[string]bool
	// counted are the label sets of the distribution series seen (family and sorted labels): expfmt merges a second
	// _count of a series into the first; the fast parse leaves such a page to expfmt.
	counted map[string]bool
	// strs shares the strings of one page: label names and values repeat on most lines.
	strs map[string]*string
	// labels and values are the label names and values of the sample being read (a name repeated is expfmt's error).
	labels, values [][]byte
}

// familyState is what the fast parse knows of one family of the page. mf is the family as parseMetricsFast returns
// it, for a family that is read; nil for one that is not, whose samples are checked as expfmt checks them and then
// dropped, with no allocation.
type familyState struct {
	mf            *dto.MetricFamily
	typ           dto.MetricType
	typed, helped bool
}

var fastParsers = sync.Pool{New: func() any {
	return &fastParser{index: make(map[string]int, 64), named: make(map[string]bool, 64)}
}}

// maxPooledFamilies bounds the families of a parser kept in fastParsers.
const maxPooledFamilies = 1024

// release forgets the page (every key pointing into it) and returns p to fastParsers.
func (p *fastParser) release() {
	if len(p.states) > maxPooledFamilies {
		return
	}
	clear(p.states)
	p.states = p.states[:0]
	clear(p.index)
	clear(p.named)
	clear(p.strs)
	p.counted = nil
	p.labels, p.values = p.labels[:0], p.values[:0]
	p.read, p.family, p.summary = nil, nil, false
	fastParsers.Put(p)
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

// resolve finds the family a sample or comment named name belongs to, as expfmt's setOrCreateCurrentMF does: its own
// family, or a histogram's or summary's that it is a _count, _sum or _bucket of; else a new untyped family of that
// name. It returns the family's index in states, and whether name is the _count of a histogram or summary (count) or
// another sample of one (other: its sum, or its own name).
func (p *fastParser) resolve(name []byte) (i int, count, other bool) {
	if i, ok := p.index[string(name)]; ok {
		return i, false, false
	}
	base, suffix := splitSuffix(name)
	if suffix != "" {
		if i, ok := p.index[string(base)]; ok {
			st := &p.states[i]
			t := st.typ
			if st.typed && (t == dto.MetricType_SUMMARY && suffix != "_bucket" || t == dto.MetricType_HISTOGRAM ||
				t == dto.MetricType_GAUGE_HISTOGRAM) {
				return i, suffix == "_count", suffix != "_count"
			}
		}
	}
	var st familyState
	if p.read.has(name) {
		n := string(name)
		st.mf = &dto.MetricFamily{Name: &n}
	}
	p.states = append(p.states, st)
	p.index[unsafe.String(&name[0], len(name))] = len(p.states) - 1
	return len(p.states) - 1, false, false
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
	i, _, _ := p.resolve(rest[:n])
	st := &p.states[i]
	if string(word) == "HELP" {
		if st.helped || bytes.IndexByte(text, '\\') >= 0 {
			return false
		}
		st.helped = true
		if st.mf != nil {
			h := string(text)
			st.mf.Help = &h
		}
		return true
	}
	if st.typed {
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
	st.typ, st.typed = t, true
	if st.mf != nil {
		st.mf.Type = t.Enum()
	}
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
	first, rest := labelFirst, labelRest
	if colon {
		first, rest = metricFirst, metricRest
	}
	if len(b) == 0 || nameChars[b[0]]&first == 0 {
		return 0
	}
	i := 1
	for i < len(b) && nameChars[b[i]]&rest != 0 {
		i++
	}
	return i
}

// nameChars classifies each byte for legacyNameLen (a table: the names are most of a page's bytes).
var nameChars = func() (t [256]uint8) {
	for c := range 256 {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
		digit := c >= '0' && c <= '9'
		if letter {
			t[c] |= labelFirst | labelRest | metricFirst | metricRest
		}
		if digit {
			t[c] |= labelRest | metricRest
		}
		if c == ':' {
			t[c] |= metricFirst | metricRest
		}
	}
	return t
}()

const (
	labelFirst uint8 = 1 << iota
	labelRest
	metricFirst
	metricRest
)

// sample handles a sample line: name[{label="value",...}] value[ timestamp]. A sample of a family that is not read is
// checked as one that is, and dropped.
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
	i, count, other := p.resolve(line[:n])
	if other {
		return false
	}
	st := &p.states[i]
	if !st.typed {
		st.typ, st.typed = dto.MetricType_UNTYPED, true
		if st.mf != nil {
			st.mf.Type = dto.MetricType_UNTYPED.Enum()
		}
	}
	distribution := st.typ == dto.MetricType_HISTOGRAM || st.typ == dto.MetricType_SUMMARY ||
		st.typ == dto.MetricType_GAUGE_HISTOGRAM
	if distribution && !count {
		return false // the family's own name in a histogram: expfmt keeps an empty series; not worth the fast path
	}
	var m *dto.Metric
	if st.mf != nil {
		m = &dto.Metric{}
	}
	p.labels, p.values = p.labels[:0], p.values[:0]
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
			for _, l := range p.labels {
				if string(l) == string(name) {
					return false // expfmt's error
				}
			}
			p.labels = append(p.labels, name)
			rest = rest[ln+2:]
			end := bytes.IndexByte(rest, '"')
			if end < 0 {
				return false
			}
			value := rest[:end]
			if bytes.IndexByte(value, '\\') >= 0 || !utf8.Valid(value) {
				return false
			}
			p.values = append(p.values, value)
			rest = rest[end+1:]
			if len(rest) > 0 && rest[0] == ',' {
				rest = rest[1:]
			} else if len(rest) == 0 || rest[0] != '}' {
				return false
			}
		}
	}
	if m != nil && len(p.labels) > 0 {
		pairs := make([]dto.LabelPair, len(p.labels)) // one allocation for the sample's pairs
		m.Label = make([]*dto.LabelPair, len(p.labels))
		for i := range pairs {
			pairs[i].Name, pairs[i].Value = p.str(p.labels[i]), p.str(p.values[i])
			m.Label[i] = &pairs[i]
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
	value, err := strconv.ParseFloat(unsafe.String(&tok[0], len(tok)), 64)
	if err != nil {
		return false
	}
	var timestamp int64
	if ts != nil {
		if timestamp, err = strconv.ParseInt(unsafe.String(&ts[0], len(ts)), 10, 64); err != nil {
			return false
		}
	}
	if distribution && !(value >= 0 && value < 1<<53 && value == math.Trunc(value)) {
		return false
	}
	if m == nil {
		return true // not read (a second _count of a series, which expfmt merges into the first, changes only its family)
	}
	if ts != nil {
		t := timestamp
		m.TimestampMs = &t
	}
	v := value
	switch st.typ {
	case dto.MetricType_COUNTER:
		m.Counter = &dto.Counter{Value: &v}
	case dto.MetricType_GAUGE:
		m.Gauge = &dto.Gauge{Value: &v}
	case dto.MetricType_UNTYPED:
		m.Untyped = &dto.Untyped{Value: &v}
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM, dto.MetricType_SUMMARY:
		if !p.firstCount(st.mf, m.Label) {
			return false
		}
		c := uint64(v)
		if st.typ == dto.MetricType_SUMMARY {
			m.Summary = &dto.Summary{SampleCount: &c}
		} else {
			m.Histogram = &dto.Histogram{SampleCount: &c}
		}
	default:
		return false
	}
	st.mf.Metric = append(st.mf.Metric, m)
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
