package plugins

import (
	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// The peer exchange, when this EPP is one of several replicas owning shares of the pool (FlowControlDeps.Peers):
// every replication.DefaultExchangeInterval the replica's transport asks PeerSummary for the summary to send its
// peers and hands each summary it receives to HearPeer. Admission then sizes the Critical seat reserve for the whole
// pool and keeps its part of it, and a Critical request that would wait on this replica's endpoints goes at once to a
// peer's endpoint with an idle seat (flowcontrol/peers.go). Nothing on the request path waits for a peer: it reads the
// latest summaries held.

// PeerSummary returns this replica's next summary for its peers, after putting in force what the live peers last
// reported (so a peer that fell silent stops counting, and the summary acknowledges what was taken in).
func (f *FlowControl) PeerSummary() replication.Summary {
	now := f.clock.Now()
	f.applyPeers()
	s := f.ctrl.SeatSummary()
	own := replication.Summary{CriticalRate: s.CriticalRate, SeatFrees: s.SeatFrees, Seats: s.Seats,
		CriticalWaiting: s.CriticalWaiting}
	for _, e := range s.Idle {
		own.Idle = append(own.Idle, replication.EndpointCount{Endpoint: e.Endpoint, N: e.Seats})
	}
	return f.peers.Next(own, now)
}

// HearPeer takes in a peer's summary and puts it in force at once: Critical requests waiting here go to the idle
// seats it reports.
func (f *FlowControl) HearPeer(s replication.Summary) {
	now := f.clock.Now()
	f.peers.Heard(s, now)
	f.applyPeers()
	if f.steersElsewhere() {
		f.ctrl.DispatchWaitingElsewhere(func(id string) (string, bool) { return f.peers.Take(id, now) })
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
	f.ctrl.SetPeers(flowcontrol.Peers{
		CriticalRate: pool.CriticalRate, SeatFrees: pool.SeatFrees, Seats: pool.Seats,
		CriticalWaiting: pool.CriticalWaiting, Load: pool.Load,
		ReserveShare: func(n, seats int) int { return pool.ReserveShare(self, n, seats) },
	})
}

// sendElsewhere dispatches req to a peer's endpoint with an idle seat when it is a Critical request that would wait
// here; ok is false when it is not, or no peer reported an idle seat.
func (f *FlowControl) sendElsewhere(req flowcontrol.Request) (d flowcontrol.Decision, ok bool) {
	if f.peers == nil || !f.steersElsewhere() || !f.ctrl.CriticalWouldWait(req) {
		return d, false
	}
	endpoint, ok := f.peers.Take(req.ID, f.clock.Now())
	if !ok {
		return d, false
	}
	return f.ctrl.DispatchedElsewhere(req, endpoint), true
}
