package runner

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// observerCounter counts the response observer's outcomes (responseobserver.go) on /metrics; its label takes the
// closed set of observerOutcome values.
type observerCounter struct{ vec *prometheus.CounterVec }

func (c observerCounter) observed(o observerOutcome) { c.vec.WithLabelValues(string(o)).Inc() }

// responseObserverCounter is the process's counter, registered on the registry /metrics serves the first time a
// server with the response observer is assembled.
var responseObserverCounter = sync.OnceValues(func() (observerRecorder, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_response_observer_total",
		Help: "Response observer streams and routed requests, by outcome: joined (an observer stream found its routed " +
			"request), orphan (an observer stream no routed request expected), missing (a routed request's observer did " +
			"not come within --response-observer-wait; the request ended then), duplicate_id (a request ID already " +
			"expected; the requests sharing it end with their routing streams, but one an observer already joined).",
	}, []string{"outcome"})
	for _, o := range []observerOutcome{observerJoined, observerOrphan, observerMissing, observerDuplicateID} {
		vec.WithLabelValues(string(o))
	}
	return observerCounter{vec}, crmetrics.Registry.Register(vec)
})
