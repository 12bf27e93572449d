package replication

import (
	"cmp"
	"iter"
	"slices"
	"sync"
	"time"
)

// Summary is what one replica tells its peers every exchange tick (DefaultExchangeInterval): the figures the pool's
// Critical seat reserve is sized from, where its idle seats are, which of its requests run on endpoints it does not
// own, and which of each peer's summaries it has taken in. No request waits for one: each replica acts on the latest
// summaries it holds.
type Summary struct {
	// From is the sender's replica name (its --replica-id); Seq numbers its summaries from 1.
	From string
	Seq  uint64
	// CriticalRate is the sender's Critical arrivals per second, SeatFrees the rate its seat-bound seats free and
	// Seats how many it has (flowcontrol.SeatSummary).
	CriticalRate, SeatFrees float64
	Seats                   int
	// CriticalWaiting is how many Critical requests wait at the sender for a seat.
	CriticalWaiting int
	// PoolSlots is the smallest slot limit the sender learned on its own endpoints, 0 when none
	// (flowcontrol.SeatSummary).
	PoolSlots int
	// PoolRunning is the most requests any of the sender's own endpoints was seen running at once, 0 when none
	// (flowcontrol.SeatSummary; wire version 5).
	PoolRunning int
	// Idle lists the sender's endpoints with idle seats, and how many each has.
	Idle []EndpointCount
	// Spare lists places on the sender's endpoints that a waiting request at a peer may take (TakeSpare), and how
	// many each has: places the sender would leave idle (flowcontrol.SeatSummary.Spare; wire version 6).
	// SpareProtected says that only a request of a tenant under its share may take them. ProtectedWaiting is how many
	// requests of tenants under their share wait at the sender, for which its peers keep seats and offer them.
	Spare            []EndpointCount
	SpareProtected   bool
	ProtectedWaiting int
	// Sent counts, per endpoint the sender does not own, its requests running there: Critical ones sent to idle seats
	// (Exchange.Take) and any routed there for prefix affinity (Exchange.SentTo).
	Sent []EndpointCount
	// SentTokens is, per entry of Sent, the KV size in tokens its requests reach at their ends (their prompts and
	// expected outputs), for the owner to count its endpoints' KV room with them (wire version 8); nil from a sender
	// that does not tell them (an older release), and 0 for an entry whose size the sender does not know: such
	// requests are of unknown size to the owner.
	SentTokens []int
	// Acks is, per peer, the Seq of the latest of its summaries the sender has taken in: a peer's request sent to
	// the sender's endpoint counts in the sender's Idle once the summary that first told of it is acknowledged.
	Acks []Ack
	// Demand is what the sender's tenants ask and what its endpoints drain (flowcontrol.Controller.Demand), sent
	// every few summaries (wire version 4); nil in a summary without it, whose receiver keeps the sender's last while
	// the sender sends version 4 or later.
	Demand *Demand
	// Prefix is, per model-server pod, the prompt blocks the sender's prefix index inserted since its last summary
	// (prefixcache.PodInserts): what it routed there that the pod did not hold before, so each replica's index holds
	// what any replica routed. Bounded by the sender (plugins.DefaultSharedPrefixBlocks) and by the wire form.
	Prefix []BlockInserts
	// Version is the wire version the summary was read in (ParseSummary); 0 for one built here.
	Version byte
	// Reads is the newest wire version the sender reads, as it declared beside its summaries (the peer stream's
	// metadata); 0 when it did not: a release from before the declaration reads what it sends.
	Reads byte
}

// Demand is one replica's per-tenant demand and drain rate: with its peers' it judges whether a tenant is under its
// share of the pool, as one replica seeing every request would, rather than of its own share of the traffic.
type Demand struct {
	// Drain is the cost per second the sender's admission dispatched while requests waited; Settled whether it has a
	// window of evidence.
	Drain   float64
	Settled bool
	// Unseated is whether some endpoint of the sender's that is not down is not seat-bound: the rate its seats free
	// (Summary.SeatFrees) is then not all it drains.
	Unseated bool
	// Tenants are the sender's tenants active in the drain-rate window, at most a bound per band (the busiest).
	Tenants []TenantDemand
}

// TenantDemand is what one tenant of one band asks at a replica, per second over Span seconds, and the tenant's
// weight.
type TenantDemand struct {
	Band                   uint8
	Tenant                 string
	Cost, Requests, Weight float64
	Span                   float64
}

// BlockInserts are the prompt-block hashes a replica's prefix index inserted for one pod (its namespace/name), in
// the order it inserted them.
type BlockInserts struct {
	Pod    string
	Hashes []uint64
}

// EndpointCount is a count on one endpoint.
type EndpointCount struct {
	Endpoint string
	N        int
}

// Ack acknowledges a peer's summary.
type Ack struct {
	Peer string
	Seq  uint64
}

// Exchange is one replica's side of the summary exchange, safe for concurrent use: it keeps each peer's latest
// summary while the peer is live (heard within the timeout), the Critical requests this replica sent to peers'
// endpoints (Take, Done), and builds this replica's own summaries (Next). With no live peer it holds nothing the
// replica decides by: the replica decides alone.
type Exchange struct {
	self    string
	timeout time.Duration

	mu    sync.Mutex
	seq   uint64
	peers map[string]heardSummary
	sent  map[string]sentRequest // this replica's requests on peers' endpoints, by request ID
	// taken, spare and routed count the requests this replica sent to peers' endpoints (Counts): by Take, by TakeSpare,
	// and by SentTo for each Affinity.
	taken, spare uint64
	routed       [numAffinities]uint64
}

// Counts are how many requests a replica sent to peers' endpoints since it started: to idle seats its peers offered
// (Take), to spare places (TakeSpare), and where prefix or adapter affinity placed them (SentTo).
type Counts struct {
	IdleSeat, SparePlace, PrefixAffinity, AdapterAffinity uint64
}

// Counts returns the requests this replica sent to peers' endpoints so far.
func (x *Exchange) Counts() Counts {
	x.mu.Lock()
	defer x.mu.Unlock()
	return Counts{IdleSeat: x.taken, SparePlace: x.spare, PrefixAffinity: x.routed[ForPrefix], AdapterAffinity: x.routed[ForAdapter]}
}

// Affinity is why a request went to a peer's endpoint without an offered seat (SentTo).
type Affinity uint8

const (
	// ForPrefix: the endpoint held much more of the request's prompt than this replica's own.
	ForPrefix Affinity = iota
	// ForAdapter: the endpoint held the request's LoRA adapter, which none of this replica's own candidates did.
	ForAdapter
	numAffinities
)

type heardSummary struct {
	Summary
	at time.Time
	// version is the newest wire version the peer has declared it reads or has sent since it was last silent
	// (WireVersion).
	version byte
}

// sentRequest is a request sent to a peer's endpoint, and the Seq of the first of this replica's summaries to count
// it: until the owner acknowledges that summary, its Idle does not count the request.
type sentRequest struct {
	endpoint, owner string
	seq             uint64
	at              time.Time
	// tokens is the request's KV size at its end (Summary.SentTokens).
	tokens int
}

// sentTTL is how long a request sent to a peer's endpoint is counted without its end being reported (Done). Its end
// is reported with the response, also after errors and client disconnects; the bound keeps a record whose end was
// lost from holding a peer's seat for good. A request streaming longer is still counted by its owner, whose scrapes
// show it as load the owner did not send.
const sentTTL = 2 * time.Minute

// NewExchange returns self's side of the exchange; a peer's summary counts for timeout after it arrives.
func NewExchange(self string, timeout time.Duration) *Exchange {
	return &Exchange{self: self, timeout: timeout, peers: map[string]heardSummary{}, sent: map[string]sentRequest{}}
}

// Self returns the replica's own name.
func (x *Exchange) Self() string { return x.self }

// Heard takes in a peer's summary received at now. A summary older than the one held (a lower Seq: reordered, or
// from before the peer restarted and a newer one came) is ignored, as is one from self.
func (x *Exchange) Heard(s Summary, now time.Time) {
	if s.From == x.self || s.From == "" {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	h := heardSummary{Summary: s, at: now, version: max(s.Version, s.Reads)}
	if old, ok := x.peers[s.From]; ok && now.Sub(old.at) < x.timeout {
		if s.Seq <= old.Seq {
			return
		}
		h.version = max(h.version, old.version)
		if h.Demand == nil && s.Version >= wireVersionDemand {
			// Sent every few summaries: the last one holds while the peer is live and still sends a version that
			// carries it (a peer rolled back to an older release sends none again, and its last is dropped).
			h.Demand = old.Demand
		}
	}
	x.peers[s.From] = h
}

// WireVersion is the wire version to send peer in: the newest it has declared it reads (Summary.Reads) or has sent
// since it was last silent, up to WireVersion; version 1, which every release reads, until it is heard. Replicas of
// this release declare WireVersion, so they send each other the newest version from the first summary heard. Older
// releases declare nothing: one from before prefix sharing sends only version 1, and one from before the pool's slot
// limit sends version 1 while it has no prefix inserts to tell and 2 when it has, so it is sent version 2 from its
// first summary with inserts on.
func (x *Exchange) WireVersion(peer string) byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	h, ok := x.peers[peer]
	if !ok || h.version == 0 {
		return wireVersionSeats
	}
	return min(h.version, WireVersion)
}

// liveLocked drops the summaries of peers silent for the timeout, and the records of requests sent to peers older than
// sentTTL.
func (x *Exchange) liveLocked(now time.Time) {
	for p, h := range x.peers {
		if now.Sub(h.at) >= x.timeout {
			delete(x.peers, p)
		}
	}
	for id, r := range x.sent {
		if now.Sub(r.at) >= sentTTL {
			delete(x.sent, id)
		}
	}
}

// Next returns this replica's next summary, from its own seat figures (own.From, Seq, Sent and Acks are filled in).
func (x *Exchange) Next(own Summary, now time.Time) Summary {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.liveLocked(now)
	x.seq++
	own.From, own.Seq, own.Sent, own.SentTokens, own.Acks = x.self, x.seq, nil, nil, nil
	type onEndpoint struct {
		n, tokens int
		unsized   bool // a request there of a size this replica does not know: the entry's size is unknown (0)
	}
	counts := map[string]onEndpoint{}
	for _, r := range x.sent {
		c := counts[r.endpoint]
		c.n++
		c.tokens += r.tokens
		c.unsized = c.unsized || r.tokens <= 0
		counts[r.endpoint] = c
	}
	for e, c := range counts {
		own.Sent = append(own.Sent, EndpointCount{Endpoint: e, N: c.n})
	}
	slices.SortFunc(own.Sent, func(a, b EndpointCount) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	for _, e := range own.Sent {
		tokens := counts[e.Endpoint].tokens
		if counts[e.Endpoint].unsized {
			tokens = 0
		}
		own.SentTokens = append(own.SentTokens, tokens)
	}
	for p, h := range x.peers {
		own.Acks = append(own.Acks, Ack{Peer: p, Seq: h.Seq})
	}
	slices.SortFunc(own.Acks, func(a, b Ack) int { return cmp.Compare(a.Peer, b.Peer) })
	return own
}

// Pool is what the live peers reported, summed: the figures a replica sizes the pool's Critical reserve from.
type Pool struct {
	CriticalRate, SeatFrees float64
	Seats, CriticalWaiting  int
	// PoolSlots is the smallest slot limit a live peer learned on its endpoints; 0 when none did. IdleSeats is how
	// many idle seats they listed, to whichever replica each is offered.
	PoolSlots, IdleSeats int
	// PoolRunning is the most requests any live peer saw one of its endpoints run at once; 0 when none reported it.
	PoolRunning int
	// ProtectedWaiting is how many requests of tenants under their share wait at the live peers.
	ProtectedWaiting int
	// Load is, per endpoint, the requests peers said they sent there and still run. LoadTokens is, per endpoint, the
	// KV size in tokens those requests reach at their ends, of the peers that tell it (Summary.SentTokens), and
	// LoadUnsized how many of the requests are of peers that do not (older releases): of unknown size.
	Load, LoadTokens, LoadUnsized map[string]int
	// seats are the live replicas' seat-bound seats, self's not included, by name (ReserveShare).
	seats map[string]int
	// Demand sums the Demand of the live peers that sent one (DemandPeers of them; a peer of a release from before
	// wire version 4 sends none): their drain rates, settled only if every one is, their tenants' demand summed per
	// band and tenant (the largest weight), and the rate their seats free (DemandSeatFrees), so that a replica judges
	// tenants over itself and the peers that reported, a consistent part of the pool.
	Demand          Demand
	DemandPeers     int
	DemandSeatFrees float64
}

// Live reports whether some peer is live: without one a replica decides alone.
func (p Pool) Live() bool { return len(p.seats) > 0 }

// Pool returns the live peers' figures at now.
func (x *Exchange) Pool(now time.Time) Pool {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.liveLocked(now)
	p := Pool{seats: map[string]int{}}
	for name, h := range x.peers {
		p.CriticalRate += h.CriticalRate
		p.SeatFrees += h.SeatFrees
		p.Seats += h.Seats
		p.CriticalWaiting += h.CriticalWaiting
		p.ProtectedWaiting += h.ProtectedWaiting
		for _, e := range h.Idle {
			p.IdleSeats += e.N
		}
		if h.PoolSlots > 0 && (p.PoolSlots == 0 || h.PoolSlots < p.PoolSlots) {
			p.PoolSlots = h.PoolSlots
		}
		p.PoolRunning = max(p.PoolRunning, h.PoolRunning)
		p.seats[name] = h.Seats
		for i, s := range h.Sent {
			if p.Load == nil {
				p.Load, p.LoadTokens, p.LoadUnsized = map[string]int{}, map[string]int{}, map[string]int{}
			}
			p.Load[s.Endpoint] += s.N
			if len(h.SentTokens) == len(h.Sent) && h.SentTokens[i] > 0 {
				p.LoadTokens[s.Endpoint] += h.SentTokens[i]
			} else {
				p.LoadUnsized[s.Endpoint] += s.N
			}
		}
	}
	// Demand in peer name order: sums of floats, which the same figures then give the same in every run.
	names := make([]string, 0, len(x.peers))
	for name, h := range x.peers {
		if h.Demand != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		h := x.peers[name]
		p.addDemand(h.Demand, h.SeatFrees)
	}
	return p
}

// addDemand adds a peer's demand, and the rate its seats free, to the pool's (Pool.Demand).
func (p *Pool) addDemand(d *Demand, frees float64) {
	if p.DemandPeers == 0 {
		p.Demand.Settled = true
	}
	p.DemandPeers++
	p.DemandSeatFrees += frees
	p.Demand.Drain += d.Drain
	p.Demand.Settled = p.Demand.Settled && d.Settled
	p.Demand.Unseated = p.Demand.Unseated || d.Unseated
	for _, t := range d.Tenants {
		i := slices.IndexFunc(p.Demand.Tenants, func(u TenantDemand) bool { return u.Band == t.Band && u.Tenant == t.Tenant })
		if i < 0 {
			p.Demand.Tenants = append(p.Demand.Tenants, t)
			continue
		}
		// Summed as counted (rate times span) over the longest span (flowcontrol's tenantRates).
		u := &p.Demand.Tenants[i]
		span := max(u.Span, t.Span)
		if span > 0 {
			u.Cost, u.Requests = (u.Cost*u.Span+t.Cost*t.Span)/span, (u.Requests*u.Span+t.Requests*t.Span)/span
		}
		u.Weight, u.Span = max(u.Weight, t.Weight), span
	}
}

// ReserveShare is self's part of a pool-wide reserve of pool seats when it has seats seat-bound seats: the pool's
// reserve apportioned over the replicas in name order by their seats, so that the parts add up to the pool's reserve
// (the first replicas' parts round down, the later ones' up) and every replica computes the same parts from the same
// figures.
func (p Pool) ReserveShare(self string, pool, seats int) int {
	// The replicas before self in name order, summed without sorting: this runs under the controller's lock on every
	// seat check, so it allocates nothing.
	total, before := seats, 0
	for n, s := range p.seats {
		total += s
		if n < self {
			before += s
		}
	}
	if total <= 0 || pool <= 0 {
		return 0
	}
	return pool*(before+seats)/total - pool*before/total
}

// Take picks, for request id, whose KV size at its end is tokens (Summary.SentTokens), a peer's endpoint with an idle
// seat offered to this replica that no request of this replica has taken since the peer last counted (the one with most
// such seats; names break ties), records the request there and returns the endpoint. ok is false when no live peer
// offers one.
//
// A peer's idle seats are offered in turn: seat i of its summary (counting its Idle list seat by seat; a spare place
// on an endpoint Idle lists is one of those seats, seatNumbers) to the (i+Seq) mod n-th of the n peers it
// acknowledges, in name order. So two replicas never take the same idle seat
// from one summary, and each summary (every exchange interval) offers the seats to the next replica.
func (x *Exchange) Take(id string, tokens int, now time.Time) (endpoint string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if endpoint, ok = x.takeLocked(id, tokens, now, func(h heardSummary) []EndpointCount { return h.Idle }); ok {
		x.taken++
	}
	return endpoint, ok
}

// TakeSpare is Take over the peers' spare places (Summary.Spare) rather than their idle seats: for a request waiting
// here, where one replica owning the pool would have sent it to an idle server of the pool; protected says whether its
// tenant is under its share, which it must be to take a place a peer offered only to such requests
// (Summary.SpareProtected). The places are offered in turn as idle seats are, so two replicas never take the same place
// from one summary, and a replica takes a place again only once the owner acknowledges the summary that counted its
// last one there.
func (x *Exchange) TakeSpare(id string, tokens int, now time.Time, protected bool) (endpoint string, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	spare := func(h heardSummary) []EndpointCount {
		if h.SpareProtected && !protected {
			return nil
		}
		return h.Spare
	}
	if endpoint, ok = x.takeLocked(id, tokens, now, spare); ok {
		x.spare++
	}
	return endpoint, ok
}

// takeLocked is Take over the list of each live peer's summary that offered gives.
func (x *Exchange) takeLocked(id string, tokens int, now time.Time, offered func(heardSummary) []EndpointCount) (endpoint string, ok bool) {
	x.liveLocked(now)
	// unseen counts this replica's requests each owner has not yet acknowledged, by endpoint.
	unseen := map[string]int{}
	for _, r := range x.sent {
		if h, live := x.peers[r.owner]; live && r.seq > ackOf(h.Acks, x.self) {
			unseen[r.endpoint]++
		}
	}
	best, bestOwner, bestFree := "", "", 0
	for owner, h := range x.peers {
		rank := slices.IndexFunc(h.Acks, func(a Ack) bool { return a.Peer == x.self })
		if rank < 0 {
			continue // the owner has not heard this replica: it would not count the request
		}
		number := seatNumbers(h.Idle)
		for _, e := range offered(h) {
			mine := 0
			for seat := range number(e) {
				if (uint64(seat)+h.Seq)%uint64(len(h.Acks)) == uint64(rank) {
					mine++
				}
			}
			free := mine - unseen[e.Endpoint]
			if free > bestFree || (free == bestFree && free > 0 && e.Endpoint < best) {
				best, bestOwner, bestFree = e.Endpoint, owner, free
			}
		}
	}
	if bestFree <= 0 {
		return "", false
	}
	x.sent[id] = sentRequest{endpoint: best, owner: bestOwner, seq: x.seq + 1, at: now, tokens: tokens}
	return best, true
}

// seatNumbers numbers the seats a summary offers so that a seat has one number whichever of its lists offers it: the
// seats of idle, seat by seat in order, then any other place, in the order they are asked for. The function it
// returns yields the numbers of an entry's seats: on an endpoint idle lists, the last e.N of its idle seats (a spare
// place there is one of its idle seats), so Take and TakeSpare offer one seat to one peer.
func seatNumbers(idle []EndpointCount) func(e EndpointCount) iter.Seq[int] {
	type seats struct{ first, n int }
	listed := make(map[string]seats, len(idle))
	next := 0
	for _, e := range idle {
		listed[e.Endpoint] = seats{next, e.N}
		next += e.N
	}
	return func(e EndpointCount) iter.Seq[int] {
		l := listed[e.Endpoint]
		shared := min(e.N, l.n)
		start, more := l.first+l.n-shared, e.N-shared
		extra := next
		next += more
		return func(yield func(int) bool) {
			for seat := start; seat < start+shared; seat++ {
				if !yield(seat) {
					return
				}
			}
			for seat := extra; seat < extra+more; seat++ {
				if !yield(seat) {
					return
				}
			}
		}
	}
}

// SentTo records request id, of KV size tokens at its end, which this replica routed to endpoint, a peer's, without
// taking an offered seat (affinity, why, chose it): its summaries count it there (Sent), and the owner on its seats,
// until Done. A request already recorded (Take) keeps its record. Its owner is not known here, so it does not hold back
// this replica's next Take of that endpoint's offered seats before the owner counts it: for one exchange interval a
// seat may be offered twice.
func (x *Exchange) SentTo(id, endpoint string, tokens int, why Affinity, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.sent[id]; !ok {
		x.sent[id] = sentRequest{endpoint: endpoint, seq: x.seq + 1, at: now, tokens: tokens}
		if why < numAffinities { // callers pass the constants above
			x.routed[why]++
		}
	}
}

// Done forgets request id sent to a peer's endpoint (it ended); it reports whether id was one.
func (x *Exchange) Done(id string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.sent[id]
	delete(x.sent, id)
	return ok
}

// Sent reports whether request id was sent to a peer's endpoint and has not been Done.
func (x *Exchange) Sent(id string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.sent[id]
	return ok
}

func ackOf(acks []Ack, peer string) uint64 {
	for _, a := range acks {
		if a.Peer == peer {
			return a.Seq
		}
	}
	return 0
}

// DefaultExchangeInterval is how often a replica sends its summary to each peer by default: a peer's idle seats and
// the requests sent to them are known within one interval plus the network, well inside one scrape (50 ms).
const DefaultExchangeInterval = 5 * time.Millisecond
