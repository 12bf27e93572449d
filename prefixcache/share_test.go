package prefixcache

import (
	"slices"
	"testing"
)

// TestSharedInsertsMatchOnPeer: what one replica routes, a peer that takes in its inserts scores as held, on the
// same pod only; blocks a pod already held are not sent again; without ShareInserts nothing is logged.
func TestSharedInsertsMatchOnPeer(t *testing.T) {
	a, b := newIndex(t, testConfig()), newIndex(t, testConfig())
	cs := cands(3)
	score(a, textPrompt(""), cs) // both replicas index the pool
	score(b, textPrompt(""), cs)
	p := textPrompt("system prompt: be brief. question one")

	a.Route(t0, "r0", p, cs[0])
	if got, _ := a.TakeInserts(); got != nil {
		t.Fatalf("logged %v without ShareInserts", got)
	}
	a.ShareInserts(1000)
	q := textPrompt("system prompt: be brief. question two, longer")
	a.Route(t0, "r1", q, cs[1])
	a.Route(t0, "r2", q, cs[1]) // held already: nothing new to send
	ins, dropped := a.TakeInserts()
	if dropped != 0 || len(ins) != 1 || ins[0].Pod != pid(1) {
		t.Fatalf("inserts %v (dropped %d), want one list for %v", ins, dropped, pid(1))
	}
	c := AppendChain(nil, q.Salt, q.Rendered, 4, a.maxBlocks(4))
	rev := slices.Clone(c)
	slices.Reverse(rev)
	if !slices.Equal(ins[0].Hashes, rev) {
		t.Fatalf("hashes %x, want the chain %x last block first", ins[0].Hashes, c)
	}
	if got, _ := a.TakeInserts(); got != nil {
		t.Fatalf("second take %v, want nothing", got)
	}

	before := score(b, q, cs)
	b.Insert(ins)
	after := score(b, q, cs)
	if before[1] != 0 || after[1] <= 0 || after[0] != 0 || after[2] != 0 {
		t.Fatalf("peer scores %v before, %v after, want only pod 1 to match after", before, after)
	}
	if want := score(a, q, cs); after[1] != want[1] {
		t.Fatalf("peer scores pod 1 %v, the router %v", after[1], want[1])
	}
	if b.InFlight(pid(1)) != 0 {
		t.Fatalf("peer counts %d in flight, want 0", b.InFlight(pid(1)))
	}
	checkConsistent(t, b)
}

// TestSharedInsertsBounded: the log holds at most its limit between takes, keeping each chain's first blocks (a match
// needs them), and counts what it dropped; a pod the receiver does not index is skipped.
func TestSharedInsertsBounded(t *testing.T) {
	a, b := newIndex(t, testConfig()), newIndex(t, testConfig())
	cs := cands(2)
	score(a, textPrompt(""), cs)
	score(b, textPrompt(""), cs[:1])
	a.ShareInserts(3)
	p := textPrompt("0123456789abcdefghijklmnopqrstuv") // several 4-byte blocks
	a.Route(t0, "r0", p, cs[0])
	a.Route(t0, "r1", textPrompt("another prompt altogether, long"), cs[1])
	ins, dropped := a.TakeInserts()
	c := AppendChain(nil, p.Salt, p.Rendered, 4, a.maxBlocks(4))
	if n := len(c) + len(AppendChain(nil, p.Salt, textPrompt("another prompt altogether, long").Rendered, 4, 100)); dropped != n-3 {
		t.Fatalf("dropped %d, want %d", dropped, n-3)
	}
	if len(ins) != 1 || !slices.Equal(ins[0].Hashes, []uint64{c[2], c[1], c[0]}) {
		t.Fatalf("inserts %v, want pod 0's first three blocks, last first", ins)
	}
	b.Insert(ins)
	b.Insert([]PodInserts{{Pod: pid(1), Hashes: []uint64{c[0]}}, {Pod: pid(0), Hashes: []uint64{0}}})
	if b.Entries(pid(0)) != 3 || len(b.Pods()) != 1 {
		t.Fatalf("peer holds %d entries on %d pods, want 3 on 1", b.Entries(pid(0)), len(b.Pods()))
	}
	got := score(b, p, cs[:1])
	if want := 3.0 / float64(len(c)); got[0] == 0 || got[0] > want+1e-9 {
		t.Fatalf("peer score %v, want the first 3 of %d blocks", got, len(c))
	}
	checkConsistent(t, b)

	a.ShareInserts(0)
	a.Route(t0, "r2", textPrompt("a third prompt, never routed before"), cs[0])
	if got, _ := a.TakeInserts(); got != nil {
		t.Fatalf("logged %v after ShareInserts(0)", got)
	}
}
