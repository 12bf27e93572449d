package eventclock

import (
	"strings"
	"testing"
	"time"
)

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestClock(t *testing.T) {
	c := New(epoch)
	var fired []string
	c.AfterFunc(2*time.Second, func() { fired = append(fired, "b") })
	stopped := c.AfterFunc(time.Second, func() { fired = append(fired, "stopped") })
	c.AfterFunc(time.Second, func() { fired = append(fired, "a") })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop must report true once for an active timer")
	}
	tick := c.NewTicker(700 * time.Millisecond)
	timer := c.NewTimer(1500 * time.Millisecond)
	ticks := 0
	for e := c.Next(); e != nil && c.Since(epoch) < 3*time.Second; e = c.Next() {
		e.Fire()
		select {
		case <-tick.C():
			ticks++
		default:
		}
	}
	tick.Stop()
	if strings.Join(fired, ",") != "a,b" || ticks != 4 {
		t.Fatalf("fired %v and %d ticks by 3s, want a,b and 4 ticks", fired, ticks)
	}
	select {
	case at := <-timer.C():
		if at.Sub(epoch) != 1500*time.Millisecond {
			t.Fatalf("timer fired at %v", at.Sub(epoch))
		}
	default:
		t.Fatal("timer did not fire")
	}
}

// TestStep: Step fires what falls due within the step, each event at its own time and in scheduling order, then
// lands on the step's end; a timer stopped before it is due never fires.
func TestStep(t *testing.T) {
	c := New(epoch)
	var fired []string
	at := func(name string) func() {
		return func() { fired = append(fired, name+"@"+c.Since(epoch).String()) }
	}
	c.AfterFunc(2*time.Second, at("b"))
	c.AfterFunc(time.Second, at("a1"))
	c.AfterFunc(time.Second, at("a2"))
	stopped := c.AfterFunc(1500*time.Millisecond, at("stopped"))
	c.AfterFunc(5*time.Second, at("late"))
	stopped.Stop()
	c.Step(3 * time.Second)
	if got, want := strings.Join(fired, ","), "a1@1s,a2@1s,b@2s"; got != want {
		t.Fatalf("fired %s, want %s", got, want)
	}
	if c.Since(epoch) != 3*time.Second {
		t.Fatalf("after the step the clock reads %v, want 3s", c.Since(epoch))
	}
	c.AdvanceTo(epoch) // never backwards
	if c.Since(epoch) != 3*time.Second {
		t.Fatalf("AdvanceTo moved the clock back to %v", c.Since(epoch))
	}
}
