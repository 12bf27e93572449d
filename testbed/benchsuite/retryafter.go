package benchsuite

import (
	"bufio"
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// RetryAfterStats is how a run's 429/503 answers and the Retry-After they carried compare with what happened next:
// when capacity for the shed request's class actually returned, and whether the clients' first retries were served.
//
// Capacity returned, for an attempt answered 429/503 at time t, at the start of the first attempt of the same class
// sent at or after t that was served: what a client could have done instead of the wait it was told. Its resolution
// is the class's arrival gap (and, for a band that queues, that attempt's wait in the gateway's queue); a class not
// served again until the end has no return.
type RetryAfterStats struct {
	// Shed counts attempts answered 429 or 503; WithoutRetryAfter those without a Retry-After.
	Shed              int `json:"shed"`
	WithoutRetryAfter int `json:"without_retry_after"`
	// RetryAfter are the Retry-After values given, sorted.
	RetryAfter []time.Duration `json:"retry_after_ns,omitempty"`
	// Returned are, sorted, the times from each 429/503 answer to when capacity for its class returned; Never counts
	// the answers after which it did not return within the run.
	Returned []time.Duration `json:"returned_ns,omitempty"`
	Never    int             `json:"never"`
	// Slack are, sorted, Retry-After minus the time capacity took to return, for answers that carried one and
	// after which it returned: negative, the client was told to come back too early; positive, it waited that much
	// longer than it had to.
	Slack []time.Duration `json:"slack_ns,omitempty"`
	// FirstRetries counts requests retried after a 429/503 (they have a second attempt) and FirstRetriesServed
	// those whose second attempt succeeded; the BelowCapacity pair counts only second attempts sent while the
	// arrival rate was below the scenario's capacity (none without a capacity).
	FirstRetries, FirstRetriesServed                           int
	FirstRetriesBelowCapacity, FirstRetriesBelowCapacityServed int
}

// ComputeRetryAfterStats computes the statistics over records of class ("" for every class); arrival and capacity
// (requests per second, 0 when unknown) tell when the offered load was below capacity.
func ComputeRetryAfterStats(records []loadgen.Record, class string, arrival loadgen.ArrivalConfig, capacity float64) RetryAfterStats {
	var st RetryAfterStats
	byClass := map[string][]loadgen.Record{}
	for _, r := range records {
		if class != "" && r.Class != class {
			continue
		}
		byClass[r.Class] = append(byClass[r.Class], r)
		if r.Attempt == 2 {
			st.FirstRetries++
			below := capacity > 0 && arrival.RateAt(r.Start) < capacity
			if below {
				st.FirstRetriesBelowCapacity++
			}
			if r.OK() {
				st.FirstRetriesServed++
				if below {
					st.FirstRetriesBelowCapacityServed++
				}
			}
		}
	}
	for _, recs := range byClass {
		slices.SortStableFunc(recs, func(a, b loadgen.Record) int { return cmp.Compare(a.Start, b.Start) })
		served := servedStarts(recs)
		for _, r := range recs {
			if !isShed(r) {
				continue
			}
			st.Shed++
			if r.RetryAfterSet {
				st.RetryAfter = append(st.RetryAfter, r.RetryAfter)
			} else {
				st.WithoutRetryAfter++
			}
			answered := r.Start + r.E2E
			at, ok := capacityReturnedAt(served, answered)
			if !ok {
				st.Never++
				continue
			}
			returned := at - answered
			st.Returned = append(st.Returned, returned)
			if r.RetryAfterSet {
				st.Slack = append(st.Slack, r.RetryAfter-returned)
			}
		}
	}
	for _, d := range [][]time.Duration{st.RetryAfter, st.Returned, st.Slack} {
		slices.Sort(d)
	}
	return st
}

// servedStarts are the start times of the successful attempts among records, ascending.
func servedStarts(records []loadgen.Record) []time.Duration {
	var served []time.Duration
	for _, r := range records {
		if r.OK() {
			served = append(served, r.Start)
		}
	}
	slices.Sort(served)
	return served
}

// capacityReturnedAt is the first of served (ascending start times of a class's successful attempts) at or after
// answered; false if none.
func capacityReturnedAt(served []time.Duration, answered time.Duration) (time.Duration, bool) {
	i, _ := slices.BinarySearch(served, answered)
	if i == len(served) {
		return 0, false
	}
	return served[i], true
}

// PhaseRetryAfter compares, for the 429/503 answers given during one phase of a phased arrival, when their clients
// were told to come back with when capacity for their class actually returned, and counts how their first retries
// fared: whether a retry failed because the client was told too early, or the capacity it was told about was gone
// again by the time it came back.
type PhaseRetryAfter struct {
	Phase loadgen.Phase
	// From is when the phase starts, from the run start.
	From time.Duration
	// Shed counts the attempts answered 429/503 during the phase.
	Shed int
	// ToldAt are, sorted, the moments (from the run start) their Retry-After sent the clients back to; ReturnedAt
	// when capacity for their class returned (the start of the first later attempt of the class that was served).
	ToldAt, ReturnedAt []time.Duration
	// FirstRetries counts the requests whose first attempt was answered 429/503 during the phase and were retried;
	// FirstRetriesServed those whose retry succeeded.
	FirstRetries, FirstRetriesServed int
}

// RetryAfterByPhase is PhaseRetryAfter for each phase of a phased arrival (nil for other arrivals), over every class.
func RetryAfterByPhase(records []loadgen.Record, arrival loadgen.ArrivalConfig) []PhaseRetryAfter {
	if arrival.Kind != loadgen.ArrivalPhased {
		return nil
	}
	out := make([]PhaseRetryAfter, len(arrival.Phases))
	var from time.Duration
	for i, p := range arrival.Phases {
		out[i].Phase, out[i].From = p, from
		from += p.Duration
	}
	phaseOf := func(t time.Duration) *PhaseRetryAfter {
		i, _ := slices.BinarySearchFunc(out, t, func(p PhaseRetryAfter, t time.Duration) int { return cmp.Compare(p.From, t) })
		if i == len(out) || out[i].From > t {
			i-- // t falls inside the phase before (the last one goes on)
		}
		return &out[max(i, 0)]
	}
	byClass := map[string][]loadgen.Record{}
	firstShedIn := map[int]*PhaseRetryAfter{} // Seq → phase its first attempt was answered 429/503 in
	for _, r := range records {
		byClass[r.Class] = append(byClass[r.Class], r)
		if r.Attempt == 1 && isShed(r) {
			firstShedIn[r.Seq] = phaseOf(r.Start + r.E2E)
		}
	}
	for _, recs := range byClass {
		served := servedStarts(recs)
		for _, r := range recs {
			if !isShed(r) {
				continue
			}
			answered := r.Start + r.E2E
			p := phaseOf(answered)
			p.Shed++
			if r.RetryAfterSet {
				p.ToldAt = append(p.ToldAt, answered+r.RetryAfter)
			}
			if at, ok := capacityReturnedAt(served, answered); ok {
				p.ReturnedAt = append(p.ReturnedAt, at)
			}
		}
	}
	for _, r := range records {
		if p := firstShedIn[r.Seq]; p != nil && r.Attempt == 2 {
			p.FirstRetries++
			if r.OK() {
				p.FirstRetriesServed++
			}
		}
	}
	for i := range out {
		slices.Sort(out[i].ToldAt)
		slices.Sort(out[i].ReturnedAt)
	}
	return out
}

// isShed reports an attempt the gateway turned away.
func isShed(r loadgen.Record) bool {
	return r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable
}

// Early is the number of answers whose Retry-After sent the client back before capacity returned.
func (st RetryAfterStats) Early() int {
	n, _ := slices.BinarySearch(st.Slack, 0)
	return n
}

// RecordFigures are the CountFigures of a run's records of class ("" for all): the counts, and the shares of first
// retries served (missing when there were none).
func RecordFigures(records []loadgen.Record, class string, arrival loadgen.ArrivalConfig, capacity float64) FigureValues {
	st := ComputeRetryAfterStats(records, class, arrival, capacity)
	v := FigureValues{FigureShed: float64(st.Shed), FigureShedWithoutRetryAfter: float64(st.WithoutRetryAfter)}
	unanswered := 0
	for _, r := range records {
		if r.Final && (class == "" || r.Class == class) && r.Status == 0 {
			unanswered++
		}
	}
	v[FigureUnanswered] = float64(unanswered)
	if st.FirstRetries > 0 {
		v[FigureFirstRetryServed] = float64(st.FirstRetriesServed) / float64(st.FirstRetries)
	}
	if st.FirstRetriesBelowCapacity > 0 {
		v[FigureFirstRetryServedBelowCapacity] = float64(st.FirstRetriesBelowCapacityServed) / float64(st.FirstRetriesBelowCapacity)
	}
	return v
}

// writeRetryAfter compares, per contender that shed anything, the Retry-After it gave with when capacity returned
// (ComputeRetryAfterStats), and counts the first retries served, when the scenario's clients retry.
func writeRetryAfter(b *bufio.Writer, s *ScenarioResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if s.Scenario.Retry.MaxAttempts < 2 {
		return
	}
	header := false
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		st := ComputeRetryAfterStats(run.Result.Records, "", s.Scenario.Arrival, s.Scenario.Capacity)
		if st.Shed == 0 {
			continue
		}
		if !header {
			header = true
			p("\nRetry-After against when capacity returned (for a 429/503 answer: the start of the first later attempt " +
				"of its class that was served). Durations as P10 / P50 / P90; told − needed is Retry-After minus the time " +
				"capacity took to return (negative: the client was sent back too early).\n\n")
			p("| Contender | Answered 429/503 | without Retry-After | Retry-After | capacity returned after | never returned " +
				"| told − needed | sent back too early | first retries served | … sent below capacity, served |\n")
			p("|---|---|---|---|---|---|---|---|---|---|\n")
		}
		p("| %s | %d | %d | %s | %s | %d | %s | %s | %s | %s |\n", run.Contender.Name, st.Shed, st.WithoutRetryAfter,
			durationSpread(st.RetryAfter), durationSpread(st.Returned), st.Never, durationSpread(st.Slack), share(st.Early(), len(st.Slack)),
			share(st.FirstRetriesServed, st.FirstRetries), share(st.FirstRetriesBelowCapacityServed, st.FirstRetriesBelowCapacity))
	}
	if header {
		writeRetryAfterByPhase(b, s)
	}
}

// writeRetryAfterByPhase splits the comparison by the phase of a phased arrival in which the 429/503 was answered: the
// moments clients were sent back to against the moments capacity returned, and their first retries.
func writeRetryAfterByPhase(b *bufio.Writer, s *ScenarioResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	header := false
	for _, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		for _, ph := range RetryAfterByPhase(run.Result.Records, s.Scenario.Arrival) {
			if ph.Shed == 0 {
				continue
			}
			if !header {
				header = true
				p("\nThe same by the phase of the load in which the 429/503 was answered: moments from the run's start as " +
					"P10 / P50 / P90, and the first retries of the requests whose first attempt was turned away then.\n\n")
				p("| Contender | answered during | 429/503 | told to come back at | capacity returned at | first retries served |\n")
				p("|---|---|---|---|---|---|\n")
			}
			load := fmt.Sprintf("%.3g req/s", ph.Phase.Rate)
			if c := s.Scenario.Capacity; c > 0 {
				load += fmt.Sprintf(" (%.2gx capacity)", ph.Phase.Rate/c)
			}
			p("| %s | %s–%s, %s | %d | %s | %s | %s |\n", run.Contender.Name, formatSeconds(ph.From.Seconds()),
				formatSeconds((ph.From + ph.Phase.Duration).Seconds()), load, ph.Shed, durationSpread(ph.ToldAt),
				durationSpread(ph.ReturnedAt), share(ph.FirstRetriesServed, ph.FirstRetries))
		}
	}
}

// durationSpread renders a sorted sample as P10 / P50 / P90.
func durationSpread(sorted []time.Duration) string {
	if len(sorted) == 0 {
		return "–"
	}
	q := func(pct float64) string { return formatSignedSeconds(loadgen.Percentile(sorted, pct)) }
	return q(10) + " / " + q(50) + " / " + q(90)
}

func formatSignedSeconds(d time.Duration) string {
	if d < 0 {
		return "−" + formatSeconds((-d).Seconds())
	}
	return formatSeconds(d.Seconds())
}

// share renders n of total as a percentage with the counts.
func share(n, total int) string {
	if total == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%% (%d of %d)", 100*float64(n)/float64(total), n, total)
}
