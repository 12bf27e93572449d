package benchsuite

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Figure names one number that summarises a run.
type Figure string

// The figures every run is judged on. Latencies are client-perceived over
// successful requests, from the first attempt (retries included); rates
// divide by the run's wall time, drain included.
const (
	FigureTTFTP50    Figure = "ttft_p50"
	FigureTTFTP95    Figure = "ttft_p95"
	FigureTTFTP99    Figure = "ttft_p99"
	FigureThroughput Figure = "throughput" // successful requests per second
	FigureGoodput    Figure = "goodput"    // successful requests within their SLO per second
	// FigureEvery stands for all of Figures in a target.
	FigureEvery Figure = "every"
)

// Figures are the figures of a run, in report order.
var Figures = []Figure{FigureTTFTP50, FigureTTFTP95, FigureTTFTP99, FigureThroughput, FigureGoodput}

// Counts and shares, judged by their value (a target without vs), over a
// run's attempt records (see RecordFigures).
const (
	// FigureShed counts attempts the gateway answered 429 or 503.
	FigureShed Figure = "shed"
	// FigureShedWithoutRetryAfter counts those without a Retry-After.
	FigureShedWithoutRetryAfter Figure = "shed_without_retry_after"
	// FigureUnanswered counts requests whose last attempt got no answer:
	// timed out, or cancelled at the end of the drain.
	FigureUnanswered Figure = "unanswered"
	// FigureFirstRetryServed is the share of requests retried after a
	// 429/503 whose first retry succeeded.
	FigureFirstRetryServed Figure = "first_retry_served"
	// FigureFirstRetryServedBelowCapacity is that share over first retries
	// sent while the arrival rate was below the scenario's capacity (the
	// load had dropped); missing without a capacity or such retries.
	FigureFirstRetryServedBelowCapacity Figure = "first_retry_served_below_capacity"
)

// FigurePrefixHitRate is the share of prompt tokens the fleet served from
// its prefix cache (FleetCounters.PrefixHitRate), over all requests: a
// fleet figure, judged as a ratio, never per class.
const FigurePrefixHitRate Figure = "prefix_hit_rate"

// CountFigures are the figures of RecordFigures.
var CountFigures = []Figure{FigureShed, FigureShedWithoutRetryAfter, FigureUnanswered, FigureFirstRetryServed,
	FigureFirstRetryServedBelowCapacity}

// HigherIsBetter reports the direction of a figure: rates and served shares
// go up, latencies and counts down.
func (f Figure) HigherIsBetter() bool {
	return f == FigureThroughput || f == FigureGoodput || f.isShare()
}

func (f Figure) isShare() bool {
	return f == FigureFirstRetryServed || f == FigureFirstRetryServedBelowCapacity || f == FigurePrefixHitRate
}

// Label is the figure's name for people.
func (f Figure) Label() string {
	switch f {
	case FigureTTFTP50:
		return "TTFT P50"
	case FigureTTFTP95:
		return "TTFT P95"
	case FigureTTFTP99:
		return "TTFT P99"
	case FigureThroughput:
		return "Throughput"
	case FigureGoodput:
		return "Goodput"
	case FigureEvery:
		return "every figure"
	case FigureShed:
		return "attempts answered 429/503"
	case FigureShedWithoutRetryAfter:
		return "429/503 answers without Retry-After"
	case FigureUnanswered:
		return "requests unanswered (timed out or cut at the drain)"
	case FigureFirstRetryServed:
		return "share of first retries served"
	case FigureFirstRetryServedBelowCapacity:
		return "share of first retries served once load is below capacity"
	case FigurePrefixHitRate:
		return "prefix hit rate"
	}
	return string(f)
}

// Format renders a value of the figure with its unit.
func (f Figure) Format(v float64) string {
	switch {
	case f.isShare():
		return fmt.Sprintf("%.1f%%", 100*v)
	case slices.Contains(CountFigures, f):
		return fmt.Sprintf("%.0f", v)
	case f.HigherIsBetter():
		return fmt.Sprintf("%.2f req/s", v)
	}
	return formatSeconds(v)
}

// formatSeconds renders a latency in ms below a second, else in seconds.
func formatSeconds(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	default:
		return fmt.Sprintf("%.1f s", s)
	}
}

// FigureValues are a run's figures: latencies in seconds, rates in requests
// per second. A latency is missing when no request succeeded: there is
// nothing to measure, and a zero would pass any "at most" target.
type FigureValues map[Figure]float64

// FiguresOf extracts the figures from a summary line.
func FiguresOf(s loadgen.ClassSummary) FigureValues {
	v := FigureValues{FigureThroughput: s.Throughput, FigureGoodput: s.Goodput}
	if s.TTFT.Count > 0 {
		v[FigureTTFTP50] = s.TTFT.P50.Seconds()
		v[FigureTTFTP95] = s.TTFT.P95.Seconds()
		v[FigureTTFTP99] = s.TTFT.P99.Seconds()
	}
	return v
}

// Ratio is candidate/baseline; ok is false when it is undefined (a missing
// or non-positive baseline, a missing candidate).
func Ratio(candidate, baseline FigureValues, f Figure) (ratio float64, ok bool) {
	c, okc := candidate[f]
	b, okb := baseline[f]
	if !okc || !okb || b <= 0 || math.IsNaN(b) || math.IsInf(b, 0) || math.IsNaN(c) || math.IsInf(c, 0) {
		return 0, false
	}
	return c / b, true
}

// FormatRatio renders a ratio as "0.42x (-58%)".
func FormatRatio(r float64) string {
	pct := math.Round(100 * (r - 1))
	if pct == 0 {
		pct = 0 // no "-0%"
	}
	return fmt.Sprintf("%sx (%+.0f%%)", trimRatio(r), pct)
}

// trimRatio renders a ratio with two decimals, or two significant digits
// below 0.1 (0.032).
func trimRatio(r float64) string {
	switch {
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	case r >= 0.095:
		return fmt.Sprintf("%.2f", r)
	default:
		return strconv.FormatFloat(r, 'g', 2, 64)
	}
}

// TargetKind is how a target bounds a ratio.
type TargetKind string

const (
	// AtMost: ratio <= Bound.
	AtMost TargetKind = "at_most"
	// AtLeast: ratio >= Bound.
	AtLeast TargetKind = "at_least"
	// Within: no worse than the baseline by more than Bound (a fraction):
	// ratio <= 1+Bound for latencies, >= 1-Bound for rates. Being better by
	// any margin meets it.
	Within TargetKind = "within"
)

// NoWorseTolerance is how "no worse than upstream's default" is read: not
// worse by more than 5% on any figure, the resolution of a real-time run on
// a shared machine (the same tolerance the uniform control is held to).
const NoWorseTolerance = 0.05

// Target bounds Sluice's figure: its ratio against a baseline (a contender,
// or Unloaded, the unloaded reference), or, with Versus empty, its value.
// Class, when set, takes the figure over that class's requests.
type Target struct {
	Figure Figure     `json:"figure"`
	Class  string     `json:"class,omitempty"`
	Versus string     `json:"vs,omitempty"`
	Kind   TargetKind `json:"kind"`
	Bound  float64    `json:"bound"`
	// Implicit marks the target every scenario gets (no worse than
	// upstream-default).
	Implicit bool `json:"implicit,omitempty"`
	// Subject is the contender whose figures are judged; empty means
	// Sluice. A replicated sluice run (ReplicasFile) is judged against
	// Sluice, its one-replica run.
	Subject string `json:"subject,omitempty"`
}

// subject is the contender whose figures t judges.
func (t Target) subject() string {
	if t.Subject == "" {
		return Sluice
	}
	return t.Subject
}

// String renders the target for people: "TTFT P99 vs round-robin at most
// 0.05x".
func (t Target) String() string {
	what := t.Figure.Label()
	if t.Class != "" {
		what = t.Class + " " + what
	}
	if t.Subject != "" {
		what = t.Subject + ": " + what
	}
	vs := " vs " + t.Versus
	switch t.Versus {
	case "":
		bound := t.Figure.Format(t.Bound)
		if t.Kind == AtLeast {
			return fmt.Sprintf("%s at least %s", what, bound)
		}
		return fmt.Sprintf("%s at most %s", what, bound)
	case Unloaded:
		vs = " vs its unloaded value"
	}
	switch t.Kind {
	case AtMost:
		return fmt.Sprintf("%s%s at most %gx", what, vs, t.Bound)
	case AtLeast:
		return fmt.Sprintf("%s%s at least %gx", what, vs, t.Bound)
	default:
		return fmt.Sprintf("%s%s no worse by more than %g%%", what, vs, 100*t.Bound)
	}
}

// Check is one figure's ratio (its value, for a target without a
// baseline) held against a target.
type Check struct {
	Figure Figure  `json:"figure"`
	Ratio  float64 `json:"ratio"`
	// Measured is false when the ratio is undefined; such a check is not
	// met.
	Measured bool `json:"measured"`
	Met      bool `json:"met"`
}

// TargetResult is a target evaluated on one session's runs.
type TargetResult struct {
	Target Target  `json:"target"`
	Checks []Check `json:"checks"`
	Met    bool    `json:"met"`
}

// Evaluate holds Sluice's figures against the baseline's (its values alone
// for a target without Versus; baseline is then unused). A FigureEvery
// target is met when every figure is.
func (t Target) Evaluate(sluice, baseline FigureValues) TargetResult {
	figs := []Figure{t.Figure}
	if t.Figure == FigureEvery {
		figs = Figures
	}
	res := TargetResult{Target: t, Met: true}
	for _, f := range figs {
		c := Check{Figure: f}
		if t.Versus == "" {
			c.Ratio, c.Measured = sluice[f]
		} else {
			c.Ratio, c.Measured = Ratio(sluice, baseline, f)
		}
		c.Met = c.Measured && t.holds(f, c.Ratio)
		res.Met = res.Met && c.Met
		res.Checks = append(res.Checks, c)
	}
	return res
}

func (t Target) holds(f Figure, r float64) bool {
	switch t.Kind {
	case AtMost:
		return r <= t.Bound
	case AtLeast:
		return r >= t.Bound
	case Within:
		if f.HigherIsBetter() {
			return r >= 1-t.Bound
		}
		return r <= 1+t.Bound
	}
	return false
}

// Measured summarises the checks for the report: the ratio of a
// one-figure target; for FigureEvery the failing figures (or "all").
func (r TargetResult) Measured() string {
	if len(r.Checks) == 1 {
		switch c := r.Checks[0]; {
		case !c.Measured:
			return "not measurable (no successful requests or a zero baseline)"
		case r.Target.Versus == "":
			return c.Figure.Format(c.Ratio)
		default:
			return trimRatio(c.Ratio) + "x"
		}
	}
	var failed []string
	for _, c := range r.Checks {
		switch {
		case !c.Measured:
			failed = append(failed, c.Figure.Label()+" not measurable")
		case !c.Met:
			failed = append(failed, fmt.Sprintf("%s %sx", c.Figure.Label(), trimRatio(c.Ratio)))
		}
	}
	if len(failed) == 0 {
		return "all within"
	}
	return strings.Join(failed, ", ")
}
