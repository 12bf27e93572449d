package flowcontrol

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Recorder receives the controller's observations. Implementations must be goroutine-safe and cheap: RecordDecision
// runs once per request, outside the controller's lock, in the goroutine that called Admit.
type Recorder interface {
	// RecordDecision observes the final decision of one request of tenant.
	RecordDecision(tenant string, d Decision)
	// RecordQueue observes the controller's state after an operation that changed its queues or endpoints.
	RecordQueue(s QueueSample)
}

// QueueSample is the controller's state at one instant.
type QueueSample struct {
	// Queued is the number of waiting requests per band.
	Queued [NumBands]int
	// PoolSaturation is the mean saturation of endpoints with fresh metrics (1 when there are none). It is for
	// dashboards only: dispatch decides per endpoint, never on this average.
	PoolSaturation float64
	// DrainRate is the estimated drain rate in cost units (tokens) per second, 0 while unknown.
	DrainRate float64
	// StaleEndpoints counts the endpoints whose metrics are older than the staleness threshold: admission sends them
	// nothing until a scrape refreshes them, so a pool whose scrapes lag holds requests in the EPP.
	StaleEndpoints int
	// Reserved counts the dispatched requests still counted against an endpoint: not yet covered by a scrape, or
	// streamed and without a first chunk. Once traffic stops it returns to 0 within a scrape; a count that stays up
	// is a reservation nothing will release (the chaos suite checks this after every fault).
	Reserved int
}

// noopRecorder is the default Recorder.
type noopRecorder struct{}

func (noopRecorder) RecordDecision(string, Decision) {}
func (noopRecorder) RecordQueue(QueueSample)         {}

// OtherTenant is the tenant label value of tenants beyond PrometheusRecorder's limit.
const OtherTenant = "other"

// PrometheusRecorder exports the controller's observations as Prometheus metrics under sluice_flowcontrol_*.
// Labels come from closed enums (band, outcome, reason) plus a bounded tenant label: the first maxTenants distinct
// tenants keep their name and all others share "other". First-seen rather than a moving top-N keeps every series
// stable; a label that changed owner with traffic would make counters meaningless.
type PrometheusRecorder struct {
	queueLength    *prometheus.GaugeVec
	queueWait      *prometheus.HistogramVec
	dispatched     *prometheus.CounterVec
	burst          *prometheus.CounterVec
	shed           *prometheus.CounterVec
	cancelled      *prometheus.CounterVec
	capped         *prometheus.CounterVec
	retryAfter     *prometheus.HistogramVec
	poolSaturation prometheus.Gauge
	staleEndpoints prometheus.Gauge
	reserved       prometheus.Gauge
	drainRate      prometheus.Gauge

	maxTenants int
	mu         sync.Mutex
	tenants    map[string]struct{} // guarded by mu
}

var _ Recorder = (*PrometheusRecorder)(nil)

// NewPrometheusRecorder creates the metrics and registers them on reg (cmd/ passes a non-default registry).
// maxTenants bounds the tenant label's cardinality (0 labels every tenant "other").
func NewPrometheusRecorder(reg prometheus.Registerer, maxTenants int) (*PrometheusRecorder, error) {
	const ns, sub = "sluice", "flowcontrol"
	r := &PrometheusRecorder{
		queueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_length", Help: "Requests waiting in the EPP, per band."}, []string{"band"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_wait_seconds", Help: "Time requests spent waiting in the EPP, per band and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"band", "outcome"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "dispatched_total", Help: "Requests dispatched to the scheduler."}, []string{"band", "tenant"}),
		burst: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "burst_dispatched_total", Help: "Requests dispatched in the burst tier (no endpoint had headroom under the normal thresholds), per band."},
			[]string{"band"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "shed_total", Help: "Requests answered rejected (429/400) or unavailable (503), by reason."},
			[]string{"band", "outcome", "reason", "tenant"}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cancelled_total", Help: "Requests whose client went away while waiting."}, []string{"band"}),
		capped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "capped_total", Help: "Requests served in a lower band than asked because of their tenant's cap."},
			[]string{"band"}),
		retryAfter: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "retry_after_seconds", Help: "Retry-After values sent with shed requests.",
			Buckets: []float64{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144}}, []string{"band", "reason"}),
		staleEndpoints: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "stale_endpoints", Help: "Endpoints whose metrics are older than the staleness threshold: admission sends them nothing."}),
		reserved: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "reserved_requests", Help: "Dispatched requests still counted against an endpoint (not yet covered by a scrape, or streamed without a first chunk)."}),
		poolSaturation: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "pool_saturation", Help: "Mean saturation of endpoints with fresh metrics (informational)."}),
		drainRate: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "drain_rate", Help: "Estimated pool drain rate while backlogged, in cost units (tokens) per second."}),
		maxTenants: maxTenants,
		tenants:    make(map[string]struct{}),
	}
	for _, c := range []prometheus.Collector{r.queueLength, r.queueWait, r.dispatched, r.burst, r.shed, r.cancelled, r.capped,
		r.retryAfter, r.poolSaturation, r.staleEndpoints, r.reserved, r.drainRate} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// tenantLabel returns tenant if it is among the first maxTenants seen, else OtherTenant. A tenant is a header value
// a client may choose, and a label value that is not valid UTF-8 makes the Prometheus client panic: invalid bytes
// read as U+FFFD.
func (r *PrometheusRecorder) tenantLabel(tenant string) string {
	tenant = strings.ToValidUTF8(tenant, "\uFFFD")
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tenants[tenant]; ok {
		return tenant
	}
	if len(r.tenants) < r.maxTenants {
		r.tenants[tenant] = struct{}{}
		return tenant
	}
	return OtherTenant
}

// RecordDecision implements Recorder.
func (r *PrometheusRecorder) RecordDecision(tenant string, d Decision) {
	band := d.Band.String()
	if d.Capped {
		r.capped.WithLabelValues(band).Inc()
	}
	r.queueWait.WithLabelValues(band, d.Outcome.String()).Observe(d.Waited.Seconds())
	switch d.Outcome {
	case Dispatched:
		r.dispatched.WithLabelValues(band, r.tenantLabel(tenant)).Inc()
		if d.Burst {
			r.burst.WithLabelValues(band).Inc()
		}
	case Cancelled:
		r.cancelled.WithLabelValues(band).Inc()
	default:
		r.shed.WithLabelValues(band, d.Outcome.String(), d.Reason.String(), r.tenantLabel(tenant)).Inc()
		if d.RetryAfter > 0 {
			r.retryAfter.WithLabelValues(band, d.Reason.String()).Observe(d.RetryAfter.Seconds())
		}
	}
}

// RecordQueue implements Recorder.
func (r *PrometheusRecorder) RecordQueue(s QueueSample) {
	for _, b := range allBands {
		r.queueLength.WithLabelValues(b.String()).Set(float64(s.Queued[b]))
	}
	r.poolSaturation.Set(s.PoolSaturation)
	r.staleEndpoints.Set(float64(s.StaleEndpoints))
	r.reserved.Set(float64(s.Reserved))
	r.drainRate.Set(s.DrainRate)
}
