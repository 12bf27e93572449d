package inflight

import (
	"sync"
	"time"
)

// Tracker counts outstanding requests per endpoint.
type Tracker struct {
	ttl time.Duration

	mu sync.Mutex
	// counts holds the outstanding requests per endpoint; endpoints with none are absent.
	counts map[string]int
	// pending maps a request ID to its endpoint and start, until it finishes or expires.
	pending map[string]started
	// order lists started requests oldest first; entries of requests that finished are skipped when they reach
	// the front.
	order []orderEntry
}

type started struct {
	endpoint string
	at       time.Time
}

type orderEntry struct {
	id string
	at time.Time
}

// NewTracker returns a Tracker that forgets a request ttl after it started if its end was never reported. ttl must
// be positive.
func NewTracker(ttl time.Duration) *Tracker {
	return &Tracker{ttl: ttl, counts: map[string]int{}, pending: map[string]started{}}
}

// Start counts request id as outstanding on endpoint from now. Starting an ID that is still outstanding moves it
// (a retry routed elsewhere); an empty ID or endpoint is ignored.
func (t *Tracker) Start(now time.Time, id, endpoint string) {
	if id == "" || endpoint == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if old, ok := t.pending[id]; ok {
		t.decLocked(old.endpoint)
	}
	t.pending[id] = started{endpoint: endpoint, at: now}
	t.counts[endpoint]++
	t.order = append(t.order, orderEntry{id: id, at: now})
}

// Finish stops counting request id. Unknown IDs (never started, finished or expired) are ignored, so a completion
// reported twice counts once.
func (t *Tracker) Finish(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.pending[id]; ok {
		delete(t.pending, id)
		t.decLocked(s.endpoint)
	}
}

// Counts writes into out the outstanding requests of each endpoint in endpoints, as of now.
func (t *Tracker) Counts(now time.Time, endpoints []string, out []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	for i, e := range endpoints {
		out[i] = t.counts[e]
	}
}

// Outstanding returns the number of requests counted on all endpoints.
func (t *Tracker) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

func (t *Tracker) decLocked(endpoint string) {
	if t.counts[endpoint] <= 1 {
		delete(t.counts, endpoint)
		return
	}
	t.counts[endpoint]--
}

// expireLocked forgets requests that started more than ttl before now.
func (t *Tracker) expireLocked(now time.Time) {
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
	// outstanding, not what was ever started.
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
func Scores(counts []int, out []float64) {
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
