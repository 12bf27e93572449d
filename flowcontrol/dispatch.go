package flowcontrol

import "time"

// dispatchLocked dispatches waiting requests in order while endpoints have headroom: bands strictly by priority,
// fair within a band, a tenant under its share first (tenantseats.go). A band without headroom passes to the next: a
// lower band's ceiling is no higher, so it has none either, unless it may use the burst tier and the band above may
// not (a band that rejects when saturated queues only the returns it promised capacity to, and what waited before a
// policy change made it so). A head that waits for KV room (kvWaitsForRoomLocked) stops every band below it. It
// returns the number dispatched.
func (c *Controller) dispatchLocked(now time.Time) int {
	n := 0
	for _, b := range allBands {
		q := c.bands[b]
		for q.count > 0 {
			tq := c.underShareHeadLocked(b, q, now)
			_, best, burst := c.headroomLocked(b, tq.name, now)
			if best < 0 {
				break
			}
			names := c.endpointsWithHeadroomLocked(b, tq.name, burst, now)
			if c.kvWaitsForRoomLocked(b, tq.name, tq.head.size, names, now) {
				// The head, a tenant under its share, waits for KV room here or a peer's place; a lower band would
				// take the same endpoints' blocks first.
				return n
			}
			best, names = c.kvPlaceLocked(b, tq.name, tq.head.size, best, names, now)
			it := q.popTenant(tq)
			c.tenantLeftLocked(tq, it.cost, now)
			c.dequeuedLocked(it)
			reserved := c.reserveLocked(it.id, it.streamed, it.size, best, now)
			c.drain.add(it.cost)
			c.finalizeLocked(it, Decision{Outcome: Dispatched, Band: b, Capped: it.capped, Endpoints: names,
				Reserved: reserved, Waited: now.Sub(it.enqueuedAt), Burst: burst}, nil)
			n++
		}
	}
	return n
}

// expireLocked answers every request whose maximum queue time has passed, and every waiting request once the pool is
// down (poolDownLocked): Unavailable if no endpoint is fresh (the pool, not the load, is the problem), Rejected with
// ReasonQueueTimeout otherwise.
func (c *Controller) expireLocked(now time.Time) int {
	n := 0
	noEndpoints := !c.anyFreshLocked(now)
	down := c.poolDownLocked(now)
	for _, b := range allBands {
		q := c.bands[b]
		for q.oldest != nil && (down || !q.oldest.deadline.After(now)) {
			it := q.oldest
			c.removeQueuedLocked(it, now)
			d := Decision{Band: it.band, Capped: it.capped, Waited: now.Sub(it.enqueuedAt)}
			if noEndpoints {
				c.unavailableLocked(&d, ReasonNoEndpoints)
			} else {
				c.rejectLocked(&d, ReasonQueueTimeout, c.retryEstimateLocked(b, it.cost, now), it.cost, it.returnKey, now)
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

// armTTLTimerLocked makes sure a timer fires no later than the earliest deadline of a waiting request, while
// requests wait under the Critical reserve its end (which may give them headroom), and while they wait for late
// metrics the moment the pool counts as down (poolDownLocked). Deadlines in a band follow arrival
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
	if c.totalCount > 0 && !c.anyFreshLocked(now) {
		// Requests wait out late metrics; without a scrape by then, the pool is down and they are answered.
		down := time.Unix(0, c.newestScrapeNs).Add(outageStalenessMultiple * c.cfg.Endpoint.MetricsStaleness)
		if down.After(now) && (earliest.IsZero() || down.Before(earliest)) {
			earliest = down
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
