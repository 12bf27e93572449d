package chaos

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// bandsShown are the priority bands the report counts placements above seats for, in the report's order.
var bandsShown = []string{"Critical", "Standard", "Sheddable"}

// AboveSeats counts, per priority band, the attempts sent in a fault's window that admission dispatched to an endpoint
// already holding its seats: the place above them (capacity one above tentative seats, to probe for more), where a
// request waits inside a slot-limited server for its next end and takes it ahead of anything the EPP sends later.
// Traced is how many of the window's attempts had a dispatch in the traces, so that a count of 0 is told from none
// read.
type AboveSeats struct {
	Bands  map[string]int `json:"bands,omitempty"`
	Traced int            `json:"traced"`
}

// aboveSeats counts the attempts of recs sent in [from, to) whose traced admission dispatched them where the counts
// read just after the decision (this request included) exceed the endpoint's seats.
func aboveSeats(recs []loadgen.Record, from, to time.Duration, decisions map[string]tracedDecision) AboveSeats {
	out := AboveSeats{Bands: map[string]int{}}
	for _, r := range recs {
		d, ok := decisions[r.RequestID]
		if r.RequestID == "" || !ok || r.Start < from || r.Start >= to {
			continue
		}
		a := d.record.Admission
		if a == nil || a.Outcome != "dispatched" {
			continue
		}
		out.Traced++
		for _, c := range a.Counts {
			if c.Endpoint == d.record.Endpoint {
				if c.Seats > 0 && c.InFlight+max(c.Foreign, c.Peer) > c.Seats {
					out.Bands[a.Band]++
				}
				break
			}
		}
	}
	return out
}

// writeAboveSeats renders, for the cases whose runs and baselines were traced, the attempts of each band placed above
// an endpoint's seats during the fault's window, against the baseline's same window.
func writeAboveSeats(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		if r.AboveSeats == nil || r.Baseline == nil || r.Baseline.AboveSeats == nil {
			continue
		}
		if !header {
			header = true
			b.WriteString("\n## Requests placed above an endpoint's seats\n\nFrom the decision traces: the attempts sent in " +
				"the fault's window that admission dispatched to an endpoint already holding its seats (the place above " +
				"them, where a request waits inside a slot-limited server and takes its next slot), per band, during / " +
				"baseline, out of the attempts traced as dispatched.\n\n| case | mode |")
			for _, band := range bandsShown {
				b.WriteString(" " + band + " |")
			}
			b.WriteString(" dispatches traced |\n|---|---|" + strings.Repeat("---|", len(bandsShown)+1) + "\n")
		}
		fmt.Fprintf(b, "| %s | %s |", r.Case, r.Mode)
		for _, band := range bandsShown {
			fmt.Fprintf(b, " %d / %d |", r.AboveSeats.Bands[band], r.Baseline.AboveSeats.Bands[band])
		}
		fmt.Fprintf(b, " %d / %d |\n", r.AboveSeats.Traced, r.Baseline.AboveSeats.Traced)
	}
}
