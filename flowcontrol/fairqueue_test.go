package flowcontrol

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func newItem(seq uint64, tenant string, cost float64) *item {
	return &item{id: fmt.Sprintf("r%d", seq), tenant: tenant, cost: cost, bytes: 10, seq: seq}
}

// TestFairShares keeps four tenants backlogged with random costs and checks that, over 10k dispatches, each
// tenant's share of dispatched cost is within 10% of its weight's share.
func TestFairShares(t *testing.T) {
	seed := uint64(20250101)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	weights := map[string]float64{"a": 1, "b": 2, "c": 3, "d": 1}
	// d sends requests ten times larger than a's: fairness is by cost, not by request count.
	maxCost := map[string]int{"a": 100, "b": 100, "c": 100, "d": 1000}
	q := newBandQueue()
	var seq uint64
	push := func(tenant string) {
		seq++
		q.push(newItem(seq, tenant, float64(1+rng.IntN(maxCost[tenant]))), weights[tenant])
	}
	for tenant := range weights {
		for range 20 {
			push(tenant)
		}
	}
	served := map[string]float64{}
	total := 0.0
	for range 10000 {
		it := q.pop()
		served[it.tenant] += it.cost
		total += it.cost
		push(it.tenant) // keep every tenant backlogged
	}
	sumW := 0.0
	for _, w := range weights {
		sumW += w
	}
	for tenant, w := range weights {
		share, want := served[tenant]/total, w/sumW
		if math.Abs(share-want)/want > 0.10 {
			t.Errorf("tenant %s: cost share %.3f, want %.3f ±10%%", tenant, share, want)
		}
	}
}

// TestNoStarvation checks that a tenant arriving behind a huge backlog of another tenant is served within one
// round of the backlogged tenants, and that requests of one tenant stay FIFO.
func TestNoStarvation(t *testing.T) {
	q := newBandQueue()
	var seq uint64
	for range 1000 {
		seq++
		q.push(newItem(seq, "hog", 50), 1)
	}
	for range 10 {
		q.pop()
	}
	seq++
	late := newItem(seq, "late", 50)
	q.push(late, 1)
	for pops := 1; ; pops++ {
		it := q.pop()
		if it == late {
			if pops > 2 {
				t.Errorf("late tenant served after %d pops, want at most 2", pops)
			}
			break
		}
		if it.tenant != "hog" || pops > 1000 {
			t.Fatalf("unexpected pop %s of %s", it.id, it.tenant)
		}
	}
}

// TestIdleCredit: a tenant that has been below its share (here: idle while another was served) starts a few
// requests arriving together ahead of a backlogged tenant's, at most idleCreditItems of them ahead of virtual time,
// then shares the starts evenly again.
func TestIdleCredit(t *testing.T) {
	tests := []struct {
		name  string
		light int
		// want is the order of the pops after the light tenant's requests arrive: l for light, h for hog.
		want string
	}{
		{name: "a few together all start first", light: 3, want: "lllhh"},
		{name: "a burst starts its credit first, then alternates", light: 8, want: "lllllhlhlhlh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newBandQueue()
			var seq uint64
			push := func(tenant string) {
				seq++
				q.push(newItem(seq, tenant, 50), 1)
			}
			for range 100 {
				push("hog")
			}
			for range 20 {
				q.pop()
			}
			for range tt.light {
				push("light")
			}
			var got []byte
			for range len(tt.want) {
				got = append(got, q.pop().tenant[0])
			}
			if string(got) != tt.want {
				t.Errorf("pops %s, want %s", got, tt.want)
			}
		})
	}
}

// TestRemoveDoesNotPenalise checks that withdrawing a tenant's head (cancel, timeout, displacement) does not push the
// tenant's next request back as if the withdrawn one had been served.
func TestRemoveDoesNotPenalise(t *testing.T) {
	q := newBandQueue()
	a1, a2 := newItem(1, "a", 100), newItem(2, "a", 100)
	b1, b2 := newItem(3, "b", 100), newItem(4, "b", 100)
	for _, it := range []*item{a1, a2, b1, b2} {
		q.push(it, 1)
	}
	q.remove(a1)
	// a2 inherits a's start tag 0 and, being older than b1 (also tag 0), goes first. Had a1's cost been charged,
	// a2's tag would be 100 and b1 would overtake it.
	if got := q.pop(); got != a2 {
		t.Fatalf("after removing a1, popped %s, want a2", got.id)
	}
	if got := q.pop(); got != b1 {
		t.Fatalf("popped %s, want b1", got.id)
	}
	if q.count != 1 || q.oldest != b2 || q.newest != b2 {
		t.Fatalf("queue state after pops: count %d", q.count)
	}
}

// TestBandQueueInvariants applies seeded random pushes, pops and removals and checks the queue's structural
// invariants after each: counts, byte and cost totals, the arrival list, the heap order, and FIFO per tenant.
func TestBandQueueInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		q := newBandQueue()
		live := map[*item]bool{}
		lastPopped := map[string]uint64{}
		var seq uint64
		for op := range 3000 {
			switch r := rng.IntN(10); {
			case r < 5:
				seq++
				it := newItem(seq, fmt.Sprintf("t%d", rng.IntN(30)), float64(1+rng.IntN(500)))
				q.push(it, float64(1+int(it.tenant[1])%3))
				live[it] = true
			case r < 8 && q.count > 0:
				it := q.pop()
				if !live[it] {
					t.Fatalf("seed %d op %d: popped %s twice", seed, op, it.id)
				}
				if it.seq < lastPopped[it.tenant] {
					t.Fatalf("seed %d op %d: tenant %s not FIFO", seed, op, it.tenant)
				}
				lastPopped[it.tenant] = it.seq
				delete(live, it)
			case q.count > 0:
				for it := range live { // random enough: map order
					q.remove(it)
					delete(live, it)
					break
				}
			}
			checkBandQueue(t, q, len(live))
		}
	}
}

func checkBandQueue(t *testing.T, q *bandQueue, want int) {
	t.Helper()
	if q.count != want {
		t.Fatalf("count %d, want %d", q.count, want)
	}
	n, bytes, cost := 0, int64(0), 0.0
	var prev *item
	for it := q.oldest; it != nil; it = it.bNext {
		if it.bPrev != prev || (prev != nil && prev.seq >= it.seq) {
			t.Fatalf("arrival list broken at %s", it.id)
		}
		prev, n, bytes, cost = it, n+1, bytes+it.bytes, cost+it.cost
	}
	if prev != q.newest || n != q.count || bytes != q.bytes || math.Abs(cost-q.cost) > 1e-6*(1+cost) {
		t.Fatalf("arrival list: %d items %d bytes %.1f cost; queue says %d, %d, %.1f", n, bytes, cost, q.count, q.bytes, q.cost)
	}
	inHeap := 0
	for i, tq := range q.active {
		if tq.heapIdx != i || tq.n == 0 {
			t.Fatalf("heap slot %d holds tenant %s with index %d and %d items", i, tq.name, tq.heapIdx, tq.n)
		}
		if i > 0 && q.active.Less(i, (i-1)/2) {
			t.Fatalf("heap order violated at %d", i)
		}
		inHeap += tq.n
	}
	if inHeap != q.count {
		t.Fatalf("heap tenants hold %d items, queue %d", inHeap, q.count)
	}
}

// BenchmarkBandQueueSteadyState measures one enqueue plus one fair dispatch with 10k requests waiting over 1k
// tenants.
func BenchmarkBandQueueSteadyState(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	q := newBandQueue()
	tenants := make([]string, 1000)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%d", i)
	}
	items := make([]*item, 10000+b.N)
	for i := range items {
		items[i] = newItem(uint64(i+1), tenants[rng.IntN(len(tenants))], float64(1+rng.IntN(2000)))
	}
	for _, it := range items[:10000] {
		q.push(it, 1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		q.push(items[10000+i], 1)
		q.pop()
	}
}
