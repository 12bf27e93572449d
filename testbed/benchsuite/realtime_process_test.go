package benchsuite

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// benchBinaries locates the binaries (LocateBinaries); the test is skipped
// when they are missing.
func benchBinaries(t *testing.T) string {
	t.Helper()
	dir, err := LocateBinaries()
	if err != nil {
		t.Skipf("real-time smoke test needs the binaries (%v); set SLUICE_BENCH_BIN to their folder", err)
	}
	return dir
}

// TestRealTimeSmoke runs a tiny scenario end to end through the real
// binaries: a one-server fleet, 10 requests at 5 per second, the three
// contenders plus one whose EPP cannot start.
func TestRealTimeSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	bin := benchBinaries(t)
	dir := writeScenarioDir(t, "smoke", map[string]string{
		ScenarioFileName: `
fleet: h100:1
mix:
  classes:
    - {name: standard, model: m, objective: standard, prompt_tokens: 32, output_tokens: 8}
arrival: {kind: constant, rate: 5}
duration: 2s
drain: 20s
objectives: objectives.yaml
extra_contenders:
  - {name: broken, router: epp, epp_config: broken.yaml}
`,
		"objectives.yaml": `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: standard}
spec: {priority: 0, poolRef: {name: static}}
`,
		"broken.yaml": "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: no-such-plugin\n",
	})
	sc, err := LoadScenario(filepath.Join(dir, ScenarioFileName))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	engine := &RealTime{Bin: bin, OutDir: out, SampleEvery: 100 * time.Millisecond, Settle: 200 * time.Millisecond,
		StartupTimeout: 30 * time.Second}
	res, err := (&Suite{Engine: engine, EngineName: RealTimeEngineName, OutDir: out}).Run(t.Context(), []*Scenario{sc})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Scenarios[0]
	for _, run := range s.Runs {
		name := run.Contender.Name
		if name == "broken" {
			if run.Result != nil || !strings.Contains(run.Error, "epp exited") || !strings.Contains(run.Error, "no-such-plugin") {
				t.Errorf("broken contender: %q, want the EPP's exit and its log", run.Error)
			}
			continue
		}
		r := run.Result
		if r == nil {
			t.Errorf("%s failed: %s", name, run.Error)
			continue
		}
		if o := r.Summary.Overall; o.Requests != 10 || o.Succeeded != 10 || o.TTFT.Count != 10 {
			t.Errorf("%s: %d requests, %d succeeded, %d TTFTs; want 10 of each", name, o.Requests, o.Succeeded, o.TTFT.Count)
		}
		if len(r.Samples) == 0 {
			t.Errorf("%s: no queue samples", name)
		}
		if r.Fleet.PrefixQueryTokens <= 0 {
			t.Errorf("%s: fleet counters %+v, want prompt tokens looked up", name, r.Fleet)
		}
		if runtime.GOOS == "linux" {
			if r.CPU == nil {
				t.Errorf("%s: no CPU times", name)
			} else if (r.CPU.EPP > 0) != (name != RoundRobin) {
				t.Errorf("%s: EPP CPU time %v, want some for an EPP contender and none for round-robin", name, r.CPU.EPP)
			}
		}
		switch name {
		case Sluice:
			if r.Admission == nil || r.Admission.Dispatched["Standard"] != 10 {
				t.Errorf("sluice admission counters %+v, want 10 Standard requests dispatched", r.Admission)
			}
			if last := r.Samples[len(r.Samples)-1]; last.EPPQueued == nil || last.EPPStaleEndpoints == nil {
				t.Errorf("sluice: samples without the EPP's queue or stale endpoints: %+v", last)
			}
		default:
			if r.Admission != nil {
				t.Errorf("%s: Sluice admission counters %+v without Sluice admission", name, r.Admission)
			}
		}
		for _, f := range []string{"vllm-sim.log", "dataplane.log", RunFileName} {
			if _, err := os.Stat(filepath.Join(out, sc.Name, name, f)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	if err := WriteOutputs(out, res); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(out, ReportFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "smoke/ttft-cdf.svg") || !strings.Contains(string(report), "| broken |") {
		t.Errorf("report:\n%s", report)
	}
}

func TestCheckBinaries(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, EPPBinary), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	err := CheckBinaries(dir)
	if err == nil || !strings.Contains(err.Error(), SimulatorBinary) || !strings.Contains(err.Error(), DataPlaneBinary) ||
		strings.Contains(err.Error(), filepath.Join(dir, EPPBinary)+",") || !strings.Contains(err.Error(), "make build") {
		t.Errorf("CheckBinaries: %v", err)
	}
}

// TestRealTimeInterleavedSmoke runs the three contenders in one load
// (interleave): every contender gets the scenario's rate, its own requests
// (each through its own data plane), and its own processes' CPU.
func TestRealTimeInterleavedSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	bin := benchBinaries(t)
	dir := writeScenarioDir(t, "together", map[string]string{
		ScenarioFileName: `
fleet: h100:1
mix:
  classes:
    - {name: standard, model: m, prompt_tokens: 32, output_tokens: 8}
arrival: {kind: constant, rate: 4}
duration: 2s
drain: 20s
interleave: true
`,
	})
	sc, err := LoadScenario(filepath.Join(dir, ScenarioFileName))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	engine := &RealTime{Bin: bin, OutDir: out, SampleEvery: 100 * time.Millisecond, Settle: 200 * time.Millisecond,
		StartupTimeout: 30 * time.Second}
	res, err := (&Suite{Engine: engine, EngineName: RealTimeEngineName, OutDir: out}).Run(t.Context(), []*Scenario{sc})
	if err != nil {
		t.Fatal(err)
	}
	starts := map[time.Time]bool{}
	for k, run := range res.Scenarios[0].Runs {
		name, r := run.Contender.Name, run.Result
		if r == nil {
			t.Fatalf("%s failed: %s", name, run.Error)
		}
		starts[r.Started] = true
		if o := r.Summary.Overall; o.Requests != 8 || o.Succeeded != 8 {
			t.Errorf("%s: %d requests, %d succeeded; want 8 of each (4/s for 2 s)", name, o.Requests, o.Succeeded)
		}
		for _, rec := range r.Records {
			if rec.Target != k {
				t.Errorf("%s: a record of target %d", name, rec.Target)
			}
			if (rec.EPPTime > 0) != (name != RoundRobin) {
				t.Errorf("%s: EPP time %v", name, rec.EPPTime)
			}
		}
		if runtime.GOOS == "linux" && (r.CPU == nil || (r.CPU.EPP > 0) != (name != RoundRobin)) {
			t.Errorf("%s: CPU %+v, want EPP time for an EPP contender only", name, r.CPU)
		}
		if len(r.Samples) == 0 {
			t.Errorf("%s: no queue samples", name)
		}
	}
	if len(starts) != 1 {
		t.Errorf("the contenders' loads started at %d instants, want one load", len(starts))
	}
}
