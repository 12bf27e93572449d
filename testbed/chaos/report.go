package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Files a run of the suite writes: the report and the raw results (WriteOutputs), and each run's records (RunCase).
const (
	ReportFileName  = "report.md"
	ResultsFileName = "results.json"
	// RecordsFileName holds a run's records, in its folder under logs/ (logs/<case>/<mode>/, and baseline/ below it).
	RecordsFileName = "records.json"
	// DecisionsFileName holds, beside the records, the first EPP replica's decision trace as its
	// /debug/sluice/decisions page served it at the run's end (--decision-trace); replica k's is decisions-k.json. A
	// record's request_id is a decision's requestId. A replica killed in the run leaves none.
	DecisionsFileName = "decisions.json"
)

// SortResults orders results as Cases lists the cases, static mode first
// within a case.
func SortResults(results []Result) {
	order := map[string]int{}
	for i, c := range Cases() {
		order[c.Name] = i
	}
	slices.SortStableFunc(results, func(a, b Result) int {
		if d := order[a.Case] - order[b.Case]; d != 0 {
			return d
		}
		return strings.Compare(string(a.Mode), string(b.Mode)) * -1 // "static" before "kubernetes"
	})
}

// WriteReport renders the chaos table as Markdown.
func WriteReport(w io.Writer, results []Result, tl Timeline) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Chaos suite\n\nEach case: a fresh stack (3 simulated servers, the EPP with Sluice admission, the data plane), "+
		"%.0f requests/s for %v (20%% Critical, 50%% Standard, 30%% Sheddable streamed chats, no retries), "+
		"the fault at %v, cleared at %v.\n\n", tl.Rate, tl.Load, tl.FaultAt, tl.ClearAt)
	b.WriteString("| case | mode | requests | 200 | 429+RA | 503+RA | other | lost | hung | traffic left the faulty endpoint " +
		"(target ≤ " + ms(stalenessWindow) + ") | Critical TTFT p99 during (before) | EPP after | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		o := r.Outcomes
		other := fmt.Sprint(o[OutcomeOther])
		if n := o[OutcomeDisconnected]; n > 0 {
			other += fmt.Sprintf(" (+%d disconnected)", n)
		}
		drained := "drained"
		if r.Leak != "" {
			drained = "**leak**"
		}
		verdict := "ok"
		if f := r.Failures(); len(f) > 0 {
			verdict = "**FAIL**: " + strings.Join(f, "; ")
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %s | %d | %d | %s | %s (%s) | %s | %s |\n",
			r.Case, r.Mode, r.Requests, o[OutcomeOK], o[OutcomeShed], o[OutcomeUnavailable], other, o[OutcomeLost], o[OutcomeHung],
			leaveText(r), critical(r.CriticalDuring, r.CriticalDuringN), ms(r.CriticalBefore), drained, verdict)
	}
	writeBaselines(&b, results)
	writeRetries(&b, results)
	writeSlowest(&b, results)
	writeAboveSeats(&b, results)
	b.WriteString("\n## Faults\n\n")
	seen := map[string]bool{}
	for _, r := range results {
		if !seen[r.Case] {
			seen[r.Case] = true
			fmt.Fprintf(&b, "- **%s**: %s.\n", r.Case, r.Fault)
		}
	}
	b.WriteString("\n## Answers of class other\n\n")
	for _, r := range results {
		if len(r.Other) == 0 {
			continue
		}
		parts := make([]string, 0, len(r.Other))
		for _, k := range sortedKeys(r.Other) {
			parts = append(parts, fmt.Sprintf("%d × %s", r.Other[k], k))
		}
		fmt.Fprintf(&b, "- %s / %s: %s\n", r.Case, r.Mode, strings.Join(parts, ", "))
	}
	b.WriteString("\n" + legend)
	_, err := io.WriteString(w, b.String())
	return err
}

const legend = `## Reading the table

- Outcomes are each request's final answer: 200 (complete), 429 or 503 with Retry-After (admission's designed
  answers), other (a server's 500, the data plane's 502 or fail-closed 500, a stream cut), lost (no answer at all),
  hung (no answer within the client's 60 s). Lost and hung must be 0; each case lists the other answers its fault
  makes unavoidable, and any other answer fails it.
- Traffic left: the time from the fault to the last request that reached the faulty endpoint (its first byte back,
  an upper bound of when it was routed there), or "no" with the share of requests it still got when requests were
  still reaching it at the end of the fault's window. For server-slow-10x, a request is timed by when it was sent (a
  lower bound of when it was routed), since the slowed server's first byte comes seconds later. For server-500s and
  server-slow-10x, requests that reached it alone after a gap of at least the outlier filter's base ejection time
  (1 s) are probes (one let through as each ejection ends), counted apart and not in the time; "first request there"
  is when the first request reached it after the fault, before which a detector that learns from the server's
  answers cannot know. The target is one metrics staleness window of Sluice
  admission (an endpoint whose scrapes stop gets nothing after it); a fault the metrics do not show (500s, a slow
  server) is not one admission can see.
- EPP after: once the load is over, no request waits in the EPP and no reservation is left
  (sluice_flowcontrol_queue_length and sluice_flowcontrol_reserved_requests at 0).
`

// writeBaselines renders, for the cases with a baseline run, the Critical TTFT of the fault's window against the same
// window of the baseline.
func writeBaselines(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		bl := r.Baseline
		if bl == nil {
			continue
		}
		if !header {
			header = true
			b.WriteString("\n## Against a baseline run\n\nThe same load, with no fault, run just before the case on the stack named, " +
				"and the Critical TTFT of the fault's window set against the same window there. The TTFT figures count " +
				"requests served on their first attempt only; a Critical request answered 503 with Retry-After (counted " +
				"apart) waits at least that long for a retry (see the retries below when the clients retry). Over a few dozen requests, the p99 is the slowest one or two.\n\n" +
				"| case | mode | baseline | Critical TTFT p50 during / baseline | Critical TTFT p99 during / baseline | " +
				"Critical requests served (during / baseline) | Critical 503+RA (during / baseline) | baseline's answers |\n" +
				"|---|---|---|---|---|---|---|---|\n")
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %d / %d | %d / %d | %s |\n", r.Case, r.Mode, bl.Name,
			againstBaseline(r.CriticalDuringP50, bl.CriticalP50, r.CriticalDuringN, bl.CriticalN, bl.Target),
			againstBaseline(r.CriticalDuring, bl.CriticalP99, r.CriticalDuringN, bl.CriticalN, bl.Target),
			r.CriticalDuringN, bl.CriticalN, r.CriticalUnavailable, bl.CriticalUnavailable, outcomesText(bl.Outcomes))
	}
}

// writeRetries renders, for the cases whose clients retry after Retry-After, what the retries of the requests first
// sent during the fault did, beside the same window of the baseline run.
func writeRetries(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		rt := r.Retries
		if rt == nil {
			continue
		}
		if !header {
			header = true
			fmt.Fprintf(b, "\n## Retries after Retry-After\n\nThe cases whose clients retry a 429 or 503 that carries "+
				"Retry-After (%d attempts, each wait as Retry-After says up to %s): the requests first sent during the "+
				"fault that needed a retry, how they ended, and how long the longest-waiting Critical one took from its "+
				"first attempt to its first token; with a baseline, its count over the same window.\n\n"+
				"| case | mode | requests retried (during / baseline) | their final answers | Critical retried / served | "+
				"Critical first token from the first attempt (longest) |\n|---|---|---|---|---|---|\n",
				retryPolicy.MaxAttempts, retryPolicy.MaxWait)
		}
		baseline := "-"
		if r.Baseline != nil && r.Baseline.Retries != nil {
			baseline = fmt.Sprint(r.Baseline.Retries.Requests)
		}
		firstToken := "-"
		if rt.CriticalServed > 0 {
			firstToken = ms(rt.CriticalFirstToken)
		}
		fmt.Fprintf(b, "| %s | %s | %d / %s | %s | %d / %d | %s |\n", r.Case, r.Mode, rt.Requests, baseline,
			outcomesText(rt.Outcomes), rt.Critical, rt.CriticalServed, firstToken)
	}
}

// againstBaseline renders a figure of the fault's window, the baseline's and their ratio, judged against target (0:
// no target).
func againstBaseline(during, baseline time.Duration, n, baselineN int, target float64) string {
	if n == 0 || baselineN == 0 || baseline <= 0 {
		return fmt.Sprintf("%s / %s", critical(during, n), critical(baseline, baselineN))
	}
	ratio := float64(during) / float64(baseline)
	text := fmt.Sprintf("%s / %s (%.2fx", ms(during), ms(baseline), ratio)
	switch {
	case target == 0:
	case ratio <= target:
		text += fmt.Sprintf(", met: ≤ %.1fx", target)
	default:
		text += fmt.Sprintf(", not met: ≤ %.1fx", target)
	}
	return text + ")"
}

// outcomesText lists a run's final answers by outcome, in the table's order.
func outcomesText(o map[Outcome]int) string {
	var parts []string
	for _, oc := range Outcomes {
		if o[oc] > 0 {
			parts = append(parts, fmt.Sprintf("%d × %s", o[oc], oc))
		}
	}
	return strings.Join(parts, ", ")
}

func leaveText(r Result) string {
	var text string
	switch {
	case r.Leave == nil:
		return "n/a"
	case r.Leave.Left && r.Leave.After <= stalenessWindow:
		text = ms(r.Leave.After) + " (met)"
	case r.Leave.Left:
		text = ms(r.Leave.After) + " (not met)"
	default:
		text = fmt.Sprintf("no (%.0f%% of requests)", 100*r.Leave.Share)
	}
	if r.Leave.Probes > 0 {
		text += fmt.Sprintf("; first request there at %s, %d probes after", ms(r.Leave.First), r.Leave.Probes)
	}
	return text
}

func critical(p99 time.Duration, n int) string {
	if n == 0 {
		return "none"
	}
	return ms(p99)
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// WriteOutputs writes the report and the raw results into dir.
func WriteOutputs(dir string, results []Result, tl Timeline) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, ReportFileName))
	if err != nil {
		return err
	}
	if err := WriteReport(f, results, tl); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ResultsFileName), raw, 0o644)
}
