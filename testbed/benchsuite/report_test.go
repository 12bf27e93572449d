package benchsuite

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// fakeRequests describes the requests of one class in a synthetic run.
type fakeRequests struct {
	class string
	ttft  []time.Duration // one successful request each
	shed  int             // requests answered 429 on both attempts
}

// fakeRun builds a run whose records and summary hold the given requests,
// over a 10 s wall time.
func fakeRun(scenario, contender string, classes ...fakeRequests) *RunResult {
	var recs []loadgen.Record
	seq := 0
	for _, c := range classes {
		for _, d := range c.ttft {
			recs = append(recs, loadgen.Record{Seq: seq, Attempt: 1, Final: true, Class: c.class, Status: http.StatusOK,
				TTFT: d, E2E: d + time.Second, OutputTokens: 16, Start: time.Duration(seq) * 10 * time.Millisecond,
				Stream: true, Endpoint: fmt.Sprintf("10.0.0.%d:8000", seq%2)})
			seq++
		}
		for range c.shed {
			first := loadgen.Record{Seq: seq, Attempt: 1, Class: c.class, Status: http.StatusTooManyRequests,
				RetryAfter: time.Second, RetryAfterSet: true, Error: "HTTP 429"}
			last := first
			last.Attempt, last.Final, last.SinceFirstAttempt = 2, true, time.Second
			recs = append(recs, first, last)
			seq++
		}
	}
	return &RunResult{
		Scenario: scenario, Contender: contender, Engine: "test", Wall: 10 * time.Second,
		Records: recs, Summary: loadgen.Summarize(recs, loadgen.SummaryOptions{Duration: 10 * time.Second}),
		Fleet: FleetCounters{PrefixHitTokens: 25, PrefixQueryTokens: 100, AdapterLoads: 3},
		Samples: []QueueSample{
			{At: 500 * time.Millisecond, ServerWaiting: 2, EPPQueued: map[string]float64{"Critical": 1}},
			{At: time.Second, ServerWaiting: 5, EPPQueued: map[string]float64{"Critical": 0, "Standard": 3}},
		},
	}
}

func ms(n ...int) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, v := range n {
		out[i] = time.Duration(v) * time.Millisecond
	}
	return out
}

// fakeSuite is a session of two scenarios: "steady" whose sluice run is
// 10x faster than round-robin, and "prio" with bands, shedding and a
// failed upstream-default run.
func fakeSuite(t *testing.T) *SuiteResult {
	t.Helper()
	steady, err := ParseScenario([]byte(minimalScenario+"title: Steady\ndescription: The steady one.\n"+
		"targets: [{figure: ttft_p99, vs: round-robin, at_most: 0.2}, {figure: throughput, vs: round-robin, at_least: 2}]\n"), "/x/steady")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeScenarioDir(t, "prio", map[string]string{
		ScenarioFileName: `
fleet: h100:2
mix:
  classes:
    - {name: critical, model: m, objective: critical, prompt_tokens: 8, output_tokens: 8}
    - {name: sheddable, model: m, objective: sheddable, prompt_tokens: 8, output_tokens: 8}
arrival: {kind: poisson, rate: 80}
retry: {max_attempts: 2, max_wait: 5s}
objectives: objectives.yaml
`,
		"objectives.yaml": "kind: InferenceObjective\n",
	})
	prio, err := LoadScenario(filepath.Join(dir, ScenarioFileName))
	if err != nil {
		t.Fatal(err)
	}

	res := &SuiteResult{Engine: "test", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Wall: 90 * time.Second,
		CPUs: 2, Platform: "linux/amd64"}
	s1 := ScenarioResult{Scenario: steady, Runs: []ContenderRun{
		{Contender: steady.Contenders[0], Result: fakeRun("steady", RoundRobin, fakeRequests{class: "chat", ttft: ms(100, 200, 1000, 2000)})},
		{Contender: steady.Contenders[1], Result: fakeRun("steady", UpstreamDefault, fakeRequests{class: "chat", ttft: ms(20, 40, 100, 400)})},
		{Contender: Contender{Name: "epp-control", Router: RouterEPP, EndpointPickerConfigSource: "control.yaml", Extra: true},
			Result: fakeRun("steady", "epp-control", fakeRequests{class: "chat", ttft: ms(10, 20, 100, 100)})},
		{Contender: steady.Contenders[2], Result: fakeRun("steady", Sluice, fakeRequests{class: "chat", ttft: ms(10, 20, 100, 200)})},
	}}
	s1.Targets = s1.EvaluateTargets()
	s1.Runs[0].Result.CPU = &ProcessCPU{Fleet: 40 * time.Millisecond, DataPlane: 20 * time.Millisecond}
	s1.Runs[3].Result.CPU = &ProcessCPU{Fleet: 40 * time.Millisecond, EPP: 50 * time.Millisecond, DataPlane: 44 * time.Millisecond}
	s2 := ScenarioResult{Scenario: prio, Runs: []ContenderRun{
		{Contender: prio.Contenders[0], Result: fakeRun("prio", RoundRobin,
			fakeRequests{class: "critical", ttft: ms(900, 5000)}, fakeRequests{class: "sheddable", ttft: ms(800, 6000)})},
		{Contender: prio.Contenders[1], Error: "epp exited (exit status 1)\nbad flag"},
		{Contender: prio.Contenders[2], Result: fakeRun("prio", Sluice,
			fakeRequests{class: "critical", ttft: ms(50, 60)}, fakeRequests{class: "sheddable", ttft: ms(700), shed: 3})},
	}}
	s2.Runs[2].Result.Admission = &AdmissionCounters{
		Dispatched: map[string]float64{"Critical": 2, "Sheddable": 1}, Shed: map[string]float64{"Sheddable": 6},
		ShedByReason: map[string]float64{"queue_full": 6},
	}
	s2.Targets = s2.EvaluateTargets()
	res.Scenarios = []ScenarioResult{s1, s2}
	return res
}

func TestWriteReport(t *testing.T) {
	res := fakeSuite(t)
	plots := map[string][]Plot{"steady": {{Title: "Steady: TTFT CDF per contender", SVG: "steady/ttft-cdf.svg", PNG: "steady/ttft-cdf.png"}}}
	var buf bytes.Buffer
	if err := WriteReport(&buf, res, plots); err != nil {
		t.Fatal(err)
	}
	report := buf.String()

	// The summary has a row per scenario with Sluice's ratios against both
	// baselines: steady's TTFT P99 is 0.1x round-robin's (P99 of 100,
	// 200, 1000, 2000 ms vs 10, 20, 100, 200 ms) and its throughput equal.
	steadyRow := lineWith(t, report, "| [Steady](#scenario-steady) |")
	for _, want := range []string{"0.10x (-90%)", "1.00x (+0%)", "2 of 3"} {
		if !strings.Contains(steadyRow, want) {
			t.Errorf("summary row %q lacks %q", steadyRow, want)
		}
	}
	prioRow := lineWith(t, report, "| [prio](#scenario-prio) |")
	if !strings.Contains(prioRow, "no run") || !strings.Contains(prioRow, "0 of 1") {
		t.Errorf("prio row %q: want failed upstream ratios and its target not met", prioRow)
	}

	// Every target with its mark.
	for _, want := range []string{
		"| steady | TTFT P99 vs round-robin at most 0.2x | 0.10x | " + markMet + " |",
		"| steady | Throughput vs round-robin at least 2x | 1.00x | " + markNotMet + " |",
		"| steady | every figure vs upstream-default no worse by more than 5% |",
		"| prio | every figure vs upstream-default no worse by more than 5% | no figures: the upstream-default run failed | " + markNotMet + " |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks target line %q", want)
		}
	}

	// Per scenario: parameters, the contender table, ratios, plots, raw data.
	for _, want := range []string{
		"<a id=\"scenario-steady\"></a>",
		"The steady one.",
		"Fleet `h100:2,a10g:1` (3 servers) · Poisson 10 req/s · 30s of load, drain at most 15s · seed 11 · mix inline (1 class)",
		"| round-robin | data plane, round-robin, no EPP | 4 | 4 | 0 | 600 ms | 1.85 s | 1.97 s | 0.40 req/s |",
		"| 25.0% | 3 |",
		// Sluice against every contender of the run, extra ones too.
		"| Figure | Sluice | vs round-robin | vs upstream-default | vs epp-control |",
		"| TTFT P99 | 197 ms | 0.10x (-90%) | 0.50x (-50%) | 1.97x (+97%) |",
		"![Steady: TTFT CDF per contender](steady/ttft-cdf.svg) ([PNG](steady/ttft-cdf.png))",
		"[sluice](steady/sluice/run.json)",
		"clients honour Retry-After, up to 2 attempts (wait at most 5s)",
		"objectives objectives.yaml",
		"| upstream-default | EPP, upstream v1.5.0 default profile, upstream admission | run failed: epp exited (exit status 1) bad flag |",
		// Attempts alternate between two endpoints, 10 ms apart: round-robin's TTFTs (100 ms and more) overlap on
		// both, upstream-default's (20, 40, 100, 400 ms) on one.
		"Prompts sent to an endpoint still computing an earlier one (sent before, first token after, as the clients saw " +
			"them): round-robin 50.0%, upstream-default 25.0%, epp-control 0.0%, sluice 0.0%.",
		"CPU time per attempt while the load ran (user + system, this machine): round-robin: data plane 5.00 ms, fleet 10.00 ms; " +
			"sluice: EPP 12.50 ms, data plane 11.00 ms, fleet 10.00 ms.",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}

	// Shedding per band, only where there are bands or shedding.
	for _, want := range []string{
		"| critical | 0 of 2 (0) | – | 0 of 2 (0) |",
		"| sheddable | 0 of 2 (0) | – | 3 of 4 (6) |",
		"sluice's Sluice admission: dispatched Critical 2, Sheddable 1 (in the burst tier: none); shed Sheddable 6; shed by reason queue_full 6.",
		"| critical | 2.95 s / 4.79 s / 4.96 s | – | 55 ms / 60 ms / 60 ms |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	steadySection := report[strings.Index(report, "<a id=\"scenario-steady\">"):strings.Index(report, "<a id=\"scenario-prio\">")]
	if strings.Contains(steadySection, "Shed per band") || strings.Contains(steadySection, "per class") {
		t.Error("a one-class scenario without shedding has no band tables")
	}

	var head bytes.Buffer
	if err := WriteHeadline(&head, res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(report, head.String()) || strings.Contains(head.String(), "<a id=") {
		t.Error("the headline is not the report's first part")
	}
}

func lineWith(t *testing.T, text, prefix string) string {
	t.Helper()
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	t.Fatalf("no line starts with %q in:\n%s", prefix, text)
	return ""
}

func TestSummarizeSession(t *testing.T) {
	res := fakeSuite(t)
	sum := Summarize(res)
	b, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"records"`)) {
		t.Error("results.json carries records; they belong in run.json")
	}
	steady := sum.Scenarios[0]
	if r := steady.Ratios[RoundRobin][FigureTTFTP99]; fmt.Sprintf("%.3f", r) != "0.100" {
		t.Errorf("steady TTFT P99 ratio vs round-robin %v", r)
	}
	prio := sum.Scenarios[1]
	if len(prio.Ratios[UpstreamDefault]) != 0 {
		t.Errorf("ratios against a failed run: %v", prio.Ratios[UpstreamDefault])
	}
	if prio.Contenders[1].Error == "" || prio.Contenders[1].Figures != nil {
		t.Errorf("failed contender %+v", prio.Contenders[1])
	}
	if shed := prio.Contenders[2].Shed; len(shed) != 2 || shed[1] != (ClassShed{Class: "sheddable", Requests: 4, ShedAttempts: 6, ShedFinal: 3}) {
		t.Errorf("sluice shed %+v", shed)
	}
	if !res.Failed() {
		t.Error("a session with a failed run is not Failed")
	}
}

func TestShedByClass(t *testing.T) {
	recs := []loadgen.Record{
		{Seq: 0, Attempt: 1, Final: true, Class: "b", Status: 200},
		{Seq: 1, Attempt: 1, Class: "a", Status: 429},
		{Seq: 1, Attempt: 2, Final: true, Class: "a", Status: 200},
		{Seq: 2, Attempt: 1, Final: true, Class: "a", Status: 503},
		{Seq: 3, Attempt: 1, Final: true, Class: "a", Status: 500, Error: "HTTP 500"},
		{Seq: 4, Attempt: 1, Final: true, Class: "b", Status: 200, Error: "stream ended without [DONE]"},
	}
	got := ShedByClass(recs)
	want := []ClassShed{
		{Class: "a", Requests: 3, ShedAttempts: 2, ShedFinal: 1, Failed: 1},
		{Class: "b", Requests: 2, Failed: 1},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ShedByClass = %+v, want %+v", got, want)
	}
}

func TestPromptOverlap(t *testing.T) {
	rec := func(endpoint string, start, ttft int, status int) loadgen.Record {
		return loadgen.Record{Stream: true, Final: true, Status: status, Endpoint: endpoint,
			Start: time.Duration(start) * time.Millisecond, TTFT: time.Duration(ttft) * time.Millisecond}
	}
	for _, tc := range []struct {
		name    string
		records []loadgen.Record
		want    float64
		ok      bool
	}{
		{name: "none", ok: false},
		{name: "apart", records: []loadgen.Record{rec("a", 0, 30, 200), rec("a", 40, 30, 200), rec("b", 10, 30, 200)}, want: 0, ok: true},
		// b's second prompt arrives while its first computes; a's third overlaps the first's window through the
		// second (the latest first token so far counts, not only the previous attempt's).
		{name: "overlaps", records: []loadgen.Record{
			rec("a", 0, 100, 200), rec("a", 20, 10, 200), rec("a", 50, 10, 200),
			rec("b", 0, 30, 200), rec("b", 29, 30, 200),
		}, want: 3.0 / 5, ok: true},
		// Failed attempts and attempts without an endpoint are not counted, on either side.
		{name: "failures ignored", records: []loadgen.Record{
			rec("a", 0, 100, 200), rec("a", 10, 100, 500), rec("", 20, 10, 200), rec("a", 200, 10, 200),
		}, want: 0, ok: true},
	} {
		got, ok := PromptOverlap(tc.records)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	unstreamed := rec("a", 0, 100, 200)
	unstreamed.Stream = false
	if _, ok := PromptOverlap([]loadgen.Record{unstreamed}); ok {
		t.Error("a non-streamed attempt counted")
	}
}

// TestEPPCPUVersusUpstream checks the report's line that gives issue 21's target 2 (each EPP contender's CPU time per
// attempt against upstream-default's, in one run) and when it is left out.
func TestEPPCPUVersusUpstream(t *testing.T) {
	run := func(name string, eppMillis, attempts int) ContenderRun {
		r := &RunResult{CPU: &ProcessCPU{EPP: time.Duration(eppMillis) * time.Millisecond, DataPlane: time.Millisecond}}
		r.Summary.Overall.Attempts = attempts
		return ContenderRun{Contender: Contender{Name: name}, Result: r}
	}
	failed := ContenderRun{Contender: Contender{Name: UpstreamDefault}, Error: "epp exited"}
	for _, tc := range []struct {
		name string
		runs []ContenderRun
		want string // "" when the report has no such line
	}{
		{"every EPP contender against upstream's, per attempt",
			[]ContenderRun{run(RoundRobin, 0, 100), run(UpstreamDefault, 1600, 100), run("sluice-observed", 880, 100), run(Sluice, 960, 100)},
			"EPP CPU time per attempt against upstream-default's in the same run (issue 21, target 2): sluice-observed 0.550x, sluice 0.600x."},
		{"per attempt, not per run", []ContenderRun{run(UpstreamDefault, 1000, 100), run(Sluice, 1000, 200)},
			"(issue 21, target 2): sluice 0.500x."},
		{"upstream-default failed", []ContenderRun{failed, run(Sluice, 960, 100)}, ""},
		{"no CPU measured (virtual time)", []ContenderRun{{Contender: Contender{Name: UpstreamDefault}, Result: &RunResult{}},
			{Contender: Contender{Name: Sluice}, Result: &RunResult{}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := bufio.NewWriter(&buf)
			writeEPPCost(w, &ScenarioResult{Scenario: &Scenario{Name: "s"}, Runs: tc.runs})
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			got := buf.String()
			if tc.want == "" {
				if strings.Contains(got, "against upstream-default's in the same run") {
					t.Errorf("report has a ratio line:\n%s", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("report lacks %q:\n%s", tc.want, got)
			}
		})
	}
}
