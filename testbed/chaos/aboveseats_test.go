package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// TestAboveSeats counts, per band, the window's traced dispatches whose picked endpoint held more than its seats with
// the request itself (counted in the trace only where admission reserved it), the larger of the scraped and the
// peers' requests beyond this EPP's own; dispatches where the trace holds no count are told apart.
func TestAboveSeats(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// decision dispatches to picked, reserved on reserved, with counts of a (first) and the endpoints named.
	decision := func(band, outcome, picked, reserved string, counts ...decisiontrace.EndpointCount) tracedDecision {
		counts = append([]decisiontrace.EndpointCount{{Endpoint: "a", InFlight: 9, Seats: 4}}, counts...)
		return tracedDecision{record: &decisiontrace.Record{Endpoint: picked,
			Admission: &decisiontrace.Admission{Band: band, Outcome: outcome, Reserved: reserved, Counts: counts}}}
	}
	count := func(inFlight, foreign, peer, seats int) decisiontrace.EndpointCount {
		return decisiontrace.EndpointCount{Endpoint: "b", InFlight: inFlight, Foreign: foreign, Peer: peer, Seats: seats}
	}
	decisions := map[string]tracedDecision{
		"above":                decision("Critical", "dispatched", "b", "b", count(5, 0, 0, 4)),
		"at":                   decision("Critical", "dispatched", "b", "b", count(4, 0, 0, 4)),
		"at, reserved on a":    decision("Sheddable", "dispatched", "b", "a", count(4, 0, 0, 4)),
		"below, reserved on a": decision("Sheddable", "dispatched", "b", "a", count(3, 0, 0, 4)),
		"peers":                decision("Standard", "dispatched", "b", "b", count(3, 1, 2, 4)),
		"larger only":          decision("Standard", "dispatched", "b", "b", count(2, 1, 2, 4)),
		"no seats":             decision("Standard", "dispatched", "b", "b", count(9, 0, 0, 0)),
		"no count there":       decision("Standard", "dispatched", "peer:1", ""),
		"rejected":             decision("Sheddable", "rejected", "", "", count(5, 0, 0, 4)),
		"before the window":    decision("Critical", "dispatched", "b", "b", count(5, 0, 0, 4)),
		"at the window's end":  decision("Critical", "dispatched", "b", "b", count(5, 0, 0, 4)),
	}
	var recs []loadgen.Record
	for id := range decisions {
		start := map[string]time.Duration{"before the window": ms(1000), "at the window's end": ms(3000)}[id]
		if start == 0 {
			start = ms(1500)
		}
		recs = append(recs, loadgen.Record{RequestID: id, Start: start})
	}
	recs = append(recs, loadgen.Record{Start: ms(2000)}, loadgen.Record{RequestID: "untraced", Start: ms(2000)})

	got := aboveSeats(recs, ms(1500), ms(3000), decisions)
	want := map[string]int{"Critical": 1, "Standard": 1, "Sheddable": 1}
	if len(got.Bands) != len(want) || got.Traced != 8 || got.Uncounted != 1 {
		t.Fatalf("aboveSeats = %+v, want bands %v, 8 traced, 1 not counted", got, want)
	}
	for band, n := range want {
		if got.Bands[band] != n {
			t.Errorf("%s: %d above seats, want %d", band, got.Bands[band], n)
		}
	}

	var b strings.Builder
	base := AboveSeats{Bands: map[string]int{"Standard": 2}, Traced: 7}
	writeAboveSeats(&b, []Result{
		{Case: "untraced", Mode: Static},
		{Case: "replica-killed-of-3", Mode: Static, AboveSeats: &got, Baseline: &Baseline{AboveSeats: &base}},
	})
	const row = "| replica-killed-of-3 | static | 1 / 0 | 1 / 2 | 1 / 0 | 8 / 7 | 1 / 0 |"
	if out := b.String(); !strings.Contains(out, row) || strings.Contains(out, "untraced") {
		t.Fatalf("report:\n%s\nwant the row %q and no row for the untraced case", out, row)
	}
}
