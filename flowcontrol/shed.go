package flowcontrol

import (
	"math"
	"time"
)

// estimatedWaitLocked predicts how long a new request would wait: the cost ahead of it (higher bands' backlog plus
// its fair position in its own band, or only its tenant's own waiting requests while the tenant is under its share
// and so dispatches first, plus itself) over the drain rate; and, for a tenant with requests waiting and not under
// its share, no less than its tenant's waiting cost and its own over the tenant's own drain (tenantdrain.go). known
// is false while neither rate is known.
func (c *Controller) estimatedWaitLocked(band Band, tenant string, weight, cost float64, now time.Time) (wait time.Duration, known bool) {
	tenantWait, tenantKnown := c.tenantWaitLocked(band, tenant, cost, now)
	rate, ok := c.drain.rate()
	if !ok {
		return tenantWait, tenantKnown
	}
	ahead := c.bands[band].costAhead(tenant, weight) + cost
	if c.isUnderShareLocked(band, tenant, now) {
		ahead = cost
		if tq := c.bands[band].tenants[tenant]; tq != nil {
			ahead += tq.cost
		}
	}
	for b := Critical; b < band; b++ {
		ahead += c.bands[b].cost
	}
	return max(tenantWait, secondsToDuration(ahead/rate)), true
}

// timeUntilAdmitLocked estimates when band would admit again: its backlog and the backlog of higher bands, plus
// cost, over the drain rate. Unknown rate: the band's minimum if nothing waits, else its maximum.
func (c *Controller) timeUntilAdmitLocked(band Band, cost float64) time.Duration {
	backlog := c.backlogAtOrAboveLocked(band)
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

// backlogAtOrAboveLocked is the cost waiting in band and the bands above it.
func (c *Controller) backlogAtOrAboveLocked(band Band) float64 {
	backlog := 0.0
	for b := Critical; b <= band; b++ {
		backlog += c.bands[b].cost
	}
	return backlog
}

// retryEstimateLocked is the Retry-After estimate for a request of band turned away at now: when capacity for it is
// expected to return. Outside an overload episode, that is timeUntilAdmitLocked (the backlog ahead over the drain
// rate); within one, bandRecovery.capacityReturn, which also covers the overload's remaining length and the backlog
// it leaves behind: the backlog alone is blind to arrivals that keep the pool saturated (under a sustained burst a
// band that rejects when saturated, Sheddable, has no backlog at all, and clients told "1s" would come back into the
// same burst), and the drain rate alone to the arrivals that keep joining the backlog while it drains.
func (c *Controller) retryEstimateLocked(band Band, cost float64, now time.Time) time.Duration {
	estimate := c.timeUntilAdmitLocked(band, cost)
	rec := &c.recovery[band]
	backlog := c.backlogAtOrAboveLocked(band)
	rec.observeBacklog(now, backlog, c.cfg.DrainRateWindow)
	if rec.overloadSince.IsZero() {
		return estimate
	}
	if rate, ok := c.drain.rate(); ok {
		return max(estimate, rec.capacityReturn(now, backlog+cost, rate))
	}
	return max(estimate, now.Sub(rec.overloadSince))
}

// recoveringLocked reports whether capacity for band is on its way back: the backlog at and above it, built up by
// an overload, now drains (the overload is over); or, with no backlog standing there (none, or one that formed a
// moment ago: the band is blocked by the servers' saturation alone, and the EPP's queue says nothing of when that
// ends), the servers' own load falls (loadFallingLocked).
func (c *Controller) recoveringLocked(band Band, now time.Time) bool {
	rec := &c.recovery[band]
	rec.observeBacklog(now, c.backlogAtOrAboveLocked(band), c.cfg.DrainRateWindow)
	w := c.cfg.DrainRateWindow
	return rec.draining(now, w) || !rec.built(now, w) && c.loadFallingLocked(band)
}

// loadFallingLocked reports whether the servers' load falls fast enough that, at its trend, it would be gone within
// band's MaxQueueTime: a request of band let wait now (a promised return) finds the capacity it waits for before it
// would time out. Under a sustained overload the load stands near what the ceilings let in, and its trend stays a
// small fraction of that.
func (c *Controller) loadFallingLocked(band Band) bool {
	slope := c.load.slope
	return slope < 0 && -slope*c.cfg.Bands[band].MaxQueueTime.Seconds() >= c.loadNow
}

// trackBlockedLocked records, per band, whether an arrival of it would be dispatched at once after the current
// snapshot's dispatches, and the backlog at and above it; and the servers' mean load, from the fresh endpoints' scrapes.
func (c *Controller) trackBlockedLocked(now time.Time) {
	// The load is a mean over the fresh endpoints, not a sum: an endpoint that goes stale or leaves the pool must not
	// read as load falling. loadFallingLocked compares the trend with the level, so the scale does not matter.
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	load, fresh := 0, 0
	for i := range c.endpoints {
		if e := &c.endpoints[i]; e.scrapedNs >= cutoff {
			load += e.Running + e.WaitingQueue
			fresh++
		}
	}
	if fresh > 0 {
		c.loadNow = float64(load) / float64(fresh)
		c.load.observe(now, c.loadNow, (c.cfg.DrainRateWindow / trendWindowShare).Seconds())
	}
	for _, b := range allBands {
		_, best, _ := c.headroomLocked(b, "", now)
		blocked := best < 0 || c.queuedAtOrAboveLocked(b) > 0
		c.recovery[b].observe(now, blocked, c.backlogAtOrAboveLocked(b), c.cfg.DrainRateWindow)
	}
}

// rejectLocked answers 429 for a request of cost turned away at now, with Retry-After from estimate, jittered and
// booked in the band's ledger of returns (returnLedger); where a promise is kept (a band that sheds at once, or
// keepsEarlyPromises), the return is promised under the request's returnKey (promiseKeeper).
func (c *Controller) rejectLocked(d *Decision, reason Reason, estimate time.Duration, cost float64, returnKey uint64, now time.Time) {
	bc := &c.cfg.Bands[d.Band]
	d.Outcome, d.Reason = Rejected, reason
	d.RetryAfter = retryAfter(estimate, bc.RetryAfterMin, bc.RetryAfterMax, c.cfg.RetryAfterJitter, c.rng.Float64())
	rate, _ := c.drain.rate()
	budget := c.recovery[d.Band].returnBudget(now, rate, c.cfg.DrainRateWindow)
	d.RetryAfter = c.returns[d.Band].book(now, d.RetryAfter, bc.RetryAfterMax, cost, budget)
	if bc.RejectWhenSaturated || c.keepsEarlyPromises(d.Band) {
		c.promises[d.Band].promise(returnKey, now, d.RetryAfter, promiseTTL(bc))
	}
}

// keepsEarlyPromises reports whether band tells an early return the rest of its wait (admitLocked): a band that
// queues, below Critical, at a controller that is not one of several replicas.
func (c *Controller) keepsEarlyPromises(band Band) bool {
	return !c.cfg.Bands[band].RejectWhenSaturated && band != Critical && !c.replica
}

// earlyReturnLocked answers 429 for a return that came back left before the moment it was told (promiseKeeper.early):
// Retry-After is what is left, in whole seconds up, neither jittered nor booked again (the ledger holds its return at
// that moment already).
func (c *Controller) earlyReturnLocked(d *Decision, left time.Duration) {
	d.Outcome, d.Reason = Rejected, ReasonEarlyReturn
	d.RetryAfter = time.Duration(math.Ceil(left.Seconds())) * time.Second
}

// promiseTTL is how long a band keeps a promise of capacity: a client that comes back more than the band's longest
// Retry-After after it was told arrives fresh.
func promiseTTL(bc *BandConfig) time.Duration { return bc.RetryAfterMax }

// unavailableLocked answers 503: there is no backlog to estimate from, so Retry-After is the band's minimum, jittered.
func (c *Controller) unavailableLocked(d *Decision, reason Reason) {
	bc := &c.cfg.Bands[d.Band]
	d.Outcome, d.Reason = Unavailable, reason
	d.RetryAfter = retryAfter(bc.RetryAfterMin, bc.RetryAfterMin, bc.RetryAfterMax, c.cfg.RetryAfterJitter, c.rng.Float64())
}
