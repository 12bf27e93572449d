package plugins

// The in-flight tracker counts, per endpoint, the requests the EPP sent there that have not finished yet:
// least outstanding requests, as Envoy's LEAST_REQUEST balancer does (the sluice-inflight-scorer).
//
// Scraped metrics (waiting and running requests, KV use) are up to one refresh interval old, so every scorer that
// reads them ranks the endpoints the same way for a whole interval and sends every request of that interval to the
// same "best" endpoint. The EPP's own count changes with every request it routes and every response that ends, so
// ranking by it spreads a burst at once and sends more work where work finishes faster.
//
// The tracker is pure bookkeeping: time comes in as arguments, no I/O, no goroutines. A request whose end the EPP
// never sees (the proxy dropped the stream) stops counting once it is the tracker's TTL old, so a lost completion
// cannot mark an endpoint busy for ever. It is safe for concurrent use; one mutex guards it.

import (
	"sync"
	"time"

	"github.com/sluice-gw/sluice/internal/ttlmap"
)

// inflightTracker counts outstanding requests per endpoint.
type inflightTracker struct {
	mu sync.Mutex
	// counts holds the outstanding requests per endpoint; endpoints with none are absent.
	counts map[string]int
	// endpoints maps a request ID to its endpoint until the request finishes or expires.
	endpoints *ttlmap.Map[string, string]
}

// newInflightTracker returns an inflightTracker that forgets a request ttl after it started if its end was never
// reported. ttl must be positive.
func newInflightTracker(ttl time.Duration) *inflightTracker {
	t := &inflightTracker{counts: map[string]int{}}
	t.endpoints = ttlmap.New(ttl, func(_, endpoint string) { t.decLocked(endpoint) })
	return t
}

// Start counts request id as outstanding on endpoint from now. Starting an ID that is still outstanding moves it
// (a retry routed elsewhere); an empty ID or endpoint is ignored.
func (t *inflightTracker) Start(now time.Time, id, endpoint string) {
	if id == "" || endpoint == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.endpoints.Put(now, id, endpoint); ok {
		t.decLocked(old)
	}
	t.counts[endpoint]++
}

// Finish stops counting request id. Unknown IDs (never started, finished or expired) are ignored, so a completion
// reported twice counts once.
func (t *inflightTracker) Finish(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if endpoint, ok := t.endpoints.Delete(id); ok {
		t.decLocked(endpoint)
	}
}

// Counts writes into out the outstanding requests of each endpoint in endpoints, as of now.
func (t *inflightTracker) Counts(now time.Time, endpoints []string, out []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endpoints.Expire(now)
	for i, e := range endpoints {
		out[i] = t.counts[e]
	}
}

// Outstanding returns the number of requests counted on all endpoints.
func (t *inflightTracker) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.endpoints.Len()
}

func (t *inflightTracker) decLocked(endpoint string) {
	if t.counts[endpoint] <= 1 {
		delete(t.counts, endpoint)
		return
	}
	t.counts[endpoint]--
}

// leastOutstandingScores writes least-outstanding scores for counts into out: the endpoint with the fewest
// outstanding requests scores 1, the one with the most 0, linear in between; all score 1 when the counts are equal.
func leastOutstandingScores(counts []int, out []float64) {
	if len(counts) == 0 {
		return
	}
	lo, hi := counts[0], counts[0]
	for _, c := range counts[1:] {
		lo, hi = min(lo, c), max(hi, c)
	}
	for i, c := range counts {
		if hi == lo {
			out[i] = 1
			continue
		}
		out[i] = float64(hi-c) / float64(hi-lo)
	}
}
