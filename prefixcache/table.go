package prefixcache

import "math/bits"

// noSlot is the nil link of lruTable's list.
const noSlot = ^uint32(0)

// maxTableEntries keeps slot indexes below noSlot.
const maxTableEntries = 1 << 30

// slot is one entry of an lruTable: a block hash (0 = empty) and its links
// in the recency list. 16 bytes.
type slot struct {
	hash       uint64
	prev, next uint32 // towards head (newer) and tail (older)
}

// lruTable is a set of block hashes with least-recently-used eviction, the
// model of one pod's KV cache. It is an open-addressing hash table (linear
// probing, backward-shift deletion) whose slots are also the nodes of an
// intrusive doubly linked recency list, so an entry costs one 16-byte slot
// and the table is sized once for its capacity at a load of at most 3/4:
// about 21 bytes per entry when full.
//
// Not safe for concurrent use: its pod's mutex guards it.
type lruTable struct {
	slots      []slot
	head, tail uint32 // most and least recently used; noSlot when empty
	n          int    // entries
	limit      int    // entries kept; at most cap
	cap        int    // entries the slots were sized for
}

// newLRUTable returns an empty table that can hold capacity entries.
func newLRUTable(capacity int) lruTable {
	capacity = max(1, min(capacity, maxTableEntries))
	return lruTable{
		// At most 3/4 full, and always one empty slot so probes end.
		slots: make([]slot, capacity+capacity/3+1),
		head:  noSlot,
		tail:  noSlot,
		limit: capacity,
		cap:   capacity,
	}
}

// capacity is the most entries the table can hold.
func (t *lruTable) capacity() int { return t.cap }

// home is the slot a hash probes first (multiply-shift, so any table size
// works).
func (t *lruTable) home(h uint64) uint32 {
	hi, _ := bits.Mul64(h, uint64(len(t.slots)))
	return uint32(hi)
}

// find returns the slot holding h.
func (t *lruTable) find(h uint64) (uint32, bool) {
	size := uint32(len(t.slots))
	for i := t.home(h); ; {
		switch t.slots[i].hash {
		case h:
			return i, true
		case 0:
			return i, false
		}
		if i++; i == size {
			i = 0
		}
	}
}

// contains reports whether h is in the table, without touching recency.
func (t *lruTable) contains(h uint64) bool {
	_, ok := t.find(h)
	return ok
}

// touch makes h the most recently used entry, inserting it when absent. An
// insertion into a full table first evicts the least recently used entry,
// whose hash is appended to evicted. It reports whether h was inserted.
func (t *lruTable) touch(h uint64, evicted []uint64) (inserted bool, _ []uint64) {
	i, ok := t.find(h)
	if ok {
		t.unlink(i)
		t.pushFront(i)
		return false, evicted
	}
	if t.n >= t.limit {
		evicted = append(evicted, t.slots[t.tail].hash)
		t.remove(t.tail)
		i, _ = t.find(h) // the shift may have moved the free slot
	}
	t.slots[i] = slot{hash: h}
	t.pushFront(i)
	t.n++
	return true, evicted
}

// setLimit changes how many entries are kept (at most capacity), evicting
// the least recently used beyond it into evicted.
func (t *lruTable) setLimit(limit int, evicted []uint64) []uint64 {
	t.limit = max(1, min(limit, t.capacity()))
	for t.n > t.limit {
		evicted = append(evicted, t.slots[t.tail].hash)
		t.remove(t.tail)
	}
	return evicted
}

// appendAll appends every hash in the table, most recent first.
func (t *lruTable) appendAll(dst []uint64) []uint64 {
	for i := t.head; i != noSlot; i = t.slots[i].next {
		dst = append(dst, t.slots[i].hash)
	}
	return dst
}

func (t *lruTable) pushFront(i uint32) {
	s := &t.slots[i]
	s.prev, s.next = noSlot, t.head
	if t.head != noSlot {
		t.slots[t.head].prev = i
	} else {
		t.tail = i
	}
	t.head = i
}

func (t *lruTable) unlink(i uint32) {
	s := t.slots[i]
	if s.prev != noSlot {
		t.slots[s.prev].next = s.next
	} else {
		t.head = s.next
	}
	if s.next != noSlot {
		t.slots[s.next].prev = s.prev
	} else {
		t.tail = s.prev
	}
}

// remove deletes the entry in slot hole and closes the probe gap by shifting
// later entries of the same cluster back, relinking each moved slot.
func (t *lruTable) remove(hole uint32) {
	t.unlink(hole)
	t.n--
	size := uint32(len(t.slots))
	j := hole
	for {
		if j++; j == size {
			j = 0
		}
		h := t.slots[j].hash
		if h == 0 {
			break
		}
		k := t.home(h)
		// The entry at j stays if its home lies cyclically in (hole, j].
		if (hole <= j && hole < k && k <= j) || (hole > j && (hole < k || k <= j)) {
			continue
		}
		t.move(j, hole)
		hole = j
	}
	t.slots[hole] = slot{}
}

// move relocates the entry in slot from to the empty slot to.
func (t *lruTable) move(from, to uint32) {
	s := t.slots[from]
	t.slots[to] = s
	if s.prev != noSlot {
		t.slots[s.prev].next = to
	} else {
		t.head = to
	}
	if s.next != noSlot {
		t.slots[s.next].prev = to
	} else {
		t.tail = to
	}
}
