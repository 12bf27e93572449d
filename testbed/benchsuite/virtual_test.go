package benchsuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// shippedScenarios loads bench/scenarios.
func shippedScenarios(t *testing.T) []*Scenario {
	t.Helper()
	scs, err := LoadScenarios(filepath.Join("..", "bench", "scenarios"))
	if err != nil {
		t.Fatal(err)
	}
	return scs
}

func TestVirtualConfigMapsTheScenario(t *testing.T) {
	byName := map[string]*Scenario{}
	for _, sc := range shippedScenarios(t) {
		byName[sc.Name] = sc
	}
	prio, lora := byName["priority-overload"], byName["lora-heavy"]
	if prio == nil || lora == nil {
		t.Fatal("the shipped scenarios lack priority-overload or lora-heavy")
	}

	// An extra contender with its own flow-control policy (sluice-policy.yaml).
	var tuned Contender
	for _, c := range prio.Contenders {
		if c.Extra && c.FlowControlPolicy != nil {
			tuned = c
		}
	}
	if tuned.Name == "" {
		t.Fatal("priority-overload has no extra contender with a flow-control policy")
	}
	cfg, err := VirtualConfig(prio, tuned)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"critical": 10, "standard": 0, "sheddable": -1}; !reflect.DeepEqual(cfg.Objectives, want) {
		t.Errorf("objectives %v, want %v", cfg.Objectives, want)
	}
	if cfg.Fleet != prio.Fleet || cfg.Mix != prio.Mix || !reflect.DeepEqual(cfg.Arrival, prio.Arrival) || cfg.Duration != prio.Duration ||
		cfg.Drain != prio.Drain || cfg.Seed != prio.Seed || cfg.Retry != prio.Retry || cfg.SLO != prio.SLO ||
		cfg.ServerSeed != 1 {
		t.Errorf("config %+v does not carry the scenario's load", cfg)
	}
	policy, err := ParseFlowControlPolicy(tuned.FlowControlPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Router.Kind != virtualbench.EPP || !reflect.DeepEqual(cfg.Router.Admission, policy) ||
		reflect.DeepEqual(policy, flowcontrol.DefaultConfig()) || len(cfg.Router.EndpointPickerConfig) != 0 {
		t.Errorf("%s router %+v: want Sluice admission with %s (not the defaults) and the default profile",
			tuned.Name, cfg.Router, tuned.FlowControlPolicySource)
	}

	sluice, _ := lora.Contender(Sluice)
	cfg, err = VirtualConfig(lora, sluice)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.LoRAModules) != 40 || cfg.LoRAModules[0] != "adapter-00" || cfg.Objectives != nil {
		t.Errorf("adapters %v, objectives %v", cfg.LoRAModules, cfg.Objectives)
	}
	if !bytes.Equal(cfg.Router.EndpointPickerConfig, sluice.EndpointPickerConfig) || cfg.Router.Admission == nil {
		t.Errorf("sluice router %+v: want sluice.yaml with Sluice admission", cfg.Router)
	}
	rr, _ := lora.Contender(RoundRobin)
	if cfg, _ := VirtualConfig(lora, rr); cfg.Router.Kind != virtualbench.RoundRobin {
		t.Errorf("round-robin router %+v", cfg.Router)
	}
	up, _ := lora.Contender(UpstreamDefault)
	if cfg, _ := VirtualConfig(lora, up); cfg.Router.Kind != virtualbench.EPP || cfg.Router.Admission != nil || cfg.Router.EndpointPickerConfig != nil {
		t.Errorf("upstream-default router %+v: want the EPP's defaults with upstream admission", cfg.Router)
	}
}

func TestVirtualConfigErrors(t *testing.T) {
	sc := shippedScenarios(t)[0]
	bad := *sc
	bad.Objectives, bad.ObjectivesSource = []byte("kind: Pod\n"), "objectives.yaml"
	c := Contender{Name: "x", Router: RouterEPP, SluiceAdmission: true, FlowControlPolicy: []byte("endpoint: {bogus: 1}\n"),
		FlowControlPolicySource: "policy.yaml"}
	_, err := VirtualConfig(&bad, c)
	if err == nil || !strings.Contains(err.Error(), "objectives objectives.yaml") || !strings.Contains(err.Error(), "policy.yaml") {
		t.Errorf("error %v: want both the objectives and the policy named", err)
	}
	if _, err := VirtualConfig(sc, Contender{Name: "x", Router: "carrier-pigeon"}); err == nil {
		t.Error("an unknown router was accepted")
	}
}

func TestParseObjectivePriorities(t *testing.T) {
	got, err := ParseObjectivePriorities([]byte(`apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: a}
spec: {priority: 3, poolRef: {name: p}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: b}
spec: {poolRef: {name: p}}
`))
	if err != nil || !reflect.DeepEqual(got, map[string]int{"a": 3, "b": 0}) {
		t.Errorf("%v, %v; want a: 3 and b: 0 (no priority is upstream's default, 0)", got, err)
	}
	if got, err := ParseObjectivePriorities(nil); got != nil || err != nil {
		t.Errorf("no file: %v, %v", got, err)
	}
}

func TestParseFlowControlPolicy(t *testing.T) {
	for _, empty := range []string{"", "\n", "# nothing\n"} {
		if cfg, err := ParseFlowControlPolicy([]byte(empty)); err != nil || cfg == nil {
			t.Errorf("%q: %v, %v; want the defaults", empty, cfg, err)
		}
	}
	if _, err := ParseFlowControlPolicy([]byte("endpoint: [")); err == nil {
		t.Error("malformed YAML was accepted")
	}
	if _, err := ParseFlowControlPolicy([]byte("nonsense: 1\n")); err == nil {
		t.Error("an unknown field was accepted")
	}
}

// upstreamFlowControlConfig is an EndpointPickerConfig with upstream's experimental flow control on.
var upstreamFlowControlConfig = []byte("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n" +
	"featureGates: [flowControl]\nplugins: [{type: queue-scorer}]\n" +
	"schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}]}]\n")

func TestUnsupported(t *testing.T) {
	legacy := bytes.Replace(upstreamFlowControlConfig, []byte("flowControl"), []byte("enableLegacyMetrics"), 1)
	for _, tc := range []struct {
		name string
		c    Contender
		want string
	}{
		{"round-robin", Contender{Router: RouterRoundRobin}, ""},
		{"upstream default", Contender{Router: RouterEPP}, ""},
		{"upstream flow control", Contender{Router: RouterEPP, EndpointPickerConfig: upstreamFlowControlConfig}, "flow control"},
		{"flow control gate under Sluice admission", Contender{Router: RouterEPP, EndpointPickerConfig: upstreamFlowControlConfig, SluiceAdmission: true}, ""},
		{"legacy metrics", Contender{Router: RouterEPP, EndpointPickerConfig: legacy, SluiceAdmission: true}, "legacy metrics"},
		{"unparsable (the run reports it)", Contender{Router: RouterEPP, EndpointPickerConfig: []byte("[")}, ""},
	} {
		got := Unsupported(tc.c)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}

	// The skip is needed: virtualbench refuses the configuration.
	sc := shippedScenarios(t)[0]
	cfg, err := VirtualConfig(sc, Contender{Name: "x", Router: RouterEPP, EndpointPickerConfig: upstreamFlowControlConfig})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Duration = time.Second
	if _, err := virtualbench.Run(cfg); err == nil {
		t.Error("virtualbench ran upstream's flow control: Unsupported no longer needs to skip it")
	}
	_, err = (&Virtual{}).Run(t.Context(), sc, Contender{Name: "x", Router: RouterEPP, EndpointPickerConfig: upstreamFlowControlConfig})
	var skipped *SkippedError
	if !errors.As(err, &skipped) {
		t.Errorf("error %v, want a SkippedError", err)
	}
}

// TestVirtualRunIsCancellable: a cancelled context stops a run before it starts.
func TestVirtualRunIsCancellable(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	sc := shippedScenarios(t)[0]
	if _, err := (&Virtual{}).Run(ctx, sc, sc.Contenders[0]); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want the context's", err)
	}
}

// regressionDuration shortens every shipped scenario's load for the regression guards; regressionDrain bounds the
// time requests still running get after it.
const (
	regressionDuration = 10 * time.Second
	regressionDrain    = 10 * time.Second
)

// TestVirtualRegression runs every shipped scenario, shortened to 10 s of virtual load, in the virtual engine and
// guards the facts that hold today, with margin. Runs are deterministic, so every value below is exact for the code
// it was measured on; a failure means routing or admission changed (or the simulator did): read the logged table
// before moving a threshold. Values measured when the guards were set are in the comments.
func TestVirtualRegression(t *testing.T) {
	var scenarios []*Scenario
	for _, sc := range shippedScenarios(t) {
		// Every scenario file on its own fleet, and priority-overload on every shape (guarded below); the other
		// shapes add minutes under -race and nothing guarded.
		if sc.Name != sc.Family && sc.Family != "priority-overload" {
			continue
		}
		short := *sc
		short.Duration, short.Drain = regressionDuration, regressionDrain
		scenarios = append(scenarios, &short)
	}
	res := runSuiteConcurrently(t, scenarios)

	t.Log("Sluice's ratios (TTFT P50 / P95 / P99, throughput) vs round-robin | vs upstream-default:")
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		row := fmt.Sprintf("%-18s", s.Scenario.Name)
		for _, vs := range []string{RoundRobin, UpstreamDefault} {
			for _, f := range []Figure{FigureTTFTP50, FigureTTFTP95, FigureTTFTP99, FigureThroughput} {
				row += " " + ratioCell(s, vs, f)
			}
			row += " |"
		}
		t.Log(row)
	}

	scenario := func(name string) *ScenarioResult {
		for i := range res.Scenarios {
			if res.Scenarios[i].Scenario.Name == name {
				return &res.Scenarios[i]
			}
		}
		t.Fatalf("no scenario %s", name)
		return nil
	}
	ratio := func(s *ScenarioResult, vs string, f Figure) float64 {
		sluice, _ := s.Figures(Sluice)
		base, _ := s.Figures(vs)
		r, ok := Ratio(sluice, base, f)
		if !ok {
			t.Fatalf("%s: no %s ratio against %s", s.Scenario.Name, f, vs)
		}
		return r
	}

	// Sluice's TTFT P99 against round-robin's where the fleet or the load is uneven. Measured: mixed-gpu 0.065,
	// bursty 0.11, shared-prefix 0.23.
	for _, g := range []struct {
		scenario string
		atMost   float64
	}{{"mixed-gpu", 0.35}, {"bursty", 0.4}, {"shared-prefix", 0.75}} {
		if r := ratio(scenario(g.scenario), RoundRobin, FigureTTFTP99); r > g.atMost {
			t.Errorf("%s: Sluice's TTFT P99 is %.3fx round-robin's, want at most %g", g.scenario, r, g.atMost)
		}
	}
	// ... and more throughput where round-robin falls behind. Measured: mixed-gpu 2.26, bursty 3.40.
	for _, name := range []string{"mixed-gpu", "bursty"} {
		if r := ratio(scenario(name), RoundRobin, FigureThroughput); r < 1.5 {
			t.Errorf("%s: Sluice's throughput is %.3fx round-robin's, want at least 1.5", name, r)
		}
	}
	// Sluice's TTFT P99 against upstream's default. Measured: mixed-gpu 0.19, bursty 0.31, shared-prefix 0.66,
	// lora-heavy 0.32, uniform-steady 0.35. (Not guarded, as not better today: priority-overload 9.22, where Sheddable
	// requests wait in Sluice's queue and retry instead of being served late or shed at once.)
	for _, name := range []string{"mixed-gpu", "bursty", "shared-prefix", "lora-heavy", "uniform-steady"} {
		if r := ratio(scenario(name), UpstreamDefault, FigureTTFTP99); r > 0.9 {
			t.Errorf("%s: Sluice's TTFT P99 is %.3fx upstream-default's, want at most 0.9", name, r)
		}
	}

	// Bursts: with no headroom anywhere and no Critical traffic, the burst tier lets servers compute full prompt
	// batches, so the backlog drains faster. Measured: TTFT P50 1.19x and P95 0.32x upstream-default's; without the
	// burst tier (burstQueueDepthThreshold 0), 1.72x and 0.57x.
	bursty := scenario("bursty")
	if r := ratio(bursty, UpstreamDefault, FigureTTFTP50); r > 1.4 {
		t.Errorf("bursty: Sluice's TTFT P50 is %.3fx upstream-default's, want at most 1.4", r)
	}
	if r := ratio(bursty, UpstreamDefault, FigureTTFTP95); r > 0.45 {
		t.Errorf("bursty: Sluice's TTFT P95 is %.3fx upstream-default's, want at most 0.45", r)
	}

	// Skewed prefix groups: affinity survives admission (the headroom filter keeps the endpoint holding a request's
	// prefix) without melting the hot group's endpoint. Measured: TTFT P95 0.17x round-robin's, TTFT P99 0.83x
	// upstream-default's (today 0.12x and 0.74x); with the filter restricting affine requests to endpoints with
	// headroom, 0.57x and 2.36x.
	skew := scenario("prefix-skew")
	if r := ratio(skew, RoundRobin, FigureTTFTP95); r > 0.3 {
		t.Errorf("prefix-skew: Sluice's TTFT P95 is %.3fx round-robin's, want at most 0.3", r)
	}
	if r := ratio(skew, UpstreamDefault, FigureTTFTP99); r > 1 {
		t.Errorf("prefix-skew: Sluice's TTFT P99 is %.3fx upstream-default's, want at most 1", r)
	}

	// Priority overload: no Critical request is shed or fails, and Critical's TTFT P99 stays far below
	// round-robin's. Measured: Critical TTFT P99 0.21 s vs round-robin's 3.68 s (0.06x).
	prio := scenario("priority-overload")
	for _, c := range ShedByClass(prio.Result(Sluice).Records) {
		if c.Class == "critical" && (c.ShedAttempts != 0 || c.Failed != 0) {
			t.Errorf("priority-overload: Sluice shed %d Critical attempts and failed %d requests, want none", c.ShedAttempts, c.Failed)
		}
	}
	crit, _ := classSummary(prio.Result(Sluice), "critical")
	rrCrit, _ := classSummary(prio.Result(RoundRobin), "critical")
	t.Logf("priority-overload Critical TTFT P99: sluice %v, round-robin %v", crit.TTFT.P99, rrCrit.TTFT.P99)
	if crit.TTFT.Count == 0 || float64(crit.TTFT.P99) > 0.3*float64(rrCrit.TTFT.P99) {
		t.Errorf("priority-overload: Sluice's Critical TTFT P99 %v, want at most 0.3x round-robin's %v", crit.TTFT.P99, rrCrit.TTFT.P99)
	}

	// Every server shape of priority-overload: no Critical request shed, and Critical far faster than under
	// upstream's default, though not yet near its unloaded value on slot-limited and KV-bound servers (issue 17).
	// Measured at 10 s of load, Critical TTFT P99 over upstream-default's: large-batch 0.18, large-batch-2x 0.08,
	// slot-limited 0.11, kv-bound 0.32, mixed 0.11 (before seats: 0.17, 0.08, 0.37, 0.14, 0.36; the short run is
	// mostly the warm-up, where KV-bound servers still hold tentative seats). (Not guarded, as not better everywhere today: tenant-fairness's
	// light tenant, 0.81x upstream's on slot-limited servers, 0.33x large-batch, 1.56x kv-bound, 0.49x mixed.)
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		if s.Scenario.Family != "priority-overload" {
			continue
		}
		sluice, _ := s.ClassFigures(Sluice, "critical")
		upstream, _ := s.ClassFigures(UpstreamDefault, "critical")
		r, ok := Ratio(sluice, upstream, FigureTTFTP99)
		t.Logf("%s: Critical TTFT P99 %.2fx upstream-default's", s.Scenario.Name, r)
		switch {
		case !ok:
			t.Errorf("%s: no Critical TTFT P99 for Sluice or upstream-default", s.Scenario.Name)
		case sluice[FigureShed] != 0:
			t.Errorf("%s: Sluice shed %v Critical attempts, want none", s.Scenario.Name, sluice[FigureShed])
		case r > 0.6:
			t.Errorf("%s: Sluice's Critical TTFT P99 is %.2fx upstream-default's, want at most 0.6", s.Scenario.Name, r)
		}
	}

	// Determinism: a second run of the contenders with the most moving parts gives the same records, samples and
	// counters.
	for _, name := range []string{"priority-overload", "shared-prefix"} {
		s := scenario(name)
		c, _ := s.Scenario.Contender(Sluice)
		again, err := (&Virtual{}).Run(t.Context(), s.Scenario, c)
		if err != nil {
			t.Fatal(err)
		}
		first := s.Result(Sluice)
		if !reflect.DeepEqual(first.Records, again.Records) || !reflect.DeepEqual(first.Samples, again.Samples) ||
			first.Fleet != again.Fleet || first.Virtual != again.Virtual {
			t.Errorf("%s: a second run of %s differs", name, Sluice)
		}
	}
}

// runSuiteConcurrently runs every contender of every scenario in the virtual engine, as Suite.Run would but with
// the runs in parallel (they are independent and deterministic), and checks that none failed and that every request
// has exactly one final record.
func runSuiteConcurrently(t *testing.T, scenarios []*Scenario) *SuiteResult {
	t.Helper()
	res := &SuiteResult{Engine: VirtualEngineName}
	var wg sync.WaitGroup
	for _, sc := range scenarios {
		sr := ScenarioResult{Scenario: sc, Runs: make([]ContenderRun, len(sc.Contenders))}
		for i, c := range sc.Contenders {
			wg.Go(func() {
				run, err := (&Virtual{}).Run(t.Context(), sc, c)
				sr.Runs[i] = ContenderRun{Contender: c, Result: run}
				var skipped *SkippedError
				switch {
				case errors.As(err, &skipped):
					sr.Runs[i].Skipped = skipped.Reason
				case err != nil:
					sr.Runs[i].Error = err.Error()
				}
			})
		}
		res.Scenarios = append(res.Scenarios, sr)
	}
	wg.Wait()
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		s.Targets = s.EvaluateTargets()
		for _, run := range s.Runs {
			if run.Error != "" {
				t.Fatalf("%s/%s: %s", s.Scenario.Name, run.Contender.Name, run.Error)
			}
			if (Unsupported(run.Contender) != "") != (run.Skipped != "") {
				t.Errorf("%s/%s: skipped %q", s.Scenario.Name, run.Contender.Name, run.Skipped)
			}
			if run.Result != nil {
				checkOneFinalRecord(t, s.Scenario.Name+"/"+run.Contender.Name, run.Result)
			}
		}
	}
	return res
}

// checkOneFinalRecord checks that every request issued ended in exactly one final record, after its other
// attempts, and that the summary counts each once.
func checkOneFinalRecord(t *testing.T, run string, res *RunResult) {
	t.Helper()
	finals := map[int]int{} // by request: final records seen so far
	for _, r := range res.Records {
		n, seen := finals[r.Seq]
		if seen && n > 0 {
			t.Errorf("%s: request %d has a record after its final one", run, r.Seq)
			return
		}
		if r.Final {
			n++
		}
		finals[r.Seq] = n
	}
	for seq, n := range finals {
		if n != 1 {
			t.Errorf("%s: request %d has %d final records", run, seq, n)
			return
		}
	}
	if len(finals) != res.Summary.Overall.Requests {
		t.Errorf("%s: %d requests have records, the summary counts %d", run, len(finals), res.Summary.Overall.Requests)
	}
}
