package plugins

import (
	"container/list"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// decisionStore carries flow-control decisions by request ID from the hook that makes them (admission) to the hook
// that consumes them (the response shaper for rejections, the headroom filter for dispatches). Upstream's hooks share
// no per-request state, and x-request-id is the one key every hook sees.
//
// Invariants: consumers delete the entries they use. An entry whose consumer never runs (a request that failed
// between admission and scheduling, a response that was never sent) expires ttl after it was stored, on the injected
// clock, and the store never holds more than max entries: at the bound the oldest entry is dropped. ttl is the same
// for every entry, so insertion order is expiry order and expiring is a pop from the front.
//
// Concurrency: safe for concurrent use; one mutex, never held while calling out.
type decisionStore struct {
	clock clock.PassiveClock
	ttl   time.Duration
	max   int

	mu      sync.Mutex
	entries map[string]*list.Element // values are *storedDecision
	order   *list.List               // oldest first
	dropped uint64                   // entries removed unused, by the bound or by expiry
}

// storedDecision is one decision waiting for its consumer.
type storedDecision struct {
	id       string
	decision flowcontrol.Decision
	// message is the human-readable reason, for the response body.
	message string
	expires time.Time
}

func newDecisionStore(clk clock.PassiveClock, ttl time.Duration, max int) *decisionStore {
	return &decisionStore{clock: clk, ttl: ttl, max: max, entries: map[string]*list.Element{}, order: list.New()}
}

// put stores d for id, replacing any entry id already has.
func (s *decisionStore) put(id string, d flowcontrol.Decision, message string) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if el, ok := s.entries[id]; ok {
		s.removeLocked(el)
	}
	for s.order.Len() >= s.max {
		s.removeLocked(s.order.Front())
		s.dropped++
	}
	s.entries[id] = s.order.PushBack(&storedDecision{id: id, decision: d, message: message, expires: now.Add(s.ttl)})
}

// get returns id's entry without removing it (the headroom filter runs once per scheduling profile).
func (s *decisionStore) get(id string) (storedDecision, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[id]
	if !ok {
		return storedDecision{}, false
	}
	sd := el.Value.(*storedDecision)
	if !now.Before(sd.expires) {
		return storedDecision{}, false
	}
	return *sd, true
}

// take returns and removes id's entry.
func (s *decisionStore) take(id string) (storedDecision, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[id]
	if !ok {
		return storedDecision{}, false
	}
	s.removeLocked(el)
	sd := el.Value.(*storedDecision)
	if !now.Before(sd.expires) {
		s.dropped++
		return storedDecision{}, false
	}
	return *sd, true
}

// delete removes id's entry, if any.
func (s *decisionStore) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.entries[id]; ok {
		s.removeLocked(el)
	}
}

// len returns the number of entries, expired ones included until the next put.
func (s *decisionStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}

func (s *decisionStore) expireLocked(now time.Time) {
	for el := s.order.Front(); el != nil && !now.Before(el.Value.(*storedDecision).expires); el = s.order.Front() {
		s.removeLocked(el)
		s.dropped++
	}
}

func (s *decisionStore) removeLocked(el *list.Element) {
	delete(s.entries, el.Value.(*storedDecision).id)
	s.order.Remove(el)
}
