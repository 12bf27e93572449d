package prefixcache

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testConfig hashes 4-token blocks of 1 byte per token: 4-byte blocks.
func testConfig() Config {
	c := DefaultConfig()
	c.Tokens = TokenRule{BytesPerToken: 1}
	c.DefaultBlockTokens = 4
	c.DefaultPodBlocks = 1000
	return c
}

func newIndex(t testing.TB, c Config) *Index {
	t.Helper()
	ix, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func pid(i int) PodID { return PodID{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)} }

func cands(n int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{Pod: pid(i)}
	}
	return out
}

func textPrompt(s string) Prompt {
	return Prompt{Salt: testSalt, Rendered: AppendText(nil, s)}
}

func score(ix *Index, p Prompt, cs []Candidate) []float64 {
	out := make([]float64, len(cs))
	ix.Score(p, cs, out)
	return out
}

// checkConsistent verifies that the holder tables record exactly the
// pods' table entries.
func checkConsistent(t *testing.T, ix *Index) {
	t.Helper()
	reg := ix.reg.Load()
	want := map[*group]map[uint64]uint64{}
	for _, p := range reg.pods {
		p.mu.Lock()
		if want[p.group] == nil {
			want[p.group] = map[uint64]uint64{}
		}
		for _, h := range p.table.appendAll(nil) {
			want[p.group][h] |= p.bit
		}
		p.mu.Unlock()
	}
	for _, g := range reg.groups {
		got := map[uint64]uint64{}
		for i := range g.shards {
			for h, v := range g.shards[i].holders {
				got[h] = v
			}
		}
		if len(got) != len(want[g]) {
			t.Fatalf("holder table has %d blocks, pods' tables %d", len(got), len(want[g]))
		}
		for h, v := range want[g] {
			if got[h] != v {
				t.Fatalf("block %x: holders %b, want %b", h, got[h], v)
			}
		}
	}
}

func TestScoreMatchesLongestPrefixPerPod(t *testing.T) {
	ix := newIndex(t, testConfig())
	cs := cands(3)
	long := strings.Repeat("abcd", 10) // 1 domain byte + 40: 10 full blocks
	ix.Route(t0, "r1", textPrompt(long), cs[0])
	ix.Route(t0, "r2", textPrompt(long[:20]), cs[1]) // 5 blocks
	got := score(ix, textPrompt(long), cs)
	want := []float64{1, 0.5, 0}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("scores %v, want %v", got, want)
		}
	}
	// A prompt diverging in block 2 matches 2 blocks of 10 on both.
	div := long[:8] + "XXXX" + long[12:]
	got = score(ix, textPrompt(div), cs)
	if got[0] != 0.2 || got[1] != 0.2 || got[2] != 0 {
		t.Fatalf("diverging prompt scores %v, want [0.2 0.2 0]", got)
	}
	// A prompt shorter than one block scores 0 everywhere.
	if got = score(ix, textPrompt("ab"), cs); got[0] != 0 || got[1] != 0 {
		t.Fatalf("short prompt scores %v", got)
	}
	checkConsistent(t, ix)
}

func TestScoreChatTurnsShareHistory(t *testing.T) {
	ix := newIndex(t, testConfig())
	cs := cands(2)
	turn1 := Chat{Messages: []Message{msg("system", strings.Repeat("policy ", 30)), msg("user", "hello there")}}
	r1, _ := AppendChat(nil, turn1)
	ix.Route(t0, "t1", Prompt{Salt: testSalt, Rendered: r1}, cs[1])
	turn2 := turn1
	turn2.Messages = append(append([]Message(nil), turn1.Messages...), msg("assistant", "hi"), msg("user", strings.Repeat("more ", 30)))
	r2, _ := AppendChat(nil, turn2)
	got := score(ix, Prompt{Salt: testSalt, Rendered: r2}, cs)
	wantFrac := float64(len(r1)/4) / float64(len(r2)/4)
	if got[0] != 0 || math.Abs(got[1]-wantFrac) > 1e-9 {
		t.Fatalf("turn 2 scores %v, want [0 %v]", got, wantFrac)
	}
	// Another cache_salt shares nothing.
	other := Prompt{Salt: Salt{Model: testSalt.Model, CacheSalt: "tenant-b"}, Rendered: r2}
	if got = score(ix, other, cs); got[1] != 0 {
		t.Fatalf("other cache_salt scores %v", got)
	}
}

func TestPerPodBlockSizeAndCapacity(t *testing.T) {
	ix := newIndex(t, testConfig())
	small := Candidate{Pod: pid(0), Cache: CacheInfo{NumBlocks: 3, BlockTokens: 4}}
	big := Candidate{Pod: pid(1), Cache: CacheInfo{NumBlocks: 100, BlockTokens: 8}}
	p := textPrompt(strings.Repeat("z", 40)) // 41 bytes: 10 blocks of 4, 5 of 8
	if r := ix.Route(t0, "", p, small); r.TotalBlocks != 10 {
		t.Fatalf("4-token pod: %d blocks, want 10", r.TotalBlocks)
	}
	if r := ix.Route(t0, "", p, big); r.TotalBlocks != 5 {
		t.Fatalf("8-token pod: %d blocks, want 5", r.TotalBlocks)
	}
	// The 3-block pod kept the prompt's first 3 blocks (the tail was
	// evicted first): 3/10 of the prompt.
	got := score(ix, p, []Candidate{small, big})
	if math.Abs(got[0]-0.3) > 1e-9 || got[1] != 1 {
		t.Fatalf("scores %v, want [0.3 1]", got)
	}
	if eff, nom := ix.Capacity(pid(0)); eff != 3 || nom != 3 {
		t.Fatalf("capacity %d/%d, want 3/3", eff, nom)
	}
	// A new block size invalidates what the pod held.
	small.Cache.BlockTokens = 2
	if got = score(ix, p, []Candidate{small}); got[0] != 0 || ix.Entries(pid(0)) != 0 {
		t.Fatalf("after block size change: score %v, entries %d", got, ix.Entries(pid(0)))
	}
	// A new capacity keeps the most recent entries.
	ix.Route(t0, "", p, small)
	big.Cache.NumBlocks = 2
	score(ix, p, []Candidate{big})
	if e := ix.Entries(pid(1)); e != 2 {
		t.Fatalf("entries after shrinking to 2 blocks: %d", e)
	}
	if got = score(ix, p, []Candidate{big}); math.Abs(got[0]-0.4) > 1e-9 {
		t.Fatalf("kept the wrong entries: score %v, want 0.4", got)
	}
	checkConsistent(t, ix)
}

func TestLRUEvictionAcrossPrompts(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 6
	ix := newIndex(t, c)
	cs := cands(1)
	a, b, d := textPrompt("aaaabbbbccc"), textPrompt("ddddeeeefff"), textPrompt("gggghhhhiii") // 3 blocks each
	ix.Route(t0, "", a, cs[0])
	ix.Route(t0, "", b, cs[0])
	ix.Route(t0, "", a, cs[0]) // refresh a: b is now least recent
	ix.Route(t0, "", d, cs[0]) // evicts b
	if s := score(ix, a, cs); s[0] != 1 {
		t.Fatalf("a score %v, want 1", s)
	}
	if s := score(ix, b, cs); s[0] != 0 {
		t.Fatalf("evicted b scores %v", s)
	}
	if s := score(ix, d, cs); s[0] != 1 {
		t.Fatalf("d score %v, want 1", s)
	}
	checkConsistent(t, ix)
}

func TestForgetRetainAndMaxPods(t *testing.T) {
	c := testConfig()
	c.MaxPods = 2
	ix := newIndex(t, c)
	cs := cands(3)
	p := textPrompt("0123456789abcdef")
	for _, cand := range cs {
		ix.Route(t0, "", p, cand)
	}
	if got := score(ix, p, cs); got[0] != 1 || got[1] != 1 || got[2] != 0 {
		t.Fatalf("with MaxPods 2: %v, want [1 1 0]", got)
	}
	ix.Retain(func(id PodID) bool { return id != pid(0) })
	if len(ix.Pods()) != 1 {
		t.Fatalf("pods after Retain: %v", ix.Pods())
	}
	checkConsistent(t, ix)
	// pod-2 now gets the freed bit and must not inherit pod-0's blocks.
	if got := score(ix, p, cs[1:]); got[0] != 1 || got[1] != 0 {
		t.Fatalf("after forgetting pod-0: %v, want [1 0]", got)
	}
	ix.Forget(pid(1))
	ix.Forget(pid(1)) // idempotent
	if st := ix.Stats(); st.Entries != 0 || st.DistinctBlocks != 0 {
		t.Fatalf("stats after forgetting all: %+v", st)
	}
}

func TestManyPodsUseSeveralGroups(t *testing.T) {
	ix := newIndex(t, testConfig())
	cs := cands(150)
	p := textPrompt(strings.Repeat("q", 64))
	for i := 0; i < 150; i += 7 {
		ix.Route(t0, "", p, cs[i])
	}
	got := score(ix, p, cs)
	for i, s := range got {
		if want := map[bool]float64{true: 1, false: 0}[i%7 == 0]; s != want {
			t.Fatalf("pod %d scores %v, want %v", i, s, want)
		}
	}
	// The same pod twice in the candidates gets the same score.
	dup := []Candidate{cs[7], cs[7], cs[8]}
	if got = score(ix, p, dup); got[0] != 1 || got[1] != 1 || got[2] != 0 {
		t.Fatalf("duplicate candidates: %v", got)
	}
	if st := ix.Stats(); len(ix.reg.Load().groups) != 3 || st.Pods != 150 {
		t.Fatalf("groups %d pods %d, want 3 and 150", len(ix.reg.Load().groups), st.Pods)
	}
	checkConsistent(t, ix)
}

func TestConfigValidation(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	c := DefaultConfig()
	c.Tokens.BytesPerToken = 0
	c.MaxPods = 0
	c.Guard.OverloadRelative = 0.5
	c.Calibration.ShrinkGain = 0
	c.PendingTTL = 0
	err := c.Validate()
	for _, field := range []string{"bytesPerToken", "maxPods", "overloadRelative", "shrinkGain", "pendingTTL"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
	if _, err := New(c); err == nil {
		t.Error("New accepted an invalid config")
	}
}

// A chain longer than the pod's capacity evicts its own blocks while being
// recorded, and re-recording it touches blocks evicted moments before: the
// holder table must still match the pod's table.
func TestRouteChainLongerThanCapacity(t *testing.T) {
	c := testConfig()
	c.DefaultPodBlocks = 3
	ix := newIndex(t, c)
	cs := cands(1)
	p := textPrompt(strings.Repeat("0123", 5)) // 5 blocks
	for range 3 {
		ix.Route(t0, "", p, cs[0])
		checkConsistent(t, ix)
	}
	if got := score(ix, p, cs); math.Abs(got[0]-0.6) > 1e-9 {
		t.Fatalf("score %v, want 0.6 (the first 3 of 5 blocks kept)", got)
	}
}
