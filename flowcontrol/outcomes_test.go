package flowcontrol

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// checkDecision checks what every decision must satisfy, whatever the interleaving.
func checkDecision(cfg *Config, d Decision, err error) error {
	if (err == nil) != (d.Outcome == Dispatched) {
		return fmt.Errorf("outcome %s with error %v", d.Outcome, err)
	}
	if !d.Band.Valid() {
		return fmt.Errorf("invalid band %d", d.Band)
	}
	bc := cfg.Bands[d.Band]
	shed := func() error {
		if d.RetryAfter < bc.RetryAfterMin || d.RetryAfter > bc.RetryAfterMax.Round(time.Second)+time.Second ||
			d.RetryAfter%time.Second != 0 {
			return fmt.Errorf("%s/%s: Retry-After %v outside [%v, %v] or not whole seconds", d.Outcome, d.Reason,
				d.RetryAfter, bc.RetryAfterMin, bc.RetryAfterMax)
		}
		return nil
	}
	switch d.Outcome {
	case Dispatched:
		if d.Reason != ReasonNone || len(d.Endpoints) == 0 || d.RetryAfter != 0 {
			return fmt.Errorf("dispatched with reason %q, endpoints %v, Retry-After %v", d.Reason, d.Endpoints, d.RetryAfter)
		}
	case Rejected:
		switch d.Reason {
		case ReasonSaturated, ReasonQueueFull, ReasonDisplaced, ReasonPredictedWait, ReasonQueueTimeout, ReasonEarlyReturn:
			return shed()
		default:
			return fmt.Errorf("rejected with reason %q", d.Reason)
		}
	case Unavailable:
		if d.Reason != ReasonNoEndpoints && d.Reason != ReasonShuttingDown {
			return fmt.Errorf("unavailable with reason %q", d.Reason)
		}
		return shed()
	case Cancelled:
		if d.Reason != ReasonCancelled {
			return fmt.Errorf("cancelled with reason %q", d.Reason)
		}
	default:
		return fmt.Errorf("unknown outcome %d", d.Outcome)
	}
	return nil
}

// checkInvariants checks the controller's state at a quiescent moment.
func checkInvariants(c *Controller) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	total, bytes := 0, int64(0)
	for _, b := range allBands {
		q := c.bands[b]
		if q.count < 0 || int64(q.count) > c.cfg.Bands[b].MaxQueuedRequests || q.bytes > c.cfg.Bands[b].MaxQueuedBytes {
			return fmt.Errorf("band %s holds %d requests, %d bytes", b, q.count, q.bytes)
		}
		// A due timer whose callback has not run yet (the clock just stepped) may still dispatch.
		timerDue := c.ttlTimer != nil && !c.ttlAt.After(now)
		if q.count > 0 && !timerDue {
			if _, best, _ := c.headroomLocked(b, "", now); best >= 0 {
				return fmt.Errorf("band %s has %d waiting although endpoint %s has headroom", b, q.count, c.endpoints[best].Name)
			}
		}
		total += q.count
		bytes += q.bytes
	}
	if int64(total) != c.totalCount || bytes != c.totalBytes || total != len(c.queued) ||
		c.totalCount > c.cfg.MaxQueuedRequests || c.totalBytes > c.cfg.MaxQueuedBytes {
		return fmt.Errorf("totals: bands %d/%d bytes, counters %d/%d, index %d", total, bytes, c.totalCount, c.totalBytes, len(c.queued))
	}
	unscraped := make([]int, len(c.endpoints))
	pending := make([]int, len(c.endpoints))
	started := make([]int, len(c.endpoints))
	inflight := make([]int, len(c.endpoints))
	running := make([]int, len(c.endpoints))
	kvFinal := make([]float64, len(c.endpoints))
	for id, r := range c.reservations {
		i, ok := c.endpointIndex[r.endpoint]
		if !ok {
			return fmt.Errorf("reservation %s is on %s, which is not in the pool", id, r.endpoint)
		}
		if r.pending && r.started {
			return fmt.Errorf("reservation %s is both pending and started", id)
		}
		unscraped[i] += b2i(r.unscraped)
		pending[i] += b2i(r.pending)
		started[i] += b2i(r.unscraped && r.started)
		inflight[i]++
		running[i] += b2i(r.started)
		kvFinal[i] += r.size.final()
	}
	for i, e := range c.endpoints {
		if math.Abs(e.kvFinal-kvFinal[i]) > 1e-6*max(1, kvFinal[i]) {
			return fmt.Errorf("endpoint %s counts %v tokens at final size; its reservations %v", e.Name, e.kvFinal, kvFinal[i])
		}
	}
	for i, e := range c.endpoints {
		if e.reserved != unscraped[i] || e.pending != pending[i] || e.started != started[i] ||
			e.inflight != inflight[i] || e.running != running[i] {
			return fmt.Errorf("endpoint %s counts %d unscraped, %d pending, %d started, %d in flight and %d running; "+
				"reservations say %d, %d, %d, %d and %d", e.Name, e.reserved, e.pending, e.started, e.inflight, e.running,
				unscraped[i], pending[i], started[i], inflight[i], running[i])
		}
		if e.capacity > 0 && e.seats > e.capacity {
			return fmt.Errorf("endpoint %s has %d seats over a capacity of %d", e.Name, e.seats, e.capacity)
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sampleChecker is a Recorder that checks every queue sample against the capacities and counts decisions.
type sampleChecker struct {
	cfg       *Config
	decisions atomic.Int64
	mu        sync.Mutex
	err       error
}

func (s *sampleChecker) RecordDecision(string, Decision) { s.decisions.Add(1) }
func (s *sampleChecker) RecordQueue(q QueueSample) {
	total := 0
	for _, b := range allBands {
		total += q.Queued[b]
		if q.Queued[b] < 0 || int64(q.Queued[b]) > s.cfg.Bands[b].MaxQueuedRequests {
			s.fail(fmt.Errorf("sample: band %s length %d", b, q.Queued[b]))
		}
	}
	if int64(total) > s.cfg.MaxQueuedRequests || q.DrainRate < 0 {
		s.fail(fmt.Errorf("sample: %d queued, drain rate %v", total, q.DrainRate))
	}
}

func (s *sampleChecker) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func randomConfig(rng *rand.Rand) *Config {
	cfg := DefaultConfig()
	cfg.Endpoint.QueueDepth = 1 + rng.IntN(3)
	cfg.MaxQueuedRequests = int64(2 + rng.IntN(20))
	cfg.MaxQueuedBytes = int64(500 + rng.IntN(3000))
	for _, b := range allBands {
		cfg.Bands[b].MaxQueuedRequests = int64(1 + rng.IntN(12))
		cfg.Bands[b].MaxQueueTime = time.Duration(1+rng.IntN(3)) * time.Second
	}
	if rng.IntN(2) == 0 {
		queueingSheddable(cfg)
	}
	cfg.DrainRateWindow = 2 * time.Second
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return cfg
}

func testSeed(t *testing.T) uint64 {
	if s := os.Getenv("FLOWCONTROL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLOWCONTROL_SEED: %v", err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// TestRandomizedExactlyOneOutcome runs thousands of requests from concurrent callers against a driver that scrapes
// random metrics, releases, steps the clock, cancels callers and shuts down midway. Every request must end in exactly
// one valid decision and the controller's invariants must hold throughout. Rerun a failure with FLOWCONTROL_SEED.
func TestRandomizedExactlyOneOutcome(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with FLOWCONTROL_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	cfg := randomConfig(rng)
	clk := clocktesting.NewFakeClock(t0)
	rec := &sampleChecker{cfg: cfg}
	c, err := New(cfg, Deps{Clock: clk, Rand: rand.New(rand.NewPCG(seed, 3)), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}

	names := []string{"a", "b", "c"}
	if err := c.UpdateEndpoints([]Endpoint{{Name: "a", ScrapedAt: t0}, {Name: "b", WaitingQueue: 9, ScrapedAt: t0}}); err != nil {
		t.Fatal(err)
	}

	const workers, perWorker = 32, 60
	const total = workers * perWorker
	type result struct {
		d     Decision
		err   error
		calls int
	}
	results := make([]result, total)
	dispatched := make(chan string, total)
	cancels := make(chan context.CancelFunc, total)
	// The driver hands out arrival tokens, so arrivals interleave with scrapes, releases and clock steps instead of
	// all racing ahead of them.
	arrivals := make(chan struct{}, total)
	granted := 0
	var finished atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := range perWorker {
				<-arrivals
				n := w*perWorker + i
				ctx, cancel := context.WithCancel(context.Background())
				if wrng.IntN(5) == 0 {
					cancels <- cancel
				}
				d, err := c.Admit(ctx, Request{ID: fmt.Sprintf("r%d", n), Tenant: fmt.Sprintf("t%d", wrng.IntN(8)),
					Priority: wrng.IntN(3) - 1, Bytes: int64(wrng.IntN(200)), EstimatedCost: uint64(wrng.IntN(1000)),
					Streamed: wrng.IntN(2) == 0})
				cancel()
				results[n].d, results[n].err = d, err
				results[n].calls++
				if d.Outcome == Dispatched {
					dispatched <- fmt.Sprintf("r%d", n)
				}
				finished.Add(1)
			}
		})
	}
	workersDone := make(chan struct{})
	go func() { wg.Wait(); close(workersDone) }()

	shutdownAt := int64(-1)
	if rng.IntN(2) == 0 {
		shutdownAt = int64(total/2 + rng.IntN(total/2))
	}
	var drained <-chan struct{}
	for running := true; running; {
		select {
		case <-workersDone:
			running = false
			continue
		default:
		}
		switch op := rng.IntN(12); {
		case op < 2 && granted < total:
			for range 1 + rng.IntN(min(8, total-granted)) {
				arrivals <- struct{}{}
				granted++
			}
			runtime.Gosched()
		case op < 5:
			var eps []Endpoint
			for _, name := range names {
				if rng.IntN(6) == 0 {
					continue // endpoint missing from this scrape
				}
				scraped := clk.Now()
				if rng.IntN(8) == 0 {
					scraped = scraped.Add(-time.Second) // stale
				}
				eps = append(eps, Endpoint{Name: name, WaitingQueue: rng.IntN(4), KVCacheUsage: rng.Float64() * 0.9,
					ScrapedAt: scraped})
			}
			if err := c.UpdateEndpoints(eps); err != nil {
				t.Fatal(err)
			}
		case op < 7:
			select {
			case id := <-dispatched:
				if rng.IntN(2) == 0 {
					c.Bind(id, names[rng.IntN(len(names))])
				}
				if rng.IntN(2) == 0 {
					c.Started(id)
				}
				c.Release(id)
			default:
			}
		case op < 8:
			select {
			case cancel := <-cancels:
				cancel()
			default:
			}
		default:
			clk.Step(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		if drained == nil && shutdownAt >= 0 && finished.Load() >= shutdownAt {
			drained = c.Shutdown(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
		if err := checkInvariants(c); err != nil {
			t.Fatal(err)
		}
	}

	if drained == nil {
		drained = c.Shutdown(time.Second)
	}
	clk.Step(2 * time.Second) // past any grace period
	<-drained
	if err := checkInvariants(c); err != nil {
		t.Fatal(err)
	}
	counts := map[Outcome]int{}
	for n, r := range results {
		if r.calls != 1 {
			t.Fatalf("request r%d returned %d times", n, r.calls)
		}
		if err := checkDecision(cfg, r.d, r.err); err != nil {
			t.Fatalf("request r%d: %v", n, err)
		}
		counts[r.d.Outcome]++
	}
	if got := rec.decisions.Load(); got != total {
		t.Fatalf("recorder saw %d decisions for %d requests", got, total)
	}
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	if s := c.Stats(); s.Queued != [NumBands]int{} {
		t.Fatalf("still queued after shutdown: %v", s.Queued)
	}
	t.Logf("outcomes: %v", counts)
	if counts[Dispatched] == 0 || counts[Dispatched] == total {
		t.Fatalf("degenerate run, outcomes %v: the test exercised no admission decisions", counts)
	}
}

// FuzzControllerOutcomes interprets the input as a script of operations (arrivals, cancellations, scrapes, releases,
// binds, clock steps, shutdown) run inside a synctest bubble, so each input replays exactly. After every step the
// controller's invariants must hold; at the end every request must have exactly one valid decision.
func FuzzControllerOutcomes(f *testing.F) {
	f.Add([]byte{0x00, 0x10, 0x21, 0x05, 0x33, 0x17, 0x48, 0x59, 0x6a, 0x7b})
	f.Add([]byte{0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x70, 0x41})
	f.Add([]byte{0x12, 0x50, 0x03, 0x03, 0x03, 0x13, 0x23, 0x44, 0x44, 0x7f, 0x7f, 0x7f, 0x9a})
	// Streamed arrivals that start and end (a run time learned), then scrapes showing the KV cache half full or more
	// (a capacity learned), then more arrivals.
	f.Add([]byte{0x00, 0x50, 0x21, 0x23, 0x25, 0x70, 0x90, 0x91, 0x92, 0x70, 0x80, 0x70, 0xa0, 0x70, 0xa3, 0x70, 0x21, 0x23,
		0x93, 0xa2, 0x7f})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) == 0 || len(script) > 400 {
			return
		}
		synctest.Test(t, func(t *testing.T) { runScript(t, script) })
	})
}

func runScript(t *testing.T, script []byte) {
	cfg := randomConfig(rand.New(rand.NewPCG(uint64(script[0]), 5)))
	script = script[1:]
	clk := clocktesting.NewFakeClock(t0)
	rec := &sampleChecker{cfg: cfg}
	c, err := New(cfg, Deps{Clock: clk, Rand: rand.New(rand.NewPCG(1, 1)), Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		id     string
		cancel context.CancelFunc
		done   chan struct{}
		d      Decision
		err    error
		calls  atomic.Int32
	}
	var calls []*call
	names := []string{"a", "b"}
	next := func() byte {
		if len(script) == 0 {
			return 0
		}
		b := script[0]
		script = script[1:]
		return b
	}
	for len(script) > 0 {
		b := next()
		arg := int(b & 0x0f)
		switch b >> 4 {
		case 0, 1, 2, 3: // arrival: priority from the high bits, tenant from the low bits
			ctx, cancel := context.WithCancel(context.Background())
			cl := &call{id: fmt.Sprintf("r%d", len(calls)), cancel: cancel, done: make(chan struct{})}
			calls = append(calls, cl)
			req := Request{ID: cl.id, Tenant: fmt.Sprintf("t%d", arg%4), Priority: int(b>>4) - 2, Bytes: int64(arg * 40),
				EstimatedCost: uint64(arg * 100), OutputTokens: uint64(arg * 30), Streamed: arg&1 == 1}
			go func() {
				defer close(cl.done)
				cl.d, cl.err = c.Admit(ctx, req)
				cl.calls.Add(1)
			}()
		case 4: // cancel a caller
			if len(calls) > 0 {
				calls[arg%len(calls)].cancel()
			}
		case 5, 6: // scrape: each endpoint's waiting queue from two bits; bit 3 makes the scrape stale
			scraped := clk.Now()
			if arg&8 != 0 {
				scraped = scraped.Add(-time.Second)
			}
			var eps []Endpoint
			for i, name := range names {
				eps = append(eps, Endpoint{Name: name, WaitingQueue: (arg >> (2 * i)) & 3, ScrapedAt: scraped})
			}
			if b>>4 == 6 {
				eps = eps[:1]
			}
			if err := c.UpdateEndpoints(eps); err != nil {
				t.Fatal(err)
			}
		case 7: // step the clock
			clk.Step(time.Duration(arg+1) * 100 * time.Millisecond)
		case 9: // a request's first response chunk
			if len(calls) > 0 {
				c.Started(calls[arg%len(calls)].id)
			}
		case 8: // release or bind a request
			if len(calls) > 0 {
				id := calls[arg%len(calls)].id
				if arg&1 == 0 {
					c.Release(id)
				} else {
					c.Bind(id, names[arg>>1&1])
				}
			}
		case 10: // a scrape that shows the KV cache at least half full, running what the EPP started there
			var eps []Endpoint
			c.mu.Lock()
			for i, name := range names {
				running := 0
				for _, r := range c.reservations {
					running += b2i(r.endpoint == name && r.started)
				}
				eps = append(eps, Endpoint{Name: name, Running: running, KVCacheUsage: 0.5 + float64(arg>>i&1)/8 + float64(arg>>2)/8,
					ScrapedAt: clk.Now()})
			}
			c.mu.Unlock()
			if err := c.UpdateEndpoints(eps); err != nil {
				t.Fatal(err)
			}
		default: // shut down
			c.Shutdown(time.Duration(arg) * 200 * time.Millisecond)
		}
		synctest.Wait()
		if err := checkInvariants(c); err != nil {
			t.Fatal(err)
		}
	}
	drained := c.Shutdown(0) // if the script already shut down, its grace period still runs
	clk.Step(time.Minute)
	<-drained
	synctest.Wait()
	for _, cl := range calls {
		select {
		case <-cl.done:
		default:
			t.Fatalf("%s never answered", cl.id)
		}
		if n := cl.calls.Load(); n != 1 {
			t.Fatalf("%s answered %d times", cl.id, n)
		}
		if err := checkDecision(cfg, cl.d, cl.err); err != nil {
			t.Fatalf("%s: %v", cl.id, err)
		}
	}
	if got := rec.decisions.Load(); got != int64(len(calls)) {
		t.Fatalf("recorder saw %d decisions for %d requests", got, len(calls))
	}
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	if err := checkInvariants(c); err != nil {
		t.Fatal(err)
	}
}
