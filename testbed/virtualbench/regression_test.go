package virtualbench

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// The regression guards below run small scenarios of the benchmark suite in virtual time and compare contenders.
// Runs are deterministic, so every number is exact: the thresholds leave margin for legitimate model changes, and
// the comments record the values measured when they were set. A failure means routing or admission got worse (or
// the simulator changed enough to move the results): look at the logged table before moving a threshold.

func runContenders(t *testing.T, cfg Config, routers ...namedRouter) map[string]*Result {
	t.Helper()
	results := make([]*Result, len(routers))
	errs := make([]error, len(routers))
	var wg sync.WaitGroup
	for i, r := range routers {
		c := cfg
		c.Router = r.router
		wg.Go(func() { results[i], errs[i] = Run(c) })
	}
	wg.Wait()
	out := map[string]*Result{}
	for i, r := range routers {
		if errs[i] != nil {
			t.Fatalf("%s: %v", r.name, errs[i])
		}
		checkNothingLost(t, results[i].Records)
		out[r.name] = results[i]
	}
	return out
}

type namedRouter struct {
	name   string
	router Router
}

// classSummary returns the summary line of class ("all" for the overall line).
func classSummary(res *Result, class string) loadgen.ClassSummary {
	if class == loadgen.AllClasses {
		return res.Summary.Overall
	}
	for _, c := range res.Summary.Classes {
		if c.Class == class {
			return c
		}
	}
	return loadgen.ClassSummary{Class: class}
}

func logTable(t *testing.T, results map[string]*Result, order []string, classes ...string) {
	t.Helper()
	for _, name := range order {
		res := results[name]
		for _, class := range classes {
			s := classSummary(res, class)
			t.Logf("%-12s %-10s requests %4d ok %4d status %v ttft p50 %7.1fms p99 %8.1fms e2e p99 %7.0fms goodput %.2f/s",
				name, class, s.Requests, s.Succeeded, s.Status, ms(s.TTFT.P50), ms(s.TTFT.P99), ms(s.E2E.P99), s.Throughput)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ratio is a/b for latencies.
func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// TestRegressionMixedFleetTTFT: a mixed H100/A10G fleet under a steady load it can carry only if the slow A10Gs get
// less of it. Round-robin gives every server the same share and queues on the A10Gs; both EPPs steer by queue and KV
// use. Guards: each EPP's TTFT p99 stays well below round-robin's, and Sluice's is no worse than upstream's (the
// suite's "no worse than upstream's default by more than 5%"). Measured last (the saturation scorer counting
// prompts not yet answered): round-robin 7496ms, upstream 1055ms (0.141 of it), Sluice 318ms (0.042 of it, 0.301 of
// upstream's).
func TestRegressionMixedFleetTTFT(t *testing.T) {
	cfg := Config{
		Fleet: "h100:2,a10g:2", Seed: 11,
		Mix: mustMix(t, `
api: chat
stream: true
classes:
  - {name: chat, model: meta-llama/Llama-3.1-8B-Instruct, prompt_tokens: 512, output_tokens: 128}
`),
		Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 30},
		Duration: 15 * time.Second,
	}
	order := []string{"round-robin", "upstream", "sluice"}
	results := runContenders(t, cfg, namedRouter{"round-robin", RoundRobinRouter()}, namedRouter{"upstream", UpstreamRouter()},
		namedRouter{"sluice", SluiceRouter(nil, nil)})
	logTable(t, results, order, loadgen.AllClasses)
	rr := classSummary(results["round-robin"], loadgen.AllClasses).TTFT.P99
	for _, name := range order[1:] {
		got := ratio(classSummary(results[name], loadgen.AllClasses).TTFT.P99, rr)
		t.Logf("%s TTFT p99 / round-robin's = %.3f", name, got)
		if got > 0.25 {
			t.Errorf("%s: TTFT p99 is %.3f of round-robin's, want at most 0.25", name, got)
		}
	}
	vsUpstream := ratio(classSummary(results["sluice"], loadgen.AllClasses).TTFT.P99,
		classSummary(results["upstream"], loadgen.AllClasses).TTFT.P99)
	t.Logf("sluice TTFT p99 / upstream's = %.3f", vsUpstream)
	if vsUpstream > 1.05 {
		t.Errorf("sluice: TTFT p99 is %.3f of upstream's, want at most 1.05", vsUpstream)
	}
}

// sluicePriorityPolicy is bench/priority-overload/sluice-policy.yaml: an endpoint has headroom while it runs fewer
// than 32 sequences with at most 2 waiting.
func sluicePriorityPolicy(t *testing.T) *flowcontrol.Config {
	cfg, err := flowcontrol.ParseConfig([]byte(`{"endpoint":{"queueDepthThreshold":2,"runningThreshold":32,"metricsStalenessThreshold":"1s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// priorityMix is testbed/bench/scenarios/priority-overload/mix.yaml: 20/50/30 Critical/Standard/Sheddable streaming chats.
const priorityMix = `
api: chat
stream: true
classes:
  - {name: critical, model: meta-llama/Llama-3.1-8B-Instruct, weight: 20, objective: critical, tenant: interactive, prompt_tokens: 512, output_tokens: 128}
  - {name: standard, model: meta-llama/Llama-3.1-8B-Instruct, weight: 50, objective: standard, tenant: apps, prompt_tokens: 512, output_tokens: 128}
  - {name: sheddable, model: meta-llama/Llama-3.1-8B-Instruct, weight: 30, objective: sheddable, tenant: batch, prompt_tokens: 512, output_tokens: 128}
`

// TestRegressionPriorityOverload is the priority-overload scenario (bench/priority-overload) in small: twice what
// the fleet can serve, 20/50/30 Critical/Standard/Sheddable, clients that honour Retry-After (3 attempts, at most
// 10s apart). The fleet serves about 55 requests/s of this mix in virtual time (upstream's EPP at saturation; the
// real-time scenario's CAPACITY=30 includes the machine's overheads), so 110/s is twice that. Guards: Sluice serves
// every Critical request (none shed, none failed) with a TTFT p99 far below the other contenders', whose admitted
// work queues inside the servers behind lower bands. Measured last (with the Critical reserve), Critical TTFT p99:
// round-robin 56309ms, upstream 10785ms, Sluice 497ms (0.009 and 0.046 of them).
func TestRegressionPriorityOverload(t *testing.T) {
	cfg := Config{
		Fleet: "h100:2,a10g:2", Seed: 11, Objectives: map[string]int{"critical": 10, "standard": 0, "sheddable": -1},
		Mix:      mustMix(t, priorityMix),
		Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 110},
		Duration: 12 * time.Second,
		Retry:    loadgen.RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second},
	}
	order := []string{"round-robin", "upstream", "sluice"}
	results := runContenders(t, cfg, namedRouter{"round-robin", RoundRobinRouter()}, namedRouter{"upstream", UpstreamRouter()},
		namedRouter{"sluice", SluiceRouter(sluicePriorityPolicy(t), nil)})
	logTable(t, results, order, "critical", "standard", "sheddable")

	crit := classSummary(results["sluice"], "critical")
	if crit.Failed != 0 || crit.Retried != 0 {
		t.Errorf("sluice: %d Critical requests failed and %d were retried (statuses %v), want none shed", crit.Failed, crit.Retried, crit.Status)
	}
	for _, other := range order[:2] {
		got := ratio(crit.TTFT.P99, classSummary(results[other], "critical").TTFT.P99)
		t.Logf("sluice Critical TTFT p99 / %s's = %.3f", other, got)
		if got > 0.3 {
			t.Errorf("sluice: Critical TTFT p99 is %.3f of %s's, want at most 0.3", got, other)
		}
	}
}

// TestRegressionShedClientsServedOnceLoadDrops: 10-second bursts at 120 requests/s (twice what the fleet serves)
// separated by 30 idle seconds, 20/50/30 Critical/Standard/Sheddable, clients that honour Retry-After (5 attempts,
// waits up to 60s). Sluice sheds Sheddable during the burst and must tell those clients to come back when the burst is
// over, not into it: at least 90% of the requests it shed are served on a later attempt (issue 4's target), and no
// Critical request is shed. Measured last (with the Critical reserve): 360 of 360 shed requests served; when set, before the
// reserve: 332 of 349 (95.1%), and with a Retry-After from the backlog alone (no episode age) 201 of 349 (57.6%).
func TestRegressionShedClientsServedOnceLoadDrops(t *testing.T) {
	cfg := Config{
		Fleet: "h100:2,a10g:2", Seed: 11, Objectives: map[string]int{"critical": 10, "standard": 0, "sheddable": -1},
		Mix:      mustMix(t, priorityMix),
		Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalBursty, Rate: 120, BurstOn: 10 * time.Second, BurstOff: 30 * time.Second},
		Duration: 40 * time.Second,
		Drain:    2 * time.Minute,
		Retry:    loadgen.RetryPolicy{MaxAttempts: 5, MaxWait: time.Minute},
		Router:   SluiceRouter(nil, nil),
	}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, res.Records)
	all := res.Summary.Overall
	t.Logf("shed %d, served after shedding %d, final statuses %v", all.Shed, all.ShedServed, all.Status)
	if all.Shed == 0 {
		t.Fatal("nothing was shed: the scenario no longer overloads the fleet")
	}
	if got := float64(all.ShedServed) / float64(all.Shed); got < 0.9 {
		t.Errorf("%d of %d shed requests (%.1f%%) were served once load dropped, want at least 90%%", all.ShedServed, all.Shed, 100*got)
	}
	var shedAttempts, withRetryAfter int
	for _, r := range res.Records {
		if r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable {
			shedAttempts++
			if r.RetryAfterSet {
				withRetryAfter++
			}
		}
	}
	if withRetryAfter != shedAttempts {
		t.Errorf("%d of %d 429/503 answers carry Retry-After, want all", withRetryAfter, shedAttempts)
	}
	if crit := classSummary(res, "critical"); crit.Shed != 0 {
		t.Errorf("%d Critical requests were shed, want none", crit.Shed)
	}
}
