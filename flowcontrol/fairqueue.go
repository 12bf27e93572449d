package flowcontrol

import (
	"container/heap"
	"time"
)

// item is one queued request. Its links put it in two intrusive lists at once: its tenant's FIFO and its band's
// arrival order (the latter finds the oldest item for TTL and the newest for displacement in O(1)).
type item struct {
	id     string
	tenant string
	band   Band
	capped bool
	cost   float64 // estimated cost in tokens, at least 1
	size   kvSize  // the cost as KV: prompt and expected output (kvroom.go)
	bytes  int64
	// streamed is Request.Streamed: the reservation made at dispatch stays pending until Started.
	streamed bool
	seq      uint64 // arrival sequence, breaks ties between equal virtual start tags
	// returnKey is Request.ReturnKey: a request turned away from the queue is promised a return under it.
	returnKey uint64
	// underShare: its tenant was under its share when it was queued (isUnderShareLocked); the over-share queue time
	// does not answer it (shedUnreachableLocked).
	underShare bool

	enqueuedAt time.Time
	deadline   time.Time // enqueuedAt + band's MaxQueueTime

	tq           *tenantQueue
	tPrev, tNext *item
	bPrev, bNext *item

	// done is closed exactly once, by finalizeLocked, after decision and cause are set.
	done chan struct{}
	// decided, set for requests given to Submit, is called by finalizeLocked after done is closed.
	decided   func(Decision, error)
	finalized bool
	decision  Decision
	cause     error
}

// tenantQueue is one tenant's FIFO inside a band, plus its fair-queuing state.
type tenantQueue struct {
	name       string
	weight     float64
	head, tail *item
	n          int
	cost       float64 // sum of queued items' cost
	// headStart is the virtual start tag of head. It is assigned when an item becomes head, so removing a waiting item
	// (cancel, TTL, displacement) never leaves a gap that would penalise the tenant's later requests.
	headStart float64
	// lastFinish is the virtual finish tag of the tenant's last dispatched item.
	lastFinish float64
	heapIdx    int // index in bandQueue.active, -1 when the tenant has nothing queued
	// drain is the cost dispatched from this tenant per second of the time it had requests waiting: the share of
	// its band's drain fair queuing gives it (tenantdrain.go). The controller keeps it, and its backlog state, up to
	// date; it starts with the tenant's first wait and is forgotten with the tenant.
	drain drainEstimator
}

// bandQueue holds one band's waiting requests and dispatches them by start-time fair queuing (SFQ) across tenants:
// an item's start tag is S = max(V - credit, F_prev), its finish tag F = S + cost/weight, the item with the smallest
// start tag goes first, and the band's virtual time V becomes that tag if larger. A tenant that stays backlogged
// receives cost in proportion to its weight. A tenant below its share falls behind V, and may start up to credit
// (idleCreditItems of its items) behind it: its requests, arriving at random, go ahead of a backlogged tenant's
// until it has caught up, so it gets its share of starts when it asks for it, not only over the long run; it can
// hoard no more than that, and it cannot starve.
type bandQueue struct {
	tenants map[string]*tenantQueue
	// active holds the tenants with queued items; active[0] is served next.
	active       activeTenants
	activeWeight float64
	vtime        float64

	oldest, newest *item
	count          int
	bytes          int64
	cost           float64

	// sweepAt is the tenant-map size that triggers pruning idle tenants whose lastFinish <= vtime (those would
	// re-enter at most their idle credit behind vtime anyway, so forgetting one gives it at most that credit).
	sweepAt int
}

const minSweepAt = 64

// idleCreditItems is how many of its items a tenant below its fair share may start ahead of virtual time: enough that
// a few requests arriving together from a tenant within its share start before a backlogged tenant's, little enough
// that a tenant coming back from idle takes no more than a few starts from the others.
const idleCreditItems = 4

// startTag is the start tag of it when it becomes tq's head: tq's previous finish tag, or idleCreditItems of its
// items behind virtual time if that is later.
func (q *bandQueue) startTag(tq *tenantQueue, it *item) float64 {
	return max(q.vtime-idleCreditItems*it.cost/tq.weight, tq.lastFinish)
}

func newBandQueue() *bandQueue {
	return &bandQueue{tenants: make(map[string]*tenantQueue), sweepAt: minSweepAt}
}

// push appends it to its tenant's FIFO and to the band's arrival order.
func (q *bandQueue) push(it *item, weight float64) {
	tq := q.tenants[it.tenant]
	if tq == nil {
		tq = &tenantQueue{name: it.tenant, heapIdx: -1}
		q.tenants[it.tenant] = tq
	}
	if tq.n > 0 {
		// The weight changed while the tenant is backlogged (SetConfig): keep activeWeight the sum of active weights.
		q.activeWeight += weight - tq.weight
	}
	tq.weight = weight
	it.tq = tq
	it.tPrev, it.tNext = tq.tail, nil
	if tq.tail != nil {
		tq.tail.tNext = it
	} else {
		tq.head = it
	}
	tq.tail = it
	tq.n++
	tq.cost += it.cost
	if tq.n == 1 {
		tq.headStart = q.startTag(tq, it)
		heap.Push(&q.active, tq)
		q.activeWeight += tq.weight
	}

	it.bPrev, it.bNext = q.newest, nil
	if q.newest != nil {
		q.newest.bNext = it
	} else {
		q.oldest = it
	}
	q.newest = it
	q.count++
	q.bytes += it.bytes
	q.cost += it.cost
}

// pop removes and returns the item with the smallest virtual start tag, advancing virtual time. The queue must not
// be empty.
func (q *bandQueue) pop() *item { return q.popTenant(q.active[0]) }

// popTenant removes and returns the head of tq, a tenant with queued items, as pop does for the fair queue's head.
func (q *bandQueue) popTenant(tq *tenantQueue) *item {
	it := tq.head
	q.vtime = max(q.vtime, tq.headStart)
	tq.lastFinish = tq.headStart + it.cost/tq.weight
	q.unlink(it)
	return it
}

// remove takes a waiting item out without dispatching it (cancel, TTL, displacement, shutdown).
func (q *bandQueue) remove(it *item) { q.unlink(it) }

func (q *bandQueue) unlink(it *item) {
	tq := it.tq
	wasHead := tq.head == it
	if it.tPrev != nil {
		it.tPrev.tNext = it.tNext
	} else {
		tq.head = it.tNext
	}
	if it.tNext != nil {
		it.tNext.tPrev = it.tPrev
	} else {
		tq.tail = it.tPrev
	}
	it.tPrev, it.tNext, it.tq = nil, nil, nil
	tq.n--
	tq.cost -= it.cost
	switch {
	case tq.n == 0:
		tq.cost = 0 // no float drift carried into the tenant's next busy period
		heap.Remove(&q.active, tq.heapIdx)
		q.activeWeight -= tq.weight
	case wasHead:
		tq.headStart = q.startTag(tq, tq.head)
		heap.Fix(&q.active, tq.heapIdx)
	}

	if it.bPrev != nil {
		it.bPrev.bNext = it.bNext
	} else {
		q.oldest = it.bNext
	}
	if it.bNext != nil {
		it.bNext.bPrev = it.bPrev
	} else {
		q.newest = it.bPrev
	}
	it.bPrev, it.bNext = nil, nil
	q.count--
	q.bytes -= it.bytes
	q.cost -= it.cost

	if q.count == 0 {
		// Idle band: everyone is caught up, so virtual time and all tenant history restart.
		q.vtime, q.cost, q.activeWeight = 0, 0, 0
		clear(q.tenants)
		q.sweepAt = minSweepAt
	} else if len(q.tenants) > q.sweepAt {
		q.sweep()
	}
}

func (q *bandQueue) sweep() {
	for name, tq := range q.tenants {
		if tq.n == 0 && tq.lastFinish <= q.vtime {
			delete(q.tenants, name)
		}
	}
	q.sweepAt = max(minSweepAt, 2*len(q.tenants))
}

// costAhead estimates the cost that would be dispatched from this band before a new item of tenant (with weight)
// reaches the head: the virtual start tag S the item would get, times the weight of the backlogged tenants, bounded
// by the band's backlog. It is a lower bound, so predictive shedding errs towards admitting.
func (q *bandQueue) costAhead(tenant string, weight float64) float64 {
	start := q.vtime
	if tq := q.tenants[tenant]; tq != nil {
		if tq.n > 0 {
			start = tq.headStart + tq.cost/tq.weight
		} else {
			start = max(q.vtime, tq.lastFinish)
		}
	}
	return min(q.cost, max(0, start-q.vtime)*q.activeWeight)
}

// activeTenants is a min-heap (container/heap) of the tenants with queued items, keyed by (headStart, head.seq): a
// strict order, since arrival sequences are unique, so the tenant served next never depends on the heap's layout.
type activeTenants []*tenantQueue

func (h activeTenants) Len() int { return len(h) }

func (h activeTenants) Less(i, j int) bool { return h.before(h[i], h[j]) }

// before reports whether tenant a is served before tenant b in fair order.
func (activeTenants) before(a, b *tenantQueue) bool {
	if a.headStart != b.headStart {
		return a.headStart < b.headStart
	}
	return a.head.seq < b.head.seq
}

func (h activeTenants) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}

// Push and Pop are for container/heap only.
func (h *activeTenants) Push(x any) {
	tq := x.(*tenantQueue)
	tq.heapIdx = len(*h)
	*h = append(*h, tq)
}

func (h *activeTenants) Pop() any {
	old := *h
	last := len(old) - 1
	tq := old[last]
	old[last] = nil
	tq.heapIdx = -1
	*h = old[:last]
	return tq
}
