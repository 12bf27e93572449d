package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// AboveSeats counts, per priority band, the attempts sent in a fault's window that admission dispatched to an endpoint
// already holding its seats: the place above them (capacity one above tentative seats, to probe for more), where a
// request waits inside a slot-limited server for its next end and takes it ahead of anything the EPP sends later.
// Traced is how many of the window's attempts were traced as dispatched; Uncounted how many of those went where the
// trace has no count (a peer's endpoint, an endpoint kept for its prefix without headroom), so that a count of 0 is
// told from none read.
type AboveSeats struct {
	Bands     map[string]int `json:"bands,omitempty"`
	Traced    int            `json:"traced"`
	Uncounted int            `json:"uncounted,omitempty"`
}

// aboveSeats counts the attempts of recs sent in [from, to) whose traced admission dispatched them where the
// occupancy read just after the decision, with the request itself, exceeds the endpoint's seats. The trace counts the
// request on the endpoint admission reserved it on (Admission.Reserved); on any other it is added here.
func aboveSeats(recs []loadgen.Record, from, to time.Duration, decisions map[string]tracedDecision) AboveSeats {
	out := AboveSeats{Bands: map[string]int{}}
	dispatched := flowcontrol.Dispatched.String()
	for _, r := range recs {
		d, ok := decisions[r.RequestID]
		if !ok || r.Start < from || r.Start >= to {
			continue
		}
		a := d.record.Admission
		if a == nil || a.Outcome != dispatched {
			continue
		}
		out.Traced++
		picked := d.record.Endpoint
		i := slices.IndexFunc(a.Counts, func(c decisiontrace.EndpointCount) bool { return c.Endpoint == picked })
		if picked == "" || i < 0 {
			out.Uncounted++
			continue
		}
		c := a.Counts[i]
		occupancy := c.Occupancy()
		if a.Reserved != picked {
			occupancy++
		}
		if c.Seats > 0 && occupancy > c.Seats {
			out.Bands[a.Band]++
		}
	}
	return out
}

// writeAboveSeats renders, for the cases whose runs and baselines were traced, the attempts of each band placed above
// an endpoint's seats during the fault's window, against the baseline's same window.
func writeAboveSeats(b *strings.Builder, results []Result) {
	header := false
	bands := flowcontrol.AllBands()
	for _, r := range results {
		if r.AboveSeats == nil || r.Baseline == nil || r.Baseline.AboveSeats == nil {
			continue
		}
		if !header {
			header = true
			b.WriteString("\n## Requests placed above an endpoint's seats\n\nFrom the decision traces: the attempts sent in " +
				"the fault's window (retries included) that admission dispatched to an endpoint already holding its seats " +
				"(the place above them, where a request waits inside a slot-limited server and takes its next slot), per " +
				"band, during / baseline; then the attempts traced as dispatched, and of those the ones sent where the " +
				"trace holds no count (a peer's endpoint, or one kept for its prefix without headroom).\n\n| case | mode |")
			for _, band := range bands {
				b.WriteString(" " + band.String() + " |")
			}
			b.WriteString(" dispatches traced | not counted |\n|---|---|" + strings.Repeat("---|", len(bands)+2) + "\n")
		}
		fmt.Fprintf(b, "| %s | %s |", r.Case, r.Mode)
		for _, band := range bands {
			fmt.Fprintf(b, " %d / %d |", r.AboveSeats.Bands[band.String()], r.Baseline.AboveSeats.Bands[band.String()])
		}
		fmt.Fprintf(b, " %d / %d | %d / %d |\n", r.AboveSeats.Traced, r.Baseline.AboveSeats.Traced,
			r.AboveSeats.Uncounted, r.Baseline.AboveSeats.Uncounted)
	}
}
