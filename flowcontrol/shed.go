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
