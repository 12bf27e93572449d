package modelrewrite

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder receives per-rule, per-target signals. Implementations must be
// safe for concurrent use and cheap: they run on the request path.
type Recorder interface {
	// RecordDecision counts one Decision.
	RecordDecision(d Decision)
	// RecordOutcome records how a request decided as d ended: its time to
	// first token (0 when no token came) and whether it failed.
	RecordOutcome(d Decision, ttft time.Duration, failed bool)
	TripRecorder
}

// NopRecorder records nothing; it is the default.
type NopRecorder struct{}

var _ Recorder = NopRecorder{}

func (NopRecorder) RecordDecision(Decision)                     {}
func (NopRecorder) RecordOutcome(Decision, time.Duration, bool) {}
func (NopRecorder) RecordTripped(RuleID, string, bool)          {}

// DefaultMaxSeries caps the (rule, target) label pairs of a
// PrometheusRecorder unless configured otherwise.
const DefaultMaxSeries = 1000

// OverflowLabel replaces the rewrite, rule and target labels of (rule,
// target) pairs beyond the cap.
const OverflowLabel = "_overflow"

// Metric label names. Label values never come from client input: "rewrite"
// ("namespace/name"), "rule" (index) and "target" (model) come from the
// operator's objects through a Decision and are capped in number; "kind" and
// "outcome" are closed enums. Requests that match no rule are counted with
// empty rule labels, never with the client's model name.
const (
	labelRewrite = "rewrite"
	labelRule    = "rule"
	labelTarget  = "target"
	labelKind    = "kind"
	labelOutcome = "outcome"
)

// Outcome label values.
const (
	outcomeSuccess = "success"
	outcomeError   = "error"
)

// PrometheusRecorder is a Recorder backed by Prometheus collectors:
//
//	sluice_modelrewrite_decisions_total{rewrite,rule,target,kind}
//	sluice_modelrewrite_outcomes_total{rewrite,rule,target,outcome}
//	sluice_modelrewrite_ttft_seconds{rewrite,rule,target} (histogram)
//	sluice_modelrewrite_guardrail_tripped{rewrite,rule,target} (0 or 1)
//
// For decisions the target label is the model served (Decision.Model). At
// most maxSeries (rule, target) pairs get their own labels; later pairs
// share OverflowLabel.
type PrometheusRecorder struct {
	decisions *prometheus.CounterVec
	outcomes  *prometheus.CounterVec
	ttft      *prometheus.HistogramVec
	tripped   *prometheus.GaugeVec

	maxSeries int64
	nSeries   atomic.Int64
	series    sync.Map // seriesKey -> *seriesMetrics
}

var _ Recorder = (*PrometheusRecorder)(nil)

type seriesKey struct {
	rule   RuleID
	target string
}

// seriesMetrics caches one pair's children so recording costs one map load.
type seriesMetrics struct {
	decisions [numDecisionKinds]prometheus.Counter
	success   prometheus.Counter
	failure   prometheus.Counter
	ttft      prometheus.Observer
	tripped   prometheus.Gauge
}

// NewPrometheusRecorder registers the collectors on reg (use a non-default
// registry). maxSeries <= 0 selects DefaultMaxSeries.
func NewPrometheusRecorder(reg prometheus.Registerer, maxSeries int) (*PrometheusRecorder, error) {
	if reg == nil {
		return nil, errors.New("modelrewrite: NewPrometheusRecorder needs a prometheus.Registerer")
	}
	if maxSeries <= 0 {
		maxSeries = DefaultMaxSeries
	}
	ruleLabels := []string{labelRewrite, labelRule, labelTarget}
	r := &PrometheusRecorder{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "modelrewrite", Name: "decisions_total",
			Help: "Model rewrite decisions by rule, served target model and kind (sticky, weighted, diverted, unchanged, no_match).",
		}, append(ruleLabels, labelKind)),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "modelrewrite", Name: "outcomes_total",
			Help: "Finished rewritten requests by rule, served target model and outcome (success, error).",
		}, append(ruleLabels, labelOutcome)),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "sluice", Subsystem: "modelrewrite", Name: "ttft_seconds",
			Help:    "Time to first token of rewritten requests by rule and served target model.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, ruleLabels),
		tripped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "sluice", Subsystem: "modelrewrite", Name: "guardrail_tripped",
			Help: "1 while the guardrail diverts a target's share to its rule's stable target.",
		}, ruleLabels),
		maxSeries: int64(maxSeries),
	}
	for _, c := range []prometheus.Collector{r.decisions, r.outcomes, r.ttft, r.tripped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("modelrewrite: registering metrics: %w", err)
		}
	}
	return r, nil
}

// RecordDecision implements Recorder.
func (r *PrometheusRecorder) RecordDecision(d Decision) {
	switch d.Kind {
	case KindNoMatch:
		r.seriesFor(RuleID{}, "").decisions[KindNoMatch].Inc()
	case KindUnchanged:
		// d.Model is the client's model name here: never a label value.
		r.seriesFor(d.Rule, "").decisions[KindUnchanged].Inc()
	case KindSticky, KindWeighted, KindDiverted:
		r.seriesFor(d.Rule, d.Model).decisions[d.Kind].Inc()
	}
}

// RecordOutcome implements Recorder. Outcomes of requests no rule rewrote
// are not recorded.
func (r *PrometheusRecorder) RecordOutcome(d Decision, ttft time.Duration, failed bool) {
	if !d.Rewritten() || d.Model == "" {
		return
	}
	s := r.seriesFor(d.Rule, d.Model)
	if failed {
		s.failure.Inc()
	} else {
		s.success.Inc()
	}
	if ttft > 0 {
		s.ttft.Observe(ttft.Seconds())
	}
}

// RecordTripped implements TripRecorder.
func (r *PrometheusRecorder) RecordTripped(rule RuleID, target string, tripped bool) {
	if target == "" {
		return // the guardrail only names served targets
	}
	v := 0.0
	if tripped {
		v = 1
	}
	r.seriesFor(rule, target).tripped.Set(v)
}

var (
	noMatchKinds   = []DecisionKind{KindNoMatch}
	unchangedKinds = []DecisionKind{KindUnchanged}
	servedKinds    = []DecisionKind{KindSticky, KindWeighted, KindDiverted}
)

// seriesFor returns the cached children for (rule, target), creating them
// while under the cap. The zero rule with an empty target is the no-match
// series and a rule with an empty target the series of a rule without
// targets; those carry only their decision counter and do not count against
// the cap (there is at most one per rule). A non-empty target is a served
// pair, with every collector.
func (r *PrometheusRecorder) seriesFor(rule RuleID, target string) *seriesMetrics {
	key := seriesKey{rule: rule, target: target}
	if s, ok := r.series.Load(key); ok {
		return s.(*seriesMetrics)
	}
	var s *seriesMetrics
	counted := false
	switch {
	case target == "" && rule == RuleID{}:
		s = r.newSeries([]string{"", "", ""}, noMatchKinds, false)
	case target == "":
		s = r.newSeries([]string{rule.Object.String(), strconv.Itoa(rule.Index), ""}, unchangedKinds, false)
	case r.nSeries.Add(1) <= r.maxSeries:
		counted = true
		s = r.newSeries([]string{rule.Object.String(), strconv.Itoa(rule.Index), target}, servedKinds, true)
	default:
		r.nSeries.Add(-1)
		key = seriesKey{target: OverflowLabel}
		if s, ok := r.series.Load(key); ok {
			return s.(*seriesMetrics)
		}
		s = r.newSeries([]string{OverflowLabel, OverflowLabel, OverflowLabel}, servedKinds, true)
	}
	actual, loaded := r.series.LoadOrStore(key, s)
	if loaded && counted {
		r.nSeries.Add(-1) // another goroutine created the pair first
	}
	return actual.(*seriesMetrics)
}

// newSeries creates the children for one label triple.
func (r *PrometheusRecorder) newSeries(labels []string, kinds []DecisionKind, served bool) *seriesMetrics {
	s := &seriesMetrics{}
	for _, k := range kinds {
		s.decisions[k] = r.decisions.WithLabelValues(labels[0], labels[1], labels[2], k.String())
	}
	if served {
		s.success = r.outcomes.WithLabelValues(labels[0], labels[1], labels[2], outcomeSuccess)
		s.failure = r.outcomes.WithLabelValues(labels[0], labels[1], labels[2], outcomeError)
		s.ttft = r.ttft.WithLabelValues(labels...)
		s.tripped = r.tripped.WithLabelValues(labels...)
	}
	return s
}
