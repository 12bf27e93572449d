package flowcontrol

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Admit blocks until the request is dispatched, rejected, found unavailable, or ctx ends, and returns the decision.
// The error is nil exactly when the outcome is Dispatched; otherwise it is an *Error wrapping one of ErrRejected,
// ErrUnavailable or ErrCancelled. A dispatched request holds a reservation on an endpoint until Release, or until a
// scrape taken after it covers it; call Bind once the scheduler has picked the endpoint. If ctx ends just as the
// request is dispatched, Dispatched wins and the caller must still Release it.
func (c *Controller) Admit(ctx context.Context, req Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		c.mu.Lock()
		band, capped, _ := c.bandOfLocked(req)
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
	// An arrival changes its band's and tenant's demand, and with it which tenants are under their share and the
	// seats kept for them: requests already waiting may have headroom now.
	if c.dispatchLocked(now) > 0 {
		changed = true
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

// withdrawLocked answers the waiting request it Cancelled with cause, and returns the queue sample to record once the
// lock is released.
func (c *Controller) withdrawLocked(it *item, cause error) QueueSample {
	now := c.clock.Now()
	c.drain.advance(now)
	c.removeQueuedLocked(it, now)
	c.finalizeLocked(it, Decision{Outcome: Cancelled, Reason: ReasonCancelled, Band: it.band, Capped: it.capped,
		Waited: now.Sub(it.enqueuedAt)}, cause)
	c.dispatchLocked(now) // its tenant's demand fell: the seats kept for it may now be free for others
	c.endOpLocked(now)
	return c.queueSampleLocked(now)
}

// admitLocked decides an arrival. It returns either a final decision, or the queued item to wait on. changed reports
// whether queues changed (an enqueue or a displacement); the fast path changes none.
func (c *Controller) admitLocked(req Request, now time.Time) (d Decision, it *item, changed bool, cause error) {
	band, capped, weight := c.bandOfLocked(req)
	d = Decision{Band: band, Capped: capped}
	if cause = c.validateLocked(req); cause != nil {
		d.Outcome, d.Reason = Rejected, ReasonInvalidRequest
		return d, nil, false, cause
	}
	if capped && c.cfg.AboveMaxBand == CapReject {
		asked := c.cfg.BandFor(req.Priority)
		d = Decision{Outcome: Rejected, Reason: ReasonBandNotAllowed, Band: asked}
		return d, nil, false, &BandNotAllowedError{Tenant: req.Tenant, Band: asked, MaxBand: band}
	}
	cost := costOf(req)
	c.noteArrivalLocked(band, req.Tenant, weight, cost, now)
	if band == Critical {
		// A valid Critical arrival is Critical traffic, whatever its outcome: the reserve is on (or extended).
		c.lastCritical = now
		c.criticalArrivals.add(now, 1)
		if c.totalCount > 0 {
			// The reserve now ends later; its end may dispatch what waits, so a timer must be there to see it.
			c.armTTLTimerLocked(now)
		}
	}
	if c.shuttingDown {
		c.unavailableLocked(&d, ReasonShuttingDown)
		return d, nil, false, nil
	}
	fresh, best, burst := c.headroomLocked(band, req.Tenant, now)
	bc := &c.cfg.Bands[band]
	if fresh == 0 && (bc.RejectWhenSaturated || c.poolDownLocked(now)) {
		// A band that queues waits out metrics that are late (poolDownLocked); one shed when saturated cannot tell.
		c.unavailableLocked(&d, ReasonNoEndpoints)
		return d, nil, false, nil
	}
	// A band that sheds at once queues only the returns it promised capacity to, once the overload that turned them
	// away is over (under one, the band is what keeps the load off the others); a promise is used up on arrival.
	returning := bc.RejectWhenSaturated && c.promises[band].claim(req.ReturnKey, now, promiseTTL(bc)) &&
		c.recoveringLocked(band, now)
	size := sizeOf(req)
	if best >= 0 && c.nobodyAheadLocked(band, req.Tenant, now) {
		names := c.endpointsWithHeadroomLocked(band, req.Tenant, burst, now)
		if !c.kvWaitsForRoomLocked(band, req.Tenant, size, names, now) {
			// Fast path: headroom and nobody ahead.
			d.Outcome, d.Burst = Dispatched, burst
			best, d.Endpoints = c.kvPlaceLocked(band, req.Tenant, size, best, names, now)
			d.Reserved = c.reserveLocked(req.ID, req.Streamed, size, best, now)
			if c.totalCount > 0 {
				c.drain.add(cost)
			}
			return d, nil, false, nil
		}
	}

	// A band that queues tells a client it turned away when its capacity is expected (Retry-After, booked in its
	// ledger of returns). A client that comes back well before that, and would wait, is told the rest of its wait
	// rather than queued: the capacity before its moment is what was promised to the returns booked earlier and to
	// new arrivals, and a queue of such early returns is what an overload's end leaves waiting (testbed/bench/
	// scenarios/README.md, "Early returns told the rest of their wait"). A tenant under its share dispatches first,
	// so its return is let wait as a fresh arrival. Not at one of several replicas (Deps.Replica): a replica knows only
	// the returns it turned away itself, and judges a tenant's share on its own dispatches, so at moments it refused a
	// light tenant's return that would have started at once. Not for Critical, which is shed only by its own
	// predicted wait (keepsEarlyPromises).
	if c.keepsEarlyPromises(band) && !c.isUnderShareLocked(band, req.Tenant, now) {
		if left := c.promises[band].early(req.ReturnKey, now); left > 0 {
			c.earlyReturnLocked(&d, left)
			return d, nil, false, nil
		}
	}
	if bc.RejectWhenSaturated && !returning {
		c.rejectLocked(&d, ReasonSaturated, c.retryEstimateLocked(band, cost, now), cost, req.ReturnKey, now)
		return d, nil, false, nil
	}
	if wait, known := c.estimatedWaitLocked(band, req.Tenant, weight, cost, now); known && wait > c.maxQueueTimeLocked(band, req.Tenant, now) {
		c.rejectLocked(&d, ReasonPredictedWait, wait, cost, req.ReturnKey, now)
		return d, nil, false, nil
	}
	victims, fits := c.makeRoomLocked(band, req.Bytes)
	if !fits {
		c.rejectLocked(&d, ReasonQueueFull, c.retryEstimateLocked(band, cost, now), cost, req.ReturnKey, now)
		return d, nil, false, nil
	}
	for _, v := range victims {
		c.removeQueuedLocked(v, now)
		vd := Decision{Band: v.band, Capped: v.capped, Waited: now.Sub(v.enqueuedAt)}
		c.rejectLocked(&vd, ReasonDisplaced, c.retryEstimateLocked(v.band, v.cost, now), v.cost, v.returnKey, now)
		c.finalizeLocked(v, vd, nil)
	}

	c.seq++
	it = &item{
		id: req.ID, tenant: req.Tenant, band: band, capped: capped, cost: cost, size: size, bytes: req.Bytes, streamed: req.Streamed, seq: c.seq,
		returnKey:  req.ReturnKey,
		enqueuedAt: now, deadline: now.Add(bc.MaxQueueTime), done: make(chan struct{}),
		underShare: c.isUnderShareLocked(band, req.Tenant, now),
	}
	c.bands[band].push(it, weight)
	c.tenantEnqueuedLocked(it.tq, now)
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

// bandOfLocked maps the request's priority to a band, applies its tenant's cap (capped: the band was lowered to it)
// and returns the tenant's weight.
func (c *Controller) bandOfLocked(req Request) (band Band, capped bool, weight float64) {
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

// nobodyAheadLocked reports whether a new request of tenant in band would be the next to dispatch: nothing waits in a
// higher band, and nothing in its own, or nothing of its own while it is under its share (those dispatch first).
func (c *Controller) nobodyAheadLocked(band Band, tenant string, now time.Time) bool {
	if c.queuedAtOrAboveLocked(band) == 0 {
		return true
	}
	if band > Critical && c.queuedAtOrAboveLocked(band-1) > 0 {
		return false
	}
	if tq := c.bands[band].tenants[tenant]; tq != nil && tq.n > 0 {
		return false
	}
	return c.isUnderShareLocked(band, tenant, now)
}

func (c *Controller) queuedAtOrAboveLocked(band Band) int {
	n := 0
	for b := Critical; b <= band; b++ {
		n += c.bands[b].count
	}
	return n
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

// removeQueuedLocked takes a waiting item out of all queue state at now.
func (c *Controller) removeQueuedLocked(it *item, now time.Time) {
	tq := it.tq
	c.bands[it.band].remove(it)
	c.tenantLeftLocked(tq, 0, now)
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
