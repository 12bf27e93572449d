package outlier

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder receives the detectors' events. Implementations must be safe for concurrent use and cheap: Ejected runs on
// the response path.
type Recorder interface {
	// Ejected counts one ejection, for reason.
	Ejected(reason Reason)
	// Watch adds a source of the number of endpoints ejected now (a detector's Ejected at the caller's clock) to the
	// gauge of ejected endpoints.
	Watch(ejected func() int)
}

// NopRecorder discards every event; it is the default.
type NopRecorder struct{}

func (NopRecorder) Ejected(Reason)   {}
func (NopRecorder) Watch(func() int) {}

// PrometheusRecorder exports the events as Prometheus metrics: sluice_outlier_ejections_total by reason (a closed
// set) and sluice_outlier_ejected_endpoints, the endpoints ejected at scrape time summed over the watched detectors.
// No metric is labelled by endpoint: pods come and go, and the EPP's log names each ejected one.
type PrometheusRecorder struct {
	ejections *prometheus.CounterVec

	mu      sync.Mutex
	sources []func() int
}

var _ Recorder = (*PrometheusRecorder)(nil)

// NewPrometheusRecorder creates the metrics and registers them on reg (a non-default registry owned by cmd/).
func NewPrometheusRecorder(reg prometheus.Registerer) (*PrometheusRecorder, error) {
	r := &PrometheusRecorder{
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "outlier", Name: "ejections_total",
			Help: "Endpoints ejected by passive outlier detection, by reason (consecutive_5xx, local_5xx, repeat: " +
				"the first response after an ejection failed too; slow: its streams became several times slower than its usual " +
				"pace while a peer's did not).",
		}, []string{"reason"}),
	}
	gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "sluice", Subsystem: "outlier", Name: "ejected_endpoints",
		Help: "Endpoints ejected by passive outlier detection now (before each pick's cap on ejections).",
	}, r.ejected)
	if err := errors.Join(reg.Register(r.ejections), reg.Register(gauge)); err != nil {
		return nil, err
	}
	// Every series of the closed label set exists from the start, so dashboards and alerts see zeros rather than
	// nothing before the first ejection.
	for _, reason := range Reasons {
		r.ejections.WithLabelValues(reason.String())
	}
	return r, nil
}

// Ejected implements Recorder.
func (r *PrometheusRecorder) Ejected(reason Reason) {
	r.ejections.WithLabelValues(reason.String()).Inc()
}

// Watch implements Recorder.
func (r *PrometheusRecorder) Watch(ejected func() int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sources = append(r.sources, ejected)
}

func (r *PrometheusRecorder) ejected() float64 {
	r.mu.Lock()
	sources := r.sources
	r.mu.Unlock()
	n := 0
	for _, s := range sources {
		n += s()
	}
	return float64(n)
}
