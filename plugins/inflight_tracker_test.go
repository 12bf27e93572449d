package plugins

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var trackerT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func inflightCounts(t *inflightTracker, now time.Time, endpoints ...string) []int {
	out := make([]int, len(endpoints))
	t.Counts(now, endpoints, out)
	return out
}

func TestInflightTracker(t *testing.T) {
	type step struct {
		at       time.Duration
		start    [2]string // id, endpoint
		finish   string
		want     []int // counts of a, b after the step
		wantOpen int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"start and finish", []step{
			{start: [2]string{"1", "a"}, want: []int{1, 0}, wantOpen: 1},
			{start: [2]string{"2", "a"}, want: []int{2, 0}, wantOpen: 2},
			{start: [2]string{"3", "b"}, want: []int{2, 1}, wantOpen: 3},
			{finish: "1", want: []int{1, 1}, wantOpen: 2},
		}},
		{"a completion reported twice counts once", []step{
			{start: [2]string{"1", "a"}, want: []int{1, 0}, wantOpen: 1},
			{finish: "1", want: []int{0, 0}},
			{finish: "1", want: []int{0, 0}},
			{finish: "never-started", want: []int{0, 0}},
		}},
		{"a restarted request moves", []step{
			{start: [2]string{"1", "a"}, want: []int{1, 0}, wantOpen: 1},
			{start: [2]string{"1", "b"}, want: []int{0, 1}, wantOpen: 1},
			{finish: "1", want: []int{0, 0}},
		}},
		{"empty IDs and endpoints are ignored", []step{
			{start: [2]string{"", "a"}, want: []int{0, 0}},
			{start: [2]string{"1", ""}, want: []int{0, 0}},
		}},
		{"lost completions expire after the TTL", []step{
			{start: [2]string{"1", "a"}, want: []int{1, 0}, wantOpen: 1},
			{at: 30 * time.Second, start: [2]string{"2", "a"}, want: []int{2, 0}, wantOpen: 2},
			{at: 60*time.Second - 1, want: []int{2, 0}, wantOpen: 2},
			{at: 60 * time.Second, want: []int{1, 0}, wantOpen: 1}, // request 1 is one TTL old: expired
			{at: 90 * time.Second, want: []int{0, 0}},
		}},
		{"a restart resets the request's age", []step{
			{start: [2]string{"1", "a"}, want: []int{1, 0}, wantOpen: 1},
			{at: 50 * time.Second, start: [2]string{"1", "b"}, want: []int{0, 1}, wantOpen: 1},
			{at: 70 * time.Second, want: []int{0, 1}, wantOpen: 1},
			{at: 110 * time.Second, want: []int{0, 0}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newInflightTracker(time.Minute)
			for i, s := range tt.steps {
				now := trackerT0.Add(s.at)
				if s.start[0] != "" || s.start[1] != "" {
					tr.Start(now, s.start[0], s.start[1])
				}
				if s.finish != "" {
					tr.Finish(s.finish)
				}
				if got := inflightCounts(tr, now, "a", "b"); !slices.Equal(got, s.want) {
					t.Fatalf("step %d: counts %v, want %v", i, got, s.want)
				}
				if got := tr.Outstanding(); got != s.wantOpen {
					t.Fatalf("step %d: outstanding %d, want %d", i, got, s.wantOpen)
				}
			}
		})
	}
}

// TestInflightTrackerRandomized checks the tracker against a plain model over random starts, finishes and clock steps: the
// counts always equal the model's.
func TestInflightTrackerRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const ttl = 10 * time.Second
	tr := newInflightTracker(ttl)
	type open struct {
		endpoint string
		at       time.Time
	}
	model := map[string]open{}
	endpoints := []string{"a", "b", "c", "d"}
	now := trackerT0
	for i := range 20000 {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		id := fmt.Sprint(rng.IntN(500))
		switch rng.IntN(3) {
		case 0, 1:
			ep := endpoints[rng.IntN(len(endpoints))]
			tr.Start(now, id, ep)
			model[id] = open{ep, now}
		default:
			tr.Finish(id)
			delete(model, id)
		}
		want := make([]int, len(endpoints))
		for id, o := range model {
			if now.Sub(o.at) >= ttl {
				delete(model, id)
				continue
			}
			want[slices.Index(endpoints, o.endpoint)]++
		}
		if got := inflightCounts(tr, now, endpoints...); !slices.Equal(got, want) {
			t.Fatalf("op %d: counts %v, want %v", i, got, want)
		}
		if got := tr.Outstanding(); got != len(model) {
			t.Fatalf("op %d: %d outstanding, want %d", i, got, len(model))
		}
	}
}

func TestLeastOutstandingScores(t *testing.T) {
	tests := []struct {
		counts []int
		want   []float64
	}{
		{nil, nil},
		{[]int{3}, []float64{1}},
		{[]int{2, 2, 2}, []float64{1, 1, 1}},
		{[]int{0, 4, 2}, []float64{1, 0, 0.5}},
		{[]int{5, 1}, []float64{0, 1}},
	}
	for _, tt := range tests {
		got := make([]float64, len(tt.counts))
		leastOutstandingScores(tt.counts, got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("leastOutstandingScores(%v) = %v, want %v", tt.counts, got, tt.want)
		}
	}
}
