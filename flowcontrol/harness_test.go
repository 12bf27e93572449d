package flowcontrol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// testConfig returns the defaults with jitter off, metrics that never go stale (tests step the clock by seconds) and
// the tests' own reference thresholds (queue depth 5; ceilings 1, 1 and 0.8; no burst tier, which the tests of it turn
// on), so that tuning the shipped defaults does not change what a test's endpoint numbers mean; then applies mutate
// and validates.
func testConfig(t *testing.T, mutate func(*Config)) *Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.RetryAfterJitter = 0
	cfg.Endpoint.MetricsStaleness = time.Hour
	cfg.Endpoint.QueueDepth = 5
	cfg.Endpoint.BurstQueueDepth = 0
	cfg.Bands[Critical].SaturationCeiling = 1
	cfg.Bands[Standard].SaturationCeiling = 1
	cfg.Bands[Sheddable].SaturationCeiling = 0.8
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	return cfg
}

// queueingSheddable lets Sheddable wait (at Standard's ceiling) instead of being rejected when saturated.
func queueingSheddable(cfg *Config) {
	cfg.Bands[Sheddable].RejectWhenSaturated = false
	cfg.Bands[Sheddable].SaturationCeiling = cfg.Bands[Standard].SaturationCeiling
}

// harness drives a Controller on a fake clock. Tests using it run inside synctest.Test, so synctest.Wait settles
// every goroutine (Admit callers, timer callbacks) after each step: no sleeps, no races on what has happened.
type harness struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	c   *Controller
	rec *countingRecorder
	seq int
}

func newHarness(t *testing.T, cfg *Config) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	rec := &countingRecorder{}
	c, err := New(cfg, Deps{Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clk: clk, c: c, rec: rec}
	// Answer whatever still waits when the test ends, so the synctest bubble can exit.
	t.Cleanup(func() { <-c.Shutdown(0) })
	return h
}

// ep is an endpoint with a waiting queue and no KV pressure; the harness stamps ScrapedAt.
func ep(name string, waiting int) Endpoint { return Endpoint{Name: name, WaitingQueue: waiting} }

// scrape applies a snapshot taken now and lets dispatched callers return.
func (h *harness) scrape(eps ...Endpoint) {
	h.t.Helper()
	for i := range eps {
		if eps[i].ScrapedAt.IsZero() {
			eps[i].ScrapedAt = h.clk.Now()
		}
	}
	if err := h.c.UpdateEndpoints(eps); err != nil {
		h.t.Fatal(err)
	}
	synctest.Wait()
}

func (h *harness) step(d time.Duration) {
	h.clk.Step(d)
	synctest.Wait()
}

type call struct {
	req    Request
	cancel context.CancelFunc
	done   chan struct{}
	d      Decision
	err    error
}

// admit starts an Admit call and returns once it has either returned or blocked waiting.
func (h *harness) admit(priority int, tenant string, cost uint64) *call {
	h.seq++
	return h.admitReq(Request{ID: fmt.Sprintf("req-%d", h.seq), Tenant: tenant, Priority: priority, Bytes: 100, EstimatedCost: cost})
}

func (h *harness) admitReq(req Request) *call {
	ctx, cancel := context.WithCancel(context.Background())
	cl := &call{req: req, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(cl.done)
		cl.d, cl.err = h.c.Admit(ctx, req)
	}()
	synctest.Wait()
	return cl
}

func (cl *call) finished() bool {
	select {
	case <-cl.done:
		return true
	default:
		return false
	}
}

// result returns the decision of a call that must have finished.
func (cl *call) result(t *testing.T) Decision {
	t.Helper()
	if !cl.finished() {
		t.Fatalf("%s is still waiting", cl.req.ID)
	}
	if (cl.err == nil) != (cl.d.Outcome == Dispatched) {
		t.Fatalf("%s: outcome %s with error %v", cl.req.ID, cl.d.Outcome, cl.err)
	}
	return cl.d
}

func (cl *call) wantOutcome(t *testing.T, o Outcome, r Reason) Decision {
	t.Helper()
	d := cl.result(t)
	if d.Outcome != o || d.Reason != r {
		t.Fatalf("%s: got %s/%q, want %s/%q", cl.req.ID, d.Outcome, d.Reason, o, r)
	}
	return d
}

func (cl *call) wantWaiting(t *testing.T) {
	t.Helper()
	if cl.finished() {
		t.Fatalf("%s finished (%s/%q), want it waiting", cl.req.ID, cl.d.Outcome, cl.d.Reason)
	}
}

// dispatchedIDs returns, in call order, the IDs of finished calls that were dispatched.
func dispatchedIDs(calls ...*call) []string {
	var ids []string
	for _, cl := range calls {
		if cl.finished() && cl.d.Outcome == Dispatched {
			ids = append(ids, cl.req.ID)
		}
	}
	return ids
}

// countingRecorder keeps the last queue sample.
type countingRecorder struct {
	lock sync.Mutex
	last QueueSample
}

func (r *countingRecorder) RecordDecision(string, Decision) {}

func (r *countingRecorder) RecordQueue(s QueueSample) {
	r.lock.Lock()
	defer r.lock.Unlock()
	r.last = s
}

func (r *countingRecorder) lastSample() QueueSample {
	r.lock.Lock()
	defer r.lock.Unlock()
	return r.last
}
