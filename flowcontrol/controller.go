package flowcontrol

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Request describes one request asking for admission. It carries plain values only.
type Request struct {
	// ID identifies the request until it finishes; it must be unique among requests the controller still tracks
	// (waiting, or dispatched and not yet released, or neither covered by a scrape nor, if Streamed, started). Bind,
	// Started and Release use it.
	ID string
	// Tenant is the fairness ID. Tenants share a band fairly, weighted by their policy weight.
	Tenant string
	// Priority is the InferenceObjective priority, mapped to a band by the configuration (then capped by the tenant's
	// policy).
	Priority int
	// Bytes is the request body size, counted against queue byte capacities while the request waits.
	Bytes int64
	// EstimatedCost is the request's expected work in tokens (prompt + expected output). Fair queuing shares a band's
	// cost, not its request count, between tenants. 0 counts as 1.
	EstimatedCost uint64
	// OutputTokens is the part of EstimatedCost that is expected output (0: unknown, the whole cost counts as prompt).
	// On a KV-bound server a request holds its prompt's KV from its start and grows into its output as it decodes;
	// admission counts KV room with it (kvroom.go).
	OutputTokens uint64
	// Streamed says the caller reports the response's first chunk with Started. Until then the dispatched request
	// counts against its endpoint as pending (waiting there or in prefill), scraped or not: a burst of prompts an
	// endpoint has not begun answering lengthens its next steps, which is what delays a first token there. Set it only
	// when the first chunk will be reported; Release ends the count in any case.
	Streamed bool
	// ReturnKey identifies the request's content across attempts (0: none), e.g. a hash of its tenant and body: a
	// request of a band that sheds at once, turned away, whose client sends it again once its Retry-After has passed,
	// is recognised as the return it was promised and may wait for capacity instead of being turned away again (see
	// promiseKeeper).
	ReturnKey uint64
}

// Deps are the controller's seams. Nil fields take production defaults.
type Deps struct {
	// Clock provides all time, including queue-timeout and shutdown-grace events. Default clock.RealClock{}.
	Clock clock.WithDelayedExecution
	// Rand draws Retry-After jitter; it is only used under the controller's lock. Default: seeded from the clock.
	Rand *rand.Rand
	// Recorder receives metrics. Default: discards them.
	Recorder Recorder
	// SynchronousTimers runs timer events (queue timeouts, the end of the shutdown grace) inside the clock's callback
	// instead of a new goroutine. Set it only with a clock whose AfterFunc callbacks run without holding a lock the
	// controller's callers need, such as a discrete-event simulation's clock driven from one goroutine; real clocks
	// and k8s.io/utils/clock/testing's FakeClock (which holds its lock while running callbacks) need the default.
	SynchronousTimers bool
	// Replica says the controller is one of several EPP replicas (endpoint ownership, with or without the peer
	// exchange): it turns away, and judges tenants on, only its own part of the traffic.
	Replica bool
}

// Controller decides when each request may proceed to the scheduler. See the package documentation for the
// algorithm, invariants and concurrency model.
type Controller struct {
	// Immutable after New.
	clock    clock.WithDelayedExecution
	recorder Recorder
	// onTimer runs a timer event: in a new goroutine by default, inline with Deps.SynchronousTimers.
	onTimer func(event func())
	// replica: Deps.Replica.
	replica bool

	mu sync.Mutex // guards everything below

	// cfg is the configuration in force; SetConfig replaces it (never modifies it in place).
	cfg *Config

	rng           *rand.Rand
	bands         [NumBands]*bandQueue
	queued        map[string]*item // waiting requests by ID
	totalCount    int64
	totalBytes    int64
	seq           uint64
	endpoints     []endpointState
	endpointIndex map[string]int
	// newestScrapeNs is the newest scrape time among endpoints, Unix nanoseconds (math.MinInt64 when none): the
	// pool has a fresh endpoint, or is down (poolDownLocked), by it alone.
	newestScrapeNs int64
	reservations   map[string]reservation // dispatched requests not yet released, by ID
	drain          drainEstimator
	// criticalArrivals is the rate of valid Critical arrivals and holdTime the smoothed time a request dispatched to a
	// seat-bound endpoint holds its seat there, dispatch to release: what the seat reserve is sized from (seats.go).
	criticalArrivals rateMeter
	holdTime         time.Duration
	// poolSlots is the smallest slot limit learned on any endpoint at the latest scrape (0 when none): what lower
	// bands take for the limit of an endpoint whose own is not known yet, under the Critical reserve (poolSlotsCap).
	poolSlots int
	// hadPeers reports that a peer replica was live at some time (SetPeers): an endpoint that joins this controller's
	// from then on may be one a departed peer owned (endpointState.adopted).
	hadPeers bool
	// poolRunning is the most requests any endpoint was seen running at once, at the latest scrape (0 when none):
	// with live peers, what an endpoint that has not queued yet is taken to run while no slot limit is learned in the
	// pool (seatsLocked).
	poolRunning int
	// demand is what each tenant of each band asks (tenantseats.go), swept when it reaches demandSweepAt entries;
	// underShare caches, for the instant underShareAt, the tenants under their share and their arrival rates, and
	// shareInDoubt the tenants over it only by a seat free rate that leaves out part of the pool (underShareLocked).
	demand        map[tenantKey]*tenantDemand
	demandSweepAt int
	underShare    map[tenantKey]tenantArrivals
	shareInDoubt  map[tenantKey]bool
	underShareAt  time.Time
	rates         map[tenantKey]tenantRates // underShareLocked's scratch (tenantRatesLocked)
	// droppedMissing counts the requests the EPP stopped counting because its scrapes said they were gone.
	droppedMissing int
	// recovery follows, per band, the overload episodes snapshots find it in (no endpoint below its ceiling, or
	// requests of it or a higher band still waiting after dispatch) and the backlog at and above it: what
	// Retry-After predicts the return of its capacity from (see retryEstimateLocked).
	recovery [NumBands]bandRecovery
	// returns books, per band, when the clients it turned away were told to come back (see rejectLocked).
	returns [NumBands]returnLedger
	// unreachableAt is when the waiting requests were last walked for those predicted to start after their deadline
	// (shedUnreachableLocked).
	unreachableAt time.Time
	// load is the trend of the servers' own load (running and waiting, per fresh endpoint, from their scrapes), and
	// loadNow its latest value: a band blocked by saturation alone, with no backlog to watch drain, sees its capacity
	// return in it (loadFallingLocked).
	load    backlogTrend
	loadNow float64
	// promises remembers, per band, when the clients it turned away were told to come back, to recognise their returns
	// (promiseKeeper): in a band that sheds at once, a return on time claims its capacity; in one that queues, a return
	// well before its moment is told the rest of its wait (admitLocked).
	promises [NumBands]promiseKeeper
	// lastCritical is when the latest Critical request arrived; until DrainRateWindow after it the Critical reserve is
	// on (see criticalReserveLocked).
	lastCritical time.Time
	// kvMeanFinal is the smoothed final KV size, in tokens, of the requests dispatched (kvroom.go); 0 before any.
	kvMeanFinal float64
	// peers is what the live EPP replicas of the pool reported (peers.go); zero when alone.
	peers Peers

	// ttlTimer fires at ttlAt, no later than the earliest deadline of a waiting request; ttlGen tells a stale firing
	// from the current one.
	ttlTimer clock.Timer
	ttlAt    time.Time
	ttlGen   uint64

	shuttingDown  bool
	drained       chan struct{} // closed once shutting down and nothing waits
	drainedClosed bool
	graceTimer    clock.Timer
}

// New returns a Controller. A nil cfg means DefaultConfig(); a non-nil one must pass Validate.
func New(cfg *Config, deps Deps) (*Controller, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	} else if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid flow control configuration: %w", err)
	} else {
		cfg = cfg.clone()
	}
	if deps.Clock == nil {
		deps.Clock = clock.RealClock{}
	}
	if deps.Rand == nil {
		deps.Rand = rand.New(rand.NewPCG(uint64(deps.Clock.Now().UnixNano()), 0x5111ce))
	}
	if deps.Recorder == nil {
		deps.Recorder = noopRecorder{}
	}
	c := &Controller{
		cfg:            cfg,
		replica:        deps.Replica,
		clock:          deps.Clock,
		recorder:       deps.Recorder,
		rng:            deps.Rand,
		queued:         make(map[string]*item),
		endpointIndex:  make(map[string]int),
		newestScrapeNs: math.MinInt64,
		reservations:   make(map[string]reservation),
		demand:         make(map[tenantKey]*tenantDemand),
		demandSweepAt:  minTenantSweepAt,
		drain:          newDrainEstimator(cfg.DrainRateWindow),
		onTimer:        func(event func()) { go event() },
	}
	now := deps.Clock.Now()
	c.criticalArrivals = newRateMeter(cfg.DrainRateWindow)
	c.criticalArrivals.advance(now)
	if deps.SynchronousTimers {
		c.onTimer = func(event func()) { event() }
	}
	for i := range c.bands {
		c.bands[i] = newBandQueue()
	}
	return c, nil
}

// Config returns the configuration in force. It must not be modified; SetConfig replaces it rather than changing it.
func (c *Controller) Config() *Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg
}

// SetConfig validates cfg and puts a copy of it in force at once; an invalid cfg is rejected and the configuration in
// force stays. What the new configuration governs:
//
//   - Arrivals from now on: priority mapping, tenant caps and weights, saturation ceilings, RejectWhenSaturated,
//     capacities, displacement, predictive shedding, and Retry-After bounds and jitter.
//   - Requests already waiting keep their admission and their band (a tenant cap or priority mapping that changed
//     does not move them), but they are dispatched by the new ceilings and endpoint thresholds (re-evaluated at once,
//     so a raised ceiling dispatches immediately), and their deadline becomes arrival + their band's new maximum
//     queue time: a request that has already waited longer is answered now (ReasonQueueTimeout, or Unavailable with
//     ReasonNoEndpoints if no endpoint is fresh). A tenant's new weight applies from its next arrival.
//   - Lowered capacities evict nobody: waiting requests beyond them stay queued, and arrivals are refused (or
//     displace, where allowed) until the queue is back under the new limits.
//   - The drain-rate estimate is kept; a new window rescales its history, so the estimate carries over unchanged.
func (c *Controller) SetConfig(cfg *Config) error {
	if cfg == nil {
		return errors.New("flow control configuration must not be nil")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid flow control configuration: %w", err)
	}
	cfg = cfg.clone()

	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	c.cfg = cfg
	c.drain.setWindow(cfg.DrainRateWindow)
	c.criticalArrivals.setWindow(cfg.DrainRateWindow)
	for _, d := range c.demand {
		d.requests.setWindow(cfg.DrainRateWindow)
		d.cost.setWindow(cfg.DrainRateWindow)
	}
	c.underShareAt = time.Time{}
	for i := range c.endpoints {
		c.endpoints[i].refresh(cfg.Endpoint)
	}
	for b, q := range c.bands {
		maxWait := cfg.Bands[b].MaxQueueTime
		for it := q.oldest; it != nil; it = it.bNext {
			it.deadline = it.enqueuedAt.Add(maxWait)
		}
		for _, tq := range q.tenants {
			tq.drain.setWindow(cfg.DrainRateWindow)
		}
	}
	changed := c.dispatchLocked(now) + c.expireLocked(now)
	// The queue-timeout timer may be armed for a deadline that moved later or earlier: re-arm it from scratch.
	if c.ttlTimer != nil {
		c.ttlTimer.Stop()
		c.ttlTimer = nil
	}
	c.endOpLocked(now)
	sample := c.queueSampleLocked(now)
	c.mu.Unlock()
	if changed > 0 {
		c.recorder.RecordQueue(sample)
	}
	return nil
}

// Stats is a point-in-time view of the controller, for tests, debugging and status reporting.
type Stats struct {
	Queued      [NumBands]int
	QueuedBytes [NumBands]int64
	// Reserved is the number of dispatched requests a scrape does not yet show or that have not had their first
	// response chunk; InFlight, the number dispatched and not yet released.
	Reserved, InFlight int
	// DroppedMissing counts the dispatched requests the controller stopped counting, unreleased, because their
	// endpoint's scrapes said they were no longer there.
	DroppedMissing int
	// DrainRate is the estimated drain rate in cost units per second; 0 while unknown.
	DrainRate    float64
	ShuttingDown bool
}

// Stats returns the current state.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{InFlight: len(c.reservations), DroppedMissing: c.droppedMissing, ShuttingDown: c.shuttingDown}
	for _, r := range c.reservations {
		if r.unscraped || r.pending {
			s.Reserved++
		}
	}
	for b, q := range c.bands {
		s.Queued[b] = q.count
		s.QueuedBytes[b] = q.bytes
	}
	s.DrainRate, _ = c.drain.rate()
	return s
}

func (c *Controller) queueSampleLocked(now time.Time) QueueSample {
	var s QueueSample
	for b, q := range c.bands {
		s.Queued[b] = q.count
	}
	s.DrainRate, _ = c.drain.rate()
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	sum, n := 0.0, 0
	for i := range c.endpoints {
		if e := &c.endpoints[i]; e.scrapedNs >= cutoff {
			sum += e.sat
			n++
		}
	}
	s.PoolSaturation = 1
	if n > 0 {
		s.PoolSaturation = sum / float64(n)
	}
	s.StaleEndpoints = len(c.endpoints) - n
	s.Reserved = len(c.reservations)
	return s
}
