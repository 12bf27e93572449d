package virtualbench

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// The outlier filter's pace detection (package outlier, Pace) in Sluice's default profile, in virtual time: the
// engine reports every streamed chunk to the EPP (Config.EveryChunk), as upstream's handler does.

// chaosMix is the chaos suite's load (testbed/chaos): 20/50/30 Critical/Standard/Sheddable streamed chats of 64
// prompt and 32 output tokens.
const chaosMix = `
api: chat
stream: true
classes:
  - {name: critical, model: meta-llama/Llama-3.1-8B-Instruct, weight: 20, objective: critical, tenant: interactive, prompt_tokens: 64, output_tokens: 32}
  - {name: standard, model: meta-llama/Llama-3.1-8B-Instruct, weight: 50, objective: standard, tenant: apps, prompt_tokens: 64, output_tokens: 32}
  - {name: sheddable, model: meta-llama/Llama-3.1-8B-Instruct, weight: 30, objective: sheddable, tenant: batch, prompt_tokens: 64, output_tokens: 32}
`

// chaosFleet is the chaos suite's fleet: three a10g-like servers of 4 slots.
func chaosFleet(t *testing.T) []engine.Config {
	t.Helper()
	servers, err := engine.FleetConfigs("a10g:3")
	if err != nil {
		t.Fatal(err)
	}
	for i := range servers {
		servers[i].MaxNumSeqs = 4
	}
	return servers
}

// TestOutlierPaceLeavesASlowedServer is the chaos case server-slow-10x in virtual time: server 0 of the chaos fleet
// serves 10x slower from 10 s to the end of a 30 s load of 8 requests/s. With every chunk reported, the outlier
// filter leaves it out once its streams stall with no prefill sent there to explain it (then lets a probe through as
// each ejection ends), within the metrics staleness window; with only the first chunk reported (no pace to judge),
// the load scorers keep sending it some requests, which wait behind its slow steps. The figures are logged.
func TestOutlierPaceLeavesASlowedServer(t *testing.T) {
	const fault = 10 * time.Second
	cfg := Config{
		Servers: chaosFleet(t), Seed: 3, Mix: mustMix(t, chaosMix),
		Objectives: map[string]int{"critical": 2, "standard": 1, "sheddable": 0},
		Arrival:    loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 8},
		Duration:   30 * time.Second, Router: SluiceRouter(nil, nil),
		Slowdowns: []Slowdown{{Server: 0, At: fault, Factor: 10}},
	}
	figures := map[bool]slowFigures{}
	for _, every := range []bool{false, true} {
		c := cfg
		c.EveryChunk = every
		res, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		checkNothingLost(t, res.Records)
		f := slowServerFigures(res.Records, net.JoinHostPort("127.0.0.1", strconv.Itoa(BasePort)), fault)
		figures[every] = f
		t.Logf("every chunk %v: %d of %d requests after the fault to the slowed server; the last at +%v before a 1 s gap "+
			"(then %d more); Critical TTFT p99 after the fault %v",
			every, f.there, f.total, f.left, f.probes, f.criticalP99)
	}
	if with, without := figures[true], figures[false]; !(with.there < without.there && with.criticalP99 < without.criticalP99) {
		t.Errorf("pace detection: %d requests to the slowed server, Critical TTFT p99 %v; without it %d, %v: want fewer and lower",
			with.there, with.criticalP99, without.there, without.criticalP99)
	}
	// Issue 20's target: traffic leaves a faulty server within one metrics staleness window.
	if with := figures[true]; with.left > flowcontrol.DefaultMetricsStalenessThreshold {
		t.Errorf("pace detection: traffic left the slowed server %v after the fault, want within %v",
			with.left, flowcontrol.DefaultMetricsStalenessThreshold)
	}
}

type slowFigures struct {
	total, there, probes int
	// left is the time from the fault to the last request there before a gap of 1 s, the base ejection time (0 when
	// the first came 1 s after the fault or later); probes counts those after it.
	left        time.Duration
	criticalP99 time.Duration
}

// slowServerFigures counts the attempts sent from fault on, those routed to server, and the Critical TTFT p99.
func slowServerFigures(recs []loadgen.Record, server string, fault time.Duration) slowFigures {
	var f slowFigures
	var at []time.Duration
	var critical []time.Duration
	for _, r := range recs {
		if r.Start < fault {
			continue
		}
		f.total++
		if r.Endpoint == server {
			f.there++
			at = append(at, r.Start-fault)
		}
		if r.Class == "critical" && r.Status == 200 {
			critical = append(critical, r.TTFT)
		}
	}
	slices.Sort(at)
	// The fault counts as a request there: a server left out before any request reached it gets only probes.
	f.probes = len(at)
	for i, t := range at {
		if t-f.left >= time.Second {
			break
		}
		f.left, f.probes = t, len(at)-i-1
	}
	if len(critical) > 0 {
		slices.Sort(critical)
		f.criticalP99 = critical[(len(critical)*99-1)/100]
	}
	return f
}

// TestOutlierPaceEjectsNoHealthyServer: fleets without a fault, each under a load that stresses the pace (busy
// batches, long and mixed prompts, two GPU classes 3x apart in step time, requests waiting for a slot at about twice the
// slot-limited fleet's capacity), route every request the same with every chunk reported as without: the pace
// detection ejected no server. Fails with slowGaps 5 or 6 (the a10g fleet's bursts: steps in a row that compute long
// prompts); with stalls unexplained by the prompts sent (all but the chaos fleet), explained at 128 prompt tokens
// per usual gap instead of 64 (the a10g loads), or without a stream's end starting the prefill of a request that
// waited for its slot (the slot-limited fleet).
func TestOutlierPaceEjectsNoHealthyServer(t *testing.T) {
	mixed := `
api: chat
stream: true
classes:
  - {name: short, model: meta-llama/Llama-3.1-8B-Instruct, weight: 6, prompt_tokens: {min: 64, max: 512}, output_tokens: {min: 32, max: 256}}
  - {name: long, model: meta-llama/Llama-3.1-8B-Instruct, weight: 1, prompt_tokens: {min: 2000, max: 3500}, output_tokens: 64}
`
	tests := []struct {
		name string
		cfg  Config
	}{
		{"chaos fleet near capacity", Config{Servers: chaosFleet(t), Mix: mustMix(t, chaosMix),
			Objectives: map[string]int{"critical": 2, "standard": 1, "sheddable": 0},
			Arrival:    loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 16}}},
		{"mixed GPUs, mixed prompts", Config{Fleet: "h100:2,a10g:2", Mix: mustMix(t, mixed),
			Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 12}}},
		{"uniform a10g fleet, bursts of long prompts", Config{Fleet: "a10g:3", Mix: mustMix(t, mixed),
			Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalBursty, Rate: 30, BurstOn: time.Second, BurstOff: 4 * time.Second}}},
		{"uniform h100 fleet, busy batches", Config{Fleet: "h100:3", Mix: mustMix(t, mixed),
			Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 40}}},
		{"slot-limited a10g fleet, long prompts waiting for a slot", Config{Servers: chaosFleet(t), Mix: mustMix(t, mixed),
			Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 8}}},
		// The suite's lora-heavy: a step that admits a request for an adapter not resident loads it (25 ms, four
		// steps of an idle H100-like server), and a request sent during that step starts its prefill after it.
		{"LoRA fleet, adapters loading", Config{Fleet: "h100:4", Mix: loraHeavyMix(t, 24), LoRAModules: adapterNames(24),
			Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 20}}},
		// The suite's priority-overload-large-batch-2x: most steps of a 256-slot batch compute a prompt or two.
		{"large-batch fleet at twice its capacity", Config{Fleet: "h100:2,a10g:2", Mix: mustMix(t, strings.NewReplacer("prompt_tokens: 64", "prompt_tokens: 512", "output_tokens: 32", "output_tokens: 128").Replace(chaosMix)),
			Objectives: map[string]int{"critical": 2, "standard": 1, "sheddable": 0},
			Arrival:    loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 144}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Seed, cfg.Duration, cfg.Router = 5, 30*time.Second, SluiceRouter(nil, nil)
			var endpoints [2][]string
			for i, every := range []bool{false, true} {
				c := cfg
				c.EveryChunk = every
				res, err := Run(c)
				if err != nil {
					t.Fatal(err)
				}
				checkNothingLost(t, res.Records)
				for _, r := range res.Records {
					endpoints[i] = append(endpoints[i], r.Endpoint)
				}
			}
			if len(endpoints[0]) != len(endpoints[1]) {
				t.Fatalf("%d attempts with every chunk reported, %d without", len(endpoints[1]), len(endpoints[0]))
			}
			moved := 0
			for i := range endpoints[0] {
				if endpoints[0][i] != endpoints[1][i] {
					moved++
				}
			}
			if moved > 0 {
				t.Errorf("%d of %d attempts routed elsewhere once every chunk was reported: pace detection ejected a healthy server",
					moved, len(endpoints[0]))
			}
		})
	}
}

// adapterNames are n LoRA adapters' names.
func adapterNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("adapter-%02d", i)
	}
	return names
}

// loraHeavyMix is the suite's lora-heavy load on n adapters: streamed chats of 256 prompt and 64 output tokens, 70%
// of them for the adapters with Zipf popularity (s = 1), the rest for the base model.
func loraHeavyMix(t *testing.T, n int) *loadgen.Mix {
	t.Helper()
	var b strings.Builder
	b.WriteString("api: chat\nstream: true\nclasses:\n")
	b.WriteString("  - {name: base, model: meta-llama/Llama-3.1-8B-Instruct, weight: 300, prompt_tokens: 256, output_tokens: 64}\n")
	norm := 0.0
	for k := 1; k <= n; k++ {
		norm += 1 / float64(k)
	}
	for k, name := range adapterNames(n) {
		fmt.Fprintf(&b, "  - {name: %s, model: %s, weight: %.3f, prompt_tokens: 256, output_tokens: 64}\n",
			name, name, 700/float64(k+1)/norm)
	}
	return mustMix(t, b.String())
}

// outlierProfile is Sluice's default profile with the outlier filter's parameters set to params (JSON).
func outlierProfile(t *testing.T, params string) []byte {
	t.Helper()
	profile, err := plugins.DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	entry := "- type: " + plugins.OutlierFilterType + "\n"
	if strings.Count(profile, entry) != 1 {
		t.Fatalf("the default profile does not list %s once", plugins.OutlierFilterType)
	}
	return []byte(strings.Replace(profile, entry, entry+"  parameters: "+params+"\n", 1))
}

// failedFrom counts the attempts sent from from on that a server answered 500.
func failedFrom(recs []loadgen.Record, from time.Duration) int {
	n := 0
	for _, r := range recs {
		if r.Start >= from && r.Status == 500 {
			n++
		}
	}
	return n
}

// TestOutlierFirst5xx is the chaos case server-500s in virtual time: from 10 s on, server 0 of the chaos fleet
// answers every request 500. Ejecting it on its first 5xx while a peer is healthy (localConsecutive5xx 1) sends
// it fewer requests to fail than on its second (the default, 2), and traffic leaves it sooner.
func TestOutlierFirst5xx(t *testing.T) {
	const fault = 10 * time.Second
	blips := make([]Blip, 1000) // more than it receives
	for i := range blips {
		blips[i] = Blip{Server: 0, At: fault}
	}
	cfg := Config{
		Servers: chaosFleet(t), Seed: 3, Mix: mustMix(t, chaosMix),
		Objectives: map[string]int{"critical": 2, "standard": 1, "sheddable": 0},
		Arrival:    loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 8},
		Duration:   30 * time.Second, Blips: blips,
	}
	figures := map[int]slowFigures{}
	failed := map[int]int{}
	for _, local := range []int{2, 1} {
		c := cfg
		c.Router = SluiceRouter(nil, outlierProfile(t, fmt.Sprintf(`{"localConsecutive5xx": %d}`, local)))
		res, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		checkNothingLost(t, res.Records)
		f := slowServerFigures(res.Records, net.JoinHostPort("127.0.0.1", strconv.Itoa(BasePort)), fault)
		figures[local], failed[local] = f, failedFrom(res.Records, fault)
		t.Logf("localConsecutive5xx %d: %d of %d requests after the fault to the failing server (%d answered 500); "+
			"the last at +%v before a 1 s gap (then %d probes); Critical TTFT p99 after the fault %v",
			local, f.there, f.total, failed[local], f.left, f.probes, f.criticalP99)
	}
	if !(failed[1] < failed[2] && figures[1].left < figures[2].left) {
		t.Errorf("ejecting on the first 5xx: %d failed, traffic gone after %v; on the second: %d, %v: want fewer and sooner",
			failed[1], figures[1].left, failed[2], figures[2].left)
	}
}

// TestOutlierBlipCost measures what ejecting on the first 5xx costs a healthy fleet: one server of the chaos fleet
// fails one request every 5 s (a blip), and with localConsecutive5xx 1 each blip ejects it for the base ejection
// time (1 s), with 2 none does. The figures (Critical and overall TTFT p99, requests served) are logged against a
// run without blips; the test checks that every request but the blips was served and that the first-5xx rule did
// eject (the blips moved requests off the server).
func TestOutlierBlipCost(t *testing.T) {
	var blips []Blip
	for at := 2 * time.Second; at < 30*time.Second; at += 5 * time.Second {
		blips = append(blips, Blip{Server: 1, At: at})
	}
	cfg := Config{
		Servers: chaosFleet(t), Seed: 3, Mix: mustMix(t, chaosMix),
		Objectives: map[string]int{"critical": 2, "standard": 1, "sheddable": 0},
		Arrival:    loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 12},
		Duration:   30 * time.Second,
	}
	runs := []struct {
		name  string
		local int
		blips []Blip
	}{{"no blips", 1, nil}, {"blips, localConsecutive5xx 2", 2, blips}, {"blips, localConsecutive5xx 1", 1, blips}}
	dispatched := map[string]uint64{}
	for _, run := range runs {
		c := cfg
		c.Blips = run.blips
		c.Router = SluiceRouter(nil, outlierProfile(t, fmt.Sprintf(`{"localConsecutive5xx": %d}`, run.local)))
		res, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		checkNothingLost(t, res.Records)
		ok, failed := 0, 0
		for _, r := range res.Records {
			switch {
			case r.Status == 200:
				ok++
			case r.Status == 500:
				failed++
			}
		}
		if failed != len(run.blips) {
			t.Errorf("%s: %d answered 500, want the %d blips", run.name, failed, len(run.blips))
		}
		all, critical := classSummary(res, loadgen.AllClasses), classSummary(res, "critical")
		dispatched[run.name] = res.Fleet.Dispatched[1]
		t.Logf("%-30s 200 × %d, 500 × %d; TTFT p99 %v, Critical %v; server 1 received %d",
			run.name, ok, failed, all.TTFT.P99, critical.TTFT.P99, res.Fleet.Dispatched[1])
	}
	if dispatched["blips, localConsecutive5xx 1"] >= dispatched["blips, localConsecutive5xx 2"] {
		t.Errorf("with the first-5xx rule the blipping server received %d requests, without it %d: want fewer (ejected after each blip)",
			dispatched["blips, localConsecutive5xx 1"], dispatched["blips, localConsecutive5xx 2"])
	}
}
