package flowcontrol

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// reserveLocked counts a dispatched request against endpoint i until it is released: in flight, unscraped
// until a scrape covers it and, if streamed, pending until it has started. It returns the endpoint's name, the
// decision's Reserved.
func (c *Controller) reserveLocked(id string, streamed bool, size kvSize, i int, now time.Time) string {
	e := &c.endpoints[i]
	r := reservation{endpoint: e.Name, at: now, ahead: e.pending, unscraped: true, pending: streamed,
		occupied: e.occupied(), size: size}
	c.noteKVSizeLocked(size, e.kvCapacity)
	e.add(&r, c.cfg.Endpoint)
	e.noteFull(now)
	c.reservations[id] = r
	return e.Name
}

// UpdateEndpoints replaces the pool snapshot after a scrape. Requests dispatched to an endpoint before its scrape stop
// counting as unscraped, since the scrape counts them itself (they stay in flight until released, and pending until
// Started); reservations on endpoints no longer in the pool are dropped. Each endpoint's new scrape also teaches its
// concurrency and is reconciled with the requests the EPP counts there (occupancyRecon). Waiting requests are then
// dispatched onto any endpoint with headroom. Invalid entries (empty or duplicate names, negative counts, KV usage
// outside [0, 1]) are left out, and reported in the returned error; the rest of the snapshot applies.
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
	c.underShareAt = time.Time{} // judged again: whether endpoints are seat-bound, which the judgement reads, may change
	// newScrape marks the endpoints whose scrape is newer than the one the controller had: only those teach anything.
	newScrape := make([]bool, len(states))
	for i := range states {
		s := &states[i]
		newScrape[i] = s.scrapedNs != math.MinInt64
		s.peer, s.peerKV, s.peerUnsized = c.peers.Load[s.Name], c.peers.LoadKV[s.Name], c.peers.LoadUnsized[s.Name]
		// An endpoint new to a controller that had endpoints and peers: this replica's share grew.
		s.adopted = c.hadPeers && len(c.endpoints) > 0
		if j, ok := c.endpointIndex[s.Name]; ok {
			old := &c.endpoints[j]
			s.adopted = old.adopted
			s.learner, s.recon, s.foreign = old.learner, old.recon, old.foreign
			s.firstChunk, s.pendingDoneNs = old.firstChunk, old.pendingDoneNs
			s.fullNs, s.endedNs = old.fullNs, old.endedNs
			s.runTime, s.kvCapacity = old.runTime, old.kvCapacity
			newScrape[i] = s.scrapedNs > old.scrapedNs
		}
	}
	sentBefore := make([]int, len(states))
	kv := make([]kvScrape, len(states))
	for id, r := range c.reservations {
		i, ok := index[r.endpoint]
		if !ok {
			delete(c.reservations, id)
			continue
		}
		if r.at.Before(states[i].ScrapedAt) {
			sentBefore[i]++
			kv[i].add(r, states[i].scrapedNs, states[i].runTime)
			if r.unscraped {
				r.unscraped = false
				c.reservations[id] = r
			}
		}
		states[i].tally(r, +1)
	}
	c.endpoints, c.endpointIndex = states, index
	c.newestScrapeNs, c.poolSlots, c.poolRunning = math.MinInt64, 0, 0
	for i := range states {
		e := &states[i]
		c.newestScrapeNs = max(c.newestScrapeNs, e.scrapedNs)
		e.learner.settle(now.UnixNano())
		if newScrape[i] {
			e.learner.observe(e.Endpoint, e.running)
			var drop int
			e.foreign, drop = e.recon.observe(e.scrapedNs, e.Running+e.WaitingQueue, sentBefore[i])
			if drop > 0 {
				c.dropMissingLocked(i, drop)
			} else {
				e.learnKVCapacity(kv[i])
			}
		}
		e.refresh(c.cfg.Endpoint)
		e.adopted = e.adopted && e.seats == 0
		e.noteFull(now)
		if n := e.slotBound(); n > 0 && (c.poolSlots == 0 || n < c.poolSlots) {
			c.poolSlots = n
		}
		c.poolRunning = max(c.poolRunning, e.learner.maxRunning)
	}
	c.dispatchLocked(now)
	c.shedUnreachableLocked(now)
	c.trackBlockedLocked(now)
	c.endOpLocked(now)
	sample := c.queueSampleLocked(now)
	c.mu.Unlock()
	c.recorder.RecordQueue(sample)
	return errors.Join(errs...)
}

// Bind moves a dispatched request's reservation to the endpoint the scheduler picked (the controller provisionally
// reserved its least saturated endpoint with headroom). It reports whether the request still held a reservation.
// The request counts there as unscraped until a scrape taken after Bind, even if a scrape since its dispatch covered
// the provisional reservation: the caller sends the request after Bind, so no earlier scrape can show it.
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
	r.endpoint, r.at, r.ahead, r.unscraped, r.occupied = endpoint, now, 0, true, 0
	if i, ok := c.endpointIndex[endpoint]; ok {
		r.ahead, r.occupied = c.endpoints[i].pending, c.endpoints[i].occupied()
		c.endpoints[i].add(&r, c.cfg.Endpoint)
		c.reservations[id] = r
	} else {
		// An endpoint that left the pool (or never was in it) holds no seats to count: the reservation ends here, as
		// the pool update that removes an endpoint ends the reservations on it.
		delete(c.reservations, id)
	}
	c.dispatchFreedAndUnlock(now)
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
	started.pending, started.started, started.startedNs = false, true, now.UnixNano()
	if i, ok := c.endpointIndex[r.endpoint]; ok {
		e := &c.endpoints[i]
		e.learner.settle(now.UnixNano())
		e.tally(r, -1)
		e.probeStarted(r, now, c.cfg.Endpoint)
		e.tally(started, +1)
		e.learner.observeRunning(e.running, now.UnixNano(), e.endDeadline(now, c.cfg.Endpoint))
		e.learnFirstChunk(now.Sub(r.at) / time.Duration(r.ahead+1))
		e.refresh(c.cfg.Endpoint)
	}
	c.reservations[id] = started
	c.drain.advance(now)
	c.dispatchFreedAndUnlock(now)
	return true
}

// Release ends a dispatched request's reservation: the request finished, or failed before reaching its endpoint, and
// its place there is free. It reports whether the request was still counted (one dropped with its endpoint, or as
// missing, is not; that is not an error).
func (c *Controller) Release(id string) bool {
	c.mu.Lock()
	r, ok := c.reservations[id]
	if !ok {
		c.mu.Unlock()
		return false
	}
	now := c.clock.Now()
	delete(c.reservations, id)
	c.unreserveLocked(r)
	if i, ok := c.endpointIndex[r.endpoint]; ok {
		e := &c.endpoints[i]
		if r.started {
			// Every end counts, a request cut short too (Release is not told why it ended): rare against the ends of
			// an endpoint under load, and it errs towards a run time short of the mean.
			e.learnRunTime(now.Sub(time.Unix(0, r.startedNs)))
		}
		e.recon.release(r.at, now)
		e.learner.releases++
		e.learner.ended(now.UnixNano(), e.running)
		e.endedNs = now.UnixNano()
		if c.seatBoundLocked(e, now) {
			c.learnHoldTimeLocked(now.Sub(r.at))
		}
	}
	if c.totalCount == 0 {
		c.mu.Unlock()
		return true
	}
	c.drain.advance(now)
	c.dispatchFreedAndUnlock(now)
	return true
}

func (c *Controller) unreserveLocked(r reservation) {
	if i, ok := c.endpointIndex[r.endpoint]; ok {
		c.endpoints[i].remove(r, c.cfg.Endpoint)
	}
}

// dispatchFreedAndUnlock dispatches onto headroom a reservation change may have freed, then releases the lock (held
// by the caller) and reports metrics.
func (c *Controller) dispatchFreedAndUnlock(now time.Time) {
	c.unlockAfterDispatch(now, c.dispatchLocked(now))
}

// unlockAfterDispatch releases the lock (held by the caller) after n requests were dispatched from the queues, and
// reports the queues' metrics when any was.
func (c *Controller) unlockAfterDispatch(now time.Time, n int) {
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
