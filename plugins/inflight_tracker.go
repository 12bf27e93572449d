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
// never sees (the proxy dropped the stream) stops counting after the tracker's TTL, so a lost completion cannot mark
// an endpoint busy for ever. It is safe for concurrent use; one mutex guards it.

import (
	"sync"
	"time"
)

// inflightTracker counts outstanding requests per endpoint.
type inflightTracker struct {
	ttl time.Duration

	mu sync.Mutex
	// counts holds the outstanding requests per endpoint; endpoints with none are absent.
	counts map[string]int
	// pending maps a request ID to its endpoint and start, until it finishes or expires.
	pending map[string]inflightStart
	// order lists inflightStart requests oldest first; entries of requests that finished are skipped when they reach
	// the front.
	order []inflightOrderEntry
}

type inflightStart struct {
	endpoint string
	at       time.Time
}

type inflightOrderEntry struct {
	id string
	at time.Time
}

// newInflightTracker returns a inflightTracker that forgets a request ttl after it inflightStart if its end was never reported. ttl must
// be positive.
func newInflightTracker(ttl time.Duration) *inflightTracker {
	return &inflightTracker{ttl: ttl, counts: map[string]int{}, pending: map[string]inflightStart{}}
}

// Start counts request id as outstanding on endpoint from now. Starting an ID that is still outstanding moves it
// (a retry routed elsewhere); an empty ID or endpoint is ignored.
func (t *inflightTracker) Start(now time.Time, id, endpoint string) {
	if id == "" || endpoint == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if old, ok := t.pending[id]; ok {
		t.decLocked(old.endpoint)
	}
	t.pending[id] = inflightStart{endpoint: endpoint, at: now}
	t.counts[endpoint]++
	t.order = append(t.order, inflightOrderEntry{id: id, at: now})
}

// Finish stops counting request id. Unknown IDs (never inflightStart, finished or expired) are ignored, so a completion
// reported twice counts once.
func (t *inflightTracker) Finish(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.pending[id]; ok {
		delete(t.pending, id)
		t.decLocked(s.endpoint)
	}
}

// Counts writes into out the outstanding requests of each endpoint in endpoints, as of now.
func (t *inflightTracker) Counts(now time.Time, endpoints []string, out []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	for i, e := range endpoints {
		out[i] = t.counts[e]
	}
}

// Outstanding returns the number of requests counted on all endpoints.
func (t *inflightTracker) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

func (t *inflightTracker) decLocked(endpoint string) {
	if t.counts[endpoint] <= 1 {
		delete(t.counts, endpoint)
		return
	}
	t.counts[endpoint]--
}

// expireLocked forgets requests that inflightStart more than ttl before now.
func (t *inflightTracker) expireLocked(now time.Time) {
	cutoff := now.Add(-t.ttl)
	n := 0
	for n < len(t.order) && t.order[n].at.Before(cutoff) {
		e := t.order[n]
		if s, ok := t.pending[e.id]; ok && s.at.Equal(e.at) {
			delete(t.pending, e.id)
			t.decLocked(s.endpoint)
		}
		n++
	}
	if n > 0 {
		t.order = append(t.order[:0], t.order[n:]...)
	}
	// Finished requests leave their order entries behind; compact when they dominate so memory follows what is
	// outstanding, not what was ever inflightStart.
	if len(t.order) > 64 && len(t.order) > 4*len(t.pending) {
		kept := t.order[:0]
		for _, e := range t.order {
			if s, ok := t.pending[e.id]; ok && s.at.Equal(e.at) {
				kept = append(kept, e)
			}
		}
		clear(t.order[len(kept):])
		t.order = kept
	}
}

// Scores writes least-outstanding scores for counts into out: the endpoint with the fewest outstanding requests
// scores 1, the one with the most 0, linear in between; all score 1 when the counts are equal.
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
