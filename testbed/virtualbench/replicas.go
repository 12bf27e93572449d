package virtualbench

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// Balance is how the data plane spreads ext_proc streams over the EPP's replicas. Envoy opens one ext_proc stream
// per request and its cluster load balancer picks a host for each new stream, so both policies balance per request,
// never per client or per tenant.
type Balance string

const (
	// BalanceRoundRobin rotates over the replicas, one stream each (Envoy's ROUND_ROBIN, its default lb_policy).
	BalanceRoundRobin Balance = "round-robin"
	// BalanceRandom picks a replica uniformly at random for each stream (Envoy's RANDOM).
	BalanceRandom Balance = "random"
)

// Validate reports an unknown policy; the empty Balance is BalanceRoundRobin.
func (b Balance) Validate() error {
	switch b {
	case "", BalanceRoundRobin, BalanceRandom:
		return nil
	}
	return fmt.Errorf("balance %q is not %s or %s", b, BalanceRoundRobin, BalanceRandom)
}

// replicaSeed is replica k's seed for the EPP's random choices: replica 0 keeps the run's seed, so a one-replica run
// is the run it was before replicas existed.
func replicaSeed(seed uint64, k int) uint64 { return seed + uint64(k)*0x9e3779b97f4a7c15 }

// replicaSet is the EPP's replicas behind the data plane: independent in-process EPPs, each with its own plugins,
// admission, queues and prefix index, each scraping every server, as N EPP pods of one InferencePool run today.
// Nothing is shared between them but the fleet.
type replicaSet struct {
	eps []*inProcessEPP
	// servers[k] are the servers replica k knows, by its endpoint index: every server, or those it owns.
	servers [][]int
	balance Balance
	next    int        // round-robin position
	rng     *rand.Rand // random balance
	// routed counts the ext_proc streams each replica received.
	routed []int
}

func newReplicaSet(eps []*inProcessEPP, servers [][]int, balance Balance, seed uint64) *replicaSet {
	return &replicaSet{eps: eps, servers: servers, balance: balance, rng: rand.New(rand.NewPCG(seed, 0xba1a9ce)),
		routed: make([]int, len(eps))}
}

// replicaServers returns, for each of n replicas, the servers it knows: every one, as every EPP replica scrapes the
// whole pool (with ownership too: what a replica owns is admission's business, plugins.EndpointOwnership).
func replicaServers(pods []string, n int) [][]int {
	all := make([]int, len(pods))
	for i := range all {
		all[i] = i
	}
	out := make([][]int, n)
	for k := range out {
		out[k] = all
	}
	return out
}

// replicaViews returns each replica's replication.View over the replicas epp-0 ... epp-<n-1>, as the EPP's --peers
// gives them, and the heartbeat the run calls every replication.DefaultProbeInterval: each replica hears every
// other, as the EPP's peer probes do while all replicas serve.
func replicaViews(n int) ([]*replication.View, func(now time.Time)) {
	members := make([]string, n)
	for k := range members {
		members[k] = replicaName(k)
	}
	views := make([]*replication.View, n)
	for k := range views {
		views[k], _ = replication.NewView(members[k], members, replication.DefaultTimeout) // valid by construction
	}
	return views, func(now time.Time) {
		for k, v := range views {
			for j, m := range members {
				if j != k {
					v.Heard(m, now)
				}
			}
		}
	}
}

// replicaName is replica k's name among its peers.
func replicaName(k int) string { return fmt.Sprintf("epp-%d", k) }

// server is the fleet index of replica k's endpoint j.
func (s *replicaSet) server(k, j int) int { return s.servers[k][j] }

// pick chooses the replica of the next stream.
func (s *replicaSet) pick() int {
	k := 0
	switch {
	case len(s.eps) == 1:
	case s.balance == BalanceRandom:
		k = s.rng.IntN(len(s.eps))
	default:
		k = s.next % len(s.eps)
		s.next++
	}
	s.routed[k]++
	return k
}

// Close stops every replica's timers.
func (s *replicaSet) Close() {
	for _, p := range s.eps {
		p.Close()
	}
}

// Err is the first replica failure, in replica order.
func (s *replicaSet) Err() error {
	for k, p := range s.eps {
		if err := p.Err(); err != nil {
			if len(s.eps) == 1 {
				return err
			}
			return fmt.Errorf("EPP replica %d: %w", k, err)
		}
	}
	return nil
}

// InFlight sums the replicas' requests in flight.
func (s *replicaSet) InFlight() int {
	n := 0
	for _, p := range s.eps {
		n += p.InFlight()
	}
	return n
}

// AdmissionQueue sums the replicas' admission queues per band.
func (s *replicaSet) AdmissionQueue() [flowcontrol.NumBands]int {
	var q [flowcontrol.NumBands]int
	for _, p := range s.eps {
		for b, n := range p.AdmissionQueue() {
			q[b] += n
		}
	}
	return q
}
