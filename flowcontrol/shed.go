package flowcontrol

import "time"

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
// expected to return. Unblocked, that is timeUntilAdmitLocked (the backlog ahead over the drain rate). While the band
// is blocked, it is no sooner than the current saturation episode's end plus the time the backlog at and above the
// band waiting now then still takes to drain: an overload that has lasted d is expected to last about d more (the
// Lindy heuristic for episodes whose length is unknown), and the requests waiting ahead go first once it ends, so a
// client told only the episode's end comes back to a queue that sheds it again. The backlog alone is blind to
// arrivals that keep the pool saturated: under a sustained burst a band that rejects when saturated (Sheddable) has
// no backlog at all, and clients told "1s" would come back into the same burst.
func (c *Controller) retryEstimateLocked(band Band, cost float64, now time.Time) time.Duration {
	estimate := c.timeUntilAdmitLocked(band, cost)
	if since := c.blockedSince[band]; !since.IsZero() {
		episode := now.Sub(since)
		if rate, ok := c.drain.rate(); ok {
			episode += secondsToDuration(c.backlogAtOrAboveLocked(band) / rate)
		}
		estimate = max(estimate, episode)
	}
	return estimate
}

// trackBlockedLocked records, per band, whether an arrival of it would be dispatched at once after the current
// snapshot's dispatches.
func (c *Controller) trackBlockedLocked(now time.Time) {
	for _, b := range allBands {
		if _, best, _ := c.headroomLocked(b, now); best >= 0 && c.queuedAtOrAboveLocked(b) == 0 {
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
