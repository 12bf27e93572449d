package benchsuite

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Markers for targets in the report.
const (
	markMet    = "✅ met"
	markNotMet = "❌ not met"
)

// headlineFigures are the HyperPod-style summary's columns.
var headlineFigures = []Figure{FigureTTFTP95, FigureTTFTP99, FigureThroughput}

// maxClassRows bounds the per-class tables: a LoRA mix has a class per
// adapter, which is noise in a table.
const maxClassRows = 8

// WriteReport renders a session as Markdown: the headline (WriteHeadline),
// then per scenario its parameters, figures, shedding, fleet counters and
// plots (as plots lists them, paths relative to the report).
func WriteReport(w io.Writer, res *SuiteResult, plots map[string][]Plot) error {
	b := bufio.NewWriter(w)
	writeHeadline(b, res)
	writeScale(b, res.Scale, plots[ScaleName])
	writeSeeds(b, res.Seeds)
	for i := range res.Scenarios {
		writeScenario(b, &res.Scenarios[i], plots[res.Scenarios[i].Scenario.Name])
	}
	return b.Flush()
}

// WriteHeadline renders the report's first part: how to read it, the
// HyperPod-style summary of Sluice's ratios against round-robin and
// upstream-default per scenario, every target met or not, and the scale
// study's and the seed sweep's tables when they ran.
func WriteHeadline(w io.Writer, res *SuiteResult) error {
	b := bufio.NewWriter(w)
	writeHeadline(b, res)
	writeScale(b, res.Scale, nil)
	writeSeeds(b, res.Seeds)
	return b.Flush()
}

func writeHeadline(b *bufio.Writer, res *SuiteResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("# Sluice benchmark report\n\n")
	p("Engine: %s · started %s · wall time %v · %d CPUs · %s\n\n",
		res.Engine, res.Started.UTC().Format(time.RFC3339), res.Wall.Round(time.Second), res.CPUs, res.Platform)
	virtual := res.Engine == VirtualEngineName
	span := "wall time"
	if virtual {
		span = "span of virtual time"
	}
	p("Every figure below is a ratio computed within this session: Sluice's value divided by round-robin's "+
		"(the data plane with no EPP) or by upstream-default's (upstream v1.5.0's default scheduling profile in "+
		"the same EPP binary), each contender on a fresh simulated fleet with the same seeded load. Below 1 is "+
		"better for latencies, above 1 for throughput and goodput. Latencies are client-side time to first token "+
		"of successful requests, from the first attempt (retries included); rates divide by the run's %s, "+
		"drain included.\n\n", span)
	if virtual {
		p("Virtual engine: every run is a deterministic discrete-event simulation (package virtualbench) of the " +
			"same fleet model, load, EPP plugins and admission, against a virtual clock; its times are virtual, " +
			"with no network, proxy or CPU contention, so the same session gives the same latencies and rates every time. " +
			"The Wall column is the simulation's own wall time.\n\n")
	}

	if len(res.Scenarios) == 0 {
		return
	}
	p("## Summary\n\n")
	p("| Scenario |")
	for _, vs := range []string{RoundRobin, UpstreamDefault} {
		for _, f := range headlineFigures {
			p(" %s vs %s |", f.Label(), vs)
		}
	}
	p(" Targets met |\n|---|")
	for range 2 * len(headlineFigures) {
		p("---|")
	}
	p("---|\n")
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		p("| [%s](#%s) |", s.Scenario.Title, anchor(s.Scenario))
		for _, vs := range []string{RoundRobin, UpstreamDefault} {
			for _, f := range headlineFigures {
				p(" %s |", ratioCell(s, vs, f))
			}
		}
		met := 0
		for _, t := range s.Targets {
			if t.Met {
				met++
			}
		}
		p(" %d of %d |\n", met, len(s.Targets))
	}

	p("\n## Targets\n\n")
	p("\"No worse\" against upstream-default means not worse by more than %.0f%% on any figure, the resolution of "+
		"a real-time run on a shared machine.\n\n", 100*NoWorseTolerance)
	p("| Scenario | Target | Measured | Result |\n|---|---|---|---|\n")
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		for _, t := range s.Targets {
			mark := markNotMet
			if t.Met {
				mark = markMet
			}
			p("| %s | %s | %s | %s |\n", s.Scenario.Name, t.Target, measured(s, t), mark)
		}
	}
	writeShapes(b, res)
}

// measured is TargetResult.Measured, or why there is nothing to measure.
func measured(s *ScenarioResult, t TargetResult) string {
	for _, name := range []string{t.Target.subject(), t.Target.Versus} {
		if name == "" {
			continue
		}
		if why := s.missing(name); why != "" {
			return "no figures: " + why
		}
	}
	return t.Measured()
}

// missing says why a contender has no result ("" when it has one).
func (s *ScenarioResult) missing(contender string) string {
	for _, r := range s.Runs {
		if r.Contender.Name == contender {
			switch {
			case r.Skipped != "":
				return "the " + contender + " run was skipped"
			case r.Result == nil:
				return "the " + contender + " run failed"
			}
			return ""
		}
	}
	return "the " + contender + " run did not happen (interrupted)"
}

func anchor(sc *Scenario) string { return "scenario-" + sc.Name }

// ratioCell is Sluice's ratio against a baseline, or why there is none.
func ratioCell(s *ScenarioResult, baseline string, f Figure) string {
	if s.missing(Sluice) != "" || s.missing(baseline) != "" {
		return "no run"
	}
	sluice, _ := s.Figures(Sluice)
	base, _ := s.Figures(baseline)
	r, ok := Ratio(sluice, base, f)
	if !ok {
		return "n/a"
	}
	return FormatRatio(r)
}

func writeScenario(b *bufio.Writer, s *ScenarioResult, plots []Plot) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	sc := s.Scenario
	p("\n<a id=\"%s\"></a>\n## %s (`%s`)\n\n", anchor(sc), sc.Title, sc.Name)
	if d := strings.TrimSpace(sc.Description); d != "" {
		p("%s\n\n", d)
	}
	p("Fleet `%s` (%d servers", sc.Fleet, sc.FleetSize)
	if sc.Shape != "" {
		p(", shape %s", sc.Shape)
	}
	p(") · %s · %v of load, drain at most %v · seed %d · mix %s (%s)",
		describeLoad(sc), sc.Duration, sc.Drain, sc.Seed, sc.MixSource, plural(len(sc.Mix.Classes), "class", "classes"))
	if u := sc.Unloaded; u != nil {
		p(" · unloaded reference: %s alone, Poisson %g req/s", u.Class, u.Rate)
	}
	if sc.Interleave {
		p(" · in real time the contenders run at once, their requests interleaved in one load (each at this rate)")
	}
	if len(sc.Adapters) > 0 {
		p(" · %d LoRA adapters", len(sc.Adapters))
	}
	if sc.Retry.MaxAttempts > 1 {
		p(" · clients honour Retry-After, up to %d attempts (wait at most %v)", sc.Retry.MaxAttempts, sc.Retry.MaxWait)
	}
	if slo := describeSLO(sc.SLO); slo != "" {
		p(" · goodput SLO %s", slo)
	}
	if sc.ObjectivesSource != "" {
		p(" · objectives %s", sc.ObjectivesSource)
	}
	p("\n\n")

	p("| Contender | Setup | Requests | OK | Failed | TTFT P50 | TTFT P95 | TTFT P99 | Throughput | Goodput | Prefix hit rate | Adapter loads | Wall |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range s.Runs {
		r := run.Result
		switch {
		case run.Skipped != "":
			p("| %s | %s | skipped: %s ||||||||||\n", run.Contender.Name, run.Contender.Describe(), oneLine(run.Skipped))
			continue
		case r == nil:
			p("| %s | %s | run failed: %s ||||||||||\n", run.Contender.Name, run.Contender.Describe(), oneLine(run.Error))
			continue
		}
		o := r.Summary.Overall
		hit := "n/a"
		if rate, ok := r.Fleet.PrefixHitRate(); ok {
			hit = fmt.Sprintf("%.1f%%", 100*rate)
		}
		p("| %s | %s | %d | %d | %d | %s | %s | %s | %.2f req/s | %.2f req/s | %s | %.0f | %v |\n",
			run.Contender.Name, run.Contender.Describe(), o.Requests, o.Succeeded, o.Failed,
			latencyCell(o.TTFT, o.TTFT.P50), latencyCell(o.TTFT, o.TTFT.P95), latencyCell(o.TTFT, o.TTFT.P99),
			o.Throughput, o.Goodput, hit, r.Fleet.AdapterLoads, r.Wall.Round(100*time.Millisecond))
	}

	// Sluice against every other contender of the run: the two baselines
	// first, then the scenario's extra contenders (controls and variants).
	versus := []string{RoundRobin, UpstreamDefault}
	for _, run := range s.Runs {
		// Replicated sluice runs are compared with sluice itself (writeReplicas).
		if n := run.Contender.Name; n != Sluice && !run.Contender.Unloaded && run.Contender.Replicas <= 1 && !slices.Contains(versus, n) {
			versus = append(versus, n)
		}
	}
	sluice, _ := s.Figures(Sluice)
	p("\n| Figure | Sluice |")
	for _, vs := range versus {
		p(" vs %s |", vs)
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", len(versus)))
	for _, f := range Figures {
		v := "n/a"
		if x, ok := sluice[f]; ok {
			v = f.Format(x)
		}
		p("| %s | %s |", f.Label(), v)
		for _, vs := range versus {
			p(" %s |", ratioCell(s, vs, f))
		}
		p("\n")
	}

	writeReplicas(b, s)
	writeEPPCost(b, s)
	writePromptOverlap(b, s)
	writeShedding(b, s)
	writeAdmission(b, s)
	writeClassLatency(b, s)
	writeStartBreakdown(b, s)
	writeRetryAfter(b, s)

	p("\n")
	for _, pl := range plots {
		p("![%s](%s) ([PNG](%s))\n\n", pl.Title, filepath.ToSlash(pl.SVG), filepath.ToSlash(pl.PNG))
	}
	p("Raw results:")
	for _, run := range s.Runs {
		if run.Result != nil {
			p(" [%s](%s)", run.Contender.Name, filepath.ToSlash(filepath.Join(sc.Name, run.Contender.Name, RunFileName)))
		}
	}
	p("\n")
}

// writeEPPCost lists the EPP's wall time per decision of virtual runs and,
// in real time, each process's CPU time per attempt while the load ran.
func writeEPPCost(b *bufio.Writer, s *ScenarioResult) {
	var wall, cpu []string
	for _, run := range s.Runs {
		r := run.Result
		if r == nil {
			continue
		}
		if r.EPPPerDecision != nil {
			wall = append(wall, run.Contender.Name+" "+formatMicros(*r.EPPPerDecision))
		}
		if n := r.Summary.Overall.Attempts; r.CPU != nil && n > 0 {
			per := func(d time.Duration) string { return formatMillis(d / time.Duration(n)) }
			parts := []string{}
			if r.CPU.EPP > 0 {
				parts = append(parts, "EPP "+per(r.CPU.EPP))
			}
			parts = append(parts, "data plane "+per(r.CPU.DataPlane), "fleet "+per(r.CPU.Fleet))
			cpu = append(cpu, run.Contender.Name+": "+strings.Join(parts, ", "))
		}
	}
	if len(wall) > 0 {
		fmt.Fprintf(b, "\nEPP wall time per routing decision (this machine): %s.\n", strings.Join(wall, ", "))
	}
	writePeerTraffic(b, s)
	writeEPPHop(b, s)
	if len(cpu) > 0 {
		fmt.Fprintf(b, "\nCPU time per attempt while the load ran (user + system, this machine): %s.\n", strings.Join(cpu, "; "))
	}
	if ratios := eppCPUVersusUpstream(s); len(ratios) > 0 {
		fmt.Fprintf(b, "\nEPP CPU time per attempt against upstream-default's in the same run (issue 21, target 2): %s.\n",
			strings.Join(ratios, ", "))
	}
}

// eppCPUVersusUpstream is each other EPP contender's CPU time per attempt as a ratio of upstream-default's, in the
// runs' order; none when upstream-default has no EPP CPU time (virtual time, or its run failed).
func eppCPUVersusUpstream(s *ScenarioResult) []string {
	perAttempt := func(r *RunResult) float64 {
		if r == nil || r.CPU == nil || r.CPU.EPP <= 0 || r.Summary.Overall.Attempts == 0 {
			return 0
		}
		return float64(r.CPU.EPP) / float64(r.Summary.Overall.Attempts)
	}
	upstream := perAttempt(s.Result(UpstreamDefault))
	if upstream == 0 {
		return nil
	}
	var out []string
	for _, run := range s.Runs {
		if run.Contender.Name == UpstreamDefault {
			continue
		}
		if own := perAttempt(run.Result); own > 0 {
			out = append(out, fmt.Sprintf("%s %.3fx", run.Contender.Name, own/upstream))
		}
	}
	return out
}

// writeEPPHop reports, for the contenders whose data plane timed the EPP (loadgen.Record.EPPTime), what the EPP hop
// added to each successful attempt's time to first token: the median and the mean, and each contender's median
// against upstream-default's. Round-robin has no EPP hop, so this is the time to first token an EPP adds over it,
// taken per request from the data plane's clock rather than as a difference of two contenders' TTFTs.
func writeEPPHop(b *bufio.Writer, s *ScenarioResult) {
	medians := map[string]time.Duration{}
	var parts []string
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		var hops []time.Duration
		for _, r := range run.Result.Records {
			if r.OK() && r.EPPTime > 0 {
				hops = append(hops, r.EPPTime)
			}
		}
		if len(hops) == 0 {
			continue
		}
		l := loadgen.SummarizeLatency(hops)
		medians[run.Contender.Name] = l.P50
		parts = append(parts, fmt.Sprintf("%s median %s, mean %s (%d attempts)", run.Contender.Name,
			formatMillis(l.P50), formatMillis(l.Mean), l.Count))
	}
	if len(parts) == 0 {
		return
	}
	var ratios []string
	if up := medians[UpstreamDefault]; up > 0 {
		for _, run := range s.Runs {
			if m, ok := medians[run.Contender.Name]; ok && run.Contender.Name != UpstreamDefault {
				ratios = append(ratios, fmt.Sprintf("%s %.2fx", run.Contender.Name, float64(m)/float64(up)))
			}
		}
	}
	fmt.Fprintf(b, "\nTime each attempt waited on the EPP before its response headers (the data plane's %s): %s.",
		"x-dataplane-epp-seconds", strings.Join(parts, "; "))
	if len(ratios) > 0 {
		fmt.Fprintf(b, " Median against upstream-default's: %s.", strings.Join(ratios, ", "))
	}
	fmt.Fprintln(b)
}

// writePeerTraffic lists, for the replicated runs that exchange peer
// summaries, what each replica sent: bytes per second of virtual time, and
// bytes per request the pool routed.
func writePeerTraffic(b *bufio.Writer, s *ScenarioResult) {
	var parts []string
	for _, run := range s.Runs {
		r := run.Result
		if r == nil || r.PeerBytes == 0 || r.Virtual <= 0 || run.Contender.Replicas < 2 {
			continue
		}
		perReplica := float64(r.PeerBytes) / float64(run.Contender.Replicas)
		parts = append(parts, fmt.Sprintf("%s %.0f bytes/s per replica (%.0f bytes per request)", run.Contender.Name,
			perReplica/r.Virtual.Seconds(), float64(r.PeerBytes)/float64(max(1, r.Summary.Overall.Attempts))))
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, "\nPeer exchange traffic (summaries sent, virtual time): %s.\n", strings.Join(parts, ", "))
	}
}

// writePromptOverlap lists each contender's PromptOverlap.
func writePromptOverlap(b *bufio.Writer, s *ScenarioResult) {
	var parts []string
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		if share, ok := PromptOverlap(run.Result.Records); ok {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", run.Contender.Name, 100*share))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, "\nPrompts sent to an endpoint still computing an earlier one (sent before, first token after, as the "+
			"clients saw them): %s.\n", strings.Join(parts, ", "))
	}
}

// formatMillis formats a CPU time per attempt in milliseconds.
func formatMillis(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// writeShedding lists requests turned away per class (band) when anything
// was shed or the scenario has priority objectives.
func writeShedding(b *bufio.Writer, s *ScenarioResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	sheds := map[string]map[string]ClassShed{}
	var classes []string
	show := s.Scenario.Objectives != nil
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		m := map[string]ClassShed{}
		for _, c := range ShedByClass(run.Result.Records) {
			m[c.Class] = c
			if !slices.Contains(classes, c.Class) {
				classes = append(classes, c.Class)
			}
			show = show || c.ShedAttempts > 0
		}
		sheds[run.Contender.Name] = m
	}
	if !show || len(classes) > maxClassRows {
		return
	}
	slices.Sort(classes)
	p("\nShed per band (class): requests never served after a 429/503, and in brackets every attempt answered 429/503.\n\n")
	p("| Class |")
	for _, run := range s.Runs {
		p(" %s |", run.Contender.Name)
	}
	p("\n|---|")
	for range s.Runs {
		p("---|")
	}
	p("\n")
	for _, class := range classes {
		p("| %s |", class)
		for _, run := range s.Runs {
			c, ok := sheds[run.Contender.Name][class]
			if !ok {
				p(" – |")
				continue
			}
			p(" %d of %d (%d) |", c.ShedFinal, c.Requests, c.ShedAttempts)
		}
		p("\n")
	}
}

// writeAdmission lists Sluice admission's own counters (real time only).
func writeAdmission(b *bufio.Writer, s *ScenarioResult) {
	for _, run := range s.Runs {
		if run.Result == nil || run.Result.Admission == nil {
			continue
		}
		a := run.Result.Admission
		fmt.Fprintf(b, "\n%s's Sluice admission: dispatched %s (in the burst tier: %s); shed %s; shed by reason %s.\n",
			run.Contender.Name, formatCounts(a.Dispatched), formatCounts(a.BurstDispatched), formatCounts(a.Shed),
			formatCounts(a.ShedByReason))
	}
}

// writeClassLatency tabulates TTFT per class when the mix has a few classes.
func writeClassLatency(b *bufio.Writer, s *ScenarioResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	n := len(s.Scenario.Mix.Classes)
	if n < 2 || n > maxClassRows {
		return
	}
	p("\nTTFT P50 / P95 / P99 per class:\n\n| Class |")
	for _, run := range s.Runs {
		p(" %s |", run.Contender.Name)
	}
	p("\n|---|")
	for range s.Runs {
		p("---|")
	}
	p("\n")
	for _, class := range s.Scenario.Mix.Classes {
		p("| %s |", class.Name)
		for _, run := range s.Runs {
			cs, ok := classSummary(run.Result, class.Name)
			if !ok || cs.TTFT.Count == 0 {
				p(" – |")
				continue
			}
			p(" %s / %s / %s |", formatSeconds(cs.TTFT.P50.Seconds()), formatSeconds(cs.TTFT.P95.Seconds()),
				formatSeconds(cs.TTFT.P99.Seconds()))
		}
		p("\n")
	}
}

func classSummary(r *RunResult, class string) (loadgen.ClassSummary, bool) {
	if r == nil {
		return loadgen.ClassSummary{}, false
	}
	for _, c := range r.Summary.Classes {
		if c.Class == class {
			return c, true
		}
	}
	return loadgen.ClassSummary{}, false
}

func latencyCell(l loadgen.Latency, v time.Duration) string {
	if l.Count == 0 {
		return "n/a"
	}
	return formatSeconds(v.Seconds())
}

func describeArrival(a loadgen.ArrivalConfig) string {
	switch a.Kind {
	case loadgen.ArrivalBursty:
		return fmt.Sprintf("bursts of Poisson %g req/s for %v every %v (mean %.1f req/s)",
			a.Rate, a.BurstOn, a.BurstOn+a.BurstOff, a.MeanRate())
	case loadgen.ArrivalConstant:
		return fmt.Sprintf("constant %g req/s", a.Rate)
	case loadgen.ArrivalPhased:
		parts := make([]string, len(a.Phases))
		for i, ph := range a.Phases {
			parts[i] = fmt.Sprintf("%g req/s for %v", ph.Rate, ph.Duration)
		}
		return "Poisson " + strings.Join(parts, ", then ")
	default:
		return fmt.Sprintf("Poisson %g req/s", a.Rate)
	}
}

// describeLoad is describeArrival with each rate's multiple of the fleet's
// measured capacity, when the scenario gives one.
func describeLoad(sc *Scenario) string {
	d := describeArrival(sc.Arrival)
	if sc.Capacity <= 0 {
		return d
	}
	a := sc.Arrival
	switch a.Kind {
	case loadgen.ArrivalPhased:
		parts := make([]string, len(a.Phases))
		for i, ph := range a.Phases {
			parts[i] = fmt.Sprintf("%.2gx", ph.Rate/sc.Capacity)
		}
		return fmt.Sprintf("%s (%s the %g req/s the fleet serves)", d, strings.Join(parts, ", "), sc.Capacity)
	default:
		return fmt.Sprintf("%s (%.2gx the %g req/s the fleet serves)", d, a.MeanRate()/sc.Capacity, sc.Capacity)
	}
}

func describeSLO(s loadgen.SLO) string {
	var parts []string
	for _, x := range []struct {
		name string
		d    loadgen.Duration
	}{{"TTFT", s.TTFT}, {"ITL", s.ITL}, {"E2E", s.E2E}} {
		if x.d > 0 {
			parts = append(parts, fmt.Sprintf("%s ≤ %v", x.name, time.Duration(x.d)))
		}
	}
	return strings.Join(parts, ", ")
}

func formatCounts(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// writeScale renders the scale study: routing quality (TTFT P99 over
// round-robin's) and EPP cost per fleet size, then every run.
func writeScale(b *bufio.Writer, st *ScaleStudy, plots []Plot) {
	if st == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n<a id=\"%s\"></a>\n## Scale\n\n", ScaleName)
	p("The same load per server, Poisson %g req/s of %s for %v of virtual time, on mixed fleets (%s) of growing "+
		"size, each contender on each fleet in virtual time (seed %d). Routing quality is each contender's TTFT P99 "+
		"over %s's on the same fleet (below 1 is better). EPP cost is the CPU time of the EPP's request path per "+
		"routed request (admission, scheduling and response hooks; metric scrapes excluded; user + system, garbage "+
		"collection included), and its wall time, measured on this machine with one run at a time: wall time also "+
		"counts waiting for a CPU, so on a shared machine it varies with the load, the CPU time much less.\n\n",
		st.RatePerServer, st.Mix, st.Duration, st.Fleet, st.Seed, st.Contenders[0])
	if len(st.Points) == 0 {
		p("No fleet size finished.\n")
		return
	}
	others := st.Contenders[1:]
	p("| Servers | Offered load |")
	for _, c := range others {
		p(" %s TTFT P99 vs %s |", c, st.Contenders[0])
	}
	for _, c := range others {
		p(" %s EPP CPU per decision |", c)
	}
	if len(others) == 2 {
		p(" %s / %s EPP CPU |", others[1], others[0])
	}
	p("\n|---|---|")
	for range 2*len(others) + min(1, len(others)/2) {
		p("---|")
	}
	p("\n")
	for i, pt := range st.Points {
		p("| %d | %.0f req/s |", pt.Servers, pt.Rate)
		for _, c := range others {
			r, ok := st.Result(i, c)
			if !ok || r.TTFTP99VsBaseline == 0 {
				p(" n/a |")
				continue
			}
			p(" %s |", FormatRatio(r.TTFTP99VsBaseline))
		}
		for _, c := range others {
			r, _ := st.Result(i, c)
			p(" %s |", formatMicros(r.EPPCPUPerRequest))
		}
		if len(others) == 2 {
			a, _ := st.Result(i, others[0])
			b, _ := st.Result(i, others[1])
			if a.EPPCPUPerRequest > 0 {
				p(" %s |", FormatRatio(float64(b.EPPCPUPerRequest)/float64(a.EPPCPUPerRequest)))
			} else {
				p(" n/a |")
			}
		}
		p("\n")
	}
	p("\n| Servers | Contender | Requests | OK | TTFT P50 | TTFT P99 | Prefix hit rate | EPP CPU per decision | EPP wall per decision | Virtual | Wall |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, pt := range st.Points {
		for _, r := range pt.Results {
			cpu, wall := "–", "–"
			if r.EPPPerRequest > 0 {
				cpu, wall = formatMicros(r.EPPCPUPerRequest), formatMicros(r.EPPPerRequest)
			}
			p("| %d | %s | %d | %d | %s | %s | %.1f%% | %s | %s | %v | %v |\n", pt.Servers, r.Router, r.Requests, r.Succeeded,
				formatSeconds(r.TTFTP50.Seconds()), formatSeconds(r.TTFTP99.Seconds()), 100*r.PrefixHitRate, cpu, wall,
				r.Virtual.Round(100*time.Millisecond), r.Wall.Round(100*time.Millisecond))
		}
	}
	p("\nScale study wall time %v.\n", st.Wall.Round(time.Second))
	for _, pl := range plots {
		p("\n![%s](%s) ([PNG](%s))\n", pl.Title, filepath.ToSlash(pl.SVG), filepath.ToSlash(pl.PNG))
	}
}

// formatMicros renders a per-decision cost in µs.
func formatMicros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if us >= 100 {
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.1f µs", us)
}

// SessionSummary is results.json: the session's figures, ratios and
// targets without the records every run.json holds.
type SessionSummary struct {
	Engine    string            `json:"engine"`
	Started   time.Time         `json:"started"`
	Wall      time.Duration     `json:"wall_ns"`
	CPUs      int               `json:"cpus"`
	Platform  string            `json:"platform"`
	Scenarios []ScenarioSummary `json:"scenarios"`
	Scale     *ScaleStudy       `json:"scale,omitempty"`
	Seeds     *SeedSweep        `json:"seeds,omitempty"`
}

// ScenarioSummary is one scenario in results.json.
type ScenarioSummary struct {
	Name       string             `json:"name"`
	Title      string             `json:"title"`
	Contenders []ContenderSummary `json:"contenders"`
	// Ratios are Sluice's figures over each baseline's, by baseline name.
	Ratios  map[string]map[Figure]float64 `json:"ratios"`
	Targets []TargetResult                `json:"targets"`
}

// ContenderSummary is one run in results.json.
type ContenderSummary struct {
	Name      string             `json:"name"`
	Describe  string             `json:"describe"`
	Error     string             `json:"error,omitempty"`
	Skipped   string             `json:"skipped,omitempty"`
	Figures   FigureValues       `json:"figures,omitempty"`
	Summary   *loadgen.Summary   `json:"summary,omitempty"`
	Shed      []ClassShed        `json:"shed,omitempty"`
	Fleet     *FleetCounters     `json:"fleet,omitempty"`
	Admission *AdmissionCounters `json:"admission,omitempty"`
	// EPPPerDecision is a virtual run's EPP wall time per routed request.
	EPPPerDecision *time.Duration `json:"epp_per_decision_ns,omitempty"`
}

// Summarize builds results.json's content.
func Summarize(res *SuiteResult) SessionSummary {
	out := SessionSummary{Engine: res.Engine, Started: res.Started, Wall: res.Wall, CPUs: res.CPUs, Platform: res.Platform,
		Scale: res.Scale, Seeds: res.Seeds}
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		ss := ScenarioSummary{Name: s.Scenario.Name, Title: s.Scenario.Title, Targets: s.Targets,
			Ratios: map[string]map[Figure]float64{}}
		for _, run := range s.Runs {
			cs := ContenderSummary{Name: run.Contender.Name, Describe: run.Contender.Describe(), Error: run.Error,
				Skipped: run.Skipped}
			if r := run.Result; r != nil {
				cs.Figures = FiguresOf(r.Summary.Overall)
				cs.Summary = &r.Summary
				cs.Shed = ShedByClass(r.Records)
				cs.Fleet = &r.Fleet
				cs.Admission = r.Admission
				cs.EPPPerDecision = r.EPPPerDecision
			}
			ss.Contenders = append(ss.Contenders, cs)
		}
		sluice, _ := s.Figures(Sluice)
		for _, vs := range []string{RoundRobin, UpstreamDefault} {
			base, _ := s.Figures(vs)
			ratios := map[Figure]float64{}
			for _, f := range Figures {
				if r, ok := Ratio(sluice, base, f); ok {
					ratios[f] = r
				}
			}
			ss.Ratios[vs] = ratios
		}
		out.Scenarios = append(out.Scenarios, ss)
	}
	return out
}
