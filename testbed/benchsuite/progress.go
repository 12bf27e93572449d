package benchsuite

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// runOverhead is what a run takes beyond its issuing window on a quiet
// machine (start-up, settling, the last requests): the progress bar's
// estimate, nothing else depends on it.
const runOverhead = 8 * time.Second

// ProgressBar shows a suite's progress: on a terminal one line redrawn twice
// a second, elsewhere one line per run start and end. LoadStarted and Record
// are its RealTime.OnLoadStart and OnRecord.
type ProgressBar struct {
	w    io.Writer
	live bool

	done, failed atomic.Int64 // requests of the current run

	mu        sync.Mutex
	begin     time.Time     // of the suite
	planned   time.Duration // of the whole suite
	finished  time.Duration // planned time of the runs finished
	runBegin  time.Time
	loadBegin time.Time // zero while the run is starting up
	runPlan   time.Duration
	runIssue  time.Duration
	label     string
	quit      chan struct{}
	drawer    sync.WaitGroup
	lastWidth int
}

var _ Progress = (*ProgressBar)(nil)

// NewProgressBar returns a bar for scenarios, writing to w; live redraws in
// place (give true for a terminal).
func NewProgressBar(w io.Writer, live bool, scenarios []*Scenario) *ProgressBar {
	return &ProgressBar{w: w, live: live, planned: PlannedDuration(scenarios), begin: time.Now()}
}

// PlannedDuration estimates a suite's wall time on a quiet machine: every
// run's issuing window, half its drain bound and the start-up overhead; the
// contenders of an interleaved scenario (real time) take one run.
func PlannedDuration(scenarios []*Scenario) time.Duration {
	var d time.Duration
	for _, sc := range scenarios {
		runs := len(sc.Contenders)
		if sc.Interleave {
			runs = 1
			for _, c := range sc.Contenders {
				if c.Unloaded {
					runs++
				}
			}
		}
		d += time.Duration(runs) * planOf(sc)
	}
	return d
}

func planOf(sc *Scenario) time.Duration { return sc.Duration + sc.Drain/2 + runOverhead }

// LoadStarted marks the end of the current run's start-up.
func (p *ProgressBar) LoadStarted() {
	p.mu.Lock()
	p.loadBegin = time.Now()
	p.mu.Unlock()
}

// Record counts a finished request of the current run.
func (p *ProgressBar) Record(r loadgen.Record) {
	if !r.Final {
		return
	}
	p.done.Add(1)
	if !r.OK() {
		p.failed.Add(1)
	}
}

// StartRun implements Progress.
func (p *ProgressBar) StartRun(index, total int, sc *Scenario, c Contender) {
	p.mu.Lock()
	p.label = fmt.Sprintf("[%d/%d] %s · %s", index+1, total, sc.Name, c.Name)
	p.runBegin, p.loadBegin, p.runPlan, p.runIssue = time.Now(), time.Time{}, planOf(sc), sc.Duration
	p.done.Store(0)
	p.failed.Store(0)
	p.mu.Unlock()
	if !p.live {
		fmt.Fprintf(p.w, "%s: %s, %v of load\n", p.label, c.Describe(), sc.Duration)
		return
	}
	p.quit = make(chan struct{})
	p.drawer.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw()
			case <-p.quit:
				return
			}
		}
	})
}

// EndRun implements Progress.
func (p *ProgressBar) EndRun(res *RunResult, err error) {
	if p.live {
		close(p.quit)
		p.drawer.Wait()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished += p.runPlan
	var msg string
	var skipped *SkippedError
	switch {
	case errors.As(err, &skipped):
		msg = err.Error()
	case err != nil:
		msg = "FAILED: " + err.Error()
	default:
		o := res.Summary.Overall
		msg = fmt.Sprintf("%d requests, %d ok, TTFT p99 %s, %.2f req/s, ",
			o.Requests, o.Succeeded, formatSeconds(o.TTFT.P99.Seconds()), o.Throughput)
		if res.Virtual > 0 {
			msg += fmt.Sprintf("%v virtual in %v", res.Virtual.Round(time.Second), res.Wall.Round(10*time.Millisecond))
		} else {
			msg += res.Wall.Round(time.Second).String()
		}
	}
	line := fmt.Sprintf("%s: %s", p.label, msg)
	if p.live {
		fmt.Fprintf(p.w, "\r%-*s\n", p.lastWidth, line)
		p.lastWidth = 0
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *ProgressBar) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 24
	elapsed := time.Since(p.runBegin)
	frac, phase := 0.0, "start"
	if !p.loadBegin.IsZero() {
		loaded := time.Since(p.loadBegin)
		frac, phase = min(loaded.Seconds()/p.runIssue.Seconds(), 1), "load"
		if loaded > p.runIssue {
			phase = "drain"
		}
	}
	filled := int(frac * width)
	suite := min((p.finished+min(elapsed, p.runPlan)).Seconds()/p.planned.Seconds(), 1)
	line := fmt.Sprintf("%s [%s%s] %3.0f%% %s  %d done  %d failed  | suite %3.0f%%, %v elapsed",
		p.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), 100*frac, phase,
		p.done.Load(), p.failed.Load(), 100*suite, time.Since(p.begin).Round(time.Second))
	fmt.Fprintf(p.w, "\r%-*s", p.lastWidth, line)
	p.lastWidth = len(line)
}
