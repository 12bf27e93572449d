package benchsuite

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// minimalScenario is a valid scenario file with an inline mix.
const minimalScenario = `
fleet: h100:2,a10g:1
mix:
  classes:
    - {name: chat, model: m, prompt_tokens: 64, output_tokens: 16}
arrival: {kind: poisson, rate: 10}
`

// writeScenarioDir writes files into a fresh folder named name and returns
// its path.
func writeScenarioDir(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestParseScenarioDefaults(t *testing.T) {
	sc, err := ParseScenario([]byte(minimalScenario), "/x/my-scenario")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "my-scenario" || sc.Title != "my-scenario" {
		t.Errorf("name %q title %q, want the folder's name", sc.Name, sc.Title)
	}
	if sc.Duration != DefaultDuration || sc.Drain != DefaultDrain || sc.Seed != DefaultSeed {
		t.Errorf("defaults: duration %v drain %v seed %d", sc.Duration, sc.Drain, sc.Seed)
	}
	if sc.FleetSize != 3 || sc.Model != "m" || sc.MixSource != "inline" {
		t.Errorf("fleet size %d, model %q, mix source %q", sc.FleetSize, sc.Model, sc.MixSource)
	}
	if sc.Retry.MaxAttempts != 0 || sc.Objectives != nil {
		t.Errorf("retry %+v objectives %q: want none", sc.Retry, sc.Objectives)
	}
	var names []string
	for _, c := range sc.Contenders {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "round-robin,upstream-default,sluice" {
		t.Errorf("contenders %s", got)
	}
	up, _ := sc.Contender(UpstreamDefault)
	sl, _ := sc.Contender(Sluice)
	rr, _ := sc.Contender(RoundRobin)
	if rr.Router != RouterRoundRobin || up.Router != RouterEPP || up.SluiceAdmission || up.EndpointPickerConfig != nil {
		t.Errorf("baselines: %+v %+v", rr, up)
	}
	if !sl.SluiceAdmission || sl.EndpointPickerConfig != nil || sl.FlowControlPolicy != nil {
		t.Errorf("sluice: %+v, want admission with its defaults", sl)
	}
	if len(sc.Targets) != 1 || !sc.Targets[0].Implicit || sc.Targets[0].Versus != UpstreamDefault ||
		sc.Targets[0].Figure != FigureEvery || sc.Targets[0].Kind != Within || sc.Targets[0].Bound != NoWorseTolerance {
		t.Errorf("targets %+v, want only the implicit one against upstream-default", sc.Targets)
	}
}

func TestLoadScenarioFiles(t *testing.T) {
	dir := writeScenarioDir(t, "prio", map[string]string{
		ScenarioFileName: `
name: prio
order: 5
title: Priority
fleet: h100:1
mix: mix.yaml
arrival: {kind: bursty, rate: 50, burst_on: 2s, burst_off: 3s}
duration: 20s
drain: 5s
seed: 7
retry: {max_attempts: 3, max_wait: 10s}
slo: {ttft: 2s}
objectives: objectives.yaml
sluice: {epp_config: sluice.yaml, flow_control_policy: policy.yaml}
extra_contenders:
  - {name: upstream-fc, router: epp, epp_config: upstream.yaml}
  - {name: rr-again, router: round-robin}
targets:
  - {figure: ttft_p99, vs: round-robin, at_most: 0.1}
  - {figure: throughput, vs: upstream-default, at_least: 1.0}
`,
		"mix.yaml": "classes: [{name: a, model: m, objective: critical, prompt_tokens: 8, output_tokens: 8}, " +
			"{name: b, model: m, objective: sheddable, prompt_tokens: 8, output_tokens: 8}]\n",
		"objectives.yaml": "kind: InferenceObjective\n",
		"sluice.yaml":     "kind: EndpointPickerConfig\n",
		"policy.yaml":     "endpoint: {queueDepthThreshold: 2}\n",
		"upstream.yaml":   "featureGates: [flowControl]\n",
	})
	sc, err := LoadScenario(filepath.Join(dir, ScenarioFileName))
	if err != nil {
		t.Fatal(err)
	}
	want := loadgen.ArrivalConfig{Kind: loadgen.ArrivalBursty, Rate: 50, BurstOn: 2 * time.Second, BurstOff: 3 * time.Second}
	if !reflect.DeepEqual(sc.Arrival, want) {
		t.Errorf("arrival %+v, want %+v", sc.Arrival, want)
	}
	if sc.Order != 5 || sc.Duration != 20*time.Second || sc.Drain != 5*time.Second || sc.Seed != 7 ||
		sc.Retry != (loadgen.RetryPolicy{MaxAttempts: 3, MaxWait: 10 * time.Second}) || sc.SLO.TTFT != loadgen.Duration(2*time.Second) {
		t.Errorf("scenario %+v", sc)
	}
	if string(sc.Objectives) != "kind: InferenceObjective\n" || sc.ObjectivesSource != "objectives.yaml" || sc.MixSource != "mix.yaml" {
		t.Errorf("files: objectives %q from %q, mix from %q", sc.Objectives, sc.ObjectivesSource, sc.MixSource)
	}
	var names []string
	for _, c := range sc.Contenders {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, ","); got != "round-robin,upstream-default,upstream-fc,rr-again,sluice" {
		t.Errorf("contenders %s: extras go between the baselines and sluice", got)
	}
	fc, _ := sc.Contender("upstream-fc")
	if !fc.Extra || fc.SluiceAdmission || string(fc.EndpointPickerConfig) != "featureGates: [flowControl]\n" {
		t.Errorf("extra %+v", fc)
	}
	sl, _ := sc.Contender(Sluice)
	if string(sl.EndpointPickerConfig) != "kind: EndpointPickerConfig\n" || string(sl.FlowControlPolicy) != "endpoint: {queueDepthThreshold: 2}\n" ||
		sl.EndpointPickerConfigSource != "sluice.yaml" || sl.FlowControlPolicySource != "policy.yaml" {
		t.Errorf("sluice %+v", sl)
	}
	if len(sc.Targets) != 3 || sc.Targets[0] != (Target{Figure: FigureTTFTP99, Versus: RoundRobin, Kind: AtMost, Bound: 0.1}) ||
		sc.Targets[1] != (Target{Figure: FigureThroughput, Versus: UpstreamDefault, Kind: AtLeast, Bound: 1}) || !sc.Targets[2].Implicit {
		t.Errorf("targets %+v", sc.Targets)
	}
}

func TestParseScenarioErrors(t *testing.T) {
	// Each case replaces or adds lines of minimalScenario and expects every
	// listed fragment in the error: the field it is about and why.
	cases := []struct {
		name string
		file string
		want []string
	}{
		{"unknown field", minimalScenario + "flete: h100:1\n", []string{`unknown field "flete"`}},
		{"no fleet", strings.Replace(minimalScenario, "fleet: h100:2,a10g:1", "", 1), []string{"fleet: required"}},
		{"unknown profile", strings.Replace(minimalScenario, "h100:2", "b200:2", 1), []string{"fleet:", "b200"}},
		{"zero count", strings.Replace(minimalScenario, "h100:2", "h100:0", 1), []string{"fleet:", "positive"}},
		{"no mix", "fleet: h100:1\narrival: {kind: poisson, rate: 1}\n", []string{"mix: required"}},
		{"mix file missing", "fleet: h100:1\nmix: nope.yaml\narrival: {kind: poisson, rate: 1}\n", []string{"mix:", "nope.yaml"}},
		{"mix not a mix", "fleet: h100:1\nmix: 3\narrival: {kind: poisson, rate: 1}\n", []string{"mix: want a file path or an inline mix"}},
		{"invalid inline mix", strings.Replace(minimalScenario, "model: m, ", "", 1), []string{"mix:", "model", "required"}},
		{"two models", strings.Replace(minimalScenario, "output_tokens: 16}",
			"output_tokens: 16}\n    - {name: other, model: n, prompt_tokens: 8, output_tokens: 8}", 1), []string{"mix:", "2 base models"}},
		{"interleaved chats", strings.Replace(minimalScenario, "output_tokens: 16}", "output_tokens: 16, multi_turn: {turns: 2, concurrent: 2}}", 1) + "interleave: true\n",
			[]string{"interleave:", `class "chat" has multi_turn`}},
		{"no arrival kind", strings.Replace(minimalScenario, "kind: poisson, ", "", 1), []string{"arrival.kind: required"}},
		{"bad arrival kind", strings.Replace(minimalScenario, "poisson", "gamma", 1), []string{"arrival.kind:", `"gamma"`}},
		{"zero rate", strings.Replace(minimalScenario, "rate: 10", "rate: 0", 1), []string{"arrival.rate:", "positive"}},
		{"burst window on poisson", strings.Replace(minimalScenario, "rate: 10", "rate: 10, burst_on: 1s", 1), []string{"arrival:", "bursty arrivals only"}},
		{"bursty without on", strings.Replace(minimalScenario, "poisson", "bursty", 1), []string{"arrival.burst_on:"}},
		{"bad duration", minimalScenario + "duration: soon\n", []string{"duration:", `"soon"`}},
		{"negative drain", minimalScenario + "drain: -1s\n", []string{"drain:", "negative"}},
		{"bad slo", minimalScenario + "slo: {ttft: fast}\n", []string{"slo.ttft:", `"fast"`}},
		{"bad retry wait", minimalScenario + "retry: {max_attempts: 2, max_wait: x}\n", []string{"retry.max_wait:"}},
		{"bad burst window", strings.Replace(minimalScenario, "poisson, rate: 10", "bursty, rate: 10, burst_on: 1s, burst_off: often", 1), []string{"arrival.burst_off:"}},
		{"two templates", strings.Replace(minimalScenario, "output_tokens: 16}", "output_tokens: 16}\n    - {name: b, model: m, prompt_tokens: 8, output_tokens: 8}", 1) + "adapters: {count: 2, zipf_s: 1, share: 0.5}\n", []string{"adapters.class:", "required when the mix has 2 classes"}},
		{"long duration", minimalScenario + "duration: 2h\n", []string{"duration:", "exceeds"}},
		{"long drain", minimalScenario + "drain: 11m\n", []string{"drain:", "exceeds"}},
		{"retry attempts", minimalScenario + "retry: {max_attempts: 0}\n", []string{"retry.max_attempts:", "at least 1"}},
		{"objectives missing", minimalScenario + "objectives: nope.yaml\n", []string{"objectives:", "nope.yaml"}},
		{"sluice config missing", minimalScenario + "sluice: {epp_config: nope.yaml}\n", []string{"sluice.epp_config:", "nope.yaml"}},
		{"sluice policy missing", minimalScenario + "sluice: {flow_control_policy: nope.yaml}\n", []string{"sluice.flow_control_policy:"}},
		{"bad name", minimalScenario + "name: Mixed_GPU\n", []string{"name:", `"Mixed_GPU"`}},
		{"reserved extra", minimalScenario + "extra_contenders: [{name: sluice, router: epp}]\n", []string{"extra_contenders[0].name:", "taken"}},
		{"duplicate extra", minimalScenario + "extra_contenders: [{name: a, router: epp}, {name: a, router: epp}]\n", []string{"extra_contenders[1].name:", "taken"}},
		{"bad router", minimalScenario + "extra_contenders: [{name: a, router: envoy}]\n", []string{"extra_contenders[0].router:", `"envoy"`}},
		{"round-robin with config", minimalScenario + "extra_contenders: [{name: a, router: round-robin, sluice_admission: true}]\n",
			[]string{"extra_contenders[0]:", "no EPP"}},
		{"round-robin with body mode", minimalScenario + "extra_contenders: [{name: a, router: round-robin, request_body_mode: buffered}]\n",
			[]string{"extra_contenders[0]:", "no EPP"}},
		{"bad body mode", minimalScenario + "extra_contenders: [{name: a, router: epp, request_body_mode: streamed}]\n",
			[]string{"extra_contenders[0].request_body_mode:", `"streamed"`}},
		{"bad figure", minimalScenario + "targets: [{figure: latency, vs: round-robin, at_most: 1}]\n", []string{"targets[0].figure:", `"latency"`}},
		{"bad baseline", minimalScenario + "targets: [{figure: ttft_p99, vs: sluice, at_most: 1}]\n", []string{"targets[0].vs:", `"sluice"`}},
		{"no bound", minimalScenario + "targets: [{figure: ttft_p99, vs: round-robin}]\n", []string{"targets[0]:", "exactly one"}},
		{"two bounds", minimalScenario + "targets: [{figure: ttft_p99, vs: round-robin, at_most: 1, at_least: 0.5}]\n", []string{"targets[0]:", "exactly one"}},
		{"negative bound", minimalScenario + "targets: [{figure: ttft_p99, vs: round-robin, at_most: -1}]\n", []string{"targets[0].at_most:", ">= 0"}},
		{"every with at_most", minimalScenario + "targets: [{figure: every, vs: round-robin, at_most: 1}]\n", []string{"targets[0]:", "within"}},
		{"adapter count", minimalScenario + "adapters: {count: 0, zipf_s: 1, share: 0.5}\n", []string{"adapters.count:", "1..1000"}},
		{"adapter share", minimalScenario + "adapters: {count: 2, zipf_s: 1, share: 0}\n", []string{"adapters.share:", "(0, 1]"}},
		{"adapter class", minimalScenario + "adapters: {count: 2, zipf_s: 1, share: 0.5, class: nope}\n", []string{"adapters.class:", `no class "nope"`}},
		{"shapes without shape", minimalScenario + "shapes: [{name: b, fleet: h100:1}]\n", []string{"shape: required with shapes"}},
		{"shape name", minimalScenario + "shape: a\nshapes: [{name: B_2, fleet: h100:1}]\n", []string{"shapes[0].name:"}},
		{"duplicate shape", minimalScenario + "shape: a\nshapes: [{name: a, fleet: h100:1}]\n", []string{"shapes[0].name:", "unique"}},
		{"shape fleet", minimalScenario + "shape: a\nshapes: [{name: b, fleet: tpu:1}]\n", []string{"shapes[0] (b):", "fleet:"}},
		{"shape without unloaded rate", minimalScenario + "unloaded: {class: chat, rate: 1}\nshape: a\nshapes: [{name: b, fleet: h100:1}]\n",
			[]string{"shapes[0] (b):", "unloaded.rate:"}},
		{"unloaded class", minimalScenario + "unloaded: {class: nope, rate: 1}\n", []string{"unloaded.class:", `"nope"`}},
		{"capacity", minimalScenario + "capacity: -3\n", []string{"capacity:", "non-negative"}},
		{"vs unloaded without reference", minimalScenario + "targets: [{figure: ttft_p99, vs: unloaded, at_most: 2}]\n",
			[]string{"targets[0].vs:", "unloaded reference"}},
		{"vs unloaded other class", minimalScenario + "unloaded: {class: chat, rate: 1}\n" +
			"targets: [{figure: ttft_p99, class: other, vs: unloaded, at_most: 2}]\n", []string{"targets[0].class:", "unloaded reference's class"}},
		{"count with vs", minimalScenario + "targets: [{figure: shed, vs: round-robin, at_most: 0}]\n", []string{"targets[0].vs:", "judge its value"}},
		{"within a value", minimalScenario + "targets: [{figure: ttft_p99, within: 0.1}]\n", []string{"targets[0]:", "compare Sluice with a contender"}},
		{"unknown class", minimalScenario + "targets: [{figure: shed, class: nope, at_most: 0}]\n", []string{"targets[0].class:", `no class "nope"`}},
		{"phases on poisson", strings.Replace(minimalScenario, "rate: 10}", "rate: 10, phases: [{rate: 1, duration: 1s}]}", 1),
			[]string{"arrival.phases:", "phased arrivals only"}},
		{"phased without phases", strings.Replace(minimalScenario, "{kind: poisson, rate: 10}", "{kind: phased}", 1),
			[]string{"arrival.phases:", "at least one phase"}},
		{"phase duration", strings.Replace(minimalScenario, "{kind: poisson, rate: 10}", "{kind: phased, phases: [{rate: 1, duration: x}]}", 1),
			[]string{"arrival.phases[0].duration:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseScenario([]byte(tc.file), t.TempDir())
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseScenarioReportsEveryProblem(t *testing.T) {
	_, err := ParseScenario([]byte("mix: {classes: [{name: a, model: m, prompt_tokens: 1, output_tokens: 1}]}\narrival: {kind: poisson}\n"), "/x/y")
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"fleet: required", "arrival.rate:"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func TestAdaptersExpand(t *testing.T) {
	file := minimalScenario + "adapters: {count: 3, zipf_s: 1.0, share: 0.6}\n"
	sc, err := ParseScenario([]byte(file), "/x/lora")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sc.Adapters, ","); got != "adapter-00,adapter-01,adapter-02" {
		t.Errorf("adapters %s", got)
	}
	if len(sc.Mix.Classes) != 4 {
		t.Fatalf("%d classes, want base + 3 adapters", len(sc.Mix.Classes))
	}
	base := sc.Mix.Classes[0]
	if base.Name != "chat" || base.LoRA != "" || math.Abs(*base.Weight-0.4) > 1e-9 {
		t.Errorf("base class %+v weight %v, want 0.4 of the template's weight", base, *base.Weight)
	}
	// Zipf s=1 over 3: 1, 1/2, 1/3 normalised by 11/6.
	wantShares := []float64{6.0 / 11, 3.0 / 11, 2.0 / 11}
	for k, c := range sc.Mix.Classes[1:] {
		if c.LoRA != sc.Adapters[k] || c.Name != "chat/"+sc.Adapters[k] || c.Model != "m" || c.PromptTokens.Min != 64 {
			t.Errorf("adapter class %d: %+v", k, c)
		}
		if want := 0.6 * wantShares[k]; math.Abs(*c.Weight-want) > 1e-9 {
			t.Errorf("adapter %d weight %v, want %v", k, *c.Weight, want)
		}
	}
}

func TestAdaptersExpandAllTraffic(t *testing.T) {
	file := minimalScenario + "adapters: {count: 2, zipf_s: 0, share: 1}\n"
	sc, err := ParseScenario([]byte(file), "/x/lora")
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Mix.Classes) != 2 || sc.Mix.Classes[0].LoRA == "" || *sc.Mix.Classes[0].Weight != *sc.Mix.Classes[1].Weight {
		t.Errorf("share 1, s 0: want two equally weighted adapter classes and no base class, got %+v", sc.Mix.Classes)
	}
}

func TestLoadScenarios(t *testing.T) {
	root := t.TempDir()
	for name, order := range map[string]string{"b": "1", "a": "1", "c": "0"} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ScenarioFileName), []byte(minimalScenario+"order: "+order+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	scs, err := LoadScenarios(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sc := range scs {
		names = append(names, sc.Name)
	}
	if got := strings.Join(names, ","); got != "c,a,b" {
		t.Errorf("order %s, want by order then name", got)
	}

	if err := os.WriteFile(filepath.Join(root, "a", ScenarioFileName), []byte(minimalScenario+"name: b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadScenarios(root); err == nil || !strings.Contains(err.Error(), `name "b" is used by`) {
		t.Errorf("duplicate names: %v", err)
	}
	if _, err := LoadScenarios(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no scenarios") {
		t.Errorf("empty folder: %v", err)
	}
}

// TestShippedScenarios checks that every scenario in bench/scenarios
// parses, and that the targets are declared where it sets them.
// replicaTargets is each of targets for every replicated contender, sharing nothing, owning endpoints and exchanging
// peer summaries, in the order a scenario file declares them: ratios against sluice, values (count figures) as they
// are.
func replicaTargets(counts []int, balance []string, targets ...Target) []Target {
	var out []Target
	for _, t := range targets {
		if !slices.Contains(CountFigures, t.Figure) {
			t.Versus = Sluice
		}
		for _, n := range counts {
			for _, suffix := range []string{"", "-owned", "-exchange"} {
				for _, b := range balance {
					t.Subject = ReplicaContenderName(n, b) + suffix
					out = append(out, t)
				}
			}
		}
	}
	return out
}

func TestShippedScenarios(t *testing.T) {
	scs, err := LoadScenarios(filepath.Join("..", "bench", "scenarios"))
	if err != nil {
		t.Fatal(err)
	}
	byFamily := map[string][]*Scenario{}
	for _, sc := range scs {
		byFamily[sc.Family] = append(byFamily[sc.Family], sc)
	}
	want := map[string][]Target{
		"mixed-gpu": {{Figure: FigureTTFTP99, Versus: RoundRobin, Kind: AtMost, Bound: 0.05},
			{Figure: FigureThroughput, Versus: RoundRobin, Kind: AtLeast, Bound: 1.08}},
		"bursty": {{Figure: FigureTTFTP99, Versus: RoundRobin, Kind: AtMost, Bound: 0.1}},
		"shared-prefix": append([]Target{{Figure: FigureTTFTP95, Versus: RoundRobin, Kind: AtMost, Bound: 0.6},
			{Figure: FigureTTFTP99, Versus: RoundRobin, Kind: AtMost, Bound: 0.5}},
			replicaTargets([]int{2, 4}, []string{"round-robin"}, Target{Figure: FigurePrefixHitRate, Kind: AtLeast, Bound: 0.95},
				Target{Figure: FigureThroughput, Kind: AtLeast, Bound: 0.98},
				Target{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0})...),
		"uniform-steady": {{Figure: FigureEvery, Versus: RoundRobin, Kind: Within, Bound: 0.05}},
		// Issue 17's, on every server shape.
		"priority-overload": {{Figure: FigureTTFTP99, Class: "critical", Versus: Unloaded, Kind: AtMost, Bound: 2},
			{Figure: FigureShed, Class: "critical", Kind: AtMost, Bound: 0},
			{Figure: FigureThroughput, Versus: UpstreamDefault, Kind: AtLeast, Bound: 0.95},
			{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0}},
		"tenant-fairness": append([]Target{{Figure: FigureTTFTP99, Class: "light", Versus: Unloaded, Kind: AtMost, Bound: 2},
			{Figure: FigureUnanswered, Class: "heavy", Kind: AtMost, Bound: 0},
			{Figure: FigureShedWithoutRetryAfter, Class: "heavy", Kind: AtMost, Bound: 0}},
			replicaTargets([]int{2, 4}, []string{"round-robin"},
				Target{Figure: FigureTTFTP50, Class: "light", Kind: AtMost, Bound: 1.1},
				Target{Figure: FigureTTFTP99, Class: "light", Kind: AtMost, Bound: 1.1},
				Target{Figure: FigureThroughput, Kind: AtLeast, Bound: 0.98},
				Target{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0})...),
		// Issue 22's, every replicated run against one replica.
		"replicas": replicaTargets([]int{2, 4}, []string{"round-robin", "random"},
			Target{Figure: FigureTTFTP50, Class: "critical", Kind: AtMost, Bound: 1.1},
			Target{Figure: FigureTTFTP99, Class: "critical", Kind: AtMost, Bound: 1.1},
			Target{Figure: FigureThroughput, Kind: AtLeast, Bound: 0.98},
			Target{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0}),
		"overload-recovery": {{Figure: FigureFirstRetryServedBelowCapacity, Kind: AtLeast, Bound: 0.9},
			{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0}},
		"lora-heavy":  nil,
		"prefix-skew": nil,
		"long-prompt": nil, // issue 21's figure is what each EPP adds over round-robin: see the README
		// The same, the prompts written as prose and code with escapes.
		"long-prompt-text": nil,
		"stream-cpu":       nil, // issue 21's target 2 is the report's EPP CPU per attempt against upstream-default's
	}
	if len(byFamily) != len(want) {
		t.Errorf("%d scenario files, want %d", len(byFamily), len(want))
	}
	for family, targets := range want {
		if len(byFamily[family]) == 0 {
			t.Errorf("scenario %s missing", family)
		}
		for _, sc := range byFamily[family] {
			declared := sc.Targets[:len(sc.Targets)-1]
			if len(declared) != len(targets) {
				t.Errorf("%s: targets %+v, want %+v", sc.Name, declared, targets)
				continue
			}
			for i := range targets {
				if declared[i] != targets[i] {
					t.Errorf("%s: target %d is %+v, want %+v", sc.Name, i, declared[i], targets[i])
				}
			}
		}
	}
	// Issue 21, target 3: long prompts also run the sluice contender behind a proxy that buffers the request body.
	for _, family := range []string{"long-prompt", "long-prompt-text"} {
		if lp := byFamily[family]; len(lp) == 1 {
			c, ok := lp[0].Contender("sluice-buffered")
			if !ok || !c.Extra || !c.SluiceAdmission || c.RequestBodyMode != "buffered" || c.EndpointPickerConfig != nil {
				t.Errorf("%s's sluice-buffered contender %+v (found %v), want the sluice contender with a buffered body", family, c, ok)
			}
		}
	}
	// long-prompt-text is long-prompt with realistic text, and nothing else: its figures compare with long-prompt's.
	if words, text := byFamily["long-prompt"], byFamily["long-prompt-text"]; len(words) == 1 && len(text) == 1 {
		w, x := *words[0], *text[0]
		wm, xm := *w.Mix, *x.Mix
		if wm.PromptText != "" || xm.PromptText != loadgen.TextRealistic {
			t.Errorf("prompt_text: long-prompt %q, long-prompt-text %q, want words and realistic", wm.PromptText, xm.PromptText)
		}
		xm.PromptText = wm.PromptText
		if !reflect.DeepEqual(wm, xm) || w.Fleet != x.Fleet || !reflect.DeepEqual(w.Arrival, x.Arrival) || w.Duration != x.Duration ||
			w.Drain != x.Drain || w.Seed != x.Seed || w.Interleave != x.Interleave || !reflect.DeepEqual(w.Contenders, x.Contenders) {
			t.Error("long-prompt-text differs from long-prompt in more than its prompts' text")
		}
	}
	// Issue 21, target 2: streamed chats in one interleaved load, with the response observer's contender beside them.
	if sc := byFamily["stream-cpu"]; len(sc) == 1 {
		c, ok := sc[0].Contender("sluice-observed")
		if !sc[0].Interleave || !ok || !c.SluiceAdmission || !c.ResponseObserver {
			t.Errorf("stream-cpu: interleaved %v, sluice-observed %+v (found %v); want an interleaved run with the observed sluice contender",
				sc[0].Interleave, c, ok)
		}
	}
	// Issue 17: the priority, fairness and mixed-fleet scenarios run on at least three server shapes.
	for _, family := range []string{"priority-overload", "tenant-fairness", "mixed-gpu"} {
		fleets := map[string]bool{}
		for _, sc := range byFamily[family] {
			fleets[sc.Fleet] = true
		}
		if len(fleets) < 3 {
			t.Errorf("%s runs on %d fleets, want at least 3 server shapes", family, len(fleets))
		}
	}
}
