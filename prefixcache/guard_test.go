package prefixcache

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

func TestGuardWeight(t *testing.T) {
	g := GuardConfig{OverloadAbsolute: 8, OverloadRelative: 1.5, TaperStart: 0.5, KVCacheCutoff: 0.9}
	for _, tc := range []struct {
		load, mean, kv float64
		want           float64
		action         GuardAction
	}{
		{load: 0, mean: 0, want: 1, action: GuardNone},
		{load: 4, mean: 0, want: 1, action: GuardNone},            // excess at the taper start
		{load: 6, mean: 0, want: 0.5, action: GuardTaper},         // halfway through the taper
		{load: 8, mean: 0, want: 0, action: GuardOverload},        // absolute threshold
		{load: 17, mean: 12, want: 1, action: GuardNone},          // 5 above, but below 1.5×mean
		{load: 30, mean: 12, want: 0, action: GuardOverload},      // far above, relatively too
		{load: 17, mean: 10, want: 0.25, action: GuardTaper},      // 7 above and ≥ 1.5×mean
		{load: 0, mean: 5, kv: 0.9, want: 0, action: GuardKVFull}, // no room to keep it
		{load: 0, mean: 5, kv: 0.89, want: 1, action: GuardNone},  // just below the cutoff
		{load: 12, mean: 8, kv: 0.5, want: 1, action: GuardNone},  // 4 above: taper starts after
		{load: 13, mean: 8, kv: 0.5, want: 0.75, action: GuardTaper},
	} {
		w, a := g.weight(tc.load, tc.mean, tc.kv)
		if math.Abs(w-tc.want) > 1e-9 || a != tc.action {
			t.Errorf("weight(load=%v, mean=%v, kv=%v) = %v %v, want %v %v", tc.load, tc.mean, tc.kv, w, a, tc.want, tc.action)
		}
	}
}

func TestScoreAppliesGuard(t *testing.T) {
	c := testConfig()
	c.Guard = GuardConfig{OverloadAbsolute: 4, OverloadRelative: 1.5, TaperStart: 0.5, KVCacheCutoff: 0.95}
	ix := newIndex(t, c)
	cs := cands(4)
	p := textPrompt("0123456789abcdefghij")
	for _, cand := range cs {
		ix.Route(t0, "", p, cand)
	}
	cs[0].Load = Load{Queued: 10}            // mean 3.5, excess 6.5: overloaded
	cs[1].Load = Load{Queued: 3, Running: 1} // 4: fine
	cs[2].Load = Load{KVUtilization: 0.97}   // cache full
	got := score(ix, p, cs)
	if got[0] != 0 || got[1] != 1 || got[2] != 0 || got[3] != 1 {
		t.Fatalf("scores %v, want [0 1 0 1]", got)
	}
	// Requests routed and not finished count as load even before a scrape.
	for i := range 10 {
		ix.Route(t0, fmt.Sprint("burst-", i), p, cs[3])
	}
	cs[0].Load = Load{}
	cs[2].Load = Load{}
	if got = score(ix, p, cs); got[3] != 0 || got[0] != 1 {
		t.Fatalf("in-flight burst not seen as load: %v", got)
	}
}

// simulateHotGroup routes Zipf-like traffic (70% one prefix group, the rest
// over 50 groups) to 8 pods with a max-score profile of prefix (weight 3) and
// upstream's normalised queue scorer (weight 2). Each pod finishes one
// request per tick; 3 arrive per tick. It returns the largest queue seen and
// how many pods served the hot group.
func simulateHotGroup(t *testing.T, g GuardConfig, seed int64) (maxQueue, hotPods int) {
	c := testConfig()
	c.Guard = g
	ix := newIndex(t, c)
	rng := rand.New(rand.NewSource(seed))
	const pods = 8
	cs := cands(pods)
	queues := make([][]string, pods)
	prompts := make([]Prompt, 51)
	for i := range prompts {
		prompts[i] = textPrompt(fmt.Sprintf("group %03d shared system prompt %s", i, "................................"))
	}
	hot := map[int]bool{}
	scores := make([]float64, pods)
	seq := 0
	for tick := range 400 {
		for range 3 {
			grp := 0
			if rng.Float64() >= 0.7 {
				grp = 1 + rng.Intn(50)
			}
			minQ, maxQ := math.MaxInt, 0
			for i := range cs {
				cs[i].Load = Load{Queued: len(queues[i])}
				minQ, maxQ = min(minQ, len(queues[i])), max(maxQ, len(queues[i]))
			}
			ix.Score(prompts[grp], cs, scores)
			best, bestScore := 0, -1.0
			for i := range cs {
				queue := 1.0
				if maxQ > minQ {
					queue = float64(maxQ-len(queues[i])) / float64(maxQ-minQ)
				}
				if s := 3*scores[i] + 2*queue; s > bestScore {
					best, bestScore = i, s
				}
			}
			id := fmt.Sprint(seq)
			seq++
			ix.Route(t0, id, prompts[grp], cs[best])
			queues[best] = append(queues[best], id)
			maxQueue = max(maxQueue, len(queues[best]))
			if grp == 0 && tick > 50 {
				hot[best] = true
			}
		}
		for i := range queues {
			if len(queues[i]) > 0 {
				ix.ObserveUsage(t0, queues[i][0], Usage{PromptTokens: 10})
				queues[i] = queues[i][1:]
			}
		}
	}
	return maxQueue, len(hot)
}

func TestGuardSpreadsHotPrefixGroup(t *testing.T) {
	off := GuardConfig{OverloadAbsolute: 1e12, OverloadRelative: 1, TaperStart: 0.5, KVCacheCutoff: 1}
	on := DefaultConfig().Guard
	for seed := int64(1); seed <= 3; seed++ {
		offMax, offPods := simulateHotGroup(t, off, seed)
		onMax, onPods := simulateHotGroup(t, on, seed)
		t.Logf("seed %d: without guard max queue %d over %d hot pods; with guard %d over %d", seed, offMax, offPods, onMax, onPods)
		if offPods != 1 || offMax < 100 {
			t.Fatalf("seed %d: the unguarded baseline should pile the hot group on one pod (got %d pods, max queue %d)", seed, offPods, offMax)
		}
		if onPods < 3 {
			t.Fatalf("seed %d: hot group stayed on %d pods", seed, onPods)
		}
		if onMax > 2*int(on.OverloadAbsolute) {
			t.Fatalf("seed %d: max queue %d with guard, want <= %d", seed, onMax, 2*int(on.OverloadAbsolute))
		}
	}
}
