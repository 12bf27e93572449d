package eventclock

import (
	"container/heap"
	"time"

	"k8s.io/utils/clock"
)

// Event is one thing that happens at a virtual instant.
type Event struct {
	at   time.Time
	seq  uint64
	fire func()
	dead bool // cancelled: skipped when it comes up
}

// Cancel keeps the event from firing. Cancelling a fired or cancelled event does nothing.
func (e *Event) Cancel() { e.dead = true }

// Fire runs the event's function. Next returns events for their owner to fire.
func (e *Event) Fire() { e.fire() }

type eventHeap []*Event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*Event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// Clock is a virtual clock and its event queue.
type Clock struct {
	now   time.Time
	seq   uint64
	queue eventHeap
	fired uint64

	// AfterCallback, if set, runs after every AfterFunc callback: a simulation's hook to act on what a timer of the
	// code under test decided.
	AfterCallback func()
}

// New returns a Clock at start with no events.
func New(start time.Time) *Clock { return &Clock{now: start} }

// At schedules fire at t (at the current time if t is earlier).
func (c *Clock) At(t time.Time, fire func()) *Event {
	if t.Before(c.now) {
		t = c.now
	}
	c.seq++
	e := &Event{at: t, seq: c.seq, fire: fire}
	heap.Push(&c.queue, e)
	return e
}

// Next pops the next live event, advances the clock to it and returns it for the caller to Fire; nil when no event
// is left.
func (c *Clock) Next() *Event {
	for len(c.queue) > 0 {
		e := heap.Pop(&c.queue).(*Event)
		if e.dead {
			continue
		}
		c.now = e.at
		c.fired++
		return e
	}
	return nil
}

// Peek returns the time of the next event, if any (cancelled events included: they only make the answer early).
func (c *Clock) Peek() (time.Time, bool) {
	if len(c.queue) == 0 {
		return time.Time{}, false
	}
	return c.queue[0].at, true
}

// Fired counts the events Next has handed out.
func (c *Clock) Fired() uint64 { return c.fired }

// AdvanceTo moves the clock to t without firing anything; the caller has checked that no event falls before t.
// Earlier times are ignored: time never moves backwards.
func (c *Clock) AdvanceTo(t time.Time) {
	if t.After(c.now) {
		c.now = t
	}
}

// Step fires, in order and each at its own time, every event due within d from now, then sets the clock to now+d.
func (c *Clock) Step(d time.Duration) {
	end := c.now.Add(d)
	for {
		if next, ok := c.Peek(); !ok || next.After(end) {
			break
		}
		if e := c.Next(); e != nil {
			e.Fire()
		}
	}
	c.AdvanceTo(end)
}

// Now implements clock.PassiveClock.
func (c *Clock) Now() time.Time { return c.now }

// Since implements clock.PassiveClock.
func (c *Clock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

// Sleep would block the goroutine that moves time: nothing may call it.
func (c *Clock) Sleep(time.Duration) {
	panic("eventclock: Sleep on a virtual clock would block the event loop")
}

// After implements clock.Clock.
func (c *Clock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

// NewTimer implements clock.Clock.
func (c *Clock) NewTimer(d time.Duration) clock.Timer {
	t := &timer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// AfterFunc implements clock.WithDelayedExecution: f runs on the goroutine that fires the event.
func (c *Clock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &timer{c: c, f: f}
	t.Reset(d)
	return t
}

// Tick implements clock.Clock.
func (c *Clock) Tick(d time.Duration) <-chan time.Time { return c.NewTicker(d).C() }

// NewTicker implements clock.WithTicker.
func (c *Clock) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("eventclock: non-positive ticker period")
	}
	t := &ticker{c: c, period: d, ch: make(chan time.Time, 1)}
	t.arm()
	return t
}

var _ clock.WithTickerAndDelayedExecution = (*Clock)(nil)

// timer fires once: it runs f, or sends on ch (dropping the value if the last one was not read, as a real timer's
// buffered channel holds only one).
type timer struct {
	c  *Clock
	f  func()
	ch chan time.Time
	ev *Event
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	if t.ev == nil || t.ev.dead {
		return false
	}
	t.ev.dead = true
	return true
}

func (t *timer) Reset(d time.Duration) bool {
	active := t.Stop()
	var ev *Event
	ev = t.c.At(t.c.now.Add(d), func() {
		ev.dead = true
		if t.f != nil {
			t.f()
			if t.c.AfterCallback != nil {
				t.c.AfterCallback()
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

// ticker sends on its channel every period until stopped.
type ticker struct {
	c      *Clock
	period time.Duration
	ch     chan time.Time
	ev     *Event
}

func (t *ticker) arm() {
	t.ev = t.c.At(t.c.now.Add(t.period), func() {
		select {
		case t.ch <- t.c.now:
		default:
		}
		t.arm()
	})
}

func (t *ticker) C() <-chan time.Time { return t.ch }

func (t *ticker) Stop() {
	if t.ev != nil {
		t.ev.dead = true
	}
}
