package loadgen

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// AllClasses names the summary over every class.
const AllClasses = "all"

// Latency summarises a latency sample.
type Latency struct {
	Count int           `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

// ClassSummary aggregates the requests of one class (or all).
type ClassSummary struct {
	Class string `json:"class"`
	// Requests counts logical requests (final attempts); Attempts counts
	// every attempt; Retried counts requests with more than one attempt.
	Requests int `json:"requests"`
	Attempts int `json:"attempts"`
	Retried  int `json:"retried"`
	// Shed counts requests the gateway turned away at least once (an
	// attempt answered 429 or 503); ShedServed counts those whose final
	// attempt succeeded after honouring Retry-After. Their ratio is how
	// well shed clients are served once load drops.
	Shed       int `json:"shed"`
	ShedServed int `json:"shed_served"`
	// ShedRetryAfter counts the shed requests that were told when to come
	// back: a 429 or 503 answer to one of their attempts carried Retry-After.
	ShedRetryAfter int `json:"shed_retry_after"`
	Succeeded      int `json:"succeeded"`
	Failed         int `json:"failed"`
	// Status counts final attempts by HTTP status ("0" for no response).
	Status map[string]int `json:"status"`
	// TTFT and E2E are client-perceived: from the first attempt to the
	// first token / the end of the final attempt, over successful requests.
	// ITL pools every inter-token gap of successful requests.
	TTFT Latency `json:"ttft"`
	ITL  Latency `json:"itl"`
	E2E  Latency `json:"e2e"`
	// Throughput is successful requests per second; OutputTokensPerSecond
	// counts their output tokens.
	Throughput            float64 `json:"throughput_rps"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	// Good counts successful requests within the SLO; Goodput is Good per
	// second and GoodFraction is Good over Requests.
	SLO          SLO     `json:"slo"`
	Good         int     `json:"good"`
	Goodput      float64 `json:"goodput_rps"`
	GoodFraction float64 `json:"good_fraction"`
}

// Summary is the result of Summarize: the overall line first, then one per
// class in name order.
type Summary struct {
	Duration time.Duration  `json:"duration_ns"`
	Overall  ClassSummary   `json:"overall"`
	Classes  []ClassSummary `json:"classes"`
}

// SummaryOptions configures Summarize.
type SummaryOptions struct {
	// Duration is the run's wall time, the denominator of rates. Zero means
	// the span from the earliest start to the latest end in the records.
	Duration time.Duration
	// SLOs per class; classes without an entry use DefaultSLO. The overall
	// line judges each request by its own class's SLO.
	SLOs       map[string]SLO
	DefaultSLO SLO
}

// Summarize aggregates attempt records into per-class and overall
// statistics. It is pure: no clock, no I/O; a benchmark can call it on
// records it produced in-process. Records of one request share Seq; only
// its Final record decides its outcome.
func Summarize(records []Record, opts SummaryOptions) Summary {
	dur := opts.Duration
	if dur <= 0 {
		dur = span(records)
	}
	byClass := map[string][]Record{}
	for _, r := range records {
		byClass[r.Class] = append(byClass[r.Class], r)
	}
	classes := make([]string, 0, len(byClass))
	for c := range byClass {
		classes = append(classes, c)
	}
	slices.Sort(classes)
	sloOf := func(class string) SLO {
		if s, ok := opts.SLOs[class]; ok {
			return s.orElse(opts.DefaultSLO)
		}
		return opts.DefaultSLO
	}
	s := Summary{Duration: dur, Overall: summarizeClass(AllClasses, records, dur, sloOf)}
	s.Overall.SLO = opts.DefaultSLO
	for _, c := range classes {
		cs := summarizeClass(c, byClass[c], dur, sloOf)
		cs.SLO = sloOf(c)
		s.Classes = append(s.Classes, cs)
	}
	return s
}

func span(records []Record) time.Duration {
	if len(records) == 0 {
		return 0
	}
	lo, hi := records[0].Start, records[0].Start+records[0].E2E
	for _, r := range records[1:] {
		lo = min(lo, r.Start)
		hi = max(hi, r.Start+r.E2E)
	}
	return hi - lo
}

func summarizeClass(name string, records []Record, dur time.Duration, sloOf func(string) SLO) ClassSummary {
	cs := ClassSummary{Class: name, Status: map[string]int{}}
	var ttft, e2e, itl []time.Duration
	outputTokens := 0
	toldWhen := map[int]bool{} // Seq of requests answered a shed status with Retry-After
	for i := range records {
		r := &records[i]
		cs.Attempts++
		if isShedStatus(r.Status) && r.RetryAfterSet && !toldWhen[r.Seq] {
			toldWhen[r.Seq] = true
			cs.ShedRetryAfter++
		}
		if !r.Final {
			continue
		}
		cs.Requests++
		if r.Attempt > 1 {
			cs.Retried++
		}
		// The runner retries only answers that shed the request, so an
		// earlier attempt means the request was shed at least once.
		shed := r.Attempt > 1 || isShedStatus(r.Status)
		if shed {
			cs.Shed++
		}
		cs.Status[strconv.Itoa(r.Status)]++
		if !r.OK() {
			cs.Failed++
			continue
		}
		cs.Succeeded++
		if shed {
			cs.ShedServed++
		}
		outputTokens += r.OutputTokens
		t := r.SinceFirstAttempt + r.TTFT
		e := r.SinceFirstAttempt + r.E2E
		ttft = append(ttft, t)
		e2e = append(e2e, e)
		itl = append(itl, r.ITL...)
		if meetsSLO(sloOf(r.Class), t, e, r.MeanITL()) {
			cs.Good++
		}
	}
	cs.TTFT, cs.E2E, cs.ITL = SummarizeLatency(ttft), SummarizeLatency(e2e), SummarizeLatency(itl)
	if secs := dur.Seconds(); secs > 0 {
		cs.Throughput = float64(cs.Succeeded) / secs
		cs.OutputTokensPerSecond = float64(outputTokens) / secs
		cs.Goodput = float64(cs.Good) / secs
	}
	if cs.Requests > 0 {
		cs.GoodFraction = float64(cs.Good) / float64(cs.Requests)
	}
	return cs
}

// isShedStatus reports the statuses a gateway sheds load with.
func isShedStatus(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

func meetsSLO(s SLO, ttft, e2e, meanITL time.Duration) bool {
	return (s.TTFT == 0 || ttft <= time.Duration(s.TTFT)) &&
		(s.E2E == 0 || e2e <= time.Duration(s.E2E)) &&
		(s.ITL == 0 || meanITL <= time.Duration(s.ITL))
}

// SummarizeLatency is the count, mean, percentiles (Percentile) and maximum of sample; sample is not modified.
func SummarizeLatency(sample []time.Duration) Latency {
	if len(sample) == 0 {
		return Latency{}
	}
	sorted := slices.Clone(sample)
	slices.Sort(sorted)
	var sum float64
	for _, d := range sorted {
		sum += float64(d)
	}
	return Latency{
		Count: len(sorted),
		Mean:  time.Duration(sum / float64(len(sorted))),
		P50:   Percentile(sorted, 50),
		P95:   Percentile(sorted, 95),
		P99:   Percentile(sorted, 99),
		Max:   sorted[len(sorted)-1],
	}
}

// Percentile returns the p-th percentile (0..100) of an ascending sample by
// linear interpolation between closest ranks (Hyndman-Fan type 7, numpy's
// default): rank h = (n-1)*p/100, value = x[floor h] + (h - floor h) *
// (x[floor h + 1] - x[floor h]). An empty sample yields 0.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	p = math.Max(0, math.Min(100, p))
	h := float64(n-1) * p / 100
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := h - float64(lo)
	return sorted[lo] + time.Duration(math.Round(frac*float64(sorted[lo+1]-sorted[lo])))
}
