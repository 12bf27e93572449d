package prefixcache

import (
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
)

// TestConcurrentUse runs scoring, routing, usage reports, counter updates,
// reconfiguration and forgetting at once (run with -race), then checks that
// the holder tables agree with the pods' tables and nothing is left in
// flight.
func TestConcurrentUse(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 64
	ix := newIndex(t, c)
	const pods, workers, steps = 70, 6, 400 // 70 pods: two holder groups
	prompts := make([]Prompt, 20)
	for i := range prompts {
		prompts[i] = textPrompt(fmt.Sprintf("%02d", i%5) + strings.Repeat(fmt.Sprint(i), 30))
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			cs := cands(pods)
			scores := make([]float64, pods)
			for s := range steps {
				p := prompts[rng.Intn(len(prompts))]
				switch op := rng.Intn(20); {
				case op < 8:
					ix.Score(p, cs, scores)
					for _, v := range scores {
						if v < 0 || v > 1 {
							t.Errorf("score %v out of [0,1]", v)
						}
					}
				case op < 16:
					id := fmt.Sprintf("w%d-%d", w, s)
					cand := cs[rng.Intn(pods)]
					if rng.Intn(10) == 0 {
						cand.Cache = CacheInfo{NumBlocks: 16 + rng.Intn(64), BlockTokens: 4}
					}
					ix.Route(t0, id, p, cand)
					ix.ObserveUsage(t0, id, Usage{PromptTokens: 60, CachedTokens: rng.Intn(60), CachedReported: true})
				case op < 18:
					ix.ObserveCounters(t0, pid(rng.Intn(pods)), float64(s), float64(10*s))
				case op < 19:
					ix.Forget(pid(rng.Intn(pods)))
				default:
					ix.Stats()
				}
			}
		}()
	}
	wg.Wait()
	checkConsistent(t, ix)
	for _, id := range ix.Pods() {
		if n := ix.InFlight(id); n != 0 {
			t.Fatalf("%v: %d in flight after every request finished", id, n)
		}
		if eff, nom := ix.Capacity(id); eff < 1 || eff > nom {
			t.Fatalf("%v: effective capacity %d outside [1,%d]", id, eff, nom)
		}
		if n := ix.Entries(id); n > 80 {
			t.Fatalf("%v: %d entries above any capacity", id, n)
		}
	}
}
