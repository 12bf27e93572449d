package virtualbench

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHookGoroutinesWaitForEveryGoroutineAHookStarts: run returns only once the goroutines f started, and those
// they started, have ended; a call that starts none does not read the goroutine profile.
func TestHookGoroutinesWaitForEveryGoroutineAHookStarts(t *testing.T) {
	h := newHookGoroutines()
	if err := h.run(t.Context(), func(context.Context) {}); err != nil || h.waited != 0 {
		t.Fatalf("a call that started no goroutine: error %v, waited %v; want neither", err, h.waited)
	}

	release := make(chan struct{})
	go func() { // not labelled: it does not count
		for range 20 {
			runtime.Gosched()
		}
		close(release)
	}()
	var finished atomic.Bool
	err := h.run(t.Context(), func(context.Context) {
		go func() {
			go func() {
				<-release
				finished.Store(true)
			}()
		}()
	})
	if err != nil || !finished.Load() {
		t.Fatalf("run returned (error %v) before the grandchild goroutine ended", err)
	}
	if h.waited == 0 {
		t.Fatal("run waited for goroutines without counting the time")
	}
}

// TestHookGoroutinesFailOnWorkThatNeverEnds: a hook that leaves a goroutine running for good is an error, not a hang
// and not a silent race; another EPP's goroutines (another label) do not hold up a run.
func TestHookGoroutinesFailOnWorkThatNeverEnds(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	stuck := newHookGoroutines()
	stuck.maxPolls = 150
	err := stuck.run(t.Context(), func(context.Context) { go func() { <-stop }() })
	if err == nil || !strings.Contains(err.Error(), "1 goroutines started by plugin hooks are still running") {
		t.Fatalf("error %v, want the goroutine left running reported", err)
	}

	other := newHookGoroutines()
	other.maxPolls = 150
	if err := other.run(t.Context(), func(context.Context) { go func() {}() }); err != nil {
		t.Fatalf("another EPP's goroutine held up a run: %v", err)
	}
}
