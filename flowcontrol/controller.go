package flowcontrol

import (
	"context"
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
	// Streamed says the caller reports the response's first chunk with Started. Until then the dispatched request
	// counts against its endpoint as pending (waiting there or in prefill), scraped or not: a burst of prompts an
	// endpoint has not begun answering lengthens its next steps, which is what delays a first token there. Set it only
	// when the first chunk will be reported; Release ends the count in any case.
	Streamed bool
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
}

// Controller decides when each request may proceed to the scheduler. See the package documentation for the
// algorithm, invariants and concurrency model.
type Controller struct {
	// Immutable after New.
	clock    clock.WithDelayedExecution
	recorder Recorder
	// onTimer runs a timer event: in a new goroutine by default, inline with Deps.SynchronousTimers.
	onTimer func(event func())

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
	reservations  map[string]reservation // dispatched requests still unscraped or pending, by ID
	drain         drainEstimator
	// blockedSince is, per band, since when snapshots have found the band unable to dispatch an arrival at once (no
	// endpoint below its ceiling, or requests of it or a higher band still waiting after dispatch); zero otherwise.
	// Retry-After uses the age of such an episode (see retryEstimateLocked).
	blockedSince [NumBands]time.Time
	// lastCritical is when the latest Critical request arrived; until DrainRateWindow after it the Critical reserve is
	// on (see criticalReserveLocked).
	lastCritical time.Time

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
		cfg:           cfg,
		clock:         deps.Clock,
		recorder:      deps.Recorder,
		rng:           deps.Rand,
		queued:        make(map[string]*item),
		endpointIndex: make(map[string]int),
		reservations:  make(map[string]reservation),
		drain:         newDrainEstimator(cfg.DrainRateWindow),
		onTimer:       func(event func()) { go event() },
	}
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
	for i := range c.endpoints {
		c.endpoints[i].refresh(cfg.Endpoint)
	}
	for b, q := range c.bands {
		maxWait := cfg.Bands[b].MaxQueueTime
		for it := q.oldest; it != nil; it = it.bNext {
			it.deadline = it.enqueuedAt.Add(maxWait)
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

// Admit blocks until the request is dispatched, rejected, found unavailable, or ctx ends, and returns the decision.
// The error is nil exactly when the outcome is Dispatched; otherwise it is an *Error wrapping one of ErrRejected,
// ErrUnavailable or ErrCancelled. A dispatched request holds a reservation on an endpoint until Release, or until a
// scrape taken after it covers it; call Bind once the scheduler has picked the endpoint. If ctx ends just as the
// request is dispatched, Dispatched wins and the caller must still Release it.
func (c *Controller) Admit(ctx context.Context, req Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		c.mu.Lock()
		band, capped, _ := c.bandOf(req)
		c.mu.Unlock()
		d := Decision{Outcome: Cancelled, Reason: ReasonCancelled, Band: band, Capped: capped}
		c.recorder.RecordDecision(req.Tenant, d)
		return d, newError(d, err)
	}

	d, it, cause := c.arrive(req, nil)
	if it != nil {
		d, cause = c.wait(ctx, it)
	}
	c.recorder.RecordDecision(req.Tenant, d)
	return d, admitError(d, cause)
}

// arrive decides req on arrival and records any queue change. A request that must wait comes back as its item;
// prepare, if not nil, runs on that item before the lock is released, so no other call can decide it first.
func (c *Controller) arrive(req Request, prepare func(*item)) (Decision, *item, error) {
	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	d, it, changed, cause := c.admitLocked(req, now)
	if it != nil && prepare != nil {
		prepare(it)
	}
	var sample QueueSample
	if changed {
		c.endOpLocked(now)
		sample = c.queueSampleLocked(now)
	}
	c.mu.Unlock()
	if changed {
		c.recorder.RecordQueue(sample)
	}
	return d, it, cause
}

// withdrawLocked answers the waiting request it Cancelled with cause, and returns the queue sample to record once the
// lock is released.
func (c *Controller) withdrawLocked(it *item, cause error) QueueSample {
	now := c.clock.Now()
	c.drain.advance(now)
	c.removeQueuedLocked(it)
	c.finalizeLocked(it, Decision{Outcome: Cancelled, Reason: ReasonCancelled, Band: it.band, Capped: it.capped,
		Waited: now.Sub(it.enqueuedAt)}, cause)
	c.endOpLocked(now)
	return c.queueSampleLocked(now)
}

// wait blocks until it is finalized, removing it from its queue if ctx ends first.
func (c *Controller) wait(ctx context.Context, it *item) (Decision, error) {
	select {
	case <-it.done:
	case <-ctx.Done():
		c.mu.Lock()
		if !it.finalized {
			sample := c.withdrawLocked(it, ctx.Err())
			c.mu.Unlock()
			c.recorder.RecordQueue(sample)
		} else {
			c.mu.Unlock()
		}
		<-it.done
	}
	return it.decision, it.cause
}

// admitLocked decides an arrival. It returns either a final decision, or the queued item to wait on. changed reports
// whether queues changed (an enqueue or a displacement); the fast path changes none.
func (c *Controller) admitLocked(req Request, now time.Time) (d Decision, it *item, changed bool, cause error) {
	band, capped, weight := c.bandOf(req)
	d = Decision{Band: band, Capped: capped}
	if band == Critical {
		c.lastCritical = now
		if c.totalCount > 0 {
			// The reserve now ends later; its end may dispatch what waits, so a timer must be there to see it.
			c.armTTLTimerLocked(now)
		}
	}
	if cause = c.validateLocked(req); cause != nil {
		d.Outcome, d.Reason = Rejected, ReasonInvalidRequest
		return d, nil, false, cause
	}
	if c.shuttingDown {
		c.unavailableLocked(&d, ReasonShuttingDown)
		return d, nil, false, nil
	}
	fresh, best, burst := c.headroomLocked(band, now)
	if fresh == 0 {
		c.unavailableLocked(&d, ReasonNoEndpoints)
		return d, nil, false, nil
	}
	cost := costOf(req)
	if best >= 0 && c.queuedAtOrAbove(band) == 0 {
		// Fast path: headroom and nobody ahead.
		d.Outcome, d.Burst = Dispatched, burst
		d.Endpoints = c.endpointsWithHeadroomLocked(band, burst, now)
		c.reserveLocked(req.ID, req.Streamed, best, now)
		if c.totalCount > 0 {
			c.drain.add(cost)
		}
		return d, nil, false, nil
	}

	bc := &c.cfg.Bands[band]
	if bc.RejectWhenSaturated {
		c.rejectLocked(&d, ReasonSaturated, c.retryEstimateLocked(band, cost, now))
		return d, nil, false, nil
	}
	if wait, known := c.estimatedWaitLocked(band, req.Tenant, weight, cost); known && wait > bc.MaxQueueTime {
		c.rejectLocked(&d, ReasonPredictedWait, wait)
		return d, nil, false, nil
	}
	victims, fits := c.makeRoomLocked(band, req.Bytes)
	if !fits {
		c.rejectLocked(&d, ReasonQueueFull, c.retryEstimateLocked(band, cost, now))
		return d, nil, false, nil
	}
	for _, v := range victims {
		c.removeQueuedLocked(v)
		vd := Decision{Band: v.band, Capped: v.capped, Waited: now.Sub(v.enqueuedAt)}
		c.rejectLocked(&vd, ReasonDisplaced, c.retryEstimateLocked(v.band, v.cost, now))
		c.finalizeLocked(v, vd, nil)
	}

	c.seq++
	it = &item{
		id: req.ID, tenant: req.Tenant, band: band, capped: capped, cost: cost, bytes: req.Bytes, streamed: req.Streamed, seq: c.seq,
		enqueuedAt: now, deadline: now.Add(bc.MaxQueueTime), done: make(chan struct{}),
	}
	c.bands[band].push(it, weight)
	c.queued[req.ID] = it
	c.totalCount++
	c.totalBytes += req.Bytes
	return d, it, true, nil
}

func (c *Controller) validateLocked(req Request) error {
	if req.ID == "" {
		return errors.New("request ID must not be empty")
	}
	if req.Bytes < 0 {
		return fmt.Errorf("request %q: byte size must not be negative, got %d", req.ID, req.Bytes)
	}
	if _, dup := c.queued[req.ID]; dup {
		return fmt.Errorf("request ID %q is already waiting for admission", req.ID)
	}
	if _, dup := c.reservations[req.ID]; dup {
		return fmt.Errorf("request ID %q is already dispatched and not yet released", req.ID)
	}
	return nil
}

// bandOf (called with the lock held) maps the request's priority to a band, applies its tenant's cap and returns the tenant's weight.
func (c *Controller) bandOf(req Request) (band Band, capped bool, weight float64) {
	band = c.cfg.BandFor(req.Priority)
	pol := c.cfg.tenantPolicy(req.Tenant)
	if band.higherThan(pol.MaxBand) {
		return pol.MaxBand, true, pol.Weight
	}
	return band, false, pol.Weight
}

func costOf(req Request) float64 {
	if req.EstimatedCost == 0 {
		return 1
	}
	return float64(req.EstimatedCost)
}

func (c *Controller) queuedAtOrAbove(band Band) int {
	n := 0
	for b := Critical; b <= band; b++ {
		n += c.bands[b].count
	}
	return n
}

// headroomLocked returns the number of endpoints with fresh metrics and the index of the least saturated one with
// headroom for band (-1 if none): in the normal tier or, when no endpoint has headroom there, in the burst tier (then
// burst is true).
func (c *Controller) headroomLocked(band Band, now time.Time) (fresh, best int, burst bool) {
	ceiling := c.cfg.Bands[band].SaturationCeiling
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	reserve := c.criticalReserveLocked(now)
	tier := c.burstTierLocked(band, reserve)
	best, bestBurst := -1, -1
	var bestSat, burstSat float64
	for i := range c.endpoints {
		e := &c.endpoints[i]
		if e.scrapedNs < cutoff {
			continue
		}
		fresh++
		if sat := e.saturationFor(reserve); sat < ceiling && (best < 0 || sat < bestSat) {
			best, bestSat = i, sat
		}
		if sat := e.satBurst; tier && sat < ceiling && (bestBurst < 0 || sat < burstSat) {
			bestBurst, burstSat = i, sat
		}
	}
	if best < 0 && bestBurst >= 0 {
		return fresh, bestBurst, true
	}
	return fresh, best, false
}

// criticalReserveLocked reports whether the Critical reserve is on: while Critical traffic is active (a Critical
// request arrived within the drain-rate window) there is no burst tier, the pending count cap applies, and only
// Critical may exceed headroom for prefix affinity (see APIEndpointThresholds).
func (c *Controller) criticalReserveLocked(now time.Time) bool {
	return !c.lastCritical.IsZero() && now.Sub(c.lastCritical) < c.cfg.DrainRateWindow
}

// burstTierLocked reports whether band may use the burst tier: it is configured, the Critical reserve is off, and the
// band queues when saturated (a band that is shed when saturated, Sheddable by default, must not fill the batches the
// bands above it drain into).
func (c *Controller) burstTierLocked(band Band, reserve bool) bool {
	return !reserve && c.cfg.Endpoint.BurstQueueDepth > 0 && !c.cfg.Bands[band].RejectWhenSaturated
}

// endpointsWithHeadroomLocked lists the fresh endpoints below band's ceiling in the tier headroomLocked picked (burst
// as it reported), in snapshot order.
func (c *Controller) endpointsWithHeadroomLocked(band Band, burst bool, now time.Time) []string {
	ceiling := c.cfg.Bands[band].SaturationCeiling
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	reserve := c.criticalReserveLocked(now)
	has := func(e *endpointState) bool {
		sat := e.saturationFor(reserve)
		if burst {
			sat = e.satBurst
		}
		return e.scrapedNs >= cutoff && sat < ceiling
	}
	n := 0
	for i := range c.endpoints {
		if has(&c.endpoints[i]) {
			n++
		}
	}
	names := make([]string, 0, n)
	for i := range c.endpoints {
		if e := &c.endpoints[i]; has(e) {
			names = append(names, e.Name)
		}
	}
	return names
}

func (c *Controller) freshCountLocked(now time.Time) int {
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	n := 0
	for i := range c.endpoints {
		if c.endpoints[i].scrapedNs >= cutoff {
			n++
		}
	}
	return n
}

// reserveLocked counts a dispatched request against endpoint i until a scrape covers it and, if streamed, it has
// started, or until it is released.
func (c *Controller) reserveLocked(id string, streamed bool, i int, now time.Time) {
	r := reservation{endpoint: c.endpoints[i].Name, at: now, ahead: c.endpoints[i].pending, unscraped: true, pending: streamed}
	c.endpoints[i].add(&r, c.cfg.Endpoint)
	c.reservations[id] = r
}

// estimatedWaitLocked predicts how long a new request would wait: the cost ahead of it (higher bands' backlog plus
// its fair position in its own band, plus itself) over the drain rate. known is false while the rate is unknown.
func (c *Controller) estimatedWaitLocked(band Band, tenant string, weight, cost float64) (wait time.Duration, known bool) {
	rate, ok := c.drain.rate()
	if !ok {
		return 0, false
	}
	ahead := c.bands[band].costAhead(tenant, weight) + cost
	for b := Critical; b < band; b++ {
		ahead += c.bands[b].cost
	}
	return secondsToDuration(ahead / rate), true
}

// timeUntilAdmitLocked estimates when band would admit again: its backlog and the backlog of higher bands, plus
// cost, over the drain rate. Unknown rate: the band's minimum if nothing waits, else its maximum.
func (c *Controller) timeUntilAdmitLocked(band Band, cost float64) time.Duration {
	backlog := 0.0
	for b := Critical; b <= band; b++ {
		backlog += c.bands[b].cost
	}
	rate, ok := c.drain.rate()
	switch {
	case ok:
		return secondsToDuration((backlog + cost) / rate)
	case backlog == 0:
		return c.cfg.Bands[band].RetryAfterMin
	default:
		return c.cfg.Bands[band].RetryAfterMax
	}
}

// retryEstimateLocked is the Retry-After estimate for a request of band turned away at now: the larger of
// timeUntilAdmitLocked (the backlog ahead over the drain rate) and the age of the band's current saturation episode.
// The backlog alone is blind to arrivals that keep the pool saturated: under a sustained burst a band that rejects
// when saturated (Sheddable) has no backlog at all, and clients told "1s" would come back into the same burst and be
// shed again. An overload that has lasted d is expected to last about d more (the Lindy heuristic for episodes
// whose length is unknown), so clients are spread over the episode's likely end instead of hammering it.
func (c *Controller) retryEstimateLocked(band Band, cost float64, now time.Time) time.Duration {
	estimate := c.timeUntilAdmitLocked(band, cost)
	if since := c.blockedSince[band]; !since.IsZero() {
		estimate = max(estimate, now.Sub(since))
	}
	return estimate
}

// trackBlockedLocked records, per band, whether an arrival of it would be dispatched at once after the current
// snapshot's dispatches.
func (c *Controller) trackBlockedLocked(now time.Time) {
	for _, b := range allBands {
		if _, best, _ := c.headroomLocked(b, now); best >= 0 && c.queuedAtOrAbove(b) == 0 {
			c.blockedSince[b] = time.Time{}
		} else if c.blockedSince[b].IsZero() {
			c.blockedSince[b] = now
		}
	}
}

func (c *Controller) rejectLocked(d *Decision, reason Reason, estimate time.Duration) {
	bc := &c.cfg.Bands[d.Band]
	d.Outcome, d.Reason = Rejected, reason
	d.RetryAfter = retryAfter(estimate, bc.RetryAfterMin, bc.RetryAfterMax, c.cfg.RetryAfterJitter, c.rng.Float64())
}

// unavailableLocked answers 503: there is no backlog to estimate from, so Retry-After is the band's minimum, jittered.
func (c *Controller) unavailableLocked(d *Decision, reason Reason) {
	bc := &c.cfg.Bands[d.Band]
	d.Outcome, d.Reason = Unavailable, reason
	d.RetryAfter = retryAfter(bc.RetryAfterMin, bc.RetryAfterMin, bc.RetryAfterMax, c.cfg.RetryAfterJitter, c.rng.Float64())
}

// makeRoomLocked checks capacity for an arrival in band of size bytes. If only the controller-wide limits are hit and
// the band may displace, it returns the victims to evict: newest first from the lowest non-empty lower band upwards.
// Nothing is evicted unless enough room can be made.
func (c *Controller) makeRoomLocked(band Band, bytes int64) (victims []*item, fits bool) {
	bc := &c.cfg.Bands[band]
	q := c.bands[band]
	if int64(q.count)+1 > bc.MaxQueuedRequests || q.bytes+bytes > bc.MaxQueuedBytes || bytes > c.cfg.MaxQueuedBytes {
		return nil, false
	}
	needReq := c.totalCount + 1 - c.cfg.MaxQueuedRequests
	needBytes := c.totalBytes + bytes - c.cfg.MaxQueuedBytes
	if needReq <= 0 && needBytes <= 0 {
		return nil, true
	}
	if !bc.MayDisplace {
		return nil, false
	}
	for lower := Band(NumBands - 1); lower > band; lower-- {
		for v := c.bands[lower].newest; v != nil && (needReq > 0 || needBytes > 0); v = v.bPrev {
			victims = append(victims, v)
			needReq--
			needBytes -= v.bytes
		}
	}
	if needReq > 0 || needBytes > 0 {
		return nil, false
	}
	return victims, true
}

// removeQueuedLocked takes a waiting item out of all queue state.
func (c *Controller) removeQueuedLocked(it *item) {
	c.bands[it.band].remove(it)
	c.dequeuedLocked(it)
}

func (c *Controller) dequeuedLocked(it *item) {
	delete(c.queued, it.id)
	c.totalCount--
	c.totalBytes -= it.bytes
}

// finalizeLocked sets it's decision and wakes its Admit call, or calls its Submit callback. Finalizing twice is a bug
// that would answer a request twice, so it panics.
func (c *Controller) finalizeLocked(it *item, d Decision, cause error) {
	if it.finalized {
		panic(fmt.Sprintf("flowcontrol: request %q finalized twice (had %s, now %s)", it.id, it.decision.Outcome, d.Outcome))
	}
	it.finalized, it.decision, it.cause = true, d, cause
	close(it.done)
	if it.decided != nil {
		it.decided(d, cause)
	}
}

// dispatchLocked dispatches waiting requests in order while endpoints have headroom: bands strictly by priority,
// fair within a band. A band without headroom passes to the next: a lower band's ceiling is no higher, so it has
// none either, unless it may use the burst tier and the band above may not (a band that rejects when saturated keeps
// only what waited before a policy change made it so). It returns the number dispatched.
func (c *Controller) dispatchLocked(now time.Time) int {
	n := 0
	for _, b := range allBands {
		q := c.bands[b]
		for q.count > 0 {
			_, best, burst := c.headroomLocked(b, now)
			if best < 0 {
				break
			}
			names := c.endpointsWithHeadroomLocked(b, burst, now)
			it := q.pop()
			c.dequeuedLocked(it)
			c.reserveLocked(it.id, it.streamed, best, now)
			c.drain.add(it.cost)
			c.finalizeLocked(it, Decision{Outcome: Dispatched, Band: b, Capped: it.capped, Endpoints: names,
				Waited: now.Sub(it.enqueuedAt), Burst: burst}, nil)
			n++
		}
	}
	return n
}

// expireLocked answers every request whose maximum queue time has passed: Unavailable if no endpoint is fresh (the
// pool, not the load, is the problem), Rejected with ReasonQueueTimeout otherwise.
func (c *Controller) expireLocked(now time.Time) int {
	n := 0
	noEndpoints := c.freshCountLocked(now) == 0
	for _, b := range allBands {
		q := c.bands[b]
		for q.oldest != nil && !q.oldest.deadline.After(now) {
			it := q.oldest
			c.removeQueuedLocked(it)
			d := Decision{Band: it.band, Capped: it.capped, Waited: now.Sub(it.enqueuedAt)}
			if noEndpoints {
				c.unavailableLocked(&d, ReasonNoEndpoints)
			} else {
				c.rejectLocked(&d, ReasonQueueTimeout, c.retryEstimateLocked(b, it.cost, now))
			}
			c.finalizeLocked(it, d, nil)
			n++
		}
	}
	return n
}

// endOpLocked restores the bookkeeping every state change must leave consistent: the drain estimator's backlog
// flag, the queue-timeout timer, and the shutdown signal.
func (c *Controller) endOpLocked(now time.Time) {
	c.drain.setBacklogged(c.totalCount > 0)
	c.armTTLTimerLocked(now)
	if c.shuttingDown && !c.drainedClosed && c.totalCount == 0 {
		c.drainedClosed = true
		close(c.drained)
		if c.graceTimer != nil {
			c.graceTimer.Stop()
			c.graceTimer = nil
		}
	}
}

// armTTLTimerLocked makes sure a timer fires no later than the earliest deadline of a waiting request and, while
// requests wait under the Critical reserve, its end (which may give them headroom). Deadlines in a band follow arrival
// order, so the earliest is among the bands' oldest items. A timer that fires early (its request left) simply re-arms.
func (c *Controller) armTTLTimerLocked(now time.Time) {
	var earliest time.Time
	for _, q := range c.bands {
		if o := q.oldest; o != nil && (earliest.IsZero() || o.deadline.Before(earliest)) {
			earliest = o.deadline
		}
	}
	if c.totalCount > 0 && c.criticalReserveLocked(now) {
		if end := c.lastCritical.Add(c.cfg.DrainRateWindow); earliest.IsZero() || end.Before(earliest) {
			earliest = end
		}
	}
	if earliest.IsZero() {
		if c.ttlTimer != nil {
			c.ttlTimer.Stop()
			c.ttlTimer = nil
		}
		return
	}
	if c.ttlTimer != nil && !c.ttlAt.After(earliest) {
		return
	}
	if c.ttlTimer != nil {
		c.ttlTimer.Stop()
	}
	c.ttlGen++
	gen := c.ttlGen
	c.ttlAt = earliest
	// By default the callback only starts a goroutine: fake clocks run callbacks while holding their own lock, and
	// onTTLTimer reads the clock.
	c.ttlTimer = c.clock.AfterFunc(earliest.Sub(now), func() { c.onTimer(func() { c.onTTLTimer(gen) }) })
}

func (c *Controller) onTTLTimer(gen uint64) {
	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	if gen == c.ttlGen {
		c.ttlTimer = nil
	}
	n := c.dispatchLocked(now) + c.expireLocked(now)
	c.endOpLocked(now)
	sample := c.queueSampleLocked(now)
	c.mu.Unlock()
	if n > 0 {
		c.recorder.RecordQueue(sample)
	}
}

// UpdateEndpoints replaces the pool snapshot after a scrape. Requests dispatched to an endpoint before its scrape stop
// counting as unscraped, since the scrape counts them itself (they stay pending until Started); reservations on
// endpoints no longer in the pool are dropped. Waiting requests are then dispatched onto any endpoint with headroom. Invalid entries (empty or duplicate names, negative counts,
// KV usage outside [0, 1]) are left out, and reported in the returned error; the rest of the snapshot applies.
func (c *Controller) UpdateEndpoints(eps []Endpoint) error {
	var errs []error
	states := make([]endpointState, 0, len(eps))
	index := make(map[string]int, len(eps))
	for i, e := range eps {
		switch {
		case e.Name == "":
			errs = append(errs, fmt.Errorf("endpoints[%d]: name must not be empty", i))
		case e.WaitingQueue < 0 || e.Running < 0:
			errs = append(errs, fmt.Errorf("endpoint %q: negative queue (%d) or running (%d)", e.Name, e.WaitingQueue, e.Running))
		case !(e.KVCacheUsage >= 0 && e.KVCacheUsage <= 1):
			errs = append(errs, fmt.Errorf("endpoint %q: KV cache usage %v is outside [0, 1]", e.Name, e.KVCacheUsage))
		default:
			if _, dup := index[e.Name]; dup {
				errs = append(errs, fmt.Errorf("endpoint %q appears twice; keeping the first", e.Name))
				continue
			}
			index[e.Name] = len(states)
			states = append(states, newEndpointState(e))
		}
	}

	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	for id, r := range c.reservations {
		i, ok := index[r.endpoint]
		if ok && r.at.Before(states[i].ScrapedAt) {
			r.unscraped = false
			c.reservations[id] = r
		}
		if !ok || !r.unscraped && !r.pending {
			delete(c.reservations, id)
			continue
		}
		states[i].tally(r, +1)
	}
	for i := range states {
		if j, ok := c.endpointIndex[states[i].Name]; ok {
			states[i].firstChunk = c.endpoints[j].firstChunk
			states[i].pendingDoneNs = c.endpoints[j].pendingDoneNs
		}
		states[i].refresh(c.cfg.Endpoint)
	}
	c.endpoints, c.endpointIndex = states, index
	c.dispatchLocked(now)
	c.trackBlockedLocked(now)
	c.endOpLocked(now)
	sample := c.queueSampleLocked(now)
	c.mu.Unlock()
	c.recorder.RecordQueue(sample)
	return errors.Join(errs...)
}

// Bind moves a dispatched request's reservation to the endpoint the scheduler picked (the controller provisionally
// reserved its least saturated endpoint with headroom). It reports whether the request still held a reservation.
func (c *Controller) Bind(id, endpoint string) bool {
	c.mu.Lock()
	r, ok := c.reservations[id]
	if !ok {
		c.mu.Unlock()
		return false
	}
	now := c.clock.Now()
	c.drain.advance(now)
	c.unreserveLocked(r)
	r.endpoint, r.at, r.ahead, r.unscraped = endpoint, now, 0, true
	if i, ok := c.endpointIndex[endpoint]; ok {
		r.ahead = c.endpoints[i].pending
		c.endpoints[i].add(&r, c.cfg.Endpoint)
	}
	c.reservations[id] = r
	c.afterFreedLocked(now) // unlocks
	return true
}

// Started reports a streamed request's first response chunk: its endpoint has begun answering it, so it no longer
// counts there as pending. It reports whether the request was pending; a request that was not (not Streamed,
// already started or released) is left alone.
func (c *Controller) Started(id string) bool {
	c.mu.Lock()
	r, ok := c.reservations[id]
	if !ok || !r.pending {
		c.mu.Unlock()
		return false
	}
	now := c.clock.Now()
	started := r
	started.pending, started.started = false, true
	if i, ok := c.endpointIndex[r.endpoint]; ok {
		e := &c.endpoints[i]
		e.tally(r, -1)
		if started.unscraped {
			e.tally(started, +1)
		}
		e.learnFirstChunk(now.Sub(r.at) / time.Duration(r.ahead+1))
		e.refresh(c.cfg.Endpoint)
	}
	if started.unscraped {
		c.reservations[id] = started
	} else {
		delete(c.reservations, id)
	}
	c.drain.advance(now)
	c.afterFreedLocked(now) // unlocks
	return true
}

// Release ends a dispatched request's reservation (the request finished or failed before reaching its endpoint).
// It reports whether the request still held one; after a covering scrape it does not, and that is not an error.
func (c *Controller) Release(id string) bool {
	c.mu.Lock()
	r, ok := c.reservations[id]
	if !ok {
		c.mu.Unlock()
		return false
	}
	delete(c.reservations, id)
	c.unreserveLocked(r)
	if c.totalCount == 0 {
		c.mu.Unlock()
		return true
	}
	now := c.clock.Now()
	c.drain.advance(now)
	c.afterFreedLocked(now) // unlocks
	return true
}

func (c *Controller) unreserveLocked(r reservation) {
	if i, ok := c.endpointIndex[r.endpoint]; ok {
		c.endpoints[i].remove(r, c.cfg.Endpoint)
	}
}

// afterFreedLocked dispatches onto headroom a reservation change may have freed, then unlocks and reports metrics.
func (c *Controller) afterFreedLocked(now time.Time) {
	n := c.dispatchLocked(now)
	var sample QueueSample
	if n > 0 {
		c.endOpLocked(now)
		sample = c.queueSampleLocked(now)
	}
	c.mu.Unlock()
	if n > 0 {
		c.recorder.RecordQueue(sample)
	}
}

// Shutdown stops admission: new arrivals are answered Unavailable (ReasonShuttingDown) at once. Waiting requests are
// still dispatched as headroom appears, for up to grace (measured on the controller's clock); those left then are
// answered Unavailable. The returned channel is closed when no request waits any more. Calling Shutdown again
// returns the same channel and does not change the grace period.
func (c *Controller) Shutdown(grace time.Duration) <-chan struct{} {
	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	if !c.shuttingDown {
		c.shuttingDown = true
		c.drained = make(chan struct{})
		if grace <= 0 {
			c.flushLocked(now)
		} else if c.totalCount > 0 {
			c.graceTimer = c.clock.AfterFunc(grace, func() { c.onTimer(c.onGraceTimer) })
		}
		c.endOpLocked(now)
	}
	ch := c.drained
	c.mu.Unlock()
	return ch
}

func (c *Controller) onGraceTimer() {
	c.mu.Lock()
	now := c.clock.Now()
	c.drain.advance(now)
	c.graceTimer = nil
	c.flushLocked(now)
	c.endOpLocked(now)
	sample := c.queueSampleLocked(now)
	c.mu.Unlock()
	c.recorder.RecordQueue(sample)
}

// flushLocked answers every waiting request Unavailable (ReasonShuttingDown).
func (c *Controller) flushLocked(now time.Time) {
	for _, q := range c.bands {
		for q.oldest != nil {
			it := q.oldest
			c.removeQueuedLocked(it)
			d := Decision{Band: it.band, Capped: it.capped, Waited: now.Sub(it.enqueuedAt)}
			c.unavailableLocked(&d, ReasonShuttingDown)
			c.finalizeLocked(it, d, nil)
		}
	}
}

// Stats is a point-in-time view of the controller, for tests, debugging and status reporting.
type Stats struct {
	Queued      [NumBands]int
	QueuedBytes [NumBands]int64
	// Reserved is the number of dispatched requests still counted against an endpoint.
	Reserved int
	// DrainRate is the estimated drain rate in cost units per second; 0 while unknown.
	DrainRate    float64
	ShuttingDown bool
}

// MayExceedHeadroom reports whether a request dispatched in band may still be placed on the named endpoint, which had
// no headroom for the band, when the endpoint holds much of its prompt (the headroom filter's prefix-affinity
// exception): the endpoint's metrics must be fresh, the band must queue when saturated (a holdback band, which
// rejects instead, keeps to its ceiling), and while the Critical reserve is active (any Critical request within the
// drain-rate window, whatever the thresholds) only Critical may exceed it, so the reserve keeps its places.
func (c *Controller) MayExceedHeadroom(band Band, name string) bool {
	if band >= NumBands {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	i, ok := c.endpointIndex[name]
	if !ok || c.endpoints[i].scrapedNs < freshCutoff(now, c.cfg.Endpoint.MetricsStaleness) {
		return false
	}
	if c.cfg.Bands[band].RejectWhenSaturated {
		return false
	}
	return band == Critical || !c.criticalReserveLocked(now)
}

// Saturations writes into out the current load of each named endpoint, for schedulers to rank endpoints by load
// fresher than any scrape: its saturation from its latest snapshot plus the requests dispatched to it since that
// have not had their first response chunk (a started one runs there, no longer waits), and, while it has streamed
// prompts it has not begun answering, 1 plus the time a new prompt would take there to its first chunk over the
// pending time threshold if that is more (one pending prompt is enough to delay a new prompt's first token there;
// among busy endpoints the one where a new prompt would start first ranks lowest; endpointState.rankAt). The
// request being scheduled, self, does not count: the controller provisionally reserved it on an endpoint, which must
// not make that endpoint look busier to its own scheduling. An endpoint the controller does not know, or whose
// metrics are stale, reads as +Inf: never preferred.
func (c *Controller) Saturations(self string, names []string, out []float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	nowNs := now.UnixNano()
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	own, hasOwn := c.reservations[self]
	for i, name := range names {
		out[i] = math.Inf(1)
		j, ok := c.endpointIndex[name]
		if !ok || c.endpoints[j].scrapedNs < cutoff {
			continue
		}
		if hasOwn && own.endpoint == name {
			e := c.endpoints[j]
			e.remove(own, c.cfg.Endpoint)
			out[i] = e.rankAt(nowNs, c.cfg.Endpoint)
			continue
		}
		out[i] = c.endpoints[j].rankAt(nowNs, c.cfg.Endpoint)
	}
}

// Stats returns the current state.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Reserved: len(c.reservations), ShuttingDown: c.shuttingDown}
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
	return s
}
