package chaos

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// TestSlowestCritical joins a window's slowest served Critical requests with the decisions of the replicas whose
// traces were saved, in the order of their TTFT.
func TestSlowestCritical(t *testing.T) {
	dir := t.TempDir()
	writePage := func(name string, recs ...*decisiontrace.Record) {
		raw, err := json.Marshal(decisiontrace.Page{Capacity: 10, Recorded: uint64(len(recs)), Decisions: recs})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	routed := func(id, endpoint string, waited float64, totals ...float64) *decisiontrace.Record {
		r := &decisiontrace.Record{RequestID: id, Outcome: decisiontrace.Routed, Endpoint: endpoint,
			Admission: &decisiontrace.Admission{Band: "critical", Outcome: "Dispatched", WaitSeconds: waited, Headroom: []string{endpoint},
				Reserved: endpoint,
				Counts:   []decisiontrace.EndpointCount{{Endpoint: endpoint, InFlight: 3, Peer: 1, Seats: 4, Capacity: 5, Adopted: true}}}}
		// A profile that ran first and picked elsewhere is not the one that routed the request.
		other := decisiontrace.Profile{Name: "prefill", Picked: []string{"c:1"},
			Endpoints: []decisiontrace.EndpointScores{{Endpoint: "c:1", Total: 1}}}
		p := decisiontrace.Profile{Name: "default", Picked: []string{endpoint}}
		for i, total := range totals {
			p.Endpoints = append(p.Endpoints, decisiontrace.EndpointScores{Endpoint: []string{"a:1", "b:1"}[i], Total: total})
		}
		r.Profiles = []decisiontrace.Profile{other, p}
		return r
	}
	writePage(DecisionsFileName, routed("id-slow", "b:1", 0.004, 0.9, 0.4))
	// decisions-1.json is missing: replica 1 was killed.
	writePage("decisions-2.json", routed("id-mid", "a:1", 0, 0.8, 0.7))
	decisions, err := loadDecisions(dir, []int{0, 2})
	if err != nil {
		t.Fatal(err)
	}

	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	rec := func(seq int, class string, start, ttft time.Duration, id string, status int) loadgen.Record {
		return loadgen.Record{Seq: seq, Class: class, Final: true, Status: status, Start: start, TTFT: ttft, E2E: ttft + ms(100),
			RequestID: id, Endpoint: map[string]string{"id-slow": "b:1", "id-mid": "a:1"}[id]}
	}
	recs := []loadgen.Record{
		rec(1, criticalClass, ms(1000), ms(50), "", 200),             // before the window
		rec(2, criticalClass, ms(2100), ms(300), "id-mid", 200),      // second slowest
		rec(3, criticalClass, ms(2200), ms(900), "id-slow", 200),     // slowest
		rec(4, "standard", ms(2300), ms(5000), "", 200),              // another class
		rec(5, criticalClass, ms(2400), 0, "", 503),                  // not served
		rec(6, criticalClass, ms(2500), ms(100), "id-untraced", 200), // third, no decision (its replica was killed)
		rec(7, criticalClass, ms(2600), ms(60), "", 200),             // fourth: not shown
		rec(8, criticalClass, ms(3000), ms(2000), "", 200),           // after the window
		func() loadgen.Record { // served on a retry: counted apart (RetriesIn)
			r := rec(9, criticalClass, ms(2700), ms(1500), "", 200)
			r.Attempt, r.SinceFirstAttempt = 2, ms(1000)
			return r
		}(),
	}
	got := slowestCritical(recs, ms(2000), ms(3000), decisions, 3)
	if len(got) != 3 || got[0].Seq != 3 || got[1].Seq != 2 || got[2].Seq != 6 {
		t.Fatalf("slowest = %+v, want seqs 3, 2, 6", got)
	}
	if got[0].Replica != 0 || got[0].Waited != ms(4) || len(got[0].Candidates) != 2 || got[1].Replica != 2 || got[2].Replica != -1 {
		t.Errorf("decisions joined as %+v, want replica 0 (queued 4 ms, two candidates), replica 2, none", got)
	}

	var b strings.Builder
	writeSlowest(&b, []Result{{Case: "replica-killed-of-3", Mode: Static, Marks: map[string]time.Duration{"fault": ms(2000)}, Slowest: got}})
	for _, want := range []string{
		"seq 3, sent 200 ms after the fault, TTFT 900 ms (server queue 0 ms) on b:1: replica 0, queued 4 ms, " +
			"room on [b:1 (in flight 3, scraped beyond 0, peers' 1, seats 4, capacity 5, known 0, adopted, this one)], totals [a:1 0.90, b:1 0.40*]",
		"seq 6, sent 500 ms after the fault, TTFT 100 ms (server queue 0 ms) on -: no decision traced",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestLoadDecisionsRejectsABadPage: a saved trace that cannot be read, or is missing, is an error, not an empty join.
func TestLoadDecisionsRejectsABadPage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, DecisionsFileName), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadDecisions(dir, []int{0, 1})
	for _, name := range []string{DecisionsFileName, "decisions-1.json"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("loadDecisions = %v, want an error naming %s", err, name)
		}
	}
}
