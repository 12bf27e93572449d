package virtualbench

import (
	"container/heap"
	"time"

	"k8s.io/utils/clock"
)

// epoch is time zero of every run. It is fixed, so nothing in a run depends on when it ran.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// event is one thing that happens at a virtual instant. Events at the same instant fire in the order they were
// scheduled (seq), which makes a run a deterministic function of its inputs.
type event struct {
	at   time.Time
	seq  uint64
	fire func()
	dead bool // a stopped timer: skipped when it comes up
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// virtualClock is a run's clock and event queue: time moves only when the event loop takes the next event, and
// timers are events. It implements clock.WithTickerAndDelayedExecution for the code under test (Sluice admission and
// the plugins), whose callbacks then run on the loop's goroutine, outside any call into them. It is not safe for
// concurrent use.
type virtualClock struct {
	now    time.Time
	seq    uint64
	queue  eventHeap
	events uint64 // fired
	// afterCallback, if set, runs after every AfterFunc callback: the run lets the EPP act on what a timer decided.
	afterCallback func()
}

func newVirtualClock() *virtualClock { return &virtualClock{now: epoch} }

// at schedules fire at t (not before now).
func (c *virtualClock) at(t time.Time, fire func()) *event {
	if t.Before(c.now) {
		t = c.now
	}
	c.seq++
	e := &event{at: t, seq: c.seq, fire: fire}
	heap.Push(&c.queue, e)
	return e
}

// next pops the next live event, advances the clock to it and returns it; nil when the queue is empty.
func (c *virtualClock) next() *event {
	for len(c.queue) > 0 {
		e := heap.Pop(&c.queue).(*event)
		if e.dead {
			continue
		}
		c.now = e.at
		c.events++
		return e
	}
	return nil
}

// peek returns the time of the next event, if any (dead events included: they only make the answer early).
func (c *virtualClock) peek() (time.Time, bool) {
	if len(c.queue) == 0 {
		return time.Time{}, false
	}
	return c.queue[0].at, true
}

func (c *virtualClock) Now() time.Time                  { return c.now }
func (c *virtualClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

// Sleep would block the event loop that moves time: nothing in a run may call it.
func (c *virtualClock) Sleep(time.Duration) {
	panic("virtualbench: Sleep on the virtual clock would block the event loop")
}

func (c *virtualClock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

func (c *virtualClock) NewTimer(d time.Duration) clock.Timer {
	t := &virtualTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c *virtualClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &virtualTimer{c: c, f: f}
	t.Reset(d)
	return t
}

func (c *virtualClock) Tick(d time.Duration) <-chan time.Time { return c.NewTicker(d).C() }

func (c *virtualClock) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("virtualbench: non-positive ticker period")
	}
	t := &virtualTicker{c: c, period: d, ch: make(chan time.Time, 1)}
	t.arm()
	return t
}

var _ clock.WithTickerAndDelayedExecution = (*virtualClock)(nil)

// virtualTimer fires once: it runs f on the loop, or sends on ch (dropping the value if the last one was not read,
// as a real timer's buffered channel would hold only one).
type virtualTimer struct {
	c  *virtualClock
	f  func()
	ch chan time.Time
	ev *event
}

func (t *virtualTimer) C() <-chan time.Time { return t.ch }

func (t *virtualTimer) Stop() bool {
	if t.ev == nil || t.ev.dead {
		return false
	}
	t.ev.dead = true
	return true
}

func (t *virtualTimer) Reset(d time.Duration) bool {
	active := t.Stop()
	var ev *event
	ev = t.c.at(t.c.now.Add(d), func() {
		ev.dead = true
		if t.f != nil {
			t.f()
			if t.c.afterCallback != nil {
				t.c.afterCallback()
			}
			return
		}
		select {
		case t.ch <- t.c.now:
		default:
		}
	})
	t.ev = ev
	return active
}

// virtualTicker sends on its channel every period until stopped.
type virtualTicker struct {
	c      *virtualClock
	period time.Duration
	ch     chan time.Time
	ev     *event
}

func (t *virtualTicker) arm() {
	t.ev = t.c.at(t.c.now.Add(t.period), func() {
		select {
		case t.ch <- t.c.now:
		default:
		}
		t.arm()
	})
}

func (t *virtualTicker) C() <-chan time.Time { return t.ch }

func (t *virtualTicker) Stop() {
	if t.ev != nil {
		t.ev.dead = true
	}
}
