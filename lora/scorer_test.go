package lora

import (
	"math"
	"strings"
	"testing"
	"time"
)

func newTestScorer(t testing.TB, mutate func(*Config)) (*Scorer, *countingRecorder) {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	rec := newCountingRecorder()
	s, err := NewScorer(cfg, rec)
	if err != nil {
		t.Fatalf("NewScorer: %v", err)
	}
	return s, rec
}

// send is one remembered send, relative to the test's now.
type send struct {
	adapter, pod string
	ago          time.Duration
}

// want is an expected score for a pod, within [lo, hi].
type want struct{ lo, hi float64 }

func exactly(v float64) want { return want{v, v} }

func (w want) holds(v float64) bool {
	const eps = 1e-12
	return v >= w.lo-eps && v <= w.hi+eps
}

func TestScore(t *testing.T) {
	memoryWeight10s := math.Exp2(-10.0 / 30) // 10 s into a 30 s half-life
	tests := []struct {
		name    string
		req     Request
		pods    []PodState
		sends   []send
		want    map[string]want
		outcome Outcome
	}{
		{
			name: "base model is never penalised for adapter state",
			req:  Request{},
			pods: []PodState{
				{Name: "full", MaxLoRA: 1, Running: NewAdapters("x")},
				{Name: "free", MaxLoRA: 4},
				{Name: "unknown"},
			},
			want:    map[string]want{"full": exactly(Neutral), "free": exactly(Neutral), "unknown": exactly(Neutral)},
			outcome: OutcomeBaseModel,
		},
		{
			name: "missing LoRA metrics mean no information, not score 0",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "p1", QueueDepth: 3},
				{Name: "p2"},
			},
			want:    map[string]want{"p1": exactly(Neutral), "p2": exactly(Neutral)},
			outcome: OutcomeNoLoRAInfo,
		},
		{
			name: "running adapter is resident; free slots idle; full pods 0; unknown neutral",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "holder", MaxLoRA: 2, Running: NewAdapters("a")},
				{Name: "free", MaxLoRA: 2, Running: NewAdapters("b")},
				{Name: "full", MaxLoRA: 2, Running: NewAdapters("b"), Waiting: NewAdapters("c")},
				{Name: "unknown"},
			},
			want: map[string]want{
				"holder":  exactly(1),
				"free":    exactly(idleSlot),
				"full":    exactly(noSlot),
				"unknown": exactly(Neutral),
			},
			outcome: OutcomeResident,
		},
		{
			name: "max_lora absent but adapter running: still the holder",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "holder", Running: NewAdapters("a")},
				{Name: "other", Running: NewAdapters("b")},
			},
			want:    map[string]want{"holder": exactly(1), "other": exactly(Neutral)},
			outcome: OutcomeResident,
		},
		{
			name: "residency gauge: idle resident adapter is held",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "resident", MaxLoRA: 2, Resident: NewAdapters("a", "b"), Running: NewAdapters("b"), ObservedAt: t0},
				{Name: "free", MaxLoRA: 2, Resident: NewAdapters(), ObservedAt: t0},
			},
			want:    map[string]want{"resident": exactly(1), "free": exactly(idleSlot)},
			outcome: OutcomeResident,
		},
		{
			name: "residency gauge supersedes sends before its scrape, not after",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "evicted", MaxLoRA: 2, Resident: NewAdapters("b"), ObservedAt: t0.Add(-5 * time.Second)},
				{Name: "just-sent", MaxLoRA: 2, Resident: NewAdapters("b"), ObservedAt: t0.Add(-5 * time.Second)},
			},
			sends: []send{{"a", "evicted", 10 * time.Second}, {"a", "just-sent", 1 * time.Second}},
			want: map[string]want{
				"evicted":   exactly(idleSlot),
				"just-sent": exactly(0.5 + 0.5*math.Exp2(-1.0/30)),
			},
			outcome: OutcomeResident,
		},
		{
			name: "residency gauge without the adapter overrides an older send",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "evicted", MaxLoRA: 2, Resident: NewAdapters("b"), ObservedAt: t0.Add(-5 * time.Second)},
			},
			sends:   []send{{"a", "evicted", 10 * time.Second}},
			want:    map[string]want{"evicted": exactly(placementTarget)},
			outcome: OutcomeColdPlacement,
		},
		{
			name: "inferred residency: finished adapter still counts through memory",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "sent-10s-ago", MaxLoRA: 4, Running: NewAdapters("b")},
				{Name: "never-sent", MaxLoRA: 4},
			},
			sends: []send{{"a", "sent-10s-ago", 10 * time.Second}},
			want: map[string]want{
				"sent-10s-ago": exactly(0.5 + 0.5*memoryWeight10s),
				"never-sent":   exactly(idleSlot),
			},
			outcome: OutcomeResident,
		},
		{
			name: "memory is ignored when every slot runs another adapter",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "evicted", MaxLoRA: 2, Running: NewAdapters("b", "c")},
				{Name: "free", MaxLoRA: 2},
			},
			sends:   []send{{"a", "evicted", time.Second}},
			want:    map[string]want{"evicted": exactly(noSlot), "free": exactly(placementTarget)},
			outcome: OutcomeColdPlacement,
		},
		{
			name: "memory past its TTL is forgotten",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "old", MaxLoRA: 2},
			},
			sends:   []send{{"a", "old", DefaultMemoryTTL}},
			want:    map[string]want{"old": exactly(placementTarget)},
			outcome: OutcomeColdPlacement,
		},
		{
			name: "waiting behind a full set of slots is committed but not loaded",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "queued", MaxLoRA: 1, Running: NewAdapters("b"), Waiting: NewAdapters("a"), QueueDepth: 1},
				{Name: "full", MaxLoRA: 1, Running: NewAdapters("c")},
			},
			want:    map[string]want{"queued": exactly(0.75), "full": exactly(noSlot)},
			outcome: OutcomeResident,
		},
		{
			name: "overloaded holder spills to a pod with a free slot",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "holder", MaxLoRA: 2, Running: NewAdapters("a"), QueueDepth: DefaultSpillQueueDepth + 1},
				{Name: "free", MaxLoRA: 2},
				{Name: "full", MaxLoRA: 1, Running: NewAdapters("b")},
			},
			want: map[string]want{
				"holder": exactly(overloadedHolderMax),
				"free":   exactly(placementTarget),
				"full":   exactly(noSlot),
			},
			outcome: OutcomeSpill,
		},
		{
			name: "holder at the spill threshold is not overloaded",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "holder", MaxLoRA: 2, Running: NewAdapters("a"), QueueDepth: DefaultSpillQueueDepth},
				{Name: "free", MaxLoRA: 2},
			},
			want:    map[string]want{"holder": exactly(1), "free": exactly(idleSlot)},
			outcome: OutcomeResident,
		},
		{
			name: "one healthy holder among overloaded ones: no spill",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "hot", MaxLoRA: 2, Running: NewAdapters("a"), QueueDepth: 50},
				{Name: "ok", MaxLoRA: 2, Running: NewAdapters("a"), QueueDepth: 1},
				{Name: "free", MaxLoRA: 2},
			},
			want:    map[string]want{"hot": exactly(overloadedHolderMax), "ok": exactly(1), "free": exactly(idleSlot)},
			outcome: OutcomeResident,
		},
		{
			name: "no pod can load the adapter: holders keep their scores",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "hot", MaxLoRA: 1, Running: NewAdapters("a"), QueueDepth: 50},
				{Name: "full", MaxLoRA: 1, Running: NewAdapters("b")},
			},
			want:    map[string]want{"hot": exactly(overloadedHolderMax), "full": exactly(noSlot)},
			outcome: OutcomeNoSlot,
		},
		{
			name: "stale memory alone does not block a placement",
			req:  Request{Adapter: "a"},
			pods: []PodState{
				{Name: "p1", MaxLoRA: 2},
			},
			sends:   []send{{"a", "p1", 45 * time.Second}}, // weight < 0.5
			want:    map[string]want{"p1": exactly(placementTarget)},
			outcome: OutcomeColdPlacement,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, rec := newTestScorer(t, nil)
			for _, sd := range tc.sends {
				s.Record(sd.adapter, sd.pod, t0.Add(-sd.ago))
			}
			out := make([]float64, len(tc.pods))
			outcome := s.ScoreInto(out, tc.req, tc.pods, t0)
			if outcome != tc.outcome {
				t.Errorf("outcome = %q, want %q", outcome, tc.outcome)
			}
			if rec.outcomes[tc.outcome] != 1 {
				t.Errorf("recorded outcomes = %v, want one %q", rec.outcomes, tc.outcome)
			}
			for i, p := range tc.pods {
				w, ok := tc.want[p.Name]
				if !ok {
					t.Fatalf("test case lacks an expectation for %s", p.Name)
				}
				if !w.holds(out[i]) {
					t.Errorf("%s: score %v, want in [%v, %v]", p.Name, out[i], w.lo, w.hi)
				}
			}
		})
	}
}

func TestColdPlacementFollowsRendezvousOrder(t *testing.T) {
	s, _ := newTestScorer(t, nil)
	pods := make([]PodState, 8)
	for i := range pods {
		pods[i] = PodState{Name: string(rune('a'+i)) + "-pod", MaxLoRA: 4}
	}
	out := s.Score(Request{Adapter: "sql-lora"}, pods, t0)

	best := 0
	for i := range pods {
		if rendezvousWeight("sql-lora", pods[i].Name) > rendezvousWeight("sql-lora", pods[best].Name) {
			best = i
		}
	}
	for i, p := range pods {
		w := rendezvousWeight("sql-lora", p.Name)
		wantScore := spareSlotBase + spareSlotSpan*(float64(w)/(1<<64))
		if i == best {
			wantScore = placementTarget
		}
		if out[i] != wantScore {
			t.Errorf("%s: score %v, want %v", p.Name, out[i], wantScore)
		}
	}
}

func TestColdPlacementRespectsLoadBound(t *testing.T) {
	s, _ := newTestScorer(t, nil)
	pods := []PodState{{Name: "p0", MaxLoRA: 4}, {Name: "p1", MaxLoRA: 4}, {Name: "p2", MaxLoRA: 4}, {Name: "p3", MaxLoRA: 4}}
	adapter := "a"
	// Find the unloaded rendezvous favourite, then overload it.
	fav := -1
	for i, v := range s.Score(Request{Adapter: adapter}, pods, t0) {
		if v == placementTarget {
			fav = i
		}
	}
	if fav < 0 {
		t.Fatal("no placement target among idle pods")
	}
	for _, tc := range []struct {
		load   int
		chosen bool
	}{
		{load: 0, chosen: true},
		// Capacity ceil(1.25·(1+1)/4) = 1: one more request would exceed it.
		{load: 1, chosen: false},
		// Total 3: capacity ceil(1.25·4/4) = 2, and 2+1 > 2.
		{load: 2, chosen: false},
		{load: 20, chosen: false},
	} {
		pods[fav].RunningRequests = tc.load
		out := s.Score(Request{Adapter: adapter}, pods, t0)
		if got := out[fav] == placementTarget; got != tc.chosen {
			t.Errorf("favourite with load %d chosen = %v, want %v", tc.load, got, tc.chosen)
		}
		targets := 0
		for _, v := range out {
			if v == placementTarget {
				targets++
			}
		}
		if targets != 1 {
			t.Errorf("load %d: %d placement targets, want 1: %v", tc.load, targets, out)
		}
	}
}

func TestScoreIntoRejectsMismatchedLengths(t *testing.T) {
	s, _ := newTestScorer(t, nil)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "len(out)") {
			t.Fatalf("recover() = %v, want a len(out) panic", r)
		}
	}()
	s.ScoreInto(make([]float64, 1), Request{Adapter: "a"}, nil, t0)
}

func TestScoreEmptyPods(t *testing.T) {
	s, rec := newTestScorer(t, nil)
	if got := s.Score(Request{Adapter: "a"}, nil, t0); len(got) != 0 {
		t.Fatalf("Score(no pods) = %v", got)
	}
	if len(rec.outcomes) != 0 {
		t.Fatalf("recorded %v for an empty pod list", rec.outcomes)
	}
}

func TestRecordIgnoresBaseModel(t *testing.T) {
	s, _ := newTestScorer(t, nil)
	s.Record("", "p1", t0)
	if s.Memory().Len() != 0 {
		t.Fatal("a base-model send was remembered")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := Config{SpillQueueDepth: -1, LoadBound: math.NaN(), MemoryHalfLife: time.Minute, MemoryTTL: time.Second}
	err := bad.Validate()
	if err == nil {
		t.Fatal("Validate accepted an invalid config")
	}
	for _, field := range []string{"SpillQueueDepth", "LoadBound", "MemoryTTL", "MemoryCapacity"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not mention %s", err, field)
		}
	}
	if strings.Contains(err.Error(), "MemoryHalfLife must") {
		t.Errorf("error %q reports the valid MemoryHalfLife", err)
	}
	if _, err := NewScorer(bad, nil); err == nil {
		t.Fatal("NewScorer accepted an invalid config")
	}
}

func TestSlotsFull(t *testing.T) {
	tests := []struct {
		name string
		pod  PodState
		want bool
	}{
		{"unknown limit", PodState{Running: NewAdapters("b", "c")}, false},
		{"free slot", PodState{MaxLoRA: 3, Running: NewAdapters("b", "c")}, false},
		{"running and waiting fill it", PodState{MaxLoRA: 2, Running: NewAdapters("b"), Waiting: NewAdapters("c")}, true},
		{"an adapter both running and waiting counts once", PodState{MaxLoRA: 2, Running: NewAdapters("b"), Waiting: NewAdapters("b")}, false},
		{"the requested adapter's own slot is not another's", PodState{MaxLoRA: 2, Running: NewAdapters("a", "b")}, false},
		{"requested adapter waiting does not count", PodState{MaxLoRA: 1, Waiting: NewAdapters("a")}, false},
		{"over-full", PodState{MaxLoRA: 1, Running: NewAdapters("b", "c"), Waiting: NewAdapters("d")}, true},
	}
	for _, tc := range tests {
		if got := tc.pod.slotsFull("a"); got != tc.want {
			t.Errorf("%s: slotsFull = %v, want %v", tc.name, got, tc.want)
		}
	}
}
