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
