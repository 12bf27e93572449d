package lora

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// countingRecorder counts observations; safe for concurrent use.
type countingRecorder struct {
	mu        sync.Mutex
	outcomes  map[Outcome]int
	evictions map[EvictionReason]int
}

func newCountingRecorder() *countingRecorder {
	return &countingRecorder{outcomes: map[Outcome]int{}, evictions: map[EvictionReason]int{}}
}

func (r *countingRecorder) RecordScore(o Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[o]++
}

func (r *countingRecorder) RecordMemoryEviction(e EvictionReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evictions[e]++
}

func TestMemoryWeightDecay(t *testing.T) {
	m := newMemory(16, 30*time.Second, 2*time.Minute, noRecorder{})
	m.Record("a", "p1", t0)
	steps := []struct {
		at   time.Duration
		want float64
	}{
		{-time.Second, 1}, // clock skew: a send "in the future" is fresh
		{0, 1},
		{15 * time.Second, math.Sqrt2 / 2},
		{30 * time.Second, 0.5},
		{60 * time.Second, 0.25},
		{119 * time.Second, math.Exp2(-119.0 / 30)},
		{120 * time.Second, 0}, // TTL reached
		{time.Hour, 0},
	}
	for _, s := range steps {
		if got := m.Weight("a", "p1", t0.Add(s.at)); math.Abs(got-s.want) > 1e-12 {
			t.Errorf("Weight at +%v = %v, want %v", s.at, got, s.want)
		}
	}
	if got := m.Weight("a", "p2", t0); got != 0 {
		t.Errorf("Weight of an unknown pod = %v, want 0", got)
	}
	if got := m.Weight("b", "p1", t0); got != 0 {
		t.Errorf("Weight of an unknown adapter = %v, want 0", got)
	}
}

func TestMemoryRecordNeverMovesBackwards(t *testing.T) {
	m := newMemory(16, 30*time.Second, 2*time.Minute, noRecorder{})
	m.Record("a", "p1", t0.Add(10*time.Second))
	m.Record("a", "p1", t0) // a concurrent PreRequest with an older clock reading
	got, ok := m.LastSent("a", "p1", t0.Add(10*time.Second))
	if !ok || !got.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("LastSent = %v, %v; want %v, true", got, ok, t0.Add(10*time.Second))
	}
	if _, ok := m.LastSent("a", "p1", t0.Add(10*time.Second+2*time.Minute)); ok {
		t.Fatalf("LastSent reports a send older than the TTL")
	}
}

func TestMemoryCapacityEvictsOldestSend(t *testing.T) {
	rec := newCountingRecorder()
	m := newMemory(3, time.Minute, time.Hour, rec)
	m.Record("a", "p1", t0)
	m.Record("b", "p1", t0.Add(1*time.Second))
	m.Record("c", "p1", t0.Add(2*time.Second))
	m.Record("a", "p1", t0.Add(3*time.Second)) // refresh: "b" is now the oldest
	m.Record("d", "p2", t0.Add(4*time.Second))
	now := t0.Add(5 * time.Second)
	if got := m.Len(); got != 3 {
		t.Fatalf("Len = %d, want 3", got)
	}
	for adapter, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if _, ok := m.LastSent(adapter, "p1", now); ok != want {
			t.Errorf("remembers %s on p1 = %v, want %v", adapter, ok, want)
		}
	}
	if _, ok := m.LastSent("d", "p2", now); !ok {
		t.Errorf("forgot the newest send")
	}
	if rec.evictions[EvictionCapacity] != 1 || rec.evictions[EvictionExpired] != 0 {
		t.Errorf("evictions = %v, want 1 capacity", rec.evictions)
	}
	if _, ok := m.byAdapter["b"]; ok {
		t.Errorf("index keeps an empty entry for evicted adapter b")
	}
}

func TestMemoryRecordPrunesExpiredSends(t *testing.T) {
	rec := newCountingRecorder()
	m := newMemory(100, time.Second, 10*time.Second, rec)
	for i := range 5 {
		m.Record(fmt.Sprintf("a%d", i), "p1", t0.Add(time.Duration(i)*time.Second))
	}
	m.Record("fresh", "p1", t0.Add(13*time.Second)) // a0..a3 are now >= 10 s old
	if got := m.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2 (a4 and fresh)", got)
	}
	if rec.evictions[EvictionExpired] != 4 {
		t.Errorf("expired evictions = %d, want 4", rec.evictions[EvictionExpired])
	}
}

// TestMemoryBoundedUnderRandomLoad checks the size bound and the index's
// consistency with the LRU list after many random records.
func TestMemoryBoundedUnderRandomLoad(t *testing.T) {
	const capacity = 50
	m := newMemory(capacity, time.Second, 5*time.Second, noRecorder{})
	now := t0
	for i := range 10_000 {
		now = now.Add(time.Duration(i%7) * 10 * time.Millisecond)
		m.Record(fmt.Sprintf("a%d", i*31%97), fmt.Sprintf("p%d", i*17%13), now)
		if m.Len() > capacity {
			t.Fatalf("after %d records Len = %d > capacity %d", i+1, m.Len(), capacity)
		}
	}
	indexed := 0
	for _, pods := range m.byAdapter {
		if len(pods) == 0 {
			t.Fatalf("index holds an empty adapter entry")
		}
		indexed += len(pods)
	}
	if indexed != m.order.Len() {
		t.Fatalf("index holds %d entries, list %d", indexed, m.order.Len())
	}
}

func TestMemoryConcurrentRecordAndScore(t *testing.T) {
	s, err := NewScorer(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	pods := []PodState{{Name: "p1", MaxLoRA: 2}, {Name: "p2", MaxLoRA: 2}}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				adapter := fmt.Sprintf("a%d", (g+i)%5)
				s.Record(adapter, pods[i%2].Name, now)
				for _, v := range s.Score(Request{Adapter: adapter}, pods, now) {
					if v < 0 || v > 1 {
						t.Errorf("score %v out of [0,1]", v)
					}
				}
			}
		})
	}
	wg.Wait()
}
