package flowcontrol

import (
	"cmp"
	"slices"
	"time"
)

// Peers: several EPP replicas that own disjoint shares of a pool's endpoints (flowcontrol/replication) decide as one
// on the Critical seat reserve. Each replica tells the others, every few milliseconds, its SeatSummary: its Critical
// arrival rate, how fast its seat-bound seats free, how many there are, and which of its endpoints have idle seats.
// From its peers' summaries a replica learns the pool-wide figures (Peers), and:
//
//   - sizes the reserve for the whole pool, from the pool's Critical rate and seats, and keeps idle only its part of
//     it (Peers.ReserveShare: the replicas' parts add up to the pool's reserve), rather than a reserve sized for its
//     own share of the traffic on its own share of the seats, which N replicas keep N times over;
//   - takes the smallest slot limit any replica learned on its endpoints (SeatSummary.PoolSlots) for the pool's slot
//     limit (poolSlotsLocked) as soon as one replica learns it, as one replica owning every endpoint would: the
//     endpoints of a pool usually run one configuration, and each of N replicas, seeing 1/N of the endpoints and of
//     the traffic, would learn one later; and counts it as the seats of an endpoint whose own limit is not known
//     (seatsLocked), where a replica's own share of the traffic has not shown it yet; until one is learned, the most any
//     endpoint of the pool has run (SeatSummary.PoolRunning) stands for the seats of an endpoint that has not queued
//     yet, so that a peer whose own seats are all taken in the warm-up sees the places there as one replica would;
//   - when a Critical request finds no headroom on its own endpoints (CriticalWouldWait), its caller may send it to a
//     peer's endpoint with an idle seat, as a replica alone would take any idle seat of the pool; the owner counts
//     such requests (Peers.Load) against its endpoints' seats from the next summary on, and its scrapes show them too.
//   - judges whether a tenant is under its share (tenantseats.go) from the pool's figures: what each tenant asks and
//     what the pool drains, its own plus the peers' (Peers.Demand, from their Demand), as one replica seeing every
//     request would. Judged from its own share of the traffic, a tenant asking 80% of its share is over it at one
//     replica or another whenever the balancer sends that replica a little more of it than its share of capacity;
//     there it then waits its fair turn behind the other tenants' backlog (seconds) while the other replicas serve it
//     at once.
//
//   - offers its peers the places it would leave idle (SeatSummary.Spare): while nothing waits here, its free seats
//     and a place on each endpoint without a seat count; and a replica whose queue holds requests of the bands below
//     Critical sends them, in its dispatch order, to a peer's spare place (DispatchSpareElsewhere), as one replica
//     owning the pool would send a request to any idle server of it. Ownership gives each replica an even share of the
//     endpoints, not of their capacity, while the balancer gives it an even share of the requests: a replica owning
//     the slow servers of a mixed fleet queued (and rejected) what a peer owning fast ones had room for.
//   - tells its peers how many requests of tenants under their share wait here (SeatSummary.ProtectedWaiting); a
//     peer's tenants over their share then leave its part of that many seats idle (peerKeptLocked), offered to those
//     requests only (SeatSummary.SpareProtected): one replica would have dispatched them before the others' backlog.
//
// A replica whose peers fall silent is given Peers{} and decides alone again, on the endpoints it owns.

// Peers is what a replica's live peers reported, summed over them, for the controller to decide as part of the pool.
// The zero Peers means no peer: the controller decides alone.
type Peers struct {
	// CriticalRate is the peers' Critical arrivals per second, SeatFrees the rate their seat-bound seats free (seats
	// over the time a request holds one), Seats how many seat-bound seats they have.
	CriticalRate, SeatFrees float64
	Seats                   int
	// CriticalWaiting is how many Critical requests wait at the peers: the pool's reserve holds a seat for each, which
	// the peer takes at once (DispatchWaitingElsewhere) on hearing of it.
	CriticalWaiting int
	// ReserveShare returns this replica's part of a pool-wide reserve of pool idle seats, given its own seat-bound
	// seats. nil: no peer is live, the reserve is this controller's alone.
	ReserveShare func(pool, seats int) int
	// Load is, per endpoint of this controller, how many requests peers sent there that still run. LoadKV is the KV
	// size in tokens those requests reach at their ends (their prompts and expected outputs), as the peers that tell it
	// said, and LoadUnsized how many of them are of peers that do not (older releases): an endpoint with any is of
	// unknown KV room (kvKnown).
	Load, LoadUnsized map[string]int
	LoadKV            map[string]float64
	// PoolSlots is the smallest slot limit the peers learned on their endpoints (SeatSummary.PoolSlots); 0 when none
	// did.
	PoolSlots int
	// PoolRunning is the most requests any of the peers' endpoints was seen running at once
	// (SeatSummary.PoolRunning); 0 when none reported it.
	PoolRunning int
	// IdleSeats is how many idle seats the peers listed (SeatSummary.Idle), whichever replica each is offered to.
	IdleSeats int
	// ProtectedWaiting is how many requests of tenants under their share wait at the peers (SeatSummary): the tenants
	// over their share here leave that many seats idle for them (tenantSeatsLocked), which this replica offers them
	// (SeatSummary.Spare).
	ProtectedWaiting int
	// Demand is what the live peers that sent their Demand reported, summed; Demand.Peers == 0 when none did (older
	// releases send none): tenants are then judged on this replica's figures alone.
	Demand PeerDemand
}

// PeerDemand is the sum of the peers' Demand: tenants summed per band and tenant, drain rates and seat free rates
// summed, settled when every one is.
type PeerDemand struct {
	// Peers is how many peers the figures are from.
	Peers int
	// Drain is their drain rates summed (cost per second), Settled whether each had a window of evidence, SeatFrees
	// the rate their seat-bound seats free.
	Drain, SeatFrees float64
	Settled          bool
	// Unseated is whether some peer has an endpoint not down that is not seat-bound (Demand.Unseated).
	Unseated bool
	Tenants  []TenantDemand
}

// Demand is what a replica tells its peers of its tenants, every few summaries.
type Demand struct {
	// Drain is the cost per second dispatched here while requests waited, Settled whether it has a window of evidence
	// (drainEstimator).
	Drain   float64
	Settled bool
	// Unseated is whether some endpoint here that is not down is not seat-bound: the rate the seat-bound seats free
	// is then not all this replica's endpoints drain (poolFreesLocked).
	Unseated bool
	// Tenants are the tenants active here within the drain-rate window, at most MaxSummaryTenants per band (those
	// asking the most cost per second).
	Tenants []TenantDemand
}

// TenantDemand is what one tenant of a band asks per second: cost and requests, averaged over Span seconds (the
// drain-rate window, or the time since its first request here if shorter); Weight is its fair-queuing weight.
type TenantDemand struct {
	Band                   Band
	Tenant                 string
	Cost, Requests, Weight float64
	Span                   float64
}

// MaxSummaryTenants bounds the tenants of one band a Demand lists: the busiest, which decide what the others' share
// is. A band with more active tenants at one replica has the rest judged with their own requests here only, and the
// band's demand counted without the rest's at that replica (so its tenants' shares are, if anything, larger).
const MaxSummaryTenants = 16

// Demand returns what the controller's tenants ask and what it drains at now, for its peers.
func (c *Controller) Demand() Demand {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	var d Demand
	d.Drain, _ = c.drain.rate()
	d.Settled = c.drain.settled()
	_, whole := c.poolFreesLocked(now)
	d.Unseated = !whole
	for k, t := range c.demand {
		if !c.activeLocked(t, now) {
			continue
		}
		cost, _ := t.cost.rate(now)
		n, _ := t.requests.rate(now)
		d.Tenants = append(d.Tenants, TenantDemand{Band: k.band, Tenant: k.tenant, Cost: cost, Requests: n, Weight: t.weight,
			Span: t.cost.span})
	}
	slices.SortFunc(d.Tenants, func(a, b TenantDemand) int {
		return cmp.Or(cmp.Compare(a.Band, b.Band), cmp.Compare(b.Cost, a.Cost), cmp.Compare(a.Tenant, b.Tenant))
	})
	kept := d.Tenants[:0] // filtered in place: compare with what is kept, not with entries it may overwrite
	for _, t := range d.Tenants {
		if len(kept) < MaxSummaryTenants || kept[len(kept)-MaxSummaryTenants].Band != t.Band {
			kept = append(kept, t)
		}
	}
	d.Tenants = kept
	return d
}

// tenantRates is what a tenant of a band asks per second as underShareLocked judges it: cost and requests over this
// replica and its peers that reported demand, its weight, and its arrivals here (what seats kept for it here are
// sized from); here is whether it is active at this replica. span is the longest time a replica's figures average
// over: until a window has passed, a rate averages since the tenant's first request at that replica, which comes
// later at each of N replicas than in the pool, so the replicas' rates summed would overstate the pool's (by half at
// 4 replicas in the first seconds, measured); the pool's rate is what they counted, summed, over the longest span.
type tenantRates struct {
	cost, requests, weight, arrivals, span float64
	here                                   bool
}

// tenantRatesLocked returns what each tenant active at now asks (tenantRates), in c.rates (reused): this replica's
// own demand, plus its peers' (Peers.Demand) when some peer reported it.
func (c *Controller) tenantRatesLocked(now time.Time) map[tenantKey]tenantRates {
	if c.rates == nil {
		c.rates = make(map[tenantKey]tenantRates)
	}
	clear(c.rates)
	for k, d := range c.demand {
		if !c.activeLocked(d, now) {
			continue
		}
		cost, _ := d.cost.rate(now)
		n, _ := d.requests.rate(now)
		c.rates[k] = tenantRates{cost: cost, requests: n, weight: d.weight, arrivals: n, span: d.cost.span, here: true}
	}
	for _, t := range c.peers.Demand.Tenants {
		if t.Band >= NumBands || !(t.Weight > 0) {
			continue
		}
		k := tenantKey{t.Band, t.Tenant}
		r := c.rates[k]
		r.cost = pooledRate(r.cost, r.span, t.Cost, t.Span)
		r.requests = pooledRate(r.requests, r.span, t.Requests, t.Span)
		r.span = max(r.span, t.Span)
		if !r.here {
			r.weight = max(r.weight, t.Weight)
		}
		c.rates[k] = r
	}
	return c.rates
}

// pooledRate is the rate of two replicas' figures for one tenant: what each counted (a rate times its span is the
// decayed sum counted, which adds up over the replicas) over the longer span; 0 with no span.
func pooledRate(rate, span, peerRate, peerSpan float64) float64 {
	longest := max(span, peerSpan)
	if longest <= 0 {
		return 0
	}
	return (rate*span + peerRate*peerSpan) / longest
}

// poolDrainLocked returns what underShareLocked takes the pool to drain, in cost per second: this replica's drain
// rate and the rate its seat-bound seats free (poolFreesLocked), plus those of its peers that reported demand, whether
// the drain rates have a window of evidence, and whether every endpoint not down, here and at those peers, is
// seat-bound (whole: the seats' free rate is then all the pool drains).
func (c *Controller) poolDrainLocked(now time.Time) (drain, frees float64, known, whole bool) {
	drain, _ = c.drain.rate()
	known = c.drain.settled()
	frees, whole = c.poolFreesLocked(now)
	if p := c.peers.Demand; p.Peers > 0 {
		drain, frees, known, whole = drain+p.Drain, frees+p.SeatFrees, known && p.Settled, whole && !p.Unseated
	}
	return drain, frees, known, whole
}

// SetPeers puts what the live peers reported in force (Peers{} when none is live). A peer's load that ended frees
// seats, and so do fewer requests of tenants under their share waiting at the peers (the seats kept for them), so
// waiting requests may be dispatched.
func (c *Controller) SetPeers(p Peers) {
	c.mu.Lock()
	now := c.clock.Now()
	// Fewer requests of tenants under their share waiting at the peers free the seats kept for them (peerKeptLocked).
	freed := p.ProtectedWaiting < c.peers.ProtectedWaiting
	c.hadPeers = c.hadPeers || p.ReserveShare != nil
	c.peers = p
	c.underShareAt = time.Time{} // judged again with the peers' demand
	for i := range c.endpoints {
		e := &c.endpoints[i]
		load := p.Load[e.Name]
		e.peerKV, e.peerUnsized = p.LoadKV[e.Name], p.LoadUnsized[e.Name]
		if load == e.peer {
			continue
		}
		if load < e.peer {
			// A peer's request there ended: as one of this replica's ending, it frees a slot, and a request sent
			// beyond the learned limit that starts now confirms the limit rather than disproving it (probeStarted).
			freed = true
			e.endedNs = now.UnixNano()
			e.learner.ended(now.UnixNano(), e.running)
		}
		e.peer = load
		e.refresh(c.cfg.Endpoint)
		e.noteFull(now)
	}
	if !freed || c.totalCount == 0 {
		c.mu.Unlock()
		return
	}
	c.drain.advance(now)
	c.dispatchFreedAndUnlock(now)
}

// SeatSummary is what a replica tells its peers of its seats.
type SeatSummary struct {
	// CriticalRate is the Critical arrivals per second here, SeatFrees the rate the seat-bound seats free, Seats how
	// many seat-bound seats there are (see seatReserveLocked).
	CriticalRate, SeatFrees float64
	Seats                   int
	// CriticalWaiting is how many Critical requests wait here.
	CriticalWaiting int
	// PoolSlots is the smallest slot limit learned on this replica's own endpoints at its latest snapshot (0 when
	// none): only what it learned itself, so that a limit its endpoints no longer show is forgotten by every replica
	// within one summary rather than passed round among them.
	PoolSlots int
	// PoolRunning is the most requests any of this replica's own endpoints was seen running at once, at its latest
	// snapshot (0 when none): with the peers' it is the pool's, which stands for the seats of an endpoint that has not
	// queued yet while no slot limit is learned (seatsLocked).
	PoolRunning int
	// Idle lists endpoints with an idle seat now that lower bands here will not take, and how many each has, in
	// snapshot order (at most maxOfferedEndpoints): where a peer's Critical request may go.
	Idle []EndpointSeats
	// Spare lists places a waiting request of a peer, of any band that may go to a peer's endpoint, may take
	// (spareLocked), in snapshot order, at most maxOfferedEndpoints; SpareProtected says that only a request of a
	// tenant under its share may take them (they are seats kept for the peers' ProtectedWaiting).
	Spare          []EndpointSeats
	SpareProtected bool
	// ProtectedWaiting is how many requests of tenants under their share wait here, in the bands that may go to a
	// peer's endpoint (protectedWaitingLocked).
	ProtectedWaiting int
}

// maxOfferedEndpoints bounds the endpoints a SeatSummary lists as idle.
const maxOfferedEndpoints = 32

// EndpointSeats is a count of seats on one endpoint.
type EndpointSeats struct {
	Endpoint string
	Seats    int
}

// SeatSummary returns the controller's seat figures at now for its peers.
func (c *Controller) SeatSummary() SeatSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	var s SeatSummary
	s.Seats, _, s.SeatFrees = c.seatFiguresLocked(now)
	s.CriticalRate, _ = c.criticalArrivals.rate(now)
	s.CriticalWaiting = c.bands[Critical].count
	s.PoolSlots = c.poolSlots
	s.PoolRunning = c.poolRunning
	// While lower bands wait, an idle seat beyond the reserve is theirs at the next dispatch: only the reserve is
	// offered. Either way at most maxOfferedEndpoints are listed, which bounds a summary's size in a large pool.
	offer := -1
	if c.totalCount > int64(c.bands[Critical].count) {
		offer, _ = c.seatReserveLocked(now)
	}
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	for i := range c.endpoints {
		if offer == 0 || len(s.Idle) == maxOfferedEndpoints {
			break
		}
		e := &c.endpoints[i]
		if n := c.freeSeatsLocked(e); n > 0 && e.usable(cutoff) {
			if offer > 0 {
				n = min(n, offer)
				offer -= n
			}
			s.Idle = append(s.Idle, EndpointSeats{Endpoint: e.Name, Seats: n})
		}
	}
	s.ProtectedWaiting = c.protectedWaitingLocked(now)
	s.Spare, s.SpareProtected = c.spareLocked(now, s.ProtectedWaiting)
	return s
}

// mayGoToPeerLocked reports whether a waiting request of band may be sent to a peer's spare place: a band below
// Critical that queues when saturated (one shed when saturated keeps to this replica's ceiling), and only while the
// Critical reserve is off here (MayUsePeerEndpoint's rules).
func (c *Controller) mayGoToPeerLocked(band Band, now time.Time) bool {
	return band != Critical && !c.cfg.Bands[band].RejectWhenSaturated && !c.criticalReserveLocked(now)
}

// protectedWaitingLocked counts the requests waiting here, in the bands that may go to a peer's place
// (mayGoToPeerLocked), of tenants under their share.
func (c *Controller) protectedWaitingLocked(now time.Time) int {
	n := 0
	var under map[tenantKey]tenantArrivals
	for _, b := range allBands {
		q := c.bands[b]
		if q.count == 0 || !c.mayGoToPeerLocked(b, now) {
			continue
		}
		if under == nil {
			under = c.underShareLocked(now)
		}
		for _, tq := range q.active {
			if _, ok := under[tenantKey{b, tq.name}]; ok {
				n += tq.n
			}
		}
	}
	return n
}

// spareLocked lists the places on this replica's endpoints a peer's waiting request may take (SeatSummary.Spare), while
// the Critical reserve is off and no Critical request nor one of a tenant under its share (protectedWaiting, from
// protectedWaitingLocked) waits here. While nothing
// waits here: the free seats of an endpoint with a seat count beyond those kept for this replica's own arrivals of
// tenants under their share, and one place on an endpoint without one (a large-batch server that has never queued)
// where a Standard request would go now (below Standard's ceiling, with a slot); for the peers' requests of tenants
// under their share only while some wait (protected). While requests of tenants over their share wait here: the seats
// they leave idle for the peers' waiting requests of tenants under their share (tenantSeatsLocked), to those only. One
// place an exchange interval on such an endpoint, taken in turn by the peers, is what its owner learns of within one
// summary (Peers.Load) and its next scrape shows: enough to move a peer's backlog (hundreds of requests a second in the
// pool at the default interval), not enough to overfill it before either tells.
//
// Ownership gives each replica an even share of the endpoints, not of their capacity, while the balancer gives it an
// even share of the requests: with servers of unequal speeds (or a number of them that the replicas do not divide) a
// replica owning the slow ones queues, and rejects, what the pool has room for at a peer owning fast ones, whose
// servers idle. One replica owning the pool would have sent those requests there: here the peer offers the places, and
// the replica whose queue holds requests sends them (DispatchSpareElsewhere).
func (c *Controller) spareLocked(now time.Time, protectedWaiting int) (spare []EndpointSeats, protected bool) {
	if c.criticalReserveLocked(now) || c.bands[Critical].count > 0 || protectedWaiting > 0 {
		return nil, false // what waits here takes the next place first
	}
	seats, _, frees := c.seatFiguresLocked(now)
	own := c.underShareSeatsLocked(Standard, "", seats, frees, now) // kept for the arrivals of tenants under their share
	waiting := c.peerKeptLocked(Standard, seats, now)
	// Kept as this replica's part of the pool's (pooledTenantSeatsLocked), the seats for arrivals of tenants under
	// their share are the pool's: one that waits at a peer may take them as it would take any idle seat of the pool
	// it owned. Kept for this replica's own arrivals (no peer reports demand), they stay for those.
	if c.pooledTenantSeatsLocked() && c.peers.ProtectedWaiting > 0 && c.mayGoToPeerLocked(Standard, now) {
		own, waiting = 0, min(seats/2, waiting+own)
	}
	switch {
	case c.totalCount == 0:
		// Nothing waits here: every place beyond those kept for this replica's own arrivals, to the peers' requests
		// of tenants under their share only while some wait.
		return c.offerSeatsLocked(now, own, -1, true, waiting > 0), waiting > 0
	case waiting > 0:
		// Requests of tenants over their share wait here: the seats they left idle for the peers' waiting requests
		// of tenants under their share (tenantSeatsLocked), to those only.
		return c.offerSeatsLocked(now, own, min(waiting, max(0, seats/2-own)), false, true), true
	}
	return nil, false
}

// offerSeatsLocked lists up to limit (-1: no limit) places on this replica's fresh endpoints below Standard's ceiling
// with a slot, in snapshot order, after leaving the first skip free seats unlisted: an endpoint's free seats, and, when
// unseated, one place on an endpoint without a seat count.
//
// Places offered to requests of tenants under their share only (protected) are judged as those requests are
// (headroomLocked's strict): by seats, not by the KV cache's use, against the endpoint's capacity, and, where KV room is
// counted, by whether a request of the mean size fits there now (kvOffersRoomLocked). Judged as any
// Standard request, a KV-bound endpoint whose tenants over their share left seats idle for them (its KV use near the
// ceiling that leaves room above it for whatever has priority) offered none of them, and the peers' protected requests
// waited for a seat of their own replica's to free.
func (c *Controller) offerSeatsLocked(now time.Time, skip, limit int, unseated, protected bool) []EndpointSeats {
	ceiling := c.cfg.Bands[Standard].SaturationCeiling
	cutoff := freshCutoff(now, c.cfg.Endpoint.MetricsStaleness)
	var spare []EndpointSeats
	for i := range c.endpoints {
		if len(spare) == maxOfferedEndpoints || limit == 0 {
			break
		}
		e := &c.endpoints[i]
		if !e.usable(cutoff) || !e.hasSlot(protected) || e.saturationFor(protected) >= ceiling || c.seatsGuessedLocked(e) ||
			protected && !c.kvOffersRoomLocked(e, now) {
			continue
		}
		n := 0
		switch {
		case c.seatsLocked(e) > 0:
			n = c.freeSeatsLocked(e)
			left := min(n, skip)
			n, skip = n-left, skip-left
		case unseated:
			n = 1
		}
		if limit > 0 {
			n = min(n, limit)
			limit -= n
		}
		if n > 0 {
			spare = append(spare, EndpointSeats{Endpoint: e.Name, Seats: n})
		}
	}
	return spare
}

// seatsGuessedLocked reports whether e's seats are a figure of the pool standing for its own while the pool shows that
// its servers differ: the pool's slot limit (poolSlotsForLocked) or, before one is learned, the most the pool has run
// (unqueuedSeatsLocked), while some server of the pool has run more than the slot limit learned (none: than 0). Such an
// endpoint is offered no place (offerSeatsLocked): its owner learns that it runs more than the guess only by sending
// it more, and a peer's request in one of the guessed seats holds the owner's count at the guess: in a mixed fleet's
// warm-up a large server, held at the small servers' slot limit while its owner's tenant was under its share
// (yieldedFullLocked), ran a few requests for seconds while its owner's queue shed (testbed/bench/scenarios/README.md,
// "No place on a guessed seat"). Where every server runs what the pool has run the guess is the seat count and stays
// offered.
func (c *Controller) seatsGuessedLocked(e *endpointState) bool {
	guessed := c.poolSlotsForLocked(e) > 0 || e.seats == 0 && c.unqueuedSeatsLocked(e) > 0
	return guessed && c.poolRunningLocked() > c.poolSlotsLocked()
}

// DispatchSpareElsewhere dispatches waiting requests of the bands below Critical that may go to a peer's endpoint
// (mayGoToPeerLocked), in the order this replica dispatches them (bands by priority, a tenant under its share first),
// while take finds a peer's spare place for the next (take gets the request's ID and whether its tenant is under its
// share, which may take the places kept for such requests too, and its KV size at its end in tokens, FinalKVTokens, for
// the owner to count; it returns the endpoint; it runs under the controller's lock and must not call the controller).
// It returns how many went. A request waits here only when no endpoint here has room for it, so this sends to a peer's
// idle place only what would otherwise wait.
func (c *Controller) DispatchSpareElsewhere(take func(id string, tokens int, protected bool) (endpoint string, ok bool)) int {
	c.mu.Lock()
	now := c.clock.Now()
	n := 0
	if !c.shuttingDown {
	bands:
		for _, b := range allBands {
			q := c.bands[b]
			if !c.mayGoToPeerLocked(b, now) {
				continue
			}
			for q.count > 0 {
				tq := c.underShareHeadLocked(b, q, now)
				protected := c.isUnderShareLocked(b, tq.name, now)
				if !protected && now.Sub(tq.head.enqueuedAt) < SpareMinWait {
					break bands // the next in line has not waited long enough to leave its own endpoints
				}
				endpoint, ok := take(tq.head.id, tokensOf(tq.head.size), protected)
				if !ok {
					break bands
				}
				c.dispatchHeadToPeerLocked(q, tq, b, endpoint, now)
				n++
			}
		}
	}
	c.unlockAfterDispatch(now, n)
	return n
}

// SpareMinWait is how long a request of a tenant that is not under its share waits here before it may take a peer's
// spare place (DispatchSpareElsewhere). A short wait is usually a seat here about to free, on an endpoint this
// replica's scheduler chose for it (its prefix cached there, say); sent to a peer's idle server instead, it pays a cold
// prefill there and delays what that server's owner sends it; a wait this long left shared-prefix's TTFT P99 where it
// was without spare places, and shorter ones did not (testbed/bench/scenarios/README.md, "The light tenant across
// replicas: spare places"). A request of a tenant under its share goes at once: one replica owning the pool would have
// dispatched it first.
const SpareMinWait = 500 * time.Millisecond

// CriticalWouldWait reports whether req is a valid Critical request that would wait here: no endpoint has headroom
// for it, Critical requests wait already (they go first), or, with a live peer, it could go only beyond an endpoint's
// seats (criticalSeatLocked). A caller that then sends it to a peer's endpoint reports that with DispatchedElsewhere;
// one that finds no idle seat at the peers admits it here as usual.
func (c *Controller) CriticalWouldWait(req Request) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if band, _, _ := c.bandOfLocked(req); band != Critical || c.shuttingDown || c.validateLocked(req) != nil {
		return false
	}
	if c.queuedAtOrAboveLocked(Critical) > 0 {
		return true
	}
	_, best, _ := c.headroomLocked(Critical, "", now)
	return best < 0 || c.peers.ReserveShare != nil && !c.criticalSeatLocked(now)
}

// criticalSeatLocked reports whether an endpoint with headroom for Critical has a free seat, or no seat count at all
// while it holds fewer than the pool's slot limit (poolSlotsCapLocked): nothing known says a request waits there.
// Beyond them, where the tentative capacity of an endpoint whose slot limit is not learned yet lets a Critical request
// go, it usually waits inside the server for the first slot to free (the seats are the most it has run, typically its
// limit); a peer's idle seat starts it at once.
func (c *Controller) criticalSeatLocked(now time.Time) bool {
	for _, name := range c.endpointsWithHeadroomLocked(Critical, "", false, now) {
		if c.startsAtOnceLocked(&c.endpoints[c.endpointIndex[name]]) {
			return true
		}
	}
	return false
}

// startsAtOnceLocked reports whether a request sent to e now would start at once as far as anything known says: e has
// a free seat, or no seat count while it holds fewer than the pool's slot limit.
func (c *Controller) startsAtOnceLocked(e *endpointState) bool {
	return c.freeSeatsLocked(e) > 0 || e.seats == 0 && !c.poolSlotsCapLocked(e)
}

// atOnceOnlyLocked reports whether a request of band may go only to an endpoint where it starts at once
// (startsAtOnceLocked): with a live peer, a Critical request, while such a seat exists, on one of this replica's fresh
// endpoints below band's ceiling or listed idle by a peer. One replica owning the pool would send it to such a seat
// rather than into a server's queue behind whatever runs there, and sees every seat of the pool; so it goes to one of
// this replica's, or waits here, first in line, for the next seat to free here or to be offered to this replica (a
// peer's idle seats are offered to its peers in turn, an exchange interval each: DispatchWaitingElsewhere). It also
// waits here when no such seat exists but every candidate already holds the pool's slot limit (poolSlotsLocked): sent
// there it would wait inside a server for that server's next slot (long in a warm-up, while every server runs its
// first requests), where here it takes the next seat that frees anywhere in the pool. Where the limit is not known
// yet, or some candidate holds fewer, it goes beyond the seats as before (a server's seats are the most it has run,
// not yet its limit). Without a live peer it decides as before. strict is headroomLocked's: whether the request is
// judged by seats (saturationFor).
func (c *Controller) atOnceOnlyLocked(band Band, strict bool, cutoff int64) bool {
	if band != Critical || c.peers.ReserveShare == nil {
		return false
	}
	if c.peers.IdleSeats > 0 {
		return true
	}
	ceiling := c.cfg.Bands[band].SaturationCeiling
	slots := c.poolSlotsLocked()
	below := false
	for i := range c.endpoints {
		e := &c.endpoints[i]
		if !e.usable(cutoff) || e.saturationFor(strict) >= ceiling {
			continue
		}
		if c.startsAtOnceLocked(e) {
			return true
		}
		below = below || slots == 0 || e.occupancy() < slots
	}
	return !below
}

// DispatchedElsewhere records and returns the decision for a Critical request that arrived here and was sent to
// endpoint, a peer's: it is Critical traffic here all the same (the reserve is on, and its arrival counts in the
// rate the pool's reserve is sized from), and holds no reservation here.
func (c *Controller) DispatchedElsewhere(req Request, endpoint string) Decision {
	c.mu.Lock()
	now := c.clock.Now()
	c.lastCritical = now
	c.criticalArrivals.add(now, 1)
	if c.totalCount > 0 {
		c.armTTLTimerLocked(now)
	}
	c.mu.Unlock()
	d := Decision{Outcome: Dispatched, Band: Critical, Endpoints: []string{endpoint}}
	c.recorder.RecordDecision(req.Tenant, d)
	return d
}

// DispatchWaitingElsewhere dispatches waiting Critical requests, in their order, to peers' endpoints while take
// finds one with an idle seat for the next (take gets the request's ID and its KV size at its end in tokens,
// FinalKVTokens, and returns the endpoint; it runs under the controller's lock and must not call the controller). It
// returns how many went.
func (c *Controller) DispatchWaitingElsewhere(take func(id string, tokens int) (endpoint string, ok bool)) int {
	c.mu.Lock()
	now := c.clock.Now()
	q := c.bands[Critical]
	n := 0
	for q.count > 0 {
		endpoint, ok := take(q.active[0].head.id, tokensOf(q.active[0].head.size))
		if !ok {
			break
		}
		c.dispatchHeadToPeerLocked(q, q.active[0], Critical, endpoint, now)
		n++
	}
	c.unlockAfterDispatch(now, n)
	return n
}

// dispatchHeadToPeerLocked dispatches the head of tenant queue tq, of band b's queue q, to endpoint, a peer's seat or
// place this replica took for it.
func (c *Controller) dispatchHeadToPeerLocked(q *bandQueue, tq *tenantQueue, b Band, endpoint string, now time.Time) {
	it := q.popTenant(tq)
	c.tenantLeftLocked(tq, it.cost, now)
	c.dequeuedLocked(it)
	c.drain.add(it.cost)
	c.finalizeLocked(it, Decision{Outcome: Dispatched, Band: b, Capped: it.capped, Endpoints: []string{endpoint},
		Waited: now.Sub(it.enqueuedAt)}, nil)
}

// poolSlotsLocked is the pool's slot limit (poolSlotsCapLocked): the smallest learned on this replica's endpoints or
// on its live peers' (0 when none is).
func (c *Controller) poolSlotsLocked() int {
	if c.poolSlots == 0 || c.peers.PoolSlots > 0 && c.peers.PoolSlots < c.poolSlots {
		return c.peers.PoolSlots
	}
	return c.poolSlots
}

// pooledReserveLocked is this replica's part of the reserve the whole pool needs, given its own Critical arrival
// rate, seat free rate and seat-bound seats: the pool's reserve sized from the pool's figures, as one replica would
// size it, shared out by Peers.ReserveShare, plus what the peers' parts lack of it (their idle seats listed fall short
// of the pool's reserve less this replica's part). One replica refills its reserve from whichever seat frees; a
// replica whose part its own Critical requests took refills it only from its own seats, so meanwhile its peers keep
// the pool's reserve whole (the next summary that shows its seats idle again gives them back).
func (c *Controller) pooledReserveLocked(arrivals, frees float64, seats int) int {
	p := c.peers
	pool := reserveSeats(arrivals+p.CriticalRate, frees+p.SeatFrees, (seats+p.Seats)/2) + p.CriticalWaiting
	share := p.ReserveShare(pool, seats)
	return min(share+max(0, pool-share-p.IdleSeats), seats/2)
}

// MayUsePeerEndpoint reports whether a request of band may go to endpoint name when it is not one of this controller's
// (a peer owns it) and some peer is live: for prefix affinity, a prompt a peer's endpoint holds much more of than any
// of this replica's. The band rules are MayExceedHeadroom's: never a band shed when saturated (a holdback band such
// as Sheddable), and only Critical while the Critical reserve is active. Whether the endpoint can take it is the
// scheduler's to weigh (its load is scraped by every replica, and the prefix guard cuts an overloaded endpoint's
// match); the owner counts the request on its seats once a summary tells of it (Peers.Load).
func (c *Controller) MayUsePeerEndpoint(band Band, name string) bool {
	if band >= NumBands {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, own := c.endpointIndex[name]; own || c.peers.ReserveShare == nil || c.shuttingDown {
		return false
	}
	if c.cfg.Bands[band].RejectWhenSaturated {
		return false
	}
	return band == Critical || !c.criticalReserveLocked(c.clock.Now())
}

// IsPeerEndpoint reports whether endpoint name is not one of this controller's (in its latest snapshot) while some peer
// is live: a request sent there runs on a peer's endpoint. Without a live peer every endpoint is this replica's to
// decide on, and none is a peer's.
func (c *Controller) IsPeerEndpoint(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, own := c.endpointIndex[name]
	return !own && c.peers.ReserveShare != nil
}

// seatsLocked is e's seats as the seat reserve counts them. With a live peer, an endpoint whose own slot limit is not
// known, whose seats (the most it has run) are below the pool's slot limit (poolSlotsLocked) and that never ran more
// than it, counts the pool's slot limit as its seats, within its tentative capacity: in a warm-up each replica learns
// its endpoints' seats from its own share of the traffic, and the slots between what an endpoint has run and the
// pool's limit start a request at once as a seat does. Counted as seats, the reserve keeps them idle for Critical; left
// out, lower bands took them beyond the seats while the replicas' reserves held no seat. Alone, or once the
// endpoint's limit is known, its seats are its own. Only the reserve, the idle seats offered to peers and where a
// Critical request starts at once count them: whether the endpoint is full (noteFull) and its rank go by the seats it
// is known to hold.
//
// With a live peer, while no slot limit is learned in the pool, an endpoint that has no seat count yet (it has not
// queued) counts as its seats the most any endpoint of the pool has been seen running at once (poolRunningLocked), if
// that is a small server's (below largeBatchRunning) and the endpoint never ran more: a server of the pool ran that
// many at once, and the endpoints of a pool usually run one configuration. In the warm-up the pool's first slot limit
// is learned only once some server is sent more than it runs, which with N replicas, each filling its own endpoints
// evenly, comes when the pool is all but full (one replica's ranking happened to overfill a server earlier: measured in
// testbed/bench/scenarios/README.md). Until then a replica whose own endpoints all run their tentative seats has no
// seat to send a Critical request to but beyond them, into a server's queue, while a peer's endpoint running fewer
// than the pool has run lists none (it has no seat count): the place one replica owning both would have taken. So
// the idle seats listed for peers count these places; where a Critical request here starts at once is unchanged
// (startsAtOnceLocked), and no reserve counts them (they are not seat-bound). Bounded by what the pool has run, not
// offered without end: a peer's request counts here only from its next summary.
func (c *Controller) seatsLocked(e *endpointState) int {
	if c.peers.ReserveShare == nil {
		return e.seats
	}
	if e.seats == 0 {
		return c.unqueuedSeatsLocked(e)
	}
	n := c.poolSlotsForLocked(e)
	if n <= e.seats {
		return e.seats
	}
	return max(e.seats, min(n, e.capacity))
}

// unqueuedSeatsLocked is seatsLocked for an endpoint with no seat count, with a live peer: while no slot limit is learned
// in the pool, the most the pool has run if below largeBatchRunning and not below what e has run; 0 otherwise.
func (c *Controller) unqueuedSeatsLocked(e *endpointState) int {
	if c.poolSlotsLocked() > 0 {
		return 0
	}
	n := c.poolRunningLocked()
	if n >= largeBatchRunning || e.learner.maxRunning > n {
		return 0
	}
	return n
}

// poolRunningLocked is the most requests any endpoint of the pool was seen running at once: on this replica's endpoints
// or its live peers' (0 when none).
func (c *Controller) poolRunningLocked() int {
	return max(c.poolRunning, c.peers.PoolRunning)
}

// freeSeatsLocked is how many of e's seats (seatsLocked) are free.
func (c *Controller) freeSeatsLocked(e *endpointState) int {
	return max(0, c.seatsLocked(e)-e.occupancy())
}
