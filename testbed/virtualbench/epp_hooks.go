package virtualbench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Plugin hooks that leave work running in goroutines make a run depend on the Go scheduler: upstream's approximate
// prefix producer, for one, records each routing decision in its index from a goroutine its PreRequest starts, so
// whether the next request sees it is a race (in a real EPP, where requests are milliseconds apart, it practically
// always does). hookGoroutines makes such work part of the hook: the in-process EPP makes every call into plugin code
// through run, which returns only once every goroutine the call started has ended.
//
// How it knows, without reaching into any plugin: the call runs under a pprof label unique to the EPP, which every
// goroutine it starts inherits (and every goroutine those start); the goroutine profile lists the goroutines still
// carrying it. Reading that profile costs about 0.1 ms, so run first compares the process's count of goroutines
// ever created (runtime/metrics, a fraction of a microsecond) before and after the call: unchanged means the call
// started none, the common case. Hooks that start goroutines cost a profile read or two, which the engine does not
// count as the EPP's time (EPPCost.HookWait).

// hookLabelKey is the pprof label key every call into plugin code carries; its value names one EPP.
const hookLabelKey = "sluice-virtualbench-epp"

// maxHookPolls bounds the wait for a hook's goroutines: beyond it (a second or more), the hook has left work that
// does not end, which no simulation can make deterministic.
const maxHookPolls = 2000

var hookLabelSeq atomic.Uint64

// hookGoroutines runs calls into plugin code and waits for the goroutines they start. Not safe for concurrent use.
type hookGoroutines struct {
	maxPolls int
	labels   pprof.LabelSet
	needle   string // the label as the debug=1 goroutine profile prints it
	created  []metrics.Sample
	profile  bytes.Buffer
	// waited and waitedCPU are the wall and process CPU time spent waiting for goroutines after the calls that
	// started some: the engine's cost, not the EPP's (EPPCost.HookWait).
	waited, waitedCPU time.Duration
}

func newHookGoroutines() *hookGoroutines {
	value := strconv.FormatUint(hookLabelSeq.Add(1), 10)
	return &hookGoroutines{
		maxPolls: maxHookPolls,
		labels:   pprof.Labels(hookLabelKey, value),
		needle:   strconv.Quote(hookLabelKey) + ":" + strconv.Quote(value),
		created:  []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}},
	}
}

// run calls f with ctx and returns once every goroutine f started has ended. It fails when they are still running
// after maxPolls looks.
func (h *hookGoroutines) run(ctx context.Context, f func(context.Context)) error {
	before := h.goroutinesCreated()
	pprof.Do(ctx, h.labels, f)
	if h.goroutinesCreated() == before {
		return nil
	}
	start, startCPU := time.Now(), processCPU()
	defer func() { h.waited, h.waitedCPU = h.waited+time.Since(start), h.waitedCPU+processCPU()-startCPU }()
	for polls := 0; ; polls++ {
		// Yield first: the goroutines a hook starts are usually short and end within one yield.
		if polls < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Millisecond)
		}
		n, err := h.running()
		if err != nil || n == 0 {
			return err
		}
		if polls >= h.maxPolls {
			return fmt.Errorf("%d goroutines started by plugin hooks are still running: a plugin that works in the "+
				"background beyond its hook cannot run deterministically in process", n)
		}
	}
}

// goroutinesCreated is the number of goroutines the process has created since it started.
func (h *hookGoroutines) goroutinesCreated() uint64 {
	metrics.Read(h.created)
	return h.created[0].Value.Uint64()
}

// running counts the goroutines that carry h's label, from the goroutine profile at debug level 1: a record per
// distinct stack and label set, "N @ 0x…" followed by "# labels: {"key":"value", …}" when it has labels.
func (h *hookGoroutines) running() (int, error) {
	h.profile.Reset()
	if err := pprof.Lookup("goroutine").WriteTo(&h.profile, 1); err != nil {
		return 0, fmt.Errorf("reading the goroutine profile: %w", err)
	}
	n, count := 0, 0
	sc := bufio.NewScanner(&h.profile)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if c, _, ok := strings.Cut(line, " @ "); ok {
			count, _ = strconv.Atoi(c)
		} else if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, h.needle) {
			n += count
		}
	}
	return n, sc.Err()
}
