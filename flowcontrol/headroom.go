package flowcontrol

import (
	"math"
	"time"
)

// headroomLocked returns the number of endpoints with fresh metrics and the index of the least saturated one with
// headroom for band (-1 if none): in the normal tier or, when no endpoint has headroom there, in the burst tier (then
// burst is true). An endpoint has headroom for a band when its metrics are fresh, it is not ejected, it has a free
// slot (hasSlot) and its saturation is below the band's ceiling; while the Critical reserve is on, a band below
// Critical takes no free seat of a seat-bound endpoint once those are down to their reserve of idle seats
// (seatReserveLocked). Under the Critical reserve, and for a tenant under its share, saturation is judged without
// the KV term (satReserve): the seats, bounded by what the KV cache holds, stand for it, so the seats kept for them
// are not closed by a KV ceiling meant to leave room for them. An ejected endpoint still counts as fresh: an ejection
// never makes the pool look down.
func (c *Controller) headroomLocked(band Band, tenant string, now time.Time) (fresh, best int, burst bool) {
	r := c.takeRulesLocked(band, tenant, now)
	tier := c.burstTierLocked(band, r.reserve)
	best, bestBurst := -1, -1
	var bestSat, burstSat float64
	for i := range c.endpoints {
		e := &c.endpoints[i]
		if e.scrapedNs < r.cutoff {
			continue
		}
		fresh++
		if e.Ejected || !c.takesLocked(e, &r, now) {
			continue
		}
		if sat := e.saturationFor(r.strict); sat < r.ceiling && (best < 0 || sat < bestSat) {
			best, bestSat = i, sat
		}
		if sat := e.satBurst; tier && sat < r.ceiling && (bestBurst < 0 || sat < burstSat) {
			bestBurst, burstSat = i, sat
		}
	}
	if best < 0 && bestBurst >= 0 {
		return fresh, bestBurst, true
	}
	return fresh, best, false
}

// takeRules are what decides, for a request of a band and tenant at one moment, which endpoints may take it
// (takesLocked): headroomLocked and endpointsWithHeadroomLocked judge every endpoint by the same rules.
type takeRules struct {
	band    Band
	ceiling float64 // the band's saturation ceiling
	cutoff  int64   // freshCutoff: older metrics are stale
	// reserve: the Critical reserve is on; strict: seats are judged strictly (reserve, or the tenant under its
	// share); the rest are mayTakeLocked's and kvTakesLocked's.
	reserve, strict, seatsFull, atOnceOnly, yields, kvKeep bool
}

// takeRulesLocked returns the rules for a request of tenant in band at now.
func (c *Controller) takeRulesLocked(band Band, tenant string, now time.Time) takeRules {
	r := takeRules{band: band, ceiling: c.cfg.Bands[band].SaturationCeiling,
		cutoff: freshCutoff(now, c.cfg.Endpoint.MetricsStaleness), reserve: c.criticalReserveLocked(now)}
	r.strict = r.reserve || c.isUnderShareLocked(band, tenant, now)
	r.seatsFull = c.seatsFullLocked(band, tenant, r.reserve, now)
	r.atOnceOnly = c.atOnceOnlyLocked(band, r.strict, r.cutoff)
	r.yields = c.yieldsLocked(band, tenant, now)
	r.kvKeep = c.kvKeepsRoomLocked(band, tenant, r.reserve, now)
	return r
}

// takesLocked reports whether one more request may go to e under r, as far as seats (mayTakeLocked) and KV room
// (kvTakesLocked) go.
func (c *Controller) takesLocked(e *endpointState, r *takeRules, now time.Time) bool {
	return c.mayTakeLocked(e, r.band, r.reserve, r.strict, r.yields, r.seatsFull, r.atOnceOnly, now) &&
		c.kvTakesLocked(e, r.kvKeep)
}

// mayTakeLocked reports whether one more request may go to e as far as seats go: it has a slot (hasSlot; strict under
// the Critical reserve and for a tenant under its share, neither of which is sent beyond a learned slot limit to probe
// it, where it would wait inside the server), and it takes a free seat of a seat-bound endpoint only if the seats are
// not down to those kept for others (seatsFull). A request beyond the seats, where the capacity allows it, takes no
// seat kept for another. Under the Critical reserve a lower band also keeps to the pool's slot limit where the
// endpoint's own is not known (poolSlotsCapLocked) and, on an endpoint seen running more than that without tentative
// seats, to the most it has run (beyondMostRunLocked). With live peers a Critical request may have to start at once
// (atOnceOnlyLocked). While a tenant of the band is under its share (yields), no request of the band goes where it
// would wait inside the server (yieldedFullLocked). In a pool with a slot limit, no request goes beyond the tentative
// seats of an endpoint that shows requests waiting there (queuedBeyondSeatsLocked).
func (c *Controller) mayTakeLocked(e *endpointState, band Band, reserve, strict, yields, seatsFull, atOnceOnly bool, now time.Time) bool {
	if !e.hasSlot(strict) || yields && c.yieldedFullLocked(e) || c.queuedBeyondSeatsLocked(e) {
		return false
	}
	if reserve && band != Critical && (c.poolSlotsCapLocked(e) || c.beyondMostRunLocked(e)) || atOnceOnly && !c.startsAtOnceLocked(e) {
		return false
	}
	if c.freeSeatsLocked(e) == 0 {
		return !(reserve && seatsFull && c.warmUpGrowthLocked(e, now))
	}
	return !seatsFull || !c.seatBoundLocked(e, now)
}

// queuedBeyondSeatsLocked reports whether e, whose own limit is not known, holds its tentative seats while its latest
// scrape shows requests waiting there, in a pool where a slot limit has been learned: one more request would wait
// inside it for its first end, whatever its band or tenant. Outside the Critical reserve and the yield rule only a
// learned limit bounded a band, so an endpoint whose limit its scrapes had not taught yet took the burst tier's
// requests the moment a tenant's protection lapsed (testbed/bench/scenarios/README.md, "The mixed fleet's light
// tenant kept out of servers' queues in the warm-up"). A KV-bound endpoint, whose capacity is what its KV cache holds,
// is left to the saturation thresholds, as by yieldedFullLocked. With live peers too: a replica that owns small
// servers holds what would wait in their queues as one replica owning the pool does. Its tenants' share is judged over
// the pool's demand, and a tenant over its share only of a seat free rate that leaves out part of the pool has its
// share in doubt (shareInDoubtLocked), so what the rule holds here waits for a seat under its MaxQueueTime rather than
// being shed on this replica's small drain (testbed/bench/scenarios/README.md, "lightmix17's warm-up rules with live
// peers": before the doubt, light requests held here were answered 429 predicted_wait).
func (c *Controller) queuedBeyondSeatsLocked(e *endpointState) bool {
	return c.poolSlotsLocked() > 0 && e.known == 0 && e.WaitingQueue > 0 &&
		e.inflight > 0 && e.kvRoom() > float64(e.capacity) && !e.hasSlot(true)
}

// warmUpGrowthLocked reports whether a request beyond e's seats would take a place the Critical reserve needs in the
// warm-up: no seat-bound request has ended yet (the hold time is unknown), a slot limit has been learned in the pool,
// and e's own limit is not known: its seats are the most it has run, and the places beyond them are where it grows.
// Until a first request ends nothing frees, so every Critical arrival needs a place nobody holds yet, and the places
// beyond the seats are the only ones; lower bands that take them fill every server's first batch, and Critical then
// waits for the first ends with the pool full. So in the warm-up, while the reserve's idle seats are short, only
// Critical grows such an endpoint. Without a slot limit learned in the pool the endpoints may all be large ones
// ramping up, which this would hold at a few requests each.
func (c *Controller) warmUpGrowthLocked(e *endpointState, now time.Time) bool {
	return c.holdTime == 0 && c.poolSlotsLocked() > 0 && e.seats > 0 && c.seatBoundLocked(e, now)
}

// poolSlotsCapLocked reports whether e holds as many requests as the smallest slot limit learned in the pool while
// its own limit is not known and it has never been seen running more: under the Critical reserve a lower band sends it
// no more. No scrape shows a server's slot limit before a request waits there, and that request takes the first slot
// to free there ahead of any Critical request; the endpoints of a pool usually run one configuration, so the limit
// one has shown is the likeliest of the others. A Critical request may still go beyond it, and one that starts at
// once there shows the endpoint running more (learner.maxRunning), which lifts the cap for good.
func (c *Controller) poolSlotsCapLocked(e *endpointState) bool {
	n := c.poolSlotsForLocked(e)
	return n > 0 && e.occupancy() >= n
}

// beyondMostRunLocked reports whether one more request would take e beyond the most it has been seen running, in a
// pool where a slot limit has been learned, while e's own limit is not known and it has no tentative seats (it has run
// more than the pool's limit, and largeBatchRunning or more, so concurrencyLearner gives it none): under the Critical
// reserve a lower band sends it no more. Such an endpoint may be a slot-limited server larger than the pool's limit
// (the mixed fleet's 24-slot server, whose limit no scrape shows before a request waits there): in the warm-up lower
// bands sent it requests beyond its 24 slots, and those, not the Critical requests waiting in the EPP, took its first
// freed seats (testbed/bench/scenarios/README.md). Critical may still go beyond, as beyond the pool's slot limit
// (poolSlotsCapLocked); a request that starts at once there raises the most it has run, and the lower bands follow.
func (c *Controller) beyondMostRunLocked(e *endpointState) bool {
	pool := c.poolSlotsLocked()
	return pool > 0 && e.known == 0 && e.seats == 0 && e.learner.maxRunning > pool && e.learner.maxRunning >= largeBatchRunning &&
		e.occupancy() >= e.learner.maxRunning
}

// poolSlotsForLocked is the pool's slot limit (poolSlotsLocked) where it stands for e's own: e's limit is not known
// and e has never been seen running more than it; 0 otherwise.
func (c *Controller) poolSlotsForLocked(e *endpointState) int {
	n := c.poolSlotsLocked()
	if e.known > 0 || e.learner.maxRunning > n {
		return 0
	}
	return n
}

// seatsFullLocked reports whether the seat-bound endpoints are down to the idle seats a request of tenant in band must
// leave: Critical's reserve (reserve: it is on) for a band below Critical, and the seats kept for the band's other
// tenants under their share, here and waiting at the peers (tenantSeatsLocked). Then the request may take none of their
// seats (it may still go beyond the seats of an endpoint whose capacity allows more: that takes no seat kept for
// another).
func (c *Controller) seatsFullLocked(band Band, tenant string, reserve bool, now time.Time) bool {
	critical := reserve && band != Critical
	tenants := len(c.underShareLocked(now)) > 0 || c.peers.ProtectedWaiting > 0 && c.mayGoToPeerLocked(band, now)
	if !critical && !tenants {
		return false
	}
	seats, idle, frees := c.seatFiguresLocked(now)
	kept := 0
	if critical {
		kept = c.criticalSeatsLocked(seats, frees, now)
	}
	if tenants {
		kept += c.tenantSeatsLocked(band, tenant, seats, frees, now)
	}
	return kept > 0 && idle <= kept
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
func (c *Controller) endpointsWithHeadroomLocked(band Band, tenant string, burst bool, now time.Time) []string {
	r := c.takeRulesLocked(band, tenant, now)
	has := func(e *endpointState) bool {
		sat := e.saturationFor(r.strict)
		if burst {
			sat = e.satBurst
		}
		return e.usable(r.cutoff) && sat < r.ceiling && c.takesLocked(e, &r, now)
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

// poolDownLocked reports whether the pool is down as far as admission can tell: no endpoint has been scraped within
// outageStalenessMultiple staleness thresholds. Short of that, metrics that are merely stale (a scrape late because
// the EPP or a server is starved of CPU for a moment) make requests wait for the next scrape rather than be answered
// 503: the next scrape normally lands within one refresh interval.
func (c *Controller) poolDownLocked(now time.Time) bool {
	return c.newestScrapeNs <= freshCutoff(now, outageStalenessMultiple*c.cfg.Endpoint.MetricsStaleness)
}

// anyFreshLocked reports whether some endpoint's metrics are fresh at now.
func (c *Controller) anyFreshLocked(now time.Time) bool {
	return c.newestScrapeNs >= freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
}

// outageStalenessMultiple: with the default staleness threshold (200 ms), a pool is down after 2 s without a scrape,
// upstream's own --metrics-staleness-threshold.
const outageStalenessMultiple = 10

// MayExceedHeadroom reports whether a request dispatched in band may still be placed on the named endpoint, which had
// no headroom for the band, when the endpoint holds much of its prompt (the headroom filter's prefix-affinity
// exception): the endpoint must not be ejected, its metrics must be fresh, it must have a free slot (a request past
// its concurrency would wait inside it, behind whatever was sent before), the band must queue when saturated (a
// holdback band, which rejects instead, keeps to its ceiling), and while the Critical reserve is active (any Critical
// request within the drain-rate window, whatever the thresholds) only Critical may exceed it, so the reserve keeps its
// places.
func (c *Controller) MayExceedHeadroom(band Band, name string) bool {
	if band >= NumBands {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	i, ok := c.endpointIndex[name]
	if !ok || !c.endpoints[i].usable(freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)) {
		return false
	}
	reserve := c.criticalReserveLocked(now)
	if c.cfg.Bands[band].RejectWhenSaturated || !c.endpoints[i].hasSlot(reserve) {
		return false
	}
	return band == Critical || !reserve
}

// Saturations writes into out the current load of each named endpoint, for schedulers to rank endpoints by load
// fresher than any scrape: its saturation from its latest snapshot plus the requests dispatched to it since that
// have not had their first response chunk (a started one runs there, no longer waits), and, while it has streamed
// prompts it has not begun answering, 1 plus the time a new prompt would take there to its first chunk over the
// pending time threshold if that is more (one pending prompt is enough to delay a new prompt's first token there;
// among busy endpoints the one where a new prompt would start first ranks lowest; endpointState.rankAt). The
// request being scheduled, self, does not count: the controller provisionally reserved it on an endpoint, which must
// not make that endpoint look busier to its own scheduling. An endpoint the controller does not know, whose
// metrics are stale, or that is ejected, reads as +Inf: never preferred. While endpoints are ranked by their seats
// (the Critical reserve is active), an adopted endpoint (one taken over from a departed peer replica, with no seat
// count learned here yet) is ranked by its occupancy over the seats the pool's knowledge stands in for
// (rankSeatsLocked), not by its waiting queue alone: it would otherwise rank as idle while it runs its slots full, and
// take request after request ahead of servers ranked by their free seats (testbed/chaos README, "replica-killed
// against one replica in the same run").
func (c *Controller) Saturations(self string, names []string, out []float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	nowNs := now.UnixNano()
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	seats := c.criticalReserveLocked(now)
	own, hasOwn := c.reservations[self]
	for i, name := range names {
		out[i] = math.Inf(1)
		j, ok := c.endpointIndex[name]
		if !ok || !c.endpoints[j].usable(cutoff) {
			continue
		}
		e := &c.endpoints[j]
		if hasOwn && own.endpoint == name {
			copied := *e
			copied.remove(own, c.cfg.Endpoint)
			e = &copied
		}
		out[i] = e.rankAt(nowNs, c.cfg.Endpoint, seats)
		if !seats || !e.adopted {
			continue
		}
		if n := c.rankSeatsLocked(e); n > 0 {
			out[i] = max(out[i], float64(e.occupancy())/float64(n))
		}
	}
}

// rankSeatsLocked is the seat count an adopted endpoint e is ranked against (Saturations): the pool's slot limit where
// it stands for e's (poolSlotsForLocked); before one is learned, the most any endpoint of the pool was seen running if
// a small server's and e never ran more (unqueuedSeatsLocked); else the most e itself was seen running if a small
// server's (a larger server than the pool's limit, as a mixed fleet's). 0 when nothing stands for its seats. Only for
// adopted endpoints: every endpoint ranked so, a single replica's warm-up, when most endpoints have no seat count,
// sent Critical requests into full servers (Critical TTFT P99 12x on the slot-limited shape in the virtual suite).
func (c *Controller) rankSeatsLocked(e *endpointState) int {
	if n := c.poolSlotsForLocked(e); n > 0 {
		return n
	}
	if n := c.unqueuedSeatsLocked(e); n > 0 {
		return n
	}
	if n := e.learner.maxRunning; n < largeBatchRunning {
		return n
	}
	return 0
}
