package benchsuite

import (
	"fmt"
	"slices"

	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// ReplicasFile runs the sluice contender again with several EPP replicas
// behind the data plane, which balances ext_proc streams over them per
// request as Envoy does: one contender per count and balance policy, named
// sluice-x<count>-<balance> (sluice-x2-round-robin). The report compares
// each with the sluice contender, its one-replica run in the same session.
//
//	replicas:
//	  counts: [2, 4]                 # 2..64 replicas each
//	  balance: [round-robin, random] # default [round-robin]
type ReplicasFile struct {
	Counts  []int    `json:"counts"`
	Balance []string `json:"balance,omitempty"`
}

// maxReplicas bounds a replica count: every replica is a whole EPP.
const maxReplicas = 64

// contenders validates f and returns the replicated runs of sluice, counts
// first; none for a nil f.
func (f *ReplicasFile) contenders(sluice Contender, errs *fieldErrors) []Contender {
	if f == nil {
		return nil
	}
	if len(f.Counts) == 0 {
		errs.addf("replicas.counts", "required: the replica counts to run, e.g. [2, 4]")
	}
	balance := f.Balance
	if len(balance) == 0 {
		balance = []string{string(virtualbench.BalanceRoundRobin)}
	}
	for i, b := range balance {
		if err := virtualbench.Balance(b).Validate(); err != nil || b == "" || slices.Index(balance, b) != i {
			errs.addf(fmt.Sprintf("replicas.balance[%d]", i), "%q must be %s or %s, each once", b,
				virtualbench.BalanceRoundRobin, virtualbench.BalanceRandom)
		}
	}
	var out []Contender
	for i, n := range f.Counts {
		if n < 2 || n > maxReplicas || slices.Index(f.Counts, n) != i {
			errs.addf(fmt.Sprintf("replicas.counts[%d]", i), "%d must be 2..%d and given once (one replica is the sluice contender)", n, maxReplicas)
			continue
		}
		for _, b := range balance {
			c := sluice
			c.Name, c.Replicas, c.Balance, c.Extra = ReplicaContenderName(n, b), n, b, true
			out = append(out, c)
		}
	}
	return out
}

// ReplicaContenderName names the sluice contender with n replicas balanced by
// balance.
func ReplicaContenderName(n int, balance string) string {
	return fmt.Sprintf("%s-x%d-%s", Sluice, n, balance)
}
