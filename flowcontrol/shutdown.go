package flowcontrol

import "time"

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
			c.removeQueuedLocked(it, now)
			d := Decision{Band: it.band, Capped: it.capped, Waited: now.Sub(it.enqueuedAt)}
			c.unavailableLocked(&d, ReasonShuttingDown)
			c.finalizeLocked(it, d, nil)
		}
	}
}
