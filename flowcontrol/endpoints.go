package flowcontrol

import (
	"math"
	"time"
)

// Endpoint is one model-server endpoint as last scraped. The adapter passes the whole pool to
// Controller.UpdateEndpoints after each scrape; an endpoint missing from the snapshot is gone.
type Endpoint struct {
	// Name identifies the endpoint (e.g. namespace/pod); Bind uses the same names.
	Name string
	// WaitingQueue is the model server's count of requests waiting for a batch slot.
	WaitingQueue int
	// Running is the model server's count of running requests.
	Running int
	// KVCacheUsage is the fraction of KV cache in use, in [0, 1].
	KVCacheUsage float64
	// ScrapedAt is when these metrics were read. Older than the staleness threshold, the endpoint has no headroom;
	// requests the EPP sent to the endpoint before ScrapedAt are counted by the scrape and no longer reserved.
	ScrapedAt time.Time
}

// endpointState is an Endpoint plus the requests the EPP sent it that its last scrape does not yet show. It caches
// what the fast path needs so that a scan is two comparisons per endpoint.
type endpointState struct {
	Endpoint
	reserved  int
	sat       float64 // Saturation(Endpoint, reserved, thresholds); refresh after changing reserved
	scrapedNs int64   // ScrapedAt in Unix nanoseconds; math.MinInt64 when unknown
}

func newEndpointState(e Endpoint) endpointState {
	s := endpointState{Endpoint: e, scrapedNs: math.MinInt64}
	if !e.ScrapedAt.IsZero() {
		s.scrapedNs = e.ScrapedAt.UnixNano()
	}
	return s
}

// reserve adds delta reservations and refreshes the cached saturation.
func (e *endpointState) reserve(delta int, th EndpointThresholds) {
	e.reserved += delta
	e.sat = Saturation(e.Endpoint, e.reserved, th)
}

// reservation is one dispatched request counted against an endpoint until a scrape covers it or it finishes.
type reservation struct {
	endpoint string
	at       time.Time
}

// Saturation is an endpoint's load relative to its thresholds: the largest of
// (waiting + reserved) / QueueDepth, KV cache usage / KVCacheUtil and, if Running > 0, running / Running.
// 1.0 means "at threshold"; a band has headroom on an endpoint whose saturation is below the band's ceiling.
func Saturation(e Endpoint, reserved int, th EndpointThresholds) float64 {
	s := float64(e.WaitingQueue+reserved) / float64(th.QueueDepth)
	if kv := e.KVCacheUsage / th.KVCacheUtil; kv > s {
		s = kv
	}
	if th.Running > 0 {
		if r := float64(e.Running) / float64(th.Running); r > s {
			s = r
		}
	}
	return s
}

// freshCutoff returns the Unix-nanosecond scrape time at or after which metrics are fresh at now.
func freshCutoff(now time.Time, staleness time.Duration) int64 {
	return now.UnixNano() - int64(staleness)
}
