package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// TestAboveSeats counts, per band, the window's traced dispatches whose endpoint held more than its seats just after
// the decision, counting the larger of the scraped and the peers' requests beyond this EPP's own; nothing else.
func TestAboveSeats(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	decision := func(band, outcome, endpoint string, counts ...decisiontrace.EndpointCount) tracedDecision {
		return tracedDecision{record: &decisiontrace.Record{Endpoint: endpoint,
			Admission: &decisiontrace.Admission{Band: band, Outcome: outcome, Counts: counts}}}
	}
	count := func(endpoint string, inFlight, foreign, peer, seats int) decisiontrace.EndpointCount {
		return decisiontrace.EndpointCount{Endpoint: endpoint, InFlight: inFlight, Foreign: foreign, Peer: peer, Seats: seats}
	}
	decisions := map[string]tracedDecision{
		"above":         decision("Critical", "dispatched", "a", count("a", 5, 0, 0, 4)),
		"at":            decision("Critical", "dispatched", "a", count("a", 4, 0, 0, 4)),
		"peers":         decision("Standard", "dispatched", "a", count("a", 3, 1, 2, 4)),
		"scraped":       decision("Sheddable", "dispatched", "a", count("a", 2, 3, 0, 4)),
		"larger only":   decision("Standard", "dispatched", "a", count("a", 2, 1, 2, 4)),
		"no seats":      decision("Standard", "dispatched", "a", count("a", 9, 0, 0, 0)),
		"other full":    decision("Standard", "dispatched", "a", count("a", 1, 0, 0, 4), count("b", 6, 0, 0, 4)),
		"rejected":      decision("Sheddable", "rejected", "", count("a", 5, 0, 0, 4)),
		"before window": decision("Critical", "dispatched", "a", count("a", 5, 0, 0, 4)),
	}
	var recs []loadgen.Record
	for id := range decisions {
		start := ms(2000)
		if id == "before window" {
			start = ms(1000)
		}
		recs = append(recs, loadgen.Record{RequestID: id, Start: start})
	}
	recs = append(recs, loadgen.Record{Start: ms(2000)}, loadgen.Record{RequestID: "untraced", Start: ms(2000)})

	got := aboveSeats(recs, ms(1500), ms(3000), decisions)
	want := map[string]int{"Critical": 1, "Standard": 1, "Sheddable": 1}
	if len(got.Bands) != len(want) || got.Traced != 7 {
		t.Fatalf("aboveSeats = %+v, want bands %v out of 7 traced", got, want)
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
	const row = "| replica-killed-of-3 | static | 1 / 0 | 1 / 2 | 1 / 0 | 7 / 7 |"
	if out := b.String(); !strings.Contains(out, row) || strings.Contains(out, "untraced") {
		t.Fatalf("report:\n%s\nwant the row %q and no row for the untraced case", out, row)
	}
}
