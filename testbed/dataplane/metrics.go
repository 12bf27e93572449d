package dataplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is how a request through the proxy ended. The set is closed so it
// can label metrics.
type Outcome string

const (
	// OutcomeProxied: an upstream response was delivered to the client.
	OutcomeProxied Outcome = "proxied"
	// OutcomeImmediate: the EPP answered with an ImmediateResponse (e.g. 429).
	OutcomeImmediate Outcome = "immediate"
	// OutcomeBadRequest: the client request was rejected by the proxy itself.
	OutcomeBadRequest Outcome = "bad_request"
	// OutcomeNoEndpoint: no endpoint was named or usable (503).
	OutcomeNoEndpoint Outcome = "no_endpoint"
	// OutcomeUpstreamError: no endpoint accepted a connection, or the
	// upstream failed before its response headers (502).
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeEPPError: the EPP failed and fail-closed mode answered 500/504.
	OutcomeEPPError Outcome = "epp_error"
	// OutcomeAborted: the response was cut after its headers were sent
	// (upstream or EPP failure mid-stream, or the client went away).
	OutcomeAborted Outcome = "aborted"
)

// EPPFailure is the phase in which the EPP failed. Closed set for labels.
type EPPFailure string

const (
	// EPPFailureRequest: opening the stream or exchanging the request
	// headers/body failed.
	EPPFailureRequest EPPFailure = "request"
	// EPPFailureTimeout: the EPP did not answer the request phase within
	// MessageTimeout.
	EPPFailureTimeout EPPFailure = "timeout"
	// EPPFailureResponse: the EPP failed while processing the response.
	EPPFailureResponse EPPFailure = "response"
)

// Recorder receives proxy events. Implementations must be safe for concurrent
// use.
type Recorder interface {
	// RecordRequest is called exactly once per client request.
	RecordRequest(outcome Outcome, failedOpen bool, d time.Duration)
	// RecordEPPFailure is called each time the EPP fails a request.
	RecordEPPFailure(phase EPPFailure)
}

type noRecorder struct{}

func (noRecorder) RecordRequest(Outcome, bool, time.Duration) {}
func (noRecorder) RecordEPPFailure(EPPFailure)                {}

// PrometheusRecorder is a Recorder backed by Prometheus collectors.
type PrometheusRecorder struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	eppFailures *prometheus.CounterVec
}

var _ Recorder = (*PrometheusRecorder)(nil)

// NewPrometheusRecorder registers the data plane's collectors on reg (use a
// non-default registry).
func NewPrometheusRecorder(reg prometheus.Registerer) (*PrometheusRecorder, error) {
	r := &PrometheusRecorder{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "dataplane", Name: "requests_total",
			Help: "Client requests by outcome and whether they failed open past the EPP.",
		}, []string{"outcome", "failed_open"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "sluice", Subsystem: "dataplane", Name: "request_duration_seconds",
			Help:    "Time from request arrival to the end of its response, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"outcome"}),
		eppFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice", Subsystem: "dataplane", Name: "epp_failures_total",
			Help: "EPP failures by the phase they happened in.",
		}, []string{"phase"}),
	}
	for _, c := range []prometheus.Collector{r.requests, r.duration, r.eppFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// RecordRequest implements Recorder.
func (r *PrometheusRecorder) RecordRequest(outcome Outcome, failedOpen bool, d time.Duration) {
	fo := "false"
	if failedOpen {
		fo = "true"
	}
	r.requests.WithLabelValues(string(outcome), fo).Inc()
	r.duration.WithLabelValues(string(outcome)).Observe(d.Seconds())
}

// RecordEPPFailure implements Recorder.
func (r *PrometheusRecorder) RecordEPPFailure(phase EPPFailure) {
	r.eppFailures.WithLabelValues(string(phase)).Inc()
}
