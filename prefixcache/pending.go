package prefixcache

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// pendingEntry is a routed request awaiting its usage report.
type pendingEntry struct {
	pod       *pod
	predicted float64 // predicted cached fraction of the prompt
	at        time.Time
}

const pendingShards = 16

type pendingShard struct {
	mu        sync.Mutex
	entries   map[string]pendingEntry
	nextSweep time.Time
	_         [32]byte
}

// pendingTable holds routed requests until their usage report, bounded in
// size and age: entries older than ttl are dropped (and their in-flight count
// released) by the next put after a quarter of ttl.
type pendingTable struct {
	shards   [pendingShards]pendingShard
	perShard int
	ttl      time.Duration
}

func (t *pendingTable) init(limit int, ttl time.Duration) {
	t.perShard = max(1, limit/pendingShards)
	t.ttl = ttl
	for i := range t.shards {
		t.shards[i].entries = map[string]pendingEntry{}
	}
}

func (t *pendingTable) shard(id string) *pendingShard {
	return &t.shards[xxhash.Sum64String(id)%pendingShards]
}

// put stores e under id and reports whether it did (the shard may be full).
// A previous entry under id is replaced and its in-flight count released.
func (t *pendingTable) put(now time.Time, id string, e pendingEntry) bool {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !now.Before(s.nextSweep) {
		t.sweepLocked(s, now)
	}
	if old, ok := s.entries[id]; ok {
		old.pod.inflight.Add(-1)
	} else if len(s.entries) >= t.perShard {
		return false
	}
	s.entries[id] = e
	return true
}

// take removes and returns the entry under id.
func (t *pendingTable) take(id string) (pendingEntry, bool) {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if ok {
		delete(s.entries, id)
	}
	return e, ok
}

// expire drops every entry older than ttl at now.
func (t *pendingTable) expire(now time.Time) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		t.sweepLocked(s, now)
		s.mu.Unlock()
	}
}

func (t *pendingTable) sweepLocked(s *pendingShard, now time.Time) {
	for id, e := range s.entries {
		if now.Sub(e.at) >= t.ttl {
			e.pod.inflight.Add(-1)
			delete(s.entries, id)
		}
	}
	s.nextSweep = now.Add(t.ttl / 4)
}

// Expire drops the routed requests whose usage report has not come within
// PendingTTL of now, releasing their in-flight counts. Route does this
// lazily; call it periodically when traffic may stop.
func (ix *Index) Expire(now time.Time) { ix.pending.expire(now) }
