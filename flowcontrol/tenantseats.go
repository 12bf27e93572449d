package flowcontrol

import (
	"slices"
	"time"
)

// Tenant seats: fair queuing orders a band's dispatches, so over time a tenant that asks for less than its fair share
// gets all it asks; but only over time. Under overload every seat that frees goes to the head of the queue, so a
// request of such a tenant waits for a seat to free, and a backlog it built while nothing was dispatched (a warm-up,
// a burst) clears only at the margin between its share and its demand (about one request a second in the
// tenant-fairness scenario). So, while a band's tenants contend, a tenant under its share (active within the
// drain-rate window, and asking less cost per second than its weight's share, among the band's active tenants, of what
// the band drains) is served as its share entitles it to be, at once:
//   - its waiting requests dispatch before the other tenants' of its band (max-min fairness: what a tenant asks below
//     its share it is given in full), so its backlog clears at the band's rate;
//   - on seat-bound endpoints the other tenants of its band leave seats idle for it, sized from its own arrival rate
//     as the Critical reserve is (reserveSeats; the same seats, the same chain), so its arrival finds a free seat.
//   - its requests are judged by seats, not by the KV cache's use, as Critical's are under the reserve (satReserve):
//     the band's ceiling on KV use, which leaves room above it for whatever has priority, would otherwise close the
//     seats kept for it until a whole batch ends (on KV-bound servers whose requests start and end together, seconds).
//   - no request of its band, its own included, is sent where it would wait inside a server (yieldsLocked): beyond
//     an endpoint's capacity, or beyond the pool's slot limit where the endpoint's own is not known. In a warm-up,
//     before any request has ended, the other tenants would fill the servers' queues and take the first places to
//     free there, and the protected tenant's arrivals would wait for the ones after them.
//
// A tenant asking more than its share is not protected and waits its turn in fair order; a band with one active
// tenant has nobody to protect it from, and lower bands keep seats for no tenant of a higher band (band priority
// already orders them; only Critical has a reserve across bands). In the Critical band no seats are kept per tenant:
// the Critical reserve keeps them for the whole band (kept per tenant on top, they idled up to half the seats of the
// chaos fleet, whose Critical band holds two tenants, and delayed its Critical requests).

// tenantKey names a tenant within a band: fair queuing, and so tenant seats, are per band.
type tenantKey struct {
	band   Band
	tenant string
}

// tenantDemand is what a tenant of a band asks: requests and cost per second, measured over the drain-rate window.
type tenantDemand struct {
	requests, cost rateMeter
	weight         float64
	last           time.Time
}

// minTenantSweepAt is the size of the demand table that triggers forgetting tenants idle for a window.
const minTenantSweepAt = 64

// noteArrivalLocked counts an arrival of tenant in band, of cost, with the tenant's weight.
func (c *Controller) noteArrivalLocked(band Band, tenant string, weight, cost float64, now time.Time) {
	k := tenantKey{band, tenant}
	d := c.demand[k]
	if d == nil {
		if len(c.demand) >= c.demandSweepAt {
			c.sweepDemandLocked(now)
		}
		d = &tenantDemand{requests: newRateMeter(c.cfg.DrainRateWindow), cost: newRateMeter(c.cfg.DrainRateWindow)}
		c.demand[k] = d
	}
	d.requests.add(now, 1)
	d.cost.add(now, cost)
	d.weight, d.last = weight, now
	c.underShareAt = time.Time{}
}

// sweepDemandLocked forgets the tenants idle for a drain-rate window (they count as inactive already).
func (c *Controller) sweepDemandLocked(now time.Time) {
	for k, d := range c.demand {
		if !c.activeLocked(d, now) {
			delete(c.demand, k)
		}
	}
	c.demandSweepAt = max(minTenantSweepAt, 2*len(c.demand))
}

func (c *Controller) activeLocked(d *tenantDemand, now time.Time) bool {
	return now.Sub(d.last) < c.cfg.DrainRateWindow
}

// tenantArrivals is how many requests per second a tenant of a band sends: here, and over the pool (here plus the
// peers that reported their demand; the same as here without them).
type tenantArrivals struct {
	here, pool float64
}

// underShareLocked returns the tenants under their share at now (see the file comment), with their arrival rates in
// requests per second. It is computed once per instant: dispatch asks it for every request it sends.
func (c *Controller) underShareLocked(now time.Time) map[tenantKey]tenantArrivals {
	if c.underShare != nil && c.underShareAt.Equal(now) {
		return c.underShare
	}
	clear(c.underShare)
	clear(c.shareInDoubt)
	if c.underShare == nil {
		c.underShare, c.shareInDoubt = make(map[tenantKey]tenantArrivals), make(map[tenantKey]bool)
	}
	c.underShareAt = now
	// What each tenant asks: over the pool when peers report their demand (peers.go), else here.
	rates := c.tenantRatesLocked(now)
	var asked, requests, weight [NumBands]float64
	var active [NumBands]int
	for k, t := range rates {
		asked[k.band] += t.cost
		requests[k.band] += t.requests
		weight[k.band] += t.weight
		active[k.band]++
	}
	if !slices.ContainsFunc(active[:], func(n int) bool { return n >= 2 }) {
		return c.underShare // no band has tenants to protect from each other
	}
	// What the pool drains, in cost per second: the drain rate, or on seat-bound endpoints the rate their seats free
	// (Little's law) at the mean cost asked if more. The drain rate is measured only while requests wait, so it starts
	// low after a warm-up that dispatched nothing; until it has a window of evidence (settled) and while nothing
	// better is known, the pool counts as draining what the bands ask if more: a tenant asking less than its weight's
	// share of the demand is then under its share. The seats counted are those of every endpoint not down, fresh or
	// not (poolFreesLocked).
	//
	// The rate seats free is all the pool drains only where every endpoint not down is seat-bound (whole): one that is
	// not (a large batch, a server with room) drains beyond it. Before the drain rate settles, a tenant over its share
	// of that rate but under its share of the demand (doubt) has its share in doubt (shareInDoubt): it is not
	// protected, but not shed as a tenant over its share either (sharesDrainLocked): at a replica that owns only small
	// servers, a light tenant just over that rate in a burst would otherwise share the replica's small drain with the
	// heavy backlog and be answered 429. Judging it under its share of the demand instead (protected) cost one
	// replica's goodput on the mixed fleet (testbed/bench/scenarios/README.md, "The light tenant across replicas: seat
	// free rates that leave out part of the pool").
	drain, frees, known, whole := c.poolDrainLocked(now)
	var total, n float64
	for _, b := range allBands {
		total, n = total+asked[b], n+requests[b]
	}
	doubt := 0.0
	if frees > 0 && n > 0 {
		if !known && !whole {
			doubt = max(drain, total)
		}
		drain, known = max(drain, frees*total/n), true
	}
	if !known {
		drain = max(drain, total)
	}
	doubt = max(doubt, drain)
	// What each band drains: the pool's drain less what the bands above ask. Only tenants active here are judged:
	// the others send nothing here to protect.
	above := 0.0
	for _, b := range allBands {
		capacity, doubtful := max(0, drain-above), max(0, doubt-above)
		above += asked[b]
		if active[b] < 2 {
			continue
		}
		for k, t := range rates {
			if k.band != b || !t.here {
				continue
			}
			switch share := t.weight / weight[b]; {
			case t.cost < share*capacity:
				c.underShare[k] = tenantArrivals{here: t.arrivals, pool: t.requests}
			case t.cost < share*doubtful:
				c.shareInDoubt[k] = true
			}
		}
	}
	return c.underShare
}

// shareInDoubtLocked reports whether tenant is over its share in band only by a seat free rate that leaves out part of
// the pool, before the drain rate settles (underShareLocked).
func (c *Controller) shareInDoubtLocked(band Band, tenant string, now time.Time) bool {
	c.underShareLocked(now)
	return c.shareInDoubt[tenantKey{band, tenant}]
}

// poolFreesLocked returns the rate (per second) the seats of the seat-bound endpoints that are not down free: unlike
// the reserves' seat figures (seatFiguresLocked), the seats a request could take now, it counts an endpoint whose
// latest scrape is merely late (within outageStalenessMultiple staleness thresholds). A late scrape does not slow the
// rate its seats free, and in real time scrapes come late under load: counted over the fresh endpoints only, every
// tenant's share shrank for as long as one scrape was late, a tenant a little under its share was judged over it for
// that moment, its band stopped yielding (yieldsLocked), and the other tenants' requests went where they queue inside
// the servers, ahead of its next ones.
//
// whole reports whether every endpoint not down is seat-bound: only then do its seats free at the rate the pool drains.
func (c *Controller) poolFreesLocked(now time.Time) (frees float64, whole bool) {
	_, _, frees, whole = c.seatFiguresWithinLocked(now, outageStalenessMultiple*c.cfg.Endpoint.MetricsStaleness)
	return frees, whole
}

// isUnderShareLocked reports whether tenant is under its share in band.
func (c *Controller) isUnderShareLocked(band Band, tenant string, now time.Time) bool {
	_, under := c.underShareLocked(now)[tenantKey{band, tenant}]
	return under
}

// underShareHeadLocked returns the tenant queue of band q (b) that dispatches next: the under-share tenant with the
// earliest start tag if one has requests waiting, else the fair queue's head.
func (c *Controller) underShareHeadLocked(b Band, q *bandQueue, now time.Time) *tenantQueue {
	under := c.underShareLocked(now)
	var head *tenantQueue
	for _, tq := range q.active {
		if _, ok := under[tenantKey{b, tq.name}]; ok && (head == nil || q.active.before(tq, head)) {
			head = tq
		}
	}
	if head == nil {
		return q.active[0]
	}
	return head
}

// tenantSeatsLocked returns how many idle seats of the seat-bound endpoints (seats of them, freeing at frees per
// second) a request of tenant in band must leave for the band's other tenants under their share: for each, the
// reserve its arrival rate needs (reserveSeats), and with live peers one for each request of such a tenant waiting at a
// peer (peerKeptLocked), in all at most half the seats. A tenant under its share keeps none from the others under
// theirs: each would otherwise hold the freed seats idle for the other while both wait.
func (c *Controller) tenantSeatsLocked(band Band, tenant string, seats int, frees float64, now time.Time) int {
	if band == Critical || c.isUnderShareLocked(band, tenant, now) {
		return 0 // the Critical reserve keeps seats for the whole band, sized from all its arrivals
	}
	return min(c.underShareSeatsLocked(band, tenant, seats, frees, now)+c.peerKeptLocked(band, seats, now), seats/2)
}

// underShareSeatsLocked is the part of tenantSeatsLocked kept for the arrivals of the band's other tenants under their
// share, at most half the seats. Alone, it is sized from their arrivals here and this replica's seats. With live peers
// that report their demand (pooledTenantSeatsLocked) it is this replica's part (Peers.ReserveShare) of the pool's,
// sized as one replica owning the pool would size it: from each one's arrivals over the pool and the pool's seats and
// the rate they free (its own and the peers'). The reserve's size depends on the ratio of the rate seats free to the
// arrival rate, which is the same at every replica with an even share of both, not on how many replicas there are;
// sized from each replica's own figures, the pool kept it once per replica (N times one replica's seats idle: at
// kv-bound x4, where each replica owns one ten-seat server, five of the ten idle, and throughput fell to 0.885x of one
// replica's). A protected request that finds no seat here waits first in its band, and the peers keep seats for it
// and offer them (peerKeptLocked, spareLocked).
func (c *Controller) underShareSeatsLocked(band Band, tenant string, seats int, frees float64, now time.Time) int {
	pooled := c.pooledTenantSeatsLocked()
	sizeSeats, sizeFrees := seats, frees
	if pooled {
		sizeSeats, sizeFrees = seats+c.peers.Seats, frees+c.peers.SeatFrees
	}
	kept := 0
	for k, arrivals := range c.underShareLocked(now) {
		if k.band == band && k.tenant != tenant {
			rate := arrivals.here
			if pooled {
				rate = max(arrivals.pool, arrivals.here)
			}
			kept += reserveSeats(rate, sizeFrees, sizeSeats/2)
		}
	}
	kept = min(kept, sizeSeats/2)
	if pooled {
		kept = c.peers.ReserveShare(kept, seats)
	}
	return min(kept, seats/2)
}

// pooledTenantSeatsLocked reports whether the seats kept for tenants under their share are this replica's part of the
// pool's (underShareSeatsLocked): some live peer reports its demand.
func (c *Controller) pooledTenantSeatsLocked() bool {
	return c.peers.ReserveShare != nil && c.peers.Demand.Peers > 0
}

// peerKeptLocked is the part of tenantSeatsLocked kept, of seats seat-bound seats here, for the peers' waiting
// requests of tenants under their share (Peers.ProtectedWaiting), in a band whose requests may go to a peer's place:
// one replica owning the pool would dispatch them before the requests of a tenant over its share, and they take the
// seats from this replica's offer (spareLocked). The pool keeps one seat for each, not one at every replica: this
// replica's part of them by its seats (Peers.ReserveShare, whose parts over the replicas add up to them).
func (c *Controller) peerKeptLocked(band Band, seats int, now time.Time) int {
	if c.peers.ProtectedWaiting == 0 || c.peers.ReserveShare == nil || !c.mayGoToPeerLocked(band, now) {
		return 0
	}
	return c.peers.ReserveShare(c.peers.ProtectedWaiting, seats)
}

// yieldsLocked reports whether a request of tenant in band is sent only where it starts at once (yieldedFullLocked):
// while a tenant of its band (below Critical) is under its share. The other tenants' requests would otherwise fill the
// servers' own queues during a warm-up, before the seats are known, and take the first places to free there; the
// protected tenant's request would be the one to wait inside a server for a first request to end. It waits for a
// place in the EPP instead, first in its band.
func (c *Controller) yieldsLocked(band Band, tenant string, now time.Time) bool {
	if band == Critical {
		return false // the Critical reserve keeps its own rules (seats.go)
	}
	return c.bandUnderShareLocked(band, now)
}

// bandUnderShareLocked reports whether a tenant of band is under its share at now.
func (c *Controller) bandUnderShareLocked(band Band, now time.Time) bool {
	for k := range c.underShareLocked(now) {
		if k.band == band {
			return true
		}
	}
	return false
}

// yieldedFullLocked reports whether e takes no request of a band whose requests yield (yieldsLocked): it holds what
// it starts at once as far as the EPP can tell, which is its capacity (concurrencyLearner.limits: the most it has run
// and a ramp beyond, or its slot limit without a probe beyond it), or, where its own limit is not known and it never
// ran more, the pool's slot limit (poolSlotsCapLocked), or, in a pool with a slot limit where it has no capacity
// either (a large batch, largeBatchRunning or more running), the most it has run while its latest scrape shows
// requests waiting there at that most (queuedAtMostRun): in the warm-up the mixed fleet's 24-slot server, whose limit
// no two scrapes had shown yet, took requests beyond its slots right after its first queue, the light tenant's among
// them, which then waited there (testbed/bench/scenarios/README.md, "The mixed fleet's light tenant kept out of
// servers' queues in the warm-up"). A large server that is still growing admits what waits at its next step and shows
// more running, which opens it again. With live peers too, like queuedBeyondSeatsLocked: without it, on the mixed
// fleet the heavy tenant's requests queued inside the 24-slot server ahead of the light tenant's next ones waiting at
// the replica (the bench README, "lightmix17's warm-up rules with live peers"), and the heavy tenant pays what it pays
// at one replica. A KV-bound endpoint's capacity (what its KV cache holds of the current mix, moving with it) does not
// bound it: kept to it, the heavy tenant of the tenant-fairness scenario's KV-bound shape left the light one waiting
// longer inside the servers (testbed/bench/scenarios/README.md). An endpoint holding none of the EPP's requests is
// never full (hasSlot's floor): load the EPP did not send must not close it for as long as that load lasts.
func (c *Controller) yieldedFullLocked(e *endpointState) bool {
	if e.holdsNone() {
		return false
	}
	return e.kvRoom() > float64(e.capacity) && !e.hasSlot(true) || c.poolSlotsCapLocked(e) ||
		c.poolSlotsLocked() > 0 && e.seats == 0 && e.queuedAtMostRun() && e.occupancy() >= e.learner.maxRunning
}
