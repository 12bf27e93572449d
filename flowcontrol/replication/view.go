package replication

import (
	"sync"
	"time"
)

// View is one replica's running view of its group, safe for concurrent use: the membership that peer probes and
// the peer list's source (a flag, a file, the EPP Service's endpoints) update, and, from it, the endpoints this
// replica owns. Admission asks Owned on every pool snapshot, so a peer that falls silent loses its endpoints to the
// survivors at the first snapshot after the membership timeout, with no message from anyone.
type View struct {
	mu         sync.Mutex
	membership *Membership
}

// NewView returns self's view of peers (see NewMembership).
func NewView(self string, peers []string, timeout time.Duration) (*View, error) {
	m, err := NewMembership(self, peers, timeout)
	if err != nil {
		return nil, err
	}
	return &View{membership: m}, nil
}

// Self returns the replica's own name.
func (v *View) Self() string { return v.membership.self }

// Peers returns the configured peers, self excluded, sorted: whom to probe.
func (v *View) Peers() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.membership.peers...)
}

// SetPeers replaces the peer list (see Membership.SetPeers).
func (v *View) SetPeers(peers []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.membership.SetPeers(peers)
}

// Heard records that peer answered at now (see Membership.Heard).
func (v *View) Heard(peer string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.membership.Heard(peer, now)
}

// Unreachable records that a connection attempt to peer failed with nothing heard from it since before (see
// Membership.Unreachable).
func (v *View) Unreachable(peer string, before time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.membership.Unreachable(peer, before)
}

// Live returns the live replicas at now, self included, sorted.
func (v *View) Live(now time.Time) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.membership.Live(now)
}

// Owned returns the endpoints this replica owns at now, in their given order: its share of Partition over the live
// replicas; all of them when no peer is live, and also when its share is empty (more live replicas than endpoints),
// since a replica without endpoints could only answer 503: it then shares the whole pool, as without replication.
func (v *View) Owned(endpoints []string, now time.Time) []string {
	live := v.Live(now)
	if len(live) == 1 {
		return endpoints
	}
	if mine := Partition(endpoints, live)[v.membership.self]; len(mine) > 0 {
		return mine
	}
	return endpoints
}

// The EPP's defaults for probing peers: a replica killed is noticed within DefaultTimeout, and its endpoints are
// taken over at the next pool snapshot (50 ms by default), within upstream's default metrics staleness threshold
// (200 ms).
const (
	DefaultProbeInterval = 40 * time.Millisecond
	DefaultTimeout       = 140 * time.Millisecond
)
