package benchsuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/golden"
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

// everyShapeGuarded are the scenario files TestVirtualRegression runs on every server shape they list: the priority,
// fairness, recovery and mixed-fleet scenarios, whose defaults must hold on slot-limited, KV-bound and mixed fleets
// alike. The others run on their own fleet only.
var everyShapeGuarded = map[string]bool{"priority-overload": true, "tenant-fairness": true, "overload-recovery": true, "mixed-gpu": true}

// TestVirtualRegression runs every shipped scenario, shortened to 10 s of virtual load, in the virtual engine. Runs
// are deterministic, so it compares every contender's figures (TTFT, throughput, and the 429/503 answers with and
// without Retry-After; per band in priority-overload, the headline scenario, and per tenant in tenant-fairness) exactly
// with testdata/TestVirtualRegression.golden (package golden); after an intended change, rerun it with -update and
// commit the file with the change. The claims checked besides are the orderings Sluice is built for, which must
// survive an -update: they are what a reader of the golden diff should not have to spot.
func TestVirtualRegression(t *testing.T) {
	var scenarios []*Scenario
	for _, sc := range shippedScenarios(t) {
		if sc.Name != sc.Family && !everyShapeGuarded[sc.Family] {
			continue
		}
		short := *sc
		short.Duration, short.Drain = regressionDuration, regressionDrain
		if sc.Name != "replicas" {
			// Replicated runs are guarded on the replicas scenario alone; elsewhere they would add half the time.
			short.Contenders = slices.DeleteFunc(slices.Clone(sc.Contenders), func(c Contender) bool { return c.Replicas > 1 })
			short.Targets = slices.DeleteFunc(slices.Clone(sc.Targets), func(t Target) bool { return t.Subject != "" })
		}
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

	var figs golden.Figures
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		for _, run := range s.Runs {
			if run.Result == nil {
				continue // skipped, as Unsupported says (runSuiteConcurrently checks)
			}
			prefix := s.Scenario.Name + "/" + run.Contender.Name
			figs.Class(t, prefix+"/all", run.Result.Summary.Overall)
			shed, withRetryAfter := figs.Sheds(prefix+"/all", run.Result.Records, "")
			if strings.HasPrefix(run.Contender.Name, Sluice) && withRetryAfter != shed {
				t.Errorf("%s: %d of %s's %d 429/503 answers carry Retry-After, want all", s.Scenario.Name, withRetryAfter, run.Contender.Name, shed)
			}
			if s.Scenario.Family == "tenant-fairness" {
				for _, tenant := range []string{"light", "heavy"} {
					if run.Contender.Unloaded && tenant != s.Scenario.Unloaded.Class {
						continue // the unloaded reference sends its class alone
					}
					c, _ := classSummary(run.Result, tenant)
					figs.Class(t, prefix+"/"+tenant, c)
				}
			}
			if s.Scenario.Name != "priority-overload" {
				continue
			}
			for _, band := range priorityBands {
				if run.Contender.Unloaded && band != s.Scenario.Unloaded.Class {
					continue // the unloaded reference sends its class alone
				}
				c, _ := classSummary(run.Result, band)
				figs.Class(t, prefix+"/"+band, c)
				figs.Sheds(prefix+"/"+band, run.Result.Records, band) // every band's with Retry-After: checked over all above
			}
		}
	}
	golden.Check(t, filepath.Join("testdata", t.Name()+".golden"), &figs)

	scenario := func(name string) *ScenarioResult {
		for i := range res.Scenarios {
			if res.Scenarios[i].Scenario.Name == name {
				return &res.Scenarios[i]
			}
		}
		t.Fatalf("no scenario %s", name)
		return nil
	}
	// Sluice's figure f against contender vs's in the scenario: below (TTFT) or above (throughput).
	for _, c := range []struct {
		scenario, vs string
		f            Figure
	}{
		{"mixed-gpu", RoundRobin, FigureTTFTP99}, {"bursty", RoundRobin, FigureTTFTP99}, {"shared-prefix", RoundRobin, FigureTTFTP99},
		{"mixed-gpu", RoundRobin, FigureThroughput}, {"bursty", RoundRobin, FigureThroughput},
		{"mixed-gpu", UpstreamDefault, FigureTTFTP99}, {"bursty", UpstreamDefault, FigureTTFTP99},
		{"shared-prefix", UpstreamDefault, FigureTTFTP99}, {"lora-heavy", UpstreamDefault, FigureTTFTP99},
		{"uniform-steady", UpstreamDefault, FigureTTFTP99}, {"bursty", UpstreamDefault, FigureTTFTP95},
		{"prefix-skew", RoundRobin, FigureTTFTP95}, {"prefix-skew", UpstreamDefault, FigureTTFTP99},
	} {
		s := scenario(c.scenario)
		sluice, _ := s.Figures(Sluice)
		base, _ := s.Figures(c.vs)
		r, ok := Ratio(sluice, base, c.f)
		better := r < 1
		if c.f == FigureThroughput || c.f == FigureGoodput {
			better = r > 1
		}
		if !ok || !better {
			t.Errorf("%s: Sluice's %s is %.3fx %s's (defined: %v), want better", c.scenario, c.f, r, c.vs, ok)
		}
	}

	// Priority overload: no Critical request is shed or fails, and Critical's TTFT P99 is below every other
	// contender's.
	prio := scenario("priority-overload")
	for _, c := range ShedByClass(prio.Result(Sluice).Records) {
		if c.Class == "critical" && (c.ShedAttempts != 0 || c.Failed != 0) {
			t.Errorf("priority-overload: Sluice shed %d Critical attempts and failed %d requests, want none", c.ShedAttempts, c.Failed)
		}
	}
	crit, _ := classSummary(prio.Result(Sluice), "critical")
	for _, vs := range []string{RoundRobin, UpstreamDefault} {
		theirs, _ := classSummary(prio.Result(vs), "critical")
		if crit.TTFT.P99 >= theirs.TTFT.P99 {
			t.Errorf("priority-overload: Sluice's Critical TTFT P99 %v, want below %s's %v", crit.TTFT.P99, vs, theirs.TTFT.P99)
		}
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
	// counters, and they measured something (two empty runs are equal too).
	for _, name := range []string{"priority-overload", "shared-prefix"} {
		s := scenario(name)
		c, _ := s.Scenario.Contender(Sluice)
		again, err := (&Virtual{}).Run(t.Context(), s.Scenario, c)
		if err != nil {
			t.Fatal(err)
		}
		first := s.Result(Sluice)
		if len(first.Records) == 0 || first.Summary.Overall.Succeeded == 0 || len(first.Samples) == 0 {
			t.Fatalf("%s: the run of %s has %d records and %d samples: nothing to compare", name, Sluice, len(first.Records), len(first.Samples))
		}
		if !reflect.DeepEqual(first.Records, again.Records) || !reflect.DeepEqual(first.Samples, again.Samples) ||
			first.Fleet != again.Fleet || first.Virtual != again.Virtual {
			t.Errorf("%s: a second run of %s differs", name, Sluice)
		}
	}
}

// priorityBands are the priority-overload scenario's classes, highest band first.
var priorityBands = []string{"critical", "standard", "sheddable"}

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
