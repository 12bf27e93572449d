package prefixcache

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestCalibrationShrinksCapacityWhenPredictionsRunAhead(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 100
	ix := newIndex(t, c)
	cand := cands(1)[0]
	p := textPrompt(strings.Repeat("w", 40)) // 10 blocks
	ix.Route(t0, "warm", p, cand)
	ix.ObserveUsage(t0, "warm", Usage{PromptTokens: 41, CachedTokens: 0, CachedReported: true}) // nothing predicted: no check
	if eff, _ := ix.Capacity(cand.Pod); eff != 100 {
		t.Fatalf("capacity after a check-free report: %d", eff)
	}
	// Fill with other prompts, then keep predicting full hits that the
	// server reports as misses: the pod is evicting.
	for i := range 8 {
		ix.Route(t0, "", textPrompt(fmt.Sprintf("%040d", i)), cand)
	}
	last := 100
	for i := range 5 {
		id := fmt.Sprintf("miss-%d", i)
		r := ix.Route(t0, id, p, cand)
		if r.MatchedBlocks != 10 {
			t.Fatalf("request %d predicted %d blocks, want 10", i, r.MatchedBlocks)
		}
		ix.ObserveUsage(t0, id, Usage{PromptTokens: 41, CachedTokens: 0, CachedReported: true})
		eff, _ := ix.Capacity(cand.Pod)
		if eff >= last {
			t.Fatalf("check %d: capacity %d did not shrink from %d", i, eff, last)
		}
		if n := ix.Entries(cand.Pod); n > eff {
			t.Fatalf("check %d: %d entries above capacity %d", i, n, eff)
		}
		last = eff
	}
	// f = 0.75^5 ≈ 0.237.
	if last != 23 {
		t.Fatalf("capacity after 5 full misses: %d, want 23", last)
	}
	checkConsistent(t, ix)

	// Accurate reports restore capacity gradually.
	for i := range 20 {
		id := fmt.Sprintf("hit-%d", i)
		ix.Route(t0, id, p, cand)
		ix.ObserveUsage(t0, id, Usage{PromptTokens: 41, CachedTokens: 40, CachedReported: true})
	}
	if eff, _ := ix.Capacity(cand.Pod); eff <= last || eff >= 100 {
		t.Fatalf("capacity after 20 accurate reports: %d, want in (%d,100)", eff, last)
	}
	// A small shortfall within Tolerance does not shrink.
	before, _ := ix.Capacity(cand.Pod)
	ix.Route(t0, "close", p, cand)
	ix.ObserveUsage(t0, "close", Usage{PromptTokens: 41, CachedTokens: 34, CachedReported: true})
	if eff, _ := ix.Capacity(cand.Pod); eff < before {
		t.Fatalf("shortfall within tolerance shrank capacity %d → %d", before, eff)
	}
}

func TestCalibrationFloorAndUnreportedUsage(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 100
	ix := newIndex(t, c)
	cand := cands(1)[0]
	p := textPrompt(strings.Repeat("w", 40))
	ix.Route(t0, "", p, cand)
	for i := range 100 {
		id := fmt.Sprint(i)
		ix.Route(t0, id, p, cand)
		ix.ObserveUsage(t0, id, Usage{PromptTokens: 41, CachedReported: true})
	}
	if eff, _ := ix.Capacity(cand.Pod); eff != 5 {
		t.Fatalf("capacity at the floor: %d, want 5 (MinCapacityFraction 0.05)", eff)
	}
	before, _ := ix.Capacity(cand.Pod)
	ix.Route(t0, "x", p, cand)
	ix.ObserveUsage(t0, "x", Usage{PromptTokens: 41}) // no cached_tokens reported
	if eff, _ := ix.Capacity(cand.Pod); eff != before || ix.InFlight(cand.Pod) != 0 {
		t.Fatalf("unreported usage changed capacity (%d→%d) or left in-flight %d", before, eff, ix.InFlight(cand.Pod))
	}
}

func TestCalibrationFromCounters(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 100
	c.Calibration.MinCounterQueries = 50
	ix := newIndex(t, c)
	cand := cands(1)[0]
	p := textPrompt(strings.Repeat("k", 40))
	ix.Route(t0, "", p, cand)
	ix.ObserveCounters(t0, cand.Pod, 1000, 5000) // baseline
	for range 4 {
		ix.Route(t0, "", p, cand) // predicted ~40 of 41 tokens each
	}
	ix.ObserveCounters(t0, cand.Pod, 1010, 5020) // too few queries yet
	if eff, _ := ix.Capacity(cand.Pod); eff != 100 {
		t.Fatalf("capacity changed before MinCounterQueries: %d", eff)
	}
	ix.ObserveCounters(t0, cand.Pod, 1020, 5164) // 20 hits of 164 queried: ~12% vs ~98% predicted
	if eff, _ := ix.Capacity(cand.Pod); eff >= 100 {
		t.Fatalf("capacity did not shrink on counters: %d", eff)
	}
	shrunk, _ := ix.Capacity(cand.Pod)
	// Counters going down mean a restart: the cache is empty.
	ix.ObserveCounters(t0, cand.Pod, 3, 10)
	if n := ix.Entries(cand.Pod); n != 0 {
		t.Fatalf("entries after restart: %d", n)
	}
	if eff, _ := ix.Capacity(cand.Pod); eff != shrunk {
		t.Fatalf("restart changed calibrated capacity %d → %d", shrunk, eff)
	}
	checkConsistent(t, ix)
	ix.ObserveCounters(t0, pid(99), 1, 1) // unknown pod: ignored
}

func TestPendingExpiresAndIsBounded(t *testing.T) {
	c := testConfig()
	c.PendingTTL = time.Minute
	c.MaxPending = pendingShards // one per shard
	ix := newIndex(t, c)
	cand := cands(1)[0]
	p := textPrompt("abcdefgh")
	accepted := 0
	for i := range 200 {
		ix.Route(t0, fmt.Sprint("req-", i), p, cand)
	}
	accepted = ix.InFlight(cand.Pod)
	if accepted < 1 || accepted > pendingShards {
		t.Fatalf("in flight %d, want 1..%d", accepted, pendingShards)
	}
	ix.Route(t0, "req-0", p, cand) // same id again: replaces, no double count
	if ix.InFlight(cand.Pod) > accepted {
		t.Fatalf("duplicate id counted twice: %d > %d", ix.InFlight(cand.Pod), accepted)
	}
	ix.Expire(t0.Add(59 * time.Second))
	if ix.InFlight(cand.Pod) != accepted {
		t.Fatalf("expired early: %d", ix.InFlight(cand.Pod))
	}
	ix.Expire(t0.Add(time.Minute))
	if n := ix.InFlight(cand.Pod); n != 0 {
		t.Fatalf("in flight after TTL: %d", n)
	}
	ix.ObserveUsage(t0, "req-1", Usage{PromptTokens: 9, CachedTokens: 8, CachedReported: true}) // expired: ignored
	if n := ix.InFlight(cand.Pod); n != 0 {
		t.Fatalf("in flight went negative: %d", n)
	}
}
