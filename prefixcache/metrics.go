package prefixcache

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// CalibrationSource says what a calibration check compared predictions
// with. Its values are a closed set, usable as metric labels.
type CalibrationSource uint8

const (
	// SourceUsage is a response's usage.prompt_tokens_details.cached_tokens.
	SourceUsage CalibrationSource = iota
	// SourceCounters is a pod's prefix_cache_hits/queries counters.
	SourceCounters
)

func (s CalibrationSource) String() string {
	switch s {
	case SourceUsage:
		return "usage"
	case SourceCounters:
		return "counters"
	}
	return "unknown"
}

// Recorder receives the index's events. Implementations must be safe for
// concurrent use and cheap: IncGuard runs on the scoring path.
type Recorder interface {
	// IncGuard counts a matching pod whose affinity the load guard cut.
	IncGuard(action GuardAction)
	// ObserveCalibration records one check's reported/predicted ratio.
	ObserveCalibration(source CalibrationSource, ratio float64)
}

// NopRecorder discards every event; it is the default.
type NopRecorder struct{}

func (NopRecorder) IncGuard(GuardAction)                          {}
func (NopRecorder) ObserveCalibration(CalibrationSource, float64) {}

// PrometheusRecorder exports the events as Prometheus metrics.
type PrometheusRecorder struct {
	guard       *prometheus.CounterVec
	calibration *prometheus.HistogramVec
}

var _ Recorder = (*PrometheusRecorder)(nil)

// NewPrometheusRecorder creates the metrics and registers them on reg
// (a non-default registry owned by cmd/).
func NewPrometheusRecorder(reg prometheus.Registerer) (*PrometheusRecorder, error) {
	r := &PrometheusRecorder{
		guard: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "prefixcache", Name: "guard_total",
			Help: "Prefix matches whose affinity the load guard reduced or removed, by action.",
		}, []string{"action"}),
		calibration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "sluice", Subsystem: "prefixcache", Name: "calibration_ratio",
			Help:    "Reported over predicted cached fraction of prompts, by source; below 1 means predictions ran ahead.",
			Buckets: []float64{0, 0.25, 0.5, 0.8, 0.9, 1, 1.1, 1.25, 2},
		}, []string{"source"}),
	}
	if err := errors.Join(reg.Register(r.guard), reg.Register(r.calibration)); err != nil {
		return nil, err
	}
	// Every series of the closed label sets exists from the start, so dashboards and alerts see zeros rather than
	// nothing before the first event.
	for _, a := range []GuardAction{GuardTaper, GuardOverload, GuardKVFull} {
		r.guard.WithLabelValues(a.String())
	}
	for _, s := range []CalibrationSource{SourceUsage, SourceCounters} {
		r.calibration.WithLabelValues(s.String())
	}
	return r, nil
}

func (r *PrometheusRecorder) IncGuard(a GuardAction) { r.guard.WithLabelValues(a.String()).Inc() }

func (r *PrometheusRecorder) ObserveCalibration(s CalibrationSource, ratio float64) {
	r.calibration.WithLabelValues(s.String()).Observe(ratio)
}
