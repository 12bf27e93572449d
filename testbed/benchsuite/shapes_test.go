package benchsuite

import (
	"bufio"
	"bytes"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// shapedScenario is a scenario file with an unloaded reference, issue 17's kinds of targets and two shapes.
const shapedScenario = `
fleet: h100:2
mix:
  classes:
    - {name: critical, model: m, weight: 20, prompt_tokens: 64, output_tokens: 16}
    - {name: standard, model: m, weight: 80, prompt_tokens: 64, output_tokens: 16}
arrival: {kind: poisson, rate: 40}
capacity: 20
unloaded: {class: critical, rate: 2}
extra_contenders: [{name: sized, router: epp, sluice_admission: true}]
targets:
  - {figure: ttft_p99, class: critical, vs: unloaded, at_most: 2}
  - {figure: shed, class: critical, at_most: 0}
  - {figure: throughput, vs: upstream-default, at_least: 0.95}
shape: big
shapes:
  - {name: small, fleet: "slot4:6", arrival: {kind: poisson, rate: 10}, capacity: 5, unloaded_rate: 0.5,
     extra_contenders: [{name: slots, router: epp, sluice_admission: true}]}
  - name: recovery
    fleet: kvbound:2
    arrival: {kind: phased, phases: [{rate: 10, duration: 10s}, {rate: 2, duration: 20s}]}
    unloaded_rate: 0.2
`

func TestShapesExpandIntoScenarios(t *testing.T) {
	dir := writeScenarioDir(t, "prio", map[string]string{ScenarioFileName: shapedScenario})
	all, err := LoadScenarios(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sc := range all {
		names = append(names, sc.Name)
	}
	if strings.Join(names, " ") != "prio prio-small prio-recovery" {
		t.Fatalf("scenarios %v, want the file's, then its shapes in file order", names)
	}
	base, small, recovery := all[0], all[1], all[2]
	for _, sc := range all {
		if sc.Family != "prio" || len(sc.Targets) != 4 || sc.Unloaded == nil || sc.Unloaded.Class != "critical" {
			t.Errorf("%s: family %q, %d targets, unloaded %+v: want the file's", sc.Name, sc.Family, len(sc.Targets), sc.Unloaded)
		}
	}
	if base.Shape != "big" || small.Shape != "small" || small.Fleet != "slot4:6" || small.FleetSize != 6 ||
		small.Arrival.Rate != 10 || small.Capacity != 5 || small.Unloaded.Rate != 0.5 || small.Title != "prio · small" {
		t.Errorf("small shape: %+v", small)
	}
	if recovery.Arrival.Kind != loadgen.ArrivalPhased || len(recovery.Arrival.Phases) != 2 || recovery.Capacity != 0 {
		t.Errorf("recovery shape arrival %+v capacity %v", recovery.Arrival, recovery.Capacity)
	}
	contenders := func(sc *Scenario) string {
		var out []string
		for _, c := range sc.Contenders {
			out = append(out, c.Name)
		}
		return strings.Join(out, " ")
	}
	// Extra contenders stay with their fleet; the unloaded reference runs last, as Sluice with one class.
	if got := contenders(base); got != "round-robin upstream-default sized sluice unloaded" {
		t.Errorf("base contenders %q", got)
	}
	if got := contenders(small); got != "round-robin upstream-default slots sluice unloaded" {
		t.Errorf("small contenders %q", got)
	}
	ref, _ := small.Contender(Unloaded)
	mix, arrival := small.Load(ref)
	if !ref.Unloaded || !ref.SluiceAdmission || len(mix.Classes) != 1 || mix.Classes[0].Name != "critical" ||
		!reflect.DeepEqual(arrival, loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 0.5}) {
		t.Errorf("unloaded reference %+v runs %v at %+v", ref, mix.Classes, arrival)
	}
	sluice, _ := small.Contender(Sluice)
	if mix, arrival := small.Load(sluice); mix != small.Mix || arrival.Rate != 10 {
		t.Errorf("sluice runs %v at %+v, want the scenario's load", mix, arrival)
	}
}

func TestTargetsOnClassesAndValues(t *testing.T) {
	for _, tc := range []struct {
		target          Target
		sluice, base    FigureValues
		wantMet         bool
		wantString      string
		wantMeasurement string
	}{
		{Target{Figure: FigureTTFTP99, Class: "critical", Versus: Unloaded, Kind: AtMost, Bound: 2},
			FigureValues{FigureTTFTP99: 0.09}, FigureValues{FigureTTFTP99: 0.04}, false,
			"critical TTFT P99 vs its unloaded value at most 2x", "2.25x"},
		{Target{Figure: FigureShed, Class: "critical", Kind: AtMost, Bound: 0},
			FigureValues{FigureShed: 0}, nil, true, "critical attempts answered 429/503 at most 0", "0"},
		{Target{Figure: FigureShedWithoutRetryAfter, Kind: AtMost, Bound: 0},
			FigureValues{FigureShedWithoutRetryAfter: 3}, nil, false, "429/503 answers without Retry-After at most 0", "3"},
		{Target{Figure: FigureFirstRetryServedBelowCapacity, Kind: AtLeast, Bound: 0.9},
			FigureValues{FigureFirstRetryServedBelowCapacity: 0.95}, nil, true,
			"share of first retries served once load is below capacity at least 90.0%", "95.0%"},
		{Target{Figure: FigureFirstRetryServed, Kind: AtLeast, Bound: 0.9}, FigureValues{}, nil, false,
			"share of first retries served at least 90.0%", "not measurable (no successful requests or a zero baseline)"},
	} {
		res := tc.target.Evaluate(tc.sluice, tc.base)
		if res.Met != tc.wantMet || tc.target.String() != tc.wantString || res.Measured() != tc.wantMeasurement {
			t.Errorf("%q: met %v, measured %q; want %v, %q (string %q)", tc.target, res.Met, res.Measured(), tc.wantMet,
				tc.wantMeasurement, tc.wantString)
		}
	}
}

// attempt is a record of one attempt for the Retry-After tests: class, attempt number, start and duration in ms,
// status, Retry-After in ms (-1: none).
func attempt(seq int, class string, n int, start, dur, status, retryAfter int) loadgen.Record {
	r := loadgen.Record{Seq: seq, Class: class, Attempt: n, Start: time.Duration(start) * time.Millisecond,
		E2E: time.Duration(dur) * time.Millisecond, Status: status}
	if status != http.StatusOK {
		r.Error = "HTTP error"
	}
	if retryAfter >= 0 {
		r.RetryAfter, r.RetryAfterSet = time.Duration(retryAfter)*time.Millisecond, true
	}
	return r
}

func TestRetryAfterAgainstReturnedCapacity(t *testing.T) {
	// Overload until 10 s (rate 20 against a capacity of 10), then 5 req/s.
	arrival := loadgen.ArrivalConfig{Kind: loadgen.ArrivalPhased, Phases: []loadgen.Phase{{Rate: 20, Duration: 10 * time.Second},
		{Rate: 5, Duration: 10 * time.Second}}}
	recs := []loadgen.Record{
		attempt(1, "shed", 1, 1000, 10, 429, 4000),  // answered at 1.01 s; capacity returns at 3 s (seq 3): told 4 s, needed 1.99 s
		attempt(2, "shed", 1, 2000, 10, 503, 500),   // answered at 2.01 s; returns at 3 s: told 0.5 s, needed 0.99 s (too early)
		attempt(3, "shed", 1, 3000, 100, 200, -1),   // admitted
		attempt(2, "shed", 2, 2510, 10, 429, -1),    // the too early retry: shed again, no Retry-After; returns 0.48 s later
		attempt(1, "shed", 2, 5010, 100, 200, -1),   // first retry, sent during the overload: served
		attempt(4, "shed", 1, 11000, 10, 429, 1000), // shed after the overload; nothing of its class is admitted later
		attempt(4, "shed", 2, 12010, 0, 0, -1),      // its first retry, below capacity: unanswered (not a return of capacity)
		attempt(5, "other", 1, 500, 10, 200, -1),
	}
	recs[6].Final, recs[7].Final = true, true
	st := ComputeRetryAfterStats(recs, "", arrival, 10)
	want := RetryAfterStats{Shed: 4, WithoutRetryAfter: 1, Never: 1,
		RetryAfter:   []time.Duration{500 * time.Millisecond, time.Second, 4 * time.Second},
		Returned:     []time.Duration{480 * time.Millisecond, 990 * time.Millisecond, 1990 * time.Millisecond},
		Slack:        []time.Duration{-490 * time.Millisecond, 2010 * time.Millisecond},
		FirstRetries: 3, FirstRetriesServed: 1, FirstRetriesBelowCapacity: 1}
	if !equalStats(st, want) {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
	if st.Early() != 1 {
		t.Errorf("early %d, want 1", st.Early())
	}
	figs := RecordFigures(recs, "shed", arrival, 10)
	for f, v := range map[Figure]float64{FigureShed: 4, FigureShedWithoutRetryAfter: 1, FigureUnanswered: 1,
		FigureFirstRetryServed: 1.0 / 3, FigureFirstRetryServedBelowCapacity: 0} {
		if figs[f] != v {
			t.Errorf("%s = %v, want %v", f, figs[f], v)
		}
	}
	if figs := RecordFigures(recs, "other", arrival, 10); figs[FigureShed] != 0 || figs[FigureUnanswered] != 0 {
		t.Errorf("class other: %v", figs)
	}
	if _, ok := RecordFigures(recs, "", arrival, 0)[FigureFirstRetryServedBelowCapacity]; ok {
		t.Error("a share below capacity without a capacity")
	}
}

func equalStats(a, b RetryAfterStats) bool {
	eq := func(x, y []time.Duration) bool { return strings.Join(durs(x), ",") == strings.Join(durs(y), ",") }
	return a.Shed == b.Shed && a.WithoutRetryAfter == b.WithoutRetryAfter && a.Never == b.Never &&
		eq(a.RetryAfter, b.RetryAfter) && eq(a.Returned, b.Returned) && eq(a.Slack, b.Slack) &&
		a.FirstRetries == b.FirstRetries && a.FirstRetriesServed == b.FirstRetriesServed &&
		a.FirstRetriesBelowCapacity == b.FirstRetriesBelowCapacity && a.FirstRetriesBelowCapacityServed == b.FirstRetriesBelowCapacityServed
}

func durs(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

func TestStartBreakdown(t *testing.T) {
	rec := func(class string, ttft, serverQueue, serverTTFT int) loadgen.Record {
		return loadgen.Record{Class: class, Status: http.StatusOK, TTFT: time.Duration(ttft) * time.Millisecond,
			ServerQueue: time.Duration(serverQueue) * time.Millisecond, ServerTTFT: time.Duration(serverTTFT) * time.Millisecond}
	}
	var recs []loadgen.Record
	for range 19 {
		recs = append(recs, rec("critical", 100, 0, 40)) // 60 ms on the way, 40 ms of first steps
	}
	recs = append(recs, rec("critical", 2100, 1000, 1050)) // the slowest 5%: 1 s in the server's queue
	recs = append(recs, rec("other", 10, 0, 10), loadgen.Record{Class: "critical", Status: http.StatusOK, TTFT: time.Second})
	bd, ok := ComputeStartBreakdown(recs, "critical")
	if !ok || bd.Attempts != 20 || bd.SlowestCount != 1 || bd.SlowestTTFTMin != 2100*time.Millisecond {
		t.Fatalf("breakdown %+v, %v", bd, ok)
	}
	if want := (StartParts{Way: 1050 * time.Millisecond, ServerQueue: time.Second, FirstSteps: 50 * time.Millisecond}); bd.Slowest != want {
		t.Errorf("slowest %+v, want %+v", bd.Slowest, want)
	}
	// Means over 20: way (19 x 60 + 1050) / 20, queue 1000 / 20, first steps (19 x 40 + 50) / 20.
	if want := (StartParts{Way: 109500 * time.Microsecond, ServerQueue: 50 * time.Millisecond, FirstSteps: 40500 * time.Microsecond}); bd.All != want {
		t.Errorf("all %+v, want %+v", bd.All, want)
	}
	if _, ok := ComputeStartBreakdown(recs[len(recs)-1:], ""); ok {
		t.Error("a breakdown without the server's times")
	}
}

func TestServerShapesTable(t *testing.T) {
	dir := writeScenarioDir(t, "prio", map[string]string{ScenarioFileName: shapedScenario})
	all, err := LoadScenarios(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	res := &SuiteResult{}
	for i, sc := range all[:2] {
		var runs []ContenderRun
		for _, c := range sc.Contenders {
			crit := ms(40, 40)
			switch c.Name {
			case Sluice:
				crit = ms(60+i*1000, 60+i*1000) // 1.5x its unloaded value on the first shape, 26.5x on the second
			case UpstreamDefault:
				crit = ms(4000, 4000)
			}
			classes := []fakeRequests{{class: "critical", ttft: crit}, {class: "standard", ttft: ms(100)}}
			if c.Unloaded {
				classes = classes[:1]
			}
			runs = append(runs, ContenderRun{Contender: c, Result: fakeRun(sc.Name, c.Name, classes...)})
		}
		s := ScenarioResult{Scenario: sc, Runs: runs}
		s.Targets = s.EvaluateTargets()
		res.Scenarios = append(res.Scenarios, s)
	}
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	writeShapes(w, res)
	_ = w.Flush()
	report := buf.String()
	for _, want := range []string{
		"### prio",
		"| critical unloaded | round-robin: critical TTFT P99 (x its unloaded value) |",
		"| [big](#scenario-prio) | `h100:2` | Poisson 40 req/s (2x the 20 req/s the fleet serves) | 40 ms | 40 ms (1.00x) | 4.00 s (100.0x) | 60 ms (1.50x) | 1.00x (+0%) | 4 of 4 |",
		"| [small](#scenario-prio-small) | `slot4:6` | Poisson 10 req/s (2x the 5 req/s the fleet serves) | 40 ms | 40 ms (1.00x) | 4.00 s (100.0x) | 1.06 s (26.5x) | 1.00x (+0%) | 3 of 4 |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("shapes table lacks %q:\n%s", want, report)
		}
	}
	// The first shape meets "at most 2x its unloaded value", the second does not.
	if !res.Scenarios[0].Targets[0].Met || res.Scenarios[1].Targets[0].Met {
		t.Errorf("targets %+v / %+v", res.Scenarios[0].Targets[0], res.Scenarios[1].Targets[0])
	}
}

// TestRetryAfterByPhase splits the 429/503 answers of a phased run by the phase they were given in: where Retry-After
// sent their clients, when capacity for their class returned, and how their first retries fared.
func TestRetryAfterByPhase(t *testing.T) {
	// Overload until 10 s, then 5 req/s.
	arrival := loadgen.ArrivalConfig{Kind: loadgen.ArrivalPhased, Phases: []loadgen.Phase{{Rate: 20, Duration: 10 * time.Second},
		{Rate: 5, Duration: 10 * time.Second}}}
	recs := []loadgen.Record{
		attempt(1, "shed", 1, 2000, 10, 429, 8000),   // answered 2.01 s, told 10.01 s
		attempt(1, "shed", 2, 10010, 100, 429, 5000), // its first retry, during the second phase: shed again, told 15.11 s
		attempt(2, "shed", 1, 9000, 1000, 429, 3000), // answered 10 s (second phase), told 13 s
		attempt(2, "shed", 2, 13000, 100, 200, -1),   // served: capacity returned at 13 s
		attempt(3, "shed", 1, 4000, 10, 503, -1),     // answered 4.01 s without Retry-After; never retried
		attempt(1, "shed", 3, 15110, 100, 200, -1),   // served at 15.11 s
		attempt(4, "other", 1, 3000, 10, 429, 1000),  // answered 3.01 s; nothing of its class served later
	}
	got := RetryAfterByPhase(recs, arrival)
	want := []PhaseRetryAfter{
		{Phase: arrival.Phases[0], From: 0, Shed: 3,
			ToldAt:       []time.Duration{4010 * time.Millisecond, 10010 * time.Millisecond},
			ReturnedAt:   []time.Duration{13 * time.Second, 13 * time.Second},
			FirstRetries: 1},
		{Phase: arrival.Phases[1], From: 10 * time.Second, Shed: 2,
			ToldAt:       []time.Duration{13 * time.Second, 15110 * time.Millisecond},
			ReturnedAt:   []time.Duration{13 * time.Second, 13 * time.Second},
			FirstRetries: 1, FirstRetriesServed: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("%d phases, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Phase != w.Phase || g.From != w.From || g.Shed != w.Shed || g.FirstRetries != w.FirstRetries ||
			g.FirstRetriesServed != w.FirstRetriesServed || !slices.Equal(g.ToldAt, w.ToldAt) || !slices.Equal(g.ReturnedAt, w.ReturnedAt) {
			t.Errorf("phase %d: %+v\nwant %+v", i, g, w)
		}
	}
	if RetryAfterByPhase(recs, loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 5}) != nil {
		t.Error("phases for an arrival without phases")
	}
}
