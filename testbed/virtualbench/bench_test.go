package virtualbench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// BenchmarkScale is the scale story: the same load per server (VB_RATE_PER_SERVER, default 7.5/s, the load of the
// mixed-fleet scenario: 30/s on h100:2,a10g:2) on mixed fleets of VB_SIZES servers (default 8,64,256,1000) for
// VB_SECONDS virtual seconds (default 5), each contender on each fleet. Per fleet size it reports, side by side, the contenders' TTFT
// p99 over round-robin's (routing quality) and the EPP's wall time per request (ns/decision), plus the wall time of
// the whole point. Run it once per size:
//
//	go test -run '^$' -bench Scale -benchtime 1x ./virtualbench/
//
// GOGC=400 shortens it: most of the EPP's cost at 1000 servers is allocation.
func BenchmarkScale(b *testing.B) {
	sizes := []int{8, 64, 256, 1000}
	if v := os.Getenv("VB_SIZES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("VB_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	rate := envFloat(b, "VB_RATE_PER_SERVER", 7.5)
	seconds := envFloat(b, "VB_SECONDS", 5)
	base := Config{
		Mix: mustMix(b, `
api: chat
stream: true
classes:
  - {name: chat, model: meta-llama/Llama-3.1-8B-Instruct, prompt_tokens: 512, output_tokens: 128}
`),
		Seed: 11, Duration: time.Duration(seconds * float64(time.Second)), DiscardITL: true,
	}
	routers := []NamedRouter{{"round-robin", RoundRobinRouter()}, {"upstream", UpstreamRouter()}, {"sluice", SluiceRouter(nil, nil)}}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("servers=%d", n), func(b *testing.B) {
			for range b.N {
				pts, err := Scale(ScaleConfig{Base: base, Sizes: []int{n}, RatePerServer: rate, Routers: routers})
				if err != nil {
					b.Fatal(err)
				}
				pt := pts[0]
				for _, r := range pt.Results {
					b.Logf("%5d servers %6.0f req/s %-11s %6d requests (%d ok) TTFT p50 %7.1fms p99 %8.1fms (%.3f of round-robin) EPP %8.1fµs/request, %v virtual in %v wall",
						n, pt.Rate, r.Router, r.Requests, r.Succeeded, ms(r.TTFTP50), ms(r.TTFTP99), r.TTFTP99VsBaseline,
						float64(r.EPPPerRequest)/1e3, r.Virtual.Round(time.Millisecond), r.Wall.Round(time.Millisecond))
				}
				b.ReportMetric(pt.Results[1].TTFTP99VsBaseline, "upstream-ttft-p99/rr")
				b.ReportMetric(pt.Results[2].TTFTP99VsBaseline, "sluice-ttft-p99/rr")
				b.ReportMetric(float64(pt.Results[1].EPPPerRequest), "upstream-ns/decision")
				b.ReportMetric(float64(pt.Results[2].EPPPerRequest), "sluice-ns/decision")
			}
		})
	}
}

func envFloat(b *testing.B, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return f
}

// BenchmarkRoundRobinEvents measures the engine itself: events per second of wall time with round-robin routing on
// 64 servers, where the simulated servers are the whole cost.
func BenchmarkRoundRobinEvents(b *testing.B) {
	cfg := Config{
		Fleet: "h100:64", Seed: 1, Router: RoundRobinRouter(), DiscardITL: true, Duration: 2 * time.Second,
		Mix: mustMix(b, `
api: chat
stream: true
classes:
  - {name: chat, model: meta-llama/Llama-3.1-8B-Instruct, prompt_tokens: 512, output_tokens: 128}
`),
		Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 640},
	}
	var events uint64
	for range b.N {
		res, err := Run(cfg)
		if err != nil {
			b.Fatal(err)
		}
		events += res.Events
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkCriticalUnderOverload measures issue 4's latency target in virtual time: Critical TTFT p99 with the
// priority-overload mix (20/50/30 Critical/Standard/Sheddable, clients that honour Retry-After) at twice what the
// h100:2,a10g:2 fleet serves (110 requests/s), over Critical TTFT p99 with Critical alone at half of it (27.5
// requests/s), both through Sluice's default profile, for several seeds, with the default policy, with the strict
// Critical reserve (pendingThreshold 1) and with a count cap instead of the time (count2: pendingThreshold 2,
// pendingTimeThreshold 0, the default until the time was learned). It reports the ratio per seed
// (critical-p99-ratio-<policy>-seedN; target at most 1.5), the worst one per policy, and at 2x against upstream's
// default profile in the same run: throughput (throughput-vs-upstream-<policy>-seedN) and the requests served with
// TTFT within 2s, as in the suite's priority-overload scenario (good-vs-upstream-<policy>-seedN; a count, not a
// rate, because the contenders' runs end when their last retried request does, which differs):
//
//	go test -run '^$' -bench CriticalUnderOverload -benchtime 1x ./virtualbench/
func BenchmarkCriticalUnderOverload(b *testing.B) {
	objectives := map[string]int{"critical": 10, "standard": 0, "sheddable": -1}
	critical := mustMix(b, `
api: chat
stream: true
classes:
  - {name: critical, model: meta-llama/Llama-3.1-8B-Instruct, objective: critical, tenant: interactive, prompt_tokens: 512, output_tokens: 128}
`)
	overload := mustMix(b, priorityMix)
	strict := flowcontrol.DefaultConfig()
	strict.Endpoint.Pending = 1
	count := flowcontrol.DefaultConfig()
	count.Endpoint.Pending, count.Endpoint.PendingTime = 2, 0
	policies := []struct {
		name   string
		policy *flowcontrol.Config
	}{{"default", nil}, {"strict", strict}, {"count2", count}}
	run := func(mix *loadgen.Mix, rate float64, seed uint64, router Router) *Result {
		res, err := Run(Config{Fleet: "h100:2,a10g:2", Seed: seed, Objectives: objectives, Mix: mix,
			Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: rate},
			Duration: 30 * time.Second, Drain: 15 * time.Second,
			Retry: loadgen.RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second}, Router: router,
			SLO: loadgen.SLO{TTFT: loadgen.Duration(2 * time.Second)}})
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	for range b.N {
		worst := make([]float64, len(policies))
		for _, seed := range []uint64{1, 2, 3, 4, 11} {
			upstream := run(overload, 110, seed, UpstreamRouter())
			for i, p := range policies {
				half := run(critical, 27.5, seed, SluiceRouter(p.policy, nil))
				over := run(overload, 110, seed, SluiceRouter(p.policy, nil))
				r := float64(criticalP99(b, over)) / float64(criticalP99(b, half))
				worst[i] = max(worst[i], r)
				b.ReportMetric(r, fmt.Sprintf("critical-p99-ratio-%s-seed%d", p.name, seed))
				b.ReportMetric(over.Summary.Overall.Throughput/upstream.Summary.Overall.Throughput,
					fmt.Sprintf("throughput-vs-upstream-%s-seed%d", p.name, seed))
				b.ReportMetric(float64(over.Summary.Overall.Good)/float64(upstream.Summary.Overall.Good),
					fmt.Sprintf("good-vs-upstream-%s-seed%d", p.name, seed))
				if shed := classSummary(over, "critical").Shed; shed != 0 {
					b.Errorf("%s policy, seed %d: %d Critical requests shed", p.name, seed, shed)
				}
			}
		}
		for i, p := range policies {
			b.ReportMetric(worst[i], "critical-p99-ratio-"+p.name+"-worst")
		}
	}
}

// criticalP99 is the Critical class's TTFT p99 in res; a run without a measured Critical TTFT fails b, since a ratio
// of empty percentiles would be NaN.
func criticalP99(b *testing.B, res *Result) time.Duration {
	b.Helper()
	c := classSummary(res, "critical")
	if c.TTFT.Count == 0 {
		b.Fatalf("no Critical request has a TTFT (%d requests): nothing to compare", c.Requests)
	}
	return c.TTFT.P99
}
