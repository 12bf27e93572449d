package prefixcache

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sluice-gw/sluice/internal/ttlmap"
)

// pendingEntry is a routed request awaiting its usage report.
type pendingEntry struct {
	pod       *pod
	predicted float64 // predicted cached fraction of the prompt
}

// pendingShards spreads the table over independently locked shards: Route and ObserveUsage run on every request,
// from every EPP goroutine.
const pendingShards = 16

type pendingShard struct {
	mu      sync.Mutex
	entries *ttlmap.Map[string, pendingEntry]
	_       [48]byte
}

// pendingTable holds routed requests until their usage report, bounded in size (perShard per shard; a full shard
// refuses new requests) and age: an entry ttl old is dropped, and its in-flight count released, by the next call on
// its shard that reads the time.
type pendingTable struct {
	shards   [pendingShards]pendingShard
	perShard int
}

func (t *pendingTable) init(limit int, ttl time.Duration) {
	t.perShard = max(1, limit/pendingShards)
	for i := range t.shards {
		t.shards[i].entries = ttlmap.New(ttl, releasePending)
	}
}

// releasePending ends an entry's in-flight count.
func releasePending(_ string, e pendingEntry) { e.pod.inflight.Add(-1) }

func (t *pendingTable) shard(id string) *pendingShard {
	return &t.shards[xxhash.Sum64String(id)%pendingShards]
}

// put stores e under id at now and reports whether it did (the shard may be full). A previous entry under id is
// replaced and its in-flight count released.
func (t *pendingTable) put(now time.Time, id string, e pendingEntry) bool {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries.Expire(now)
	if old, ok := s.entries.Delete(id); ok {
		releasePending(id, old)
	} else if s.entries.Len() >= t.perShard {
		return false
	}
	s.entries.Put(now, id, e)
	return true
}

// take removes and returns the entry under id, unless it expired at now.
func (t *pendingTable) take(now time.Time, id string) (pendingEntry, bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries.Take(now, id)
}

// expire drops every entry ttl old at now.
func (t *pendingTable) expire(now time.Time) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.entries.Expire(now)
		s.mu.Unlock()
	}
}

// Expire drops the routed requests whose usage report has not come within
// PendingTTL of now, releasing their in-flight counts. Route and ObserveUsage
// do this lazily, per shard; call it periodically when traffic may stop.
func (ix *Index) Expire(now time.Time) { ix.pending.expire(now) }
