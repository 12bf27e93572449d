package prefixcache

import (
	"container/list"
	"math/rand"
	"slices"
	"testing"
)

func TestLRUTableEvictsLeastRecentlyUsed(t *testing.T) {
	tb := newLRUTable(3)
	var ev []uint64
	for _, h := range []uint64{1, 2, 3} {
		_, ev = tb.touch(h, ev)
	}
	_, ev = tb.touch(1, ev) // 1 is now the most recent; 2 the least
	inserted, ev := tb.touch(4, ev)
	if !inserted || !slices.Equal(ev, []uint64{2}) {
		t.Fatalf("touch(4) inserted=%v evicted=%v, want true [2]", inserted, ev)
	}
	if got := tb.appendAll(nil); !slices.Equal(got, []uint64{4, 1, 3}) {
		t.Fatalf("recency order %v, want [4 1 3]", got)
	}
	if ev = tb.setLimit(1, nil); !slices.Equal(ev, []uint64{3, 1}) {
		t.Fatalf("setLimit(1) evicted %v, want [3 1]", ev)
	}
	if !tb.contains(4) || tb.contains(1) || tb.n != 1 {
		t.Fatalf("after setLimit(1): contains(4)=%v contains(1)=%v n=%d", tb.contains(4), tb.contains(1), tb.n)
	}
	if tb.setLimit(100, nil); tb.limit != 3 {
		t.Fatalf("limit above capacity: got %d, want 3", tb.limit)
	}
}

// TestLRUTableMatchesReference drives the table and a container/list LRU
// with the same seeded random operations, including hashes that collide
// on their home slot, and compares contents and order after each.
func TestLRUTableMatchesReference(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		capacity := 1 + rng.Intn(40)
		tb := newLRUTable(capacity)
		ref := list.New()
		where := map[uint64]*list.Element{}
		limit := capacity
		for step := range 3000 {
			// A small key space forces hits, evictions and probe clusters.
			h := uint64(rng.Intn(3*capacity)+1) * 0x9e3779b97f4a7c15
			if h == 0 {
				h = 1
			}
			if rng.Intn(50) == 0 {
				limit = 1 + rng.Intn(capacity)
				got := tb.setLimit(limit, nil)
				var want []uint64
				for ref.Len() > limit {
					e := ref.Back()
					want = append(want, e.Value.(uint64))
					delete(where, e.Value.(uint64))
					ref.Remove(e)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: setLimit evicted %v, want %v", seed, step, got, want)
				}
				continue
			}
			_, got := tb.touch(h, nil)
			var want []uint64
			if e, ok := where[h]; ok {
				ref.MoveToFront(e)
			} else {
				if ref.Len() >= limit {
					e := ref.Back()
					want = append(want, e.Value.(uint64))
					delete(where, e.Value.(uint64))
					ref.Remove(e)
				}
				where[h] = ref.PushFront(h)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: touch evicted %v, want %v", seed, step, got, want)
			}
			var order []uint64
			for e := ref.Front(); e != nil; e = e.Next() {
				order = append(order, e.Value.(uint64))
			}
			if all := tb.appendAll(nil); !slices.Equal(all, order) || tb.n != len(order) {
				t.Fatalf("seed %d step %d: table %v (n=%d), want %v", seed, step, all, tb.n, order)
			}
			for k := range where {
				if !tb.contains(k) {
					t.Fatalf("seed %d step %d: table lost %x", seed, step, k)
				}
			}
		}
	}
}
