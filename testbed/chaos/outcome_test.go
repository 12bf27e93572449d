package chaos

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		rec  loadgen.Record
		want Outcome
	}{
		{"complete", loadgen.Record{Status: http.StatusOK}, OutcomeOK},
		{"stream cut", loadgen.Record{Status: http.StatusOK, Error: "unexpected EOF"}, OutcomeOther},
		{"shed with Retry-After", loadgen.Record{Status: http.StatusTooManyRequests, RetryAfterSet: true}, OutcomeShed},
		{"429 without Retry-After", loadgen.Record{Status: http.StatusTooManyRequests}, OutcomeOther},
		{"503 with Retry-After", loadgen.Record{Status: http.StatusServiceUnavailable, RetryAfterSet: true}, OutcomeUnavailable},
		{"503 without Retry-After", loadgen.Record{Status: http.StatusServiceUnavailable}, OutcomeOther},
		{"server 500", loadgen.Record{Status: http.StatusInternalServerError, Error: "HTTP 500: {}"}, OutcomeOther},
		{"no answer", loadgen.Record{Error: "connection reset by peer"}, OutcomeLost},
		{"client timeout", loadgen.Record{Error: "context deadline exceeded"}, OutcomeHung},
		{"stream unfinished at timeout", loadgen.Record{Status: http.StatusOK, Error: "reading stream: context deadline exceeded"}, OutcomeHung},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.rec); got != tt.want {
				t.Errorf("Classify = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestErrorCode(t *testing.T) {
	tests := []struct {
		err, want string
	}{
		{`HTTP 500: {"error":{"message":"m","code":"endpoint_picker_unavailable"}}`, "endpoint_picker_unavailable"},
		{`HTTP 500: not json`, ""},
		{`HTTP 429: {"error":{"message":"m"}}`, ""},
		{`unexpected EOF`, ""},
	}
	for _, tt := range tests {
		if got := ErrorCode(loadgen.Record{Error: tt.err}); got != tt.want {
			t.Errorf("ErrorCode(%q) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// TestTrafficLeft: an attempt counts for the endpoint it reached (served
// by it, or its 502), at its first byte back; traffic has left when none
// reached it in the window's last third (a second at most); with a probe
// gap, attempts after the first such gap between two of its attempts (or
// the fault and its first attempt) are probes, which After leaves out.
func TestTrafficLeft(t *testing.T) {
	const bad, good = "10.0.0.1:8000", "10.0.0.2:8000"
	served := func(start, ttft time.Duration, ep string) loadgen.Record {
		return loadgen.Record{Start: start, TTFT: ttft, E2E: 2 * ttft, Status: http.StatusOK, Endpoint: ep}
	}
	refused := func(start time.Duration) loadgen.Record {
		return loadgen.Record{Start: start, E2E: time.Millisecond, Status: http.StatusBadGateway, Error: "HTTP 502: upstream " + bad + " refused"}
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	probes := []loadgen.Record{served(ms(1000), ms(100), bad), served(ms(1150), ms(50), bad), served(ms(1500), ms(50), good),
		served(ms(1900), ms(100), bad), served(ms(1950), ms(50), good)}
	tests := []struct {
		name string
		recs []loadgen.Record
		gap  time.Duration
		send bool
		want Leave
	}{
		{"none reached it", []loadgen.Record{served(ms(1100), ms(50), good)}, 0, false, Leave{Left: true, Share: 0}},
		{"left after 300 ms", []loadgen.Record{served(ms(1200), ms(100), bad), served(ms(1500), ms(50), good), served(ms(2000), ms(50), good)},
			0, false, Leave{Left: true, After: ms(300), First: ms(300), Share: 1.0 / 3}},
		{"a 502 naming it counts", []loadgen.Record{refused(ms(1400)), served(ms(1500), ms(50), good)},
			0, false, Leave{Left: true, After: ms(401), First: ms(401), Share: 0.5}},
		{"still there at the end", []loadgen.Record{served(ms(1500), ms(50), good), served(ms(2800), ms(50), bad)},
			0, false, Leave{Left: false, After: ms(1850), First: ms(1850), Share: 0.5}},
		{"before the window", []loadgen.Record{served(ms(500), ms(100), bad), served(ms(1500), ms(50), good)}, 0, false, Leave{Left: true, Share: 0}},
		{"without a probe gap a probe is traffic", probes, 0, false, Leave{Left: true, After: ms(1000), First: ms(100), Share: 0.6}},
		{"a probe after the gap", probes, 500 * time.Millisecond, false, Leave{Left: true, After: ms(200), First: ms(100), Probes: 1, Share: 0.6}},
		{"only probes: left out before any attempt reached it", probes[2:], 500 * time.Millisecond, false,
			Leave{Left: true, After: 0, First: ms(1000), Probes: 1, Share: 1.0 / 3}},
		{"gaps shorter than the probe gap", probes, time.Second, false, Leave{Left: true, After: ms(1000), First: ms(100), Share: 0.6}},
		{"timed by sending", []loadgen.Record{served(ms(1200), ms(900), bad), served(ms(1500), ms(50), good)},
			0, true, Leave{Left: true, After: ms(200), First: ms(200), Share: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TrafficLeft(tt.recs, bad, time.Second, 3*time.Second, tt.gap, tt.send); got != tt.want {
				t.Errorf("TrafficLeft = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMissingFinals(t *testing.T) {
	recs := []loadgen.Record{
		{Seq: 0, Attempt: 1, Final: true},
		{Seq: 1, Attempt: 1}, {Seq: 1, Attempt: 2, Final: true}, // retried once
		{Seq: 2, Attempt: 1},                                                 // no final record
		{Seq: 4, Attempt: 1, Final: true}, {Seq: 4, Attempt: 1, Final: true}, // two finals; seq 3 missing
	}
	if got := MissingFinals(recs); got != 3 {
		t.Errorf("MissingFinals = %d, want 3 (seq 2, 3 and 4)", got)
	}
}

// TestRetriesIn: the requests first sent in the window and retried are counted by their final answer, a Critical one
// served on a retry by the wait from its first attempt; CriticalTTFT leaves them out.
func TestRetriesIn(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	unavailable := func(seq int, class string, start time.Duration, attempt int, since time.Duration) loadgen.Record {
		return loadgen.Record{Seq: seq, Class: class, Attempt: attempt, Start: start, SinceFirstAttempt: since,
			Status: http.StatusServiceUnavailable, RetryAfterSet: true, RetryAfter: time.Second, E2E: ms(2)}
	}
	served := func(seq int, class string, start time.Duration, attempt int, since, ttft time.Duration) loadgen.Record {
		return loadgen.Record{Seq: seq, Class: class, Attempt: attempt, Final: true, Start: start, SinceFirstAttempt: since,
			Status: http.StatusOK, TTFT: ttft, E2E: ttft + ms(100)}
	}
	recs := []loadgen.Record{
		served(0, criticalClass, ms(1500), 1, 0, ms(40)), // first attempt: no retry
		unavailable(1, criticalClass, ms(2000), 1, 0),
		served(1, criticalClass, ms(3005), 2, ms(1005), ms(50)), // served on its retry: 1,055 ms from its first attempt
		unavailable(2, "standard", ms(2100), 1, 0),
		unavailable(2, "standard", ms(3100), 2, ms(1000)),
		func() loadgen.Record { // never served
			r := unavailable(2, "standard", ms(4100), 3, ms(2000))
			r.Final = true
			return r
		}(),
		unavailable(3, criticalClass, ms(900), 1, 0), // first sent before the window
		served(3, criticalClass, ms(1900), 2, ms(1000), ms(30)),
		unavailable(4, criticalClass, ms(4900), 1, 0), // its retry starts after the window, its first attempt in it
		served(4, criticalClass, ms(5900), 2, ms(1000), ms(20)),
	}
	got := RetriesIn(recs, criticalClass, ms(1000), ms(5000))
	want := Retries{Requests: 3, Outcomes: map[Outcome]int{OutcomeOK: 2, OutcomeUnavailable: 1}, Critical: 2, CriticalServed: 2,
		CriticalFirstToken: ms(1055)}
	if got.Requests != want.Requests || got.Critical != want.Critical || got.CriticalServed != want.CriticalServed ||
		got.CriticalFirstToken != want.CriticalFirstToken || len(got.Outcomes) != len(want.Outcomes) ||
		got.Outcomes[OutcomeOK] != 2 || got.Outcomes[OutcomeUnavailable] != 1 {
		t.Errorf("RetriesIn = %+v, want %+v", got, want)
	}
	if ttft := CriticalTTFT(recs, criticalClass, ms(1000), ms(5000)); len(ttft) != 1 || ttft[0] != ms(40) {
		t.Errorf("CriticalTTFT = %v, want only the request served on its first attempt (40 ms)", ttft)
	}
}

// TestRetriedUnavailable: replica-killed fails on a retry answered 503 once the survivors must answer it, whatever
// attempt it was and whether a later one succeeded; a first attempt's 503 and a retry's 429 are fine.
func TestRetriedUnavailable(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	attempt := func(n int, start time.Duration, status int) loadgen.Record {
		return loadgen.Record{Seq: 1, Attempt: n, Start: start, Status: status, RetryAfterSet: status != http.StatusOK}
	}
	for _, tc := range []struct {
		name    string
		recs    []loadgen.Record
		wantErr bool
	}{
		{"first attempt 503, retry served", []loadgen.Record{attempt(1, ms(10000), 503), attempt(2, ms(11000), 200)}, false},
		{"retry shed with 429", []loadgen.Record{attempt(1, ms(10000), 429), attempt(2, ms(11000), 429)}, false},
		{"retry before the survivors must answer", []loadgen.Record{attempt(1, ms(9000), 429), attempt(2, ms(10050), 503)}, false},
		{"second attempt 503, third served", []loadgen.Record{attempt(1, ms(10000), 503), attempt(2, ms(11000), 503), attempt(3, ms(12000), 200)}, true},
		{"final retry 503", []loadgen.Record{attempt(1, ms(10500), 503), attempt(2, ms(11500), 503)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := retriedUnavailable(tc.recs, ms(11000)); (err != nil) != tc.wantErr {
				t.Errorf("retriedUnavailable = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}
