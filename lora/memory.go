package lora

import (
	"container/list"
	"math"
	"sync"
	"time"
)

// Memory remembers when the EPP last sent each adapter to each pod. It is a
// bounded LRU ordered by send time: recording beyond its capacity forgets the
// oldest send, and a send older than its TTL is neither reported nor kept.
// The weight of a remembered send halves every half-life, because the longer an
// idle adapter sits on a pod, the likelier other adapters have evicted it.
type Memory struct {
	capacity int
	halfLife time.Duration
	ttl      time.Duration
	recorder Recorder

	mu sync.RWMutex
	// order holds *memoryEntry, most recently sent first.
	order list.List
	// byAdapter indexes order by adapter, then pod, so that scoring one
	// adapter looks its pods up in one small map.
	byAdapter map[string]map[string]*list.Element
}

type memoryEntry struct {
	adapter, pod string
	lastSent     time.Time
}

// newMemory returns an empty Memory. Arguments are validated by Config.
func newMemory(capacity int, halfLife, ttl time.Duration, rec Recorder) *Memory {
	return &Memory{
		capacity:  capacity,
		halfLife:  halfLife,
		ttl:       ttl,
		recorder:  rec,
		byAdapter: map[string]map[string]*list.Element{},
	}
}

// Record notes that adapter was sent to pod at now. An earlier now than the
// one already remembered does not move the send time backwards.
func (m *Memory) Record(adapter, pod string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pods := m.byAdapter[adapter]
	if pods == nil {
		pods = map[string]*list.Element{}
		m.byAdapter[adapter] = pods
	}
	if el, ok := pods[pod]; ok {
		e := el.Value.(*memoryEntry)
		if now.After(e.lastSent) {
			e.lastSent = now
		}
		m.order.MoveToFront(el)
	} else {
		pods[pod] = m.order.PushFront(&memoryEntry{adapter: adapter, pod: pod, lastSent: now})
	}
	m.evictLocked(now)
}

// evictLocked drops sends past the TTL and, beyond capacity, the oldest ones.
func (m *Memory) evictLocked(now time.Time) {
	for el := m.order.Back(); el != nil; el = m.order.Back() {
		e := el.Value.(*memoryEntry)
		var reason EvictionReason
		switch {
		case m.order.Len() > m.capacity:
			reason = EvictionCapacity
		case now.Sub(e.lastSent) >= m.ttl:
			reason = EvictionExpired
		default:
			return
		}
		m.removeLocked(el)
		m.recorder.RecordMemoryEviction(reason)
	}
}

func (m *Memory) removeLocked(el *list.Element) {
	e := m.order.Remove(el).(*memoryEntry)
	pods := m.byAdapter[e.adapter]
	delete(pods, e.pod)
	if len(pods) == 0 {
		delete(m.byAdapter, e.adapter)
	}
}

// Len returns the number of remembered (adapter, pod) sends, including ones
// past the TTL that no Record has pruned yet.
func (m *Memory) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.order.Len()
}

// LastSent returns when adapter was last sent to pod, if that is remembered
// and not older than the TTL at now.
func (m *Memory) LastSent(adapter, pod string, now time.Time) (time.Time, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	el, ok := m.byAdapter[adapter][pod]
	if !ok {
		return time.Time{}, false
	}
	t := el.Value.(*memoryEntry).lastSent
	if now.Sub(t) >= m.ttl {
		return time.Time{}, false
	}
	return t, true
}

// Weight returns the decayed weight in [0,1] of having sent adapter to pod:
// 1 for a send at now (or later, under clock skew), 0.5 one half-life ago, and
// 0 when nothing within the TTL is remembered.
func (m *Memory) Weight(adapter, pod string, now time.Time) float64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.weightLocked(m.byAdapter[adapter], pod, now, time.Time{})
}

// weightLocked is Weight for the pods of one adapter, ignoring sends that are
// not after notBefore. The caller holds at least the read lock.
func (m *Memory) weightLocked(pods map[string]*list.Element, pod string, now, notBefore time.Time) float64 {
	el, ok := pods[pod]
	if !ok {
		return 0
	}
	sent := el.Value.(*memoryEntry).lastSent
	if !notBefore.IsZero() && !sent.After(notBefore) {
		return 0
	}
	age := now.Sub(sent)
	switch {
	case age <= 0:
		return 1
	case age >= m.ttl:
		return 0
	}
	return math.Exp2(-float64(age) / float64(m.halfLife))
}
