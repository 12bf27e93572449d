package benchsuite

import (
	"bufio"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// ReplicasFile runs the sluice contender again with several EPP replicas
// behind the data plane, which balances ext_proc streams over them per
// request as Envoy does: one contender per count and balance policy, named
// sluice-x<count>-<balance> (sluice-x2-round-robin), and with sharing
// endpoint-ownership sluice-x<count>-<balance>-owned: the replicas partition
// the fleet as the EPP's --peers makes them (replication.View), each admitting
// on and routing to its own servers only; with peer-exchange
// sluice-x<count>-<balance>-exchange: ownership plus the EPP's peer exchange
// (replication.Exchange), the replicas sizing the Critical seat reserve for
// the whole pool and sending a Critical request that would wait to a peer's
// idle seat. The report compares
// each with the sluice contender, its one-replica run in the same session,
// and Targets hold every replicated run against it.
//
//	replicas:
//	  counts: [2, 4]                 # 2..64 replicas each
//	  balance: [round-robin, random] # default [round-robin]
//	  sharing: [none, endpoint-ownership, peer-exchange]  # default [none]
//	  targets:                       # each replicated run vs sluice, or its value
//	    - {figure: ttft_p99, class: critical, vs: sluice, at_most: 1.1}
//	    - {figure: prefix_hit_rate, vs: sluice, at_least: 0.95}
//	    - {figure: shed_without_retry_after, at_most: 0}
type ReplicasFile struct {
	Counts  []int        `json:"counts"`
	Balance []string     `json:"balance,omitempty"`
	Sharing []string     `json:"sharing,omitempty"`
	Targets []TargetFile `json:"targets,omitempty"`
}

// What replicas share (ReplicasFile.Sharing).
const (
	// SharingNone: every replica admits alone on the whole fleet (today's EPP).
	SharingNone = "none"
	// SharingOwnership: the replicas partition the fleet's endpoints.
	SharingOwnership = "endpoint-ownership"
	// SharingExchange: ownership, and the replicas exchange peer summaries.
	SharingExchange = "peer-exchange"
)

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
	sharing := f.Sharing
	if len(sharing) == 0 {
		sharing = []string{SharingNone}
	}
	for i, sh := range sharing {
		if !slices.Contains([]string{SharingNone, SharingOwnership, SharingExchange}, sh) || slices.Index(sharing, sh) != i {
			errs.addf(fmt.Sprintf("replicas.sharing[%d]", i), "%q must be %s, %s or %s, each once", sh, SharingNone,
				SharingOwnership, SharingExchange)
		}
	}
	var out []Contender
	for i, n := range f.Counts {
		if n < 2 || n > maxReplicas || slices.Index(f.Counts, n) != i {
			errs.addf(fmt.Sprintf("replicas.counts[%d]", i), "%d must be 2..%d and given once (one replica is the sluice contender)", n, maxReplicas)
			continue
		}
		for _, sh := range sharing {
			for _, b := range balance {
				c := sluice
				c.Name, c.Replicas, c.Balance, c.Extra = ReplicaContenderName(n, b), n, b, true
				switch sh {
				case SharingOwnership:
					c.Name, c.EndpointOwnership = c.Name+"-owned", true
				case SharingExchange:
					c.Name, c.EndpointOwnership, c.PeerExchange = c.Name+"-exchange", true, true
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// targets validates f's targets and returns each for every replicated
// contender of sc.
func (f *ReplicasFile) targets(sc *Scenario, errs *fieldErrors) []Target {
	if f == nil {
		return nil
	}
	var out []Target
	for i, tf := range f.Targets {
		field := fmt.Sprintf("replicas.targets[%d]", i)
		ratio := tf.Vs == Sluice
		switch {
		case ratio:
			tf.Vs = UpstreamDefault // checked as a ratio target against a contender, then pointed at sluice
		case tf.Vs != "":
			errs.addf(field+".vs", "%q: a replicated run is judged against %s, its one-replica run, or by its value (no vs)", tf.Vs, Sluice)
			continue
		}
		t, ok := tf.build(errs, field, sc)
		if !ok {
			continue
		}
		if ratio {
			t.Versus = Sluice
		}
		for _, c := range sc.Contenders {
			if c.Replicas > 1 {
				t.Subject = c.Name
				out = append(out, t)
			}
		}
	}
	return out
}

// ReplicaContenderName names the sluice contender with n replicas balanced by
// balance.
func ReplicaContenderName(n int, balance string) string {
	return fmt.Sprintf("%s-x%d-%s", Sluice, n, balance)
}

// writeReplicas compares every replicated sluice run with the one-replica
// sluice run of the same session: each class's TTFT P50 and P99, the
// throughput and the fleet's prefix hit rate as ratios (replicas over one),
// with LoRA adapters the fleet's adapter loads likewise (what replicas cost
// adapter affinity), and the 429/503 answers, with how many lacked a
// Retry-After.
func writeReplicas(b *bufio.Writer, s *ScenarioResult) {
	var names []string
	for _, run := range s.Runs {
		if run.Contender.Replicas > 1 {
			names = append(names, run.Contender.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	classes := s.Scenario.Mix.Classes
	if len(classes) > maxClassRows {
		classes = nil // the overall figures only
	}
	p("\nEPP replicas against one replica (%s), ratios N replicas / one:\n\n| Contender |", Sluice)
	for _, c := range classes {
		p(" %s TTFT P50 | %s TTFT P99 |", c.Name, c.Name)
	}
	adapters := len(s.Scenario.Adapters) > 0
	columns := 2*len(classes) + 4
	p(" TTFT P99 | Throughput | Prefix hit rate |")
	if adapters {
		p(" Adapter loads |")
		columns++
	}
	p(" 429/503 (without Retry-After) |\n|---|%s\n", strings.Repeat("---|", columns))
	one := s.Result(Sluice)
	for _, name := range names {
		r := s.Result(name)
		if r == nil || one == nil {
			why := s.missing(name)
			if why == "" {
				why = s.missing(Sluice)
			}
			p("| %s | no run: %s |\n", name, why)
			continue
		}
		p("| %s |", name)
		for _, c := range classes {
			for _, f := range []Figure{FigureTTFTP50, FigureTTFTP99} {
				p(" %s |", replicaRatio(s, name, c.Name, f))
			}
		}
		p(" %s | %s |", replicaRatio(s, name, "", FigureTTFTP99), replicaRatio(s, name, "", FigureThroughput))
		hit := "n/a"
		if rn, ok := r.Fleet.PrefixHitRate(); ok {
			if r1, ok := one.Fleet.PrefixHitRate(); ok && r1 > 0 {
				hit = FormatRatio(rn / r1)
			}
		}
		p(" %s |", hit)
		if adapters {
			loads := fmt.Sprintf("%.0f (one replica: 0)", r.Fleet.AdapterLoads)
			if one.Fleet.AdapterLoads > 0 {
				loads = FormatRatio(r.Fleet.AdapterLoads / one.Fleet.AdapterLoads)
			}
			p(" %s |", loads)
		}
		v, _ := s.ClassFigures(name, "")
		p(" %.0f (%.0f) |\n", v[FigureShed], v[FigureShedWithoutRetryAfter])
	}
}

// replicaRatio is a replicated run's figure over class's requests against
// the one-replica run's.
func replicaRatio(s *ScenarioResult, name, class string, f Figure) string {
	n, okn := s.ClassFigures(name, class)
	one, ok1 := s.ClassFigures(Sluice, class)
	if !okn || !ok1 {
		return "n/a"
	}
	r, ok := Ratio(n, one, f)
	if !ok {
		return "n/a"
	}
	return FormatRatio(r)
}
