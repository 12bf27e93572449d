package flowcontrol

import "time"

// A tenant's own drain: fair queuing gives a backlogged tenant its share of what its band drains, not all of it. A
// tenant asking more than its share (the heavy tenant of a band shared with a lighter one) drains at the band's rate
// less what the others take: predicting its wait from the pool's drain rate alone understates it by the ratio of the
// two, so a request admitted with a predicted wait under its band's MaxQueueTime waits beyond it and is answered only
// at its deadline (or never, if its client gives up first). So each tenant of a band measures the cost dispatched from
// it per second of the time it had requests waiting (tenantQueue.drain, a drainEstimator of its own), and:
//
//   - an arrival of a tenant with requests waiting that shares its band's drain with others (sharesDrainLocked: not
//     under its share, as those dispatch first at the band's rate, and not alone in its band) is predicted to wait at
//     least its tenant's waiting cost, and its own, over that rate (estimatedWaitLocked);
//   - a waiting request whose predicted start (the cost waiting ahead of it in its tenant's FIFO, and its own, over the
//     tenant's rate) falls after its deadline is answered at once, 429 with ReasonPredictedWait and a Retry-After,
//     rather than at its deadline (shedUnreachableLocked): the same prediction the arrival was judged by, kept up to
//     date as the tenant's drain changes;
//   - both judge such a tenant by its band's OverShareMaxQueueTime rather than its MaxQueueTime (maxQueueTimeLocked):
//     a waiting request predicted to start more than that after it arrived is answered too, unless, in a pool with a
//     slot limit, it was queued while its tenant was under its share (item.underShare): it was admitted against its
//     MaxQueueTime.

// unreachableCheckEvery bounds how often the waiting requests are walked for those that can no longer start in time:
// a walk costs one step per waiting request, and a scrape (what triggers it) may come every few milliseconds.
const unreachableCheckEvery = 100 * time.Millisecond

// tenantEnqueuedLocked records that tq had a request added at now: its drain's clock runs from its first.
func (c *Controller) tenantEnqueuedLocked(tq *tenantQueue, now time.Time) {
	if tq.n != 1 {
		return
	}
	if tq.drain.meter.window == 0 {
		tq.drain = newDrainEstimator(c.cfg.DrainRateWindow)
	}
	tq.drain.advance(now)
	tq.drain.setBacklogged(true)
}

// tenantLeftLocked records that a request left tq at now, dispatched with cost (0: answered otherwise); the tenant's
// drain stops its clock when nothing of it waits any more.
func (c *Controller) tenantLeftLocked(tq *tenantQueue, cost float64, now time.Time) {
	if tq == nil || tq.drain.meter.window == 0 {
		return
	}
	tq.drain.advance(now)
	tq.drain.add(cost)
	if tq.n == 0 {
		tq.drain.setBacklogged(false)
	}
}

// tenantDrainLocked returns the rate (cost per second) at which tq's waiting requests dispatch while it has some,
// and false while unknown: a tenant with nothing waiting, or without enough evidence yet.
func (c *Controller) tenantDrainLocked(tq *tenantQueue, now time.Time) (float64, bool) {
	if tq == nil || tq.n == 0 || tq.drain.meter.window == 0 {
		return 0, false
	}
	tq.drain.advance(now)
	return tq.drain.rate()
}

// tenantWaitLocked predicts how long a new request of tenant in band, of cost, waits at its tenant's own drain: the
// cost of the tenant's waiting requests and its own over the tenant's rate. known is false when the tenant has
// nothing waiting, its rate is unknown, or it does not share its band's drain (sharesDrainLocked).
func (c *Controller) tenantWaitLocked(band Band, tenant string, cost float64, now time.Time) (time.Duration, bool) {
	tq := c.bands[band].tenants[tenant]
	rate, ok := c.tenantDrainLocked(tq, now)
	if !ok || !c.sharesDrainLocked(band, tenant, now) {
		return 0, false
	}
	return secondsToDuration((tq.cost + cost) / rate), true
}

// sharesDrainLocked reports whether fair queuing gives tenant only a share of band's drain: it is not under its share
// (such a tenant dispatches first, at the band's rate) nor is its share in doubt (shareInDoubtLocked: it is judged by
// its band's drain and MaxQueueTime, not shed for asking more than a share the pool may well have), and another tenant of the band has requests waiting or is
// under its share. A band's only tenant drains at the band's rate, which the pool's drain rate and the backlog above
// it already predict (estimatedWaitLocked); its own meter would add nothing but its noise.
func (c *Controller) sharesDrainLocked(band Band, tenant string, now time.Time) bool {
	if c.isUnderShareLocked(band, tenant, now) || c.shareInDoubtLocked(band, tenant, now) {
		return false
	}
	for _, tq := range c.bands[band].active {
		if tq.name != tenant {
			return true
		}
	}
	return c.bandUnderShareLocked(band, now)
}

// maxQueueTimeLocked is how long a request of tenant in band may be predicted to wait: the band's
// OverShareMaxQueueTime while the tenant shares its band's drain (it asks more than its share, and fair queuing serves
// the others first), else its MaxQueueTime.
func (c *Controller) maxQueueTimeLocked(band Band, tenant string, now time.Time) time.Duration {
	bc := &c.cfg.Bands[band]
	if c.sharesDrainLocked(band, tenant, now) {
		return bc.overShareQueueTime()
	}
	return bc.MaxQueueTime
}

// shedUnreachableLocked answers, 429 with ReasonPredictedWait, every waiting request predicted to start after its
// deadline, or (unless queued while its tenant was under its share, in a pool with a slot limit) more than its band's
// OverShareMaxQueueTime after it arrived, at its tenant's drain (see the file comment), and returns how many. Each
// tenant's FIFO is walked from its head; a request answered leaves the cost ahead of the later ones, so each is judged
// by the requests kept ahead of it. It runs at most every unreachableCheckEvery, and not during shutdown (the grace
// period decides then).
func (c *Controller) shedUnreachableLocked(now time.Time) int {
	if c.shuttingDown || c.totalCount == 0 || now.Sub(c.unreachableAt) < unreachableCheckEvery {
		return 0
	}
	c.unreachableAt = now
	// In a pool with a slot limit, a request queued while its tenant was under its share was admitted against its
	// MaxQueueTime and waited where the yield rule held its band out of full servers: judged by the over-share time
	// the moment its tenant's share lapsed, the tenant's whole backlog would be answered at once. Its deadline still
	// answers it. Not in a pool without one, where the heavy tenant's goodput paid for it (testbed/bench/scenarios/
	// README.md, "lightmix17's two warm-up rules without their replica regressions").
	pooled := c.poolSlotsLocked() > 0
	n := 0
	for _, b := range allBands {
		q := c.bands[b]
		if q.count == 0 {
			continue
		}
		// The walk removes requests, and with them possibly a tenant from the active heap: collect first.
		var doomed []*item
		for _, tq := range q.active {
			rate, ok := c.tenantDrainLocked(tq, now)
			if !ok || !c.sharesDrainLocked(b, tq.name, now) {
				continue
			}
			limit := c.cfg.Bands[b].overShareQueueTime()
			ahead := 0.0
			for it := tq.head; it != nil; it = it.tNext {
				start := now.Add(secondsToDuration((ahead + it.cost) / rate))
				if start.After(it.deadline) || !(it.underShare && pooled) && start.Sub(it.enqueuedAt) > limit {
					doomed = append(doomed, it)
					continue
				}
				ahead += it.cost
			}
		}
		for _, it := range doomed {
			rate, _ := c.tenantDrainLocked(it.tq, now)
			ahead := it.tq.cost // the most it could still wait: a bound for its Retry-After estimate
			c.removeQueuedLocked(it, now)
			d := Decision{Band: it.band, Capped: it.capped, Waited: now.Sub(it.enqueuedAt)}
			c.rejectLocked(&d, ReasonPredictedWait, secondsToDuration(ahead/rate), it.cost, it.returnKey, now)
			c.finalizeLocked(it, d, nil)
			n++
		}
	}
	return n
}
