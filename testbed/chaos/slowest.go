package chaos

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/plugins/decisiontrace"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// slowestShown is how many of a fault window's slowest Critical requests a case with a baseline explains.
const slowestShown = 3

// SlowRequest is one of the slowest Critical requests of a fault's window, joined by its request ID with the decision
// the EPP replica that routed it traced: why it went where it went.
type SlowRequest struct {
	Seq int `json:"seq"`
	// Start is when it was sent, from the start of the load; TTFT its time to first token; ServerQueue how long it
	// waited inside the server before it was scheduled (the simulator's account).
	Start       time.Duration `json:"start_ns"`
	TTFT        time.Duration `json:"ttft_ns"`
	ServerQueue time.Duration `json:"server_queue_ns,omitempty"`
	Endpoint    string        `json:"endpoint,omitempty"`
	// Picked is where the EPP sent it; the data plane may have served it elsewhere (Endpoint) when that endpoint
	// refused the connection.
	Picked string `json:"picked,omitempty"`
	// Replica is the EPP replica whose trace holds the decision; -1 when none does (a replica killed in the run
	// leaves no trace).
	Replica int `json:"replica"`
	// Waited is how long admission queued it. Candidates are the primary profile's endpoints after its filters,
	// highest total score first, and Headroom those admission found room on for its band.
	Waited     time.Duration                  `json:"waited_ns,omitempty"`
	Candidates []decisiontrace.EndpointScores `json:"candidates,omitempty"`
	Headroom   []string                       `json:"headroom,omitempty"`
	// Counts are admission's counts of the endpoints in Headroom just after its decision, the request itself counted
	// on Reserved, where admission reserved it until the scheduler's pick moved it.
	Counts   []decisiontrace.EndpointCount `json:"counts,omitempty"`
	Reserved string                        `json:"reserved,omitempty"`
}

// loadDecisions reads the decision traces SaveDecisions saved in dir for replicas, keyed by request ID, each with the
// index of its replica.
func loadDecisions(dir string, replicas []int) (map[string]tracedDecision, error) {
	byID := map[string]tracedDecision{}
	var errs []error
	for _, k := range replicas {
		name := decisionsFile(k)
		raw, err := os.ReadFile(filepath.Join(dir, name))
		var page decisiontrace.Page
		if err == nil {
			err = json.Unmarshal(raw, &page)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		for _, d := range page.Decisions {
			if d.RequestID != "" {
				byID[d.RequestID] = tracedDecision{replica: k, record: d}
			}
		}
	}
	return byID, errors.Join(errs...)
}

// tracedDecision is one decision and the replica that made it.
type tracedDecision struct {
	replica int
	record  *decisiontrace.Record
}

// slowestCritical returns the n Critical requests served on their first attempt and sent in [from, to) with the
// longest TTFT, slowest first (the requests CriticalTTFT counts), each with its decision from decisions.
func slowestCritical(recs []loadgen.Record, from, to time.Duration, decisions map[string]tracedDecision, n int) []SlowRequest {
	var served []loadgen.Record
	for _, r := range recs {
		if servedFirstTry(r, criticalClass, from, to) {
			served = append(served, r)
		}
	}
	slices.SortFunc(served, func(a, b loadgen.Record) int { return cmp.Compare(b.TTFT, a.TTFT) })
	var out []SlowRequest
	for _, r := range served[:min(n, len(served))] {
		s := SlowRequest{Seq: r.Seq, Start: r.Start, TTFT: r.TTFT, ServerQueue: r.ServerQueue, Endpoint: r.Endpoint, Replica: -1}
		if d, ok := decisions[r.RequestID]; ok && r.RequestID != "" {
			s.Replica, s.Picked = d.replica, d.record.Endpoint
			if a := d.record.Admission; a != nil {
				s.Waited = time.Duration(a.WaitSeconds * float64(time.Second))
				s.Headroom, s.Counts, s.Reserved = a.Headroom, a.Counts, a.Reserved
			}
			s.Candidates = primaryProfile(d.record).Endpoints
		}
		out = append(out, s)
	}
	return out
}

// primaryProfile returns the profile of record whose pick is where the request went (the primary profile), else its
// first.
func primaryProfile(record *decisiontrace.Record) decisiontrace.Profile {
	for _, p := range record.Profiles {
		if len(p.Picked) > 0 && p.Picked[0] == record.Endpoint {
			return p
		}
	}
	if len(record.Profiles) > 0 {
		return record.Profiles[0]
	}
	return decisiontrace.Profile{}
}

// writeSlowest renders, for the cases that explain their slowest Critical requests, one line per request: when it
// was sent against the fault, its TTFT, where it went and why.
func writeSlowest(b *strings.Builder, results []Result) {
	header := false
	for _, r := range results {
		if len(r.Slowest) == 0 {
			continue
		}
		if !header {
			header = true
			b.WriteString("\n## The slowest Critical requests of the fault's window\n\nEach with the decision of the EPP " +
				"replica that routed it (its decision trace, joined by x-request-id; the traces are in each run's logs " +
				"folder): the time admission queued it, the endpoints it had room on with its count of each just after " +
				"its decision (its requests there, this one included where marked \"this one\"; the requests its scrapes showed beyond them; " +
				"those peers run there; the seats; the capacity it holds to when it judges seats strictly, one above " +
				"seats not yet confirmed; the slot limit it knows), and each candidate's total " +
				"score, highest first, the one the EPP picked starred. Server queue is the time the request waited inside the " +
				"server before its first step.\n\n")
		}
		fmt.Fprintf(b, "- %s / %s:\n", r.Case, r.Mode)
		for _, s := range r.Slowest {
			endpoint := s.Endpoint
			if endpoint == "" {
				endpoint = "-"
			}
			fmt.Fprintf(b, "  - seq %d, sent %s after the fault, TTFT %s (server queue %s) on %s: %s\n", s.Seq,
				ms(s.Start-r.Marks["fault"]), ms(s.TTFT), ms(s.ServerQueue), endpoint, s.decisionText())
		}
	}
}

// decisionText says what the request's replica decided.
func (s SlowRequest) decisionText() string {
	if s.Replica < 0 {
		return "no decision traced"
	}
	var totals []string
	for _, c := range s.Candidates {
		mark := ""
		if c.Endpoint == s.Picked {
			mark = "*"
		}
		totals = append(totals, fmt.Sprintf("%s %.2f%s", c.Endpoint, c.Total, mark))
	}
	var room []string
	for _, name := range s.Headroom {
		i := slices.IndexFunc(s.Counts, func(c decisiontrace.EndpointCount) bool { return c.Endpoint == name })
		if i < 0 {
			room = append(room, name)
			continue
		}
		c := s.Counts[i]
		text := fmt.Sprintf("%s (in flight %d, scraped beyond %d, peers' %d, seats %d, capacity %d, known %d",
			name, c.InFlight, c.Foreign, c.Peer, c.Seats, c.Capacity, c.Known)
		if c.Adopted {
			text += ", adopted"
		}
		if name == s.Reserved {
			text += ", this one"
		}
		room = append(room, text+")")
	}
	return fmt.Sprintf("replica %d, queued %s, room on [%s], totals [%s]", s.Replica, ms(s.Waited),
		strings.Join(room, ", "), strings.Join(totals, ", "))
}
