package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteReport prints a human-readable table of a summary: one line per class
// and the overall line, with latency percentiles in milliseconds.
func WriteReport(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "class\treqs\tok\tfail\tretried\tshed→served\tstatus\tTTFT p50/p95/p99 ms\tITL p50/p95/p99 ms\tE2E p50/p95/p99 ms\treq/s\tout tok/s\tgoodput req/s\tgood %%\t\n")
	lines := append(slices.Clone(s.Classes), s.Overall)
	for _, c := range lines {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\t%s\t%.2f\t%.1f\t%.2f\t%.1f\t\n",
			c.Class, c.Requests, c.Succeeded, c.Failed, c.Retried, c.ShedServed, c.Shed, statusList(c.Status),
			pcts(c.TTFT), pcts(c.ITL), pcts(c.E2E),
			c.Throughput, c.OutputTokensPerSecond, c.Goodput, 100*c.GoodFraction)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "duration %s\n", s.Duration.Round(time.Millisecond))
	return err
}

// Contender is one gateway's summary of the same load, for WriteComparison.
type Contender struct {
	Name    string
	Summary Summary
}

// WriteComparison prints, per class and overall, what each contender did with
// the same load, side by side: requests served, shed (and how many of those
// were told when to retry), other failures, and TTFT p50 and p99 of the
// served ones. Classes appear in the first contender's order.
func WriteComparison(w io.Writer, contenders []Contender) error {
	if len(contenders) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, c := range contenders {
		fmt.Fprintf(tw, "%s\t\t\t\t\t", c.Name)
	}
	fmt.Fprint(tw, "\nclass\t")
	for range contenders {
		fmt.Fprint(tw, "served\tshed (Retry-After)\tfailed\tTTFT p50\tTTFT p99\t")
	}
	fmt.Fprintln(tw)
	var classes []string
	for _, c := range contenders[0].Summary.Classes {
		classes = append(classes, c.Class)
	}
	for _, class := range append(classes, AllClasses) {
		fmt.Fprintf(tw, "%s\t", class)
		for _, c := range contenders {
			cs, ok := c.Summary.class(class)
			if !ok {
				fmt.Fprint(tw, "-\t-\t-\t-\t-\t")
				continue
			}
			shedFinal := cs.Shed - cs.ShedServed
			fmt.Fprintf(tw, "%d/%d\t%d (%d)\t%d\t%s\t%s\t", cs.Succeeded, cs.Requests, shedFinal, cs.ShedRetryAfter,
				cs.Failed-shedFinal, shortDuration(cs.TTFT.P50, cs.TTFT.Count), shortDuration(cs.TTFT.P99, cs.TTFT.Count))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// class returns the summary of class (AllClasses for the overall line).
func (s Summary) class(name string) (ClassSummary, bool) {
	if name == AllClasses {
		return s.Overall, true
	}
	for _, c := range s.Classes {
		if c.Class == name {
			return c, true
		}
	}
	return ClassSummary{}, false
}

// shortDuration prints d in milliseconds below a second and in seconds above, "-" without samples.
func shortDuration(d time.Duration, samples int) string {
	switch {
	case samples == 0:
		return "-"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
}

func pcts(l Latency) string {
	if l.Count == 0 {
		return "-"
	}
	return ms(l.P50) + "/" + ms(l.P95) + "/" + ms(l.P99)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
}

func statusList(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+":"+strconv.Itoa(m[k]))
	}
	return strings.Join(parts, ",")
}

// WriteJSON writes a result (config, summary and every attempt record) as
// indented JSON for later plotting. Durations are integer nanoseconds in
// fields ending in _ns.
func WriteJSON(w io.Writer, res *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
