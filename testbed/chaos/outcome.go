package chaos

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Outcome is the class of a request's final answer, as the chaos report
// counts it.
type Outcome string

const (
	// OutcomeOK: a 2xx answer whose body or stream completed.
	OutcomeOK Outcome = "200"
	// OutcomeShed: 429 with Retry-After, admission's designed answer to
	// overload.
	OutcomeShed Outcome = "429+RA"
	// OutcomeUnavailable: 503 with Retry-After (no endpoint with fresh
	// metrics, the EPP shutting down).
	OutcomeUnavailable Outcome = "503+RA"
	// OutcomeOther: any other answer: an error status without Retry-After
	// (a server's 500, the data plane's 502 or its 500 when the EPP is
	// gone), or a stream cut before its end.
	OutcomeOther Outcome = "other"
	// OutcomeHung: no answer, or no end of the answer, before the client's
	// timeout or the run's drain gave up on it.
	OutcomeHung Outcome = "hung"
	// OutcomeLost: the connection failed without any answer (the gateway
	// dropped the request), or the load generator has no final record of
	// an issued request.
	OutcomeLost Outcome = "lost"
	// OutcomeDisconnected: the client left on purpose while the request
	// waited (the disconnect burst); not a failure.
	OutcomeDisconnected Outcome = "disconnected"
)

// Outcomes lists the classes in report order.
var Outcomes = []Outcome{OutcomeOK, OutcomeShed, OutcomeUnavailable, OutcomeOther, OutcomeHung, OutcomeLost, OutcomeDisconnected}

// Classify returns the class of a final record.
func Classify(r loadgen.Record) Outcome {
	switch {
	case r.OK():
		return OutcomeOK
	case clientGaveUp(r):
		return OutcomeHung
	case r.Status == 0:
		return OutcomeLost
	case r.Status == http.StatusTooManyRequests && r.RetryAfterSet:
		return OutcomeShed
	case r.Status == http.StatusServiceUnavailable && r.RetryAfterSet:
		return OutcomeUnavailable
	}
	return OutcomeOther
}

// clientGaveUp reports whether the attempt ended because the client stopped
// waiting (its timeout, or the run's drain), with no answer or with the
// answer unfinished.
func clientGaveUp(r loadgen.Record) bool {
	for _, s := range []string{"context deadline exceeded", "context canceled", "Client.Timeout exceeded"} {
		if strings.Contains(r.Error, s) {
			return true
		}
	}
	return false
}

// ErrorCode is the OpenAI error code of a non-2xx answer (the shed reason of
// the EPP's answers, the data plane's own codes), read from the body excerpt
// the load generator keeps; "" when there is none.
func ErrorCode(r loadgen.Record) string {
	_, body, ok := strings.Cut(r.Error, ": ")
	if !ok || !strings.HasPrefix(r.Error, "HTTP ") {
		return ""
	}
	var e struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// RoutedTo reports whether the attempt was sent to endpoint: it answered
// (the data plane names the endpoint that served a response), or the data
// plane could not reach it (its 502 names the endpoint).
func RoutedTo(r loadgen.Record, endpoint string) bool {
	return r.Endpoint == endpoint || r.Status == http.StatusBadGateway && strings.Contains(r.Error, endpoint)
}

// reachedAt is when the attempt reached its endpoint, at the latest: its
// first byte back (time to first token, or the whole answer). It bounds
// the routing decision from above, which keeps time-to-leave conservative.
func reachedAt(r loadgen.Record) time.Duration {
	if r.TTFT > 0 {
		return r.Start + r.TTFT
	}
	return r.Start + r.E2E
}

// sentAt is when the attempt was sent: it bounds the routing decision from
// below (admission may hold a request before it routes it). For a slow
// endpoint, whose first byte comes seconds after it was routed there.
func sentAt(r loadgen.Record) time.Duration { return r.Start }

// Leave is how traffic left a faulty endpoint.
type Leave struct {
	// Left reports that no attempt reached the endpoint in the last quiet
	// period of the window (a third of it, at most a second).
	Left bool
	// After is the time from the fault to the last attempt that reached the
	// endpoint before traffic left it (0 when none did): the last of all,
	// or, when probes are told apart, the last before the first probe.
	After time.Duration
	// First is the time from the fault to the first attempt that reached the
	// endpoint: a detector that learns of the fault from the endpoint's
	// answers can know nothing before it.
	First time.Duration
	// Probes counts the attempts that reached the endpoint after the first
	// gap of at least the probe gap between two of its attempts (or the
	// fault and its first attempt): an outlier detector letting one request
	// through as each ejection ends.
	Probes int
	// Share is the fraction of the window's attempts that went there.
	Share float64
}

// TrafficLeft measures how traffic left endpoint after from (relative to
// the load's start), within the window [from, to), timing each attempt by
// its first byte back, or by when it was sent if bySend. A positive probeGap
// tells probes apart (see Leave.Probes).
func TrafficLeft(recs []loadgen.Record, endpoint string, from, to, probeGap time.Duration, bySend bool) Leave {
	quiet := min(time.Second, (to-from)/3)
	when := reachedAt
	if bySend {
		when = sentAt
	}
	var l Leave
	var there []time.Duration
	n := 0
	for _, r := range recs {
		at := when(r)
		if at < from || at >= to {
			continue
		}
		n++
		if RoutedTo(r, endpoint) {
			there = append(there, at)
		}
	}
	if n > 0 {
		l.Share = float64(len(there)) / float64(n)
	}
	l.Left = true
	if len(there) == 0 {
		return l
	}
	slices.Sort(there)
	last := there[len(there)-1]
	l.Left = last < to-quiet
	l.First = there[0] - from
	// The fault counts as the attempt before the first: an endpoint left out before any request reached it gets
	// only probes.
	left := len(there)
	if probeGap > 0 {
		prev := from
		for i, at := range there {
			if at-prev >= probeGap {
				left = i
				break
			}
			prev = at
		}
	}
	if left > 0 {
		l.After = there[left-1] - from
	}
	l.Probes = len(there) - left
	return l
}

// CriticalTTFT returns the times to first token of the requests of class
// served on their first attempt, sent within [from, to), ascending. A request
// served on a retry is counted apart (RetriesIn).
func CriticalTTFT(recs []loadgen.Record, class string, from, to time.Duration) []time.Duration {
	var out []time.Duration
	for _, r := range recs {
		if servedFirstTry(r, class, from, to) {
			out = append(out, r.TTFT)
		}
	}
	slices.Sort(out)
	return out
}

// servedFirstTry reports whether r is a request of class served on its first attempt and sent within [from, to):
// what the Critical TTFT figures count.
func servedFirstTry(r loadgen.Record, class string, from, to time.Duration) bool {
	return r.Class == class && r.Attempt <= 1 && r.OK() && r.Start >= from && r.Start < to
}

// firstSentIn reports whether r's request was first sent within [from, to), whichever attempt r is: retried requests
// belong to the window of their first attempt.
func firstSentIn(r loadgen.Record, from, to time.Duration) bool {
	first := r.Start - r.SinceFirstAttempt
	return first >= from && first < to
}

// MissingFinals counts the issued requests (sequence numbers 0 to the
// highest seen) without exactly one final record.
func MissingFinals(recs []loadgen.Record) int {
	finals := map[int]int{}
	top := -1
	for _, r := range recs {
		top = max(top, r.Seq)
		if r.Final {
			finals[r.Seq]++
		}
	}
	missing := 0
	for seq := 0; seq <= top; seq++ {
		if finals[seq] != 1 {
			missing++
		}
	}
	return missing
}

// Retries is what the clients' retries after Retry-After (Case.Retry) did for
// the requests first sent in a window.
type Retries struct {
	// Requests counts the requests retried at least once; Outcomes are their
	// final answers.
	Requests int             `json:"requests"`
	Outcomes map[Outcome]int `json:"outcomes,omitempty"`
	// Critical counts the Critical ones and CriticalServed those served in
	// the end; CriticalFirstToken is the longest time from a served one's
	// first attempt to its first token: what its client waited.
	Critical           int           `json:"critical"`
	CriticalServed     int           `json:"critical_served"`
	CriticalFirstToken time.Duration `json:"critical_first_token_ns,omitempty"`
}

// RetriesIn measures the retries of the requests first sent within [from,
// to); critical names the Critical class.
func RetriesIn(recs []loadgen.Record, critical string, from, to time.Duration) Retries {
	out := Retries{Outcomes: map[Outcome]int{}}
	for _, r := range recs {
		if !r.Final || r.Attempt <= 1 || !firstSentIn(r, from, to) {
			continue
		}
		out.Requests++
		out.Outcomes[Classify(r)]++
		if r.Class != critical {
			continue
		}
		out.Critical++
		if r.OK() {
			out.CriticalServed++
			out.CriticalFirstToken = max(out.CriticalFirstToken, r.SinceFirstAttempt+r.TTFT)
		}
	}
	return out
}
