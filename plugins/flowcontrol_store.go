package plugins

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/internal/ttlmap"
)

// decisionStore carries flow-control decisions by request ID from the hook that makes them (admission) to the hook
// that consumes them (the response shaper for rejections, the headroom filter for dispatches). Upstream's hooks share
// no per-request state, and x-request-id is the one key every hook sees.
//
// Invariants: consumers delete the entries they use. An entry whose consumer never runs (a request that failed
// between admission and scheduling, a response that was never sent) expires ttl after it was stored, on the injected
// clock, and the store never holds more than max entries: at the bound the oldest entry is dropped.
//
// Concurrency: safe for concurrent use; one mutex, never held while calling out.
type decisionStore struct {
	clock clock.PassiveClock
	max   int

	mu      sync.Mutex
	entries *ttlmap.Map[string, storedDecision]
	dropped uint64 // entries removed unused, by the bound or by expiry
}

// storedDecision is one decision waiting for its consumer.
type storedDecision struct {
	decision flowcontrol.Decision
	// message is the human-readable reason, for the response body.
	message string
	// model is a dispatched request's target model, for candidate narrowing.
	model string
	// adapterKept are the peers' endpoints the headroom filter kept for the request's LoRA adapter
	// (keepAdapterHolders), so that PreRequest counts a placement there as adapter affinity.
	adapterKept []string
}

func newDecisionStore(clk clock.PassiveClock, ttl time.Duration, max int) *decisionStore {
	s := &decisionStore{clock: clk, max: max}
	s.entries = ttlmap.New(ttl, func(string, storedDecision) { s.dropped++ })
	return s
}

// put stores sd for id, replacing any entry id already has.
func (s *decisionStore) put(id string, sd storedDecision) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries.Expire(now)
	s.entries.Delete(id)
	for s.entries.Len() >= s.max {
		s.entries.DropOldest()
		s.dropped++
	}
	s.entries.Put(now, id, sd)
}

// get returns id's entry without removing it (the headroom filter runs once per scheduling profile).
func (s *decisionStore) get(id string) (storedDecision, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries.Get(now, id)
}

// update changes id's entry in place, if it has one, keeping its age.
func (s *decisionStore) update(id string, fn func(*storedDecision)) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries.Update(now, id, fn)
}

// take returns and removes id's entry.
func (s *decisionStore) take(id string) (storedDecision, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries.Take(now, id)
}

// delete removes id's entry, if any.
func (s *decisionStore) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries.Delete(id)
}

// len returns the number of entries, expired ones included until the next call that reads the clock.
func (s *decisionStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries.Len()
}
