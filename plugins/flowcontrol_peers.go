package plugins

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/prefixcache"
)

// The peer exchange, when this EPP is one of several replicas owning shares of the pool (FlowControlDeps.Peers):
// every replication.DefaultExchangeInterval the replica's transport asks PeerSummary for the summary to send its
// peers and hands each summary it receives to HearPeer. Admission then sizes the Critical seat reserve for the whole
// pool and keeps its part of it, and a Critical request that would wait on this replica's endpoints goes at once to a
// peer's endpoint with an idle seat (flowcontrol/peers.go). Nothing on the request path waits for a peer: it reads the
// latest summaries held.
//
// With a prefix-cache scorer (exactly one in the configuration), the summary also carries the prompt blocks its index
// inserted since the last one (prefixcache.Index.ShareInserts), at most DefaultSharedPrefixBlocks, and a replica takes
// its peers' into its own index: each replica's index then holds what any replica routed, not only its own share. So
// that a prompt a peer's endpoint holds can be sent there, the headroom filter keeps such an endpoint as a candidate
// when it holds much more of the prompt than this replica's own (mayUsePeerEndpoint); a request the scheduler then
// places there is recorded as sent to the peer's endpoint (PreRequest), which its owner counts on its seats.
//
// Every DemandEvery-th summary also carries what this replica's tenants ask and what it drains
// (flowcontrol.Controller.Demand), with which each replica judges a tenant under its share over the pool.

// PeerSummary returns this replica's next summary for its peers, after putting in force what the live peers last
// reported (so a peer that fell silent stops counting, and the summary acknowledges what was taken in).
func (f *FlowControl) PeerSummary() replication.Summary {
	now := f.clock.Now()
	f.applyPeers()
	s := f.ctrl.SeatSummary()
	own := replication.Summary{CriticalRate: s.CriticalRate, SeatFrees: s.SeatFrees, Seats: s.Seats,
		CriticalWaiting: s.CriticalWaiting, PoolSlots: s.PoolSlots, PoolRunning: s.PoolRunning,
		SpareProtected: s.SpareProtected, ProtectedWaiting: s.ProtectedWaiting,
		Idle: endpointCounts(s.Idle), Spare: endpointCounts(s.Spare)}
	if f.summaries.Add(1)%DemandEvery == 1 {
		own.Demand = wireDemand(f.ctrl.Demand())
	}
	if pc := f.sharedPrefix.Load(); pc != nil {
		inserts, dropped := pc.index.TakeInserts()
		sent := 0
		for _, in := range inserts {
			own.Prefix = append(own.Prefix, replication.BlockInserts{Pod: in.Pod.String(), Hashes: in.Hashes})
			sent += len(in.Hashes)
		}
		f.prefixBlocks.sent.Add(uint64(sent))
		f.prefixBlocks.dropped.Add(uint64(dropped))
	}
	return f.peers.Next(own, now)
}

// DemandEvery is how many summaries go between two that carry the demand: its rates are averages over the drain-rate
// window (seconds), so every 50 ms at the default interval follows them, at a tenth of the bytes of every summary.
const DemandEvery = 10

func wireDemand(d flowcontrol.Demand) *replication.Demand {
	w := &replication.Demand{Drain: d.Drain, Settled: d.Settled, Unseated: d.Unseated, Tenants: make([]replication.TenantDemand, 0, len(d.Tenants))}
	for _, t := range d.Tenants {
		w.Tenants = append(w.Tenants, replication.TenantDemand{Band: uint8(t.Band), Tenant: t.Tenant, Cost: t.Cost,
			Requests: t.Requests, Weight: t.Weight, Span: t.Span})
	}
	return w
}

// PeerWireVersion is the wire version to send peer this replica's summaries in (replication.Exchange.WireVersion).
func (f *FlowControl) PeerWireVersion(peer string) byte { return f.peers.WireVersion(peer) }

// DefaultSharedPrefixBlocks bounds the prompt blocks a summary carries: 8 bytes each, so at most 4 KiB (plus the
// pods' names) per summary and peer, 800 KB/s per peer at the default 5 ms interval. Blocks routed beyond it in one
// interval are not shared (a chain keeps its first blocks, which a match needs).
const DefaultSharedPrefixBlocks = 512

// sharePrefix makes the one PrefixCache among prefix share its inserts with the peers (none without peers, or with
// several: which index a peer's blocks belong to would be a guess).
func (f *FlowControl) sharePrefix(prefix []*PrefixCache) {
	if old := f.sharedPrefix.Load(); old != nil {
		old.index.ShareInserts(0)
	}
	if f.peers == nil || len(prefix) != 1 {
		f.sharedPrefix.Store(nil)
		return
	}
	prefix[0].index.ShareInserts(DefaultSharedPrefixBlocks)
	f.sharedPrefix.Store(prefix[0])
}

// endpointCounts is seats in the summary's wire terms (nil for none).
func endpointCounts(seats []flowcontrol.EndpointSeats) []replication.EndpointCount {
	var out []replication.EndpointCount
	for _, e := range seats {
		out = append(out, replication.EndpointCount{Endpoint: e.Endpoint, N: e.Seats})
	}
	return out
}

// HearPeer takes in a peer's summary and puts it in force at once: its prefix inserts go into the prefix index,
// Critical requests waiting here go to the idle seats it reports, and requests of the lower bands waiting here to the
// spare places it reports (flowcontrol.Controller.DispatchSpareElsewhere).
func (f *FlowControl) HearPeer(s replication.Summary) {
	now := f.clock.Now()
	if pc := f.sharedPrefix.Load(); pc != nil && len(s.Prefix) > 0 {
		inserts := make([]prefixcache.PodInserts, 0, len(s.Prefix))
		for _, in := range s.Prefix {
			ns, name, ok := strings.Cut(in.Pod, "/")
			if ok {
				inserts = append(inserts, prefixcache.PodInserts{Pod: prefixcache.PodID{Namespace: ns, Name: name}, Hashes: in.Hashes})
			}
		}
		pc.index.Insert(inserts)
	}
	s.Prefix = nil // taken in: the exchange keeps the summary's seat figures only
	f.peers.Heard(s, now)
	f.applyPeers()
	if f.steersElsewhere() {
		f.ctrl.DispatchWaitingElsewhere(func(id string, tokens int) (string, bool) { return f.peers.Take(id, tokens, now) })
		f.ctrl.DispatchSpareElsewhere(func(id string, tokens int, protected bool) (string, bool) {
			return f.peers.TakeSpare(id, tokens, now, protected)
		})
	}
}

// steersElsewhere reports whether a request sent to a peer's endpoint is scheduled there: candidate narrowing locates
// only that endpoint for it, and the headroom filter keeps only it. With neither (narrowing off and no headroom
// filter in the configuration) the scheduler would place it anywhere while the peer counts it on its endpoint, so
// no request is sent to a peer.
func (f *FlowControl) steersElsewhere() bool {
	return f.narrowing.Load() || f.filtering.Load()
}

// applyPeers hands the controller the live peers' figures (none when no peer is live: it decides alone).
func (f *FlowControl) applyPeers() {
	pool := f.peers.Pool(f.clock.Now())
	if !pool.Live() {
		f.ctrl.SetPeers(flowcontrol.Peers{})
		return
	}
	self := f.peers.Self()
	demand := flowcontrol.PeerDemand{Peers: pool.DemandPeers, Drain: pool.Demand.Drain, Settled: pool.Demand.Settled,
		Unseated: pool.Demand.Unseated, SeatFrees: pool.DemandSeatFrees}
	for _, t := range pool.Demand.Tenants {
		demand.Tenants = append(demand.Tenants, flowcontrol.TenantDemand{Band: flowcontrol.Band(t.Band), Tenant: t.Tenant,
			Cost: t.Cost, Requests: t.Requests, Weight: t.Weight, Span: t.Span})
	}
	f.ctrl.SetPeers(flowcontrol.Peers{
		CriticalRate: pool.CriticalRate, SeatFrees: pool.SeatFrees, Seats: pool.Seats,
		CriticalWaiting: pool.CriticalWaiting, Load: pool.Load, LoadKV: loadKV(pool.LoadTokens), LoadUnsized: pool.LoadUnsized,
		PoolSlots: pool.PoolSlots, PoolRunning: pool.PoolRunning,
		IdleSeats: pool.IdleSeats, ProtectedWaiting: pool.ProtectedWaiting,
		ReserveShare: func(n, seats int) int { return pool.ReserveShare(self, n, seats) },
		Demand:       demand,
	})
}

// loadKV is the peers' KV sizes on this replica's endpoints in the controller's terms (nil for none).
func loadKV(tokens map[string]int) map[string]float64 {
	if len(tokens) == 0 {
		return nil
	}
	out := make(map[string]float64, len(tokens))
	for e, n := range tokens {
		out[e] = float64(n)
	}
	return out
}

// sendElsewhere dispatches req to a peer's endpoint with an idle seat when it is a Critical request that would wait
// here; ok is false when it is not, or no peer reported an idle seat.
func (f *FlowControl) sendElsewhere(req flowcontrol.Request) (d flowcontrol.Decision, ok bool) {
	if f.peers == nil || !f.steersElsewhere() || !f.ctrl.CriticalWouldWait(req) {
		return d, false
	}
	endpoint, ok := f.peers.Take(req.ID, flowcontrol.FinalKVTokens(req), f.clock.Now())
	if !ok {
		return d, false
	}
	return f.ctrl.DispatchedElsewhere(req, endpoint), true
}

// mayUsePeerEndpoint reports whether the headroom filter may keep a peer's endpoint name, for prefix affinity, as a
// candidate of a request of band (flowcontrol.Controller.MayUsePeerEndpoint): only with the peer exchange and when a
// request placed there is steered there (steersElsewhere).
func (f *FlowControl) mayUsePeerEndpoint(band flowcontrol.Band, name string) bool {
	return f.peers != nil && f.steersElsewhere() && f.ctrl.MayUsePeerEndpoint(band, name)
}

// isPeerEndpoint reports whether endpoint, where the scheduler placed a request, is a live peer's (PreRequest records
// the request as sent there, which its owner counts on its seats).
func (f *FlowControl) isPeerEndpoint(endpoint string) bool {
	return f.peers != nil && endpoint != "" && f.ctrl.IsPeerEndpoint(endpoint)
}

// sharedBlocks counts the prefix blocks this replica's summaries carried, and those its bound dropped.
type sharedBlocks struct{ sent, dropped atomic.Uint64 }

// The peer exchange's admission metrics, read at scrape time from the exchange and the adapter's counters.
var (
	peerRequestsDesc = prometheus.NewDesc("sluice_peer_requests_sent_total",
		"Requests this replica sent to endpoints its peers own, by reason: idle_seat (a Critical request that would "+
			"have waited here took an idle seat a peer offered), spare_place (a waiting request of a lower band took "+
			"a place a peer would have left idle), prefix_affinity (the peer's endpoint held much more of "+
			"the prompt) or adapter_affinity (the peer's endpoint held the request's LoRA adapter, and none of "+
			"this replica's candidates did).", []string{"reason"}, nil)
	peerPrefixBlocksDesc = prometheus.NewDesc("sluice_peer_prefix_blocks_total",
		"Prompt blocks this replica's prefix index inserted, by outcome: sent to the peers in a summary, or dropped "+
			"because a summary carries at most DefaultSharedPrefixBlocks.", []string{"outcome"}, nil)
)

// peerCollector exports the peer exchange's admission metrics of fc (registered only when fc has peers).
type peerCollector struct{ fc *FlowControl }

var _ prometheus.Collector = peerCollector{}

func (c peerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- peerRequestsDesc
	ch <- peerPrefixBlocksDesc
}

func (c peerCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.fc.peers.Counts()
	ch <- prometheus.MustNewConstMetric(peerRequestsDesc, prometheus.CounterValue, float64(n.IdleSeat), "idle_seat")
	ch <- prometheus.MustNewConstMetric(peerRequestsDesc, prometheus.CounterValue, float64(n.SparePlace), "spare_place")
	ch <- prometheus.MustNewConstMetric(peerRequestsDesc, prometheus.CounterValue, float64(n.PrefixAffinity), "prefix_affinity")
	ch <- prometheus.MustNewConstMetric(peerRequestsDesc, prometheus.CounterValue, float64(n.AdapterAffinity), "adapter_affinity")
	b := &c.fc.prefixBlocks
	ch <- prometheus.MustNewConstMetric(peerPrefixBlocksDesc, prometheus.CounterValue, float64(b.sent.Load()), "sent")
	ch <- prometheus.MustNewConstMetric(peerPrefixBlocksDesc, prometheus.CounterValue, float64(b.dropped.Load()), "dropped")
}
