package loadgen

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func millis(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestPercentile(t *testing.T) {
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		sample []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 99, 7},
		{ten, 0, 1},
		{ten, 100, 10},
		{ten, 50, 6},  // h = 4.5 -> 5 + 0.5*(6-5) = 5.5, rounded half away from zero
		{ten, 90, 9},  // h = 8.1 -> 9.1 rounds to 9
		{ten, 95, 10}, // h = 8.55 -> 9.55 rounds to 10
		{[]time.Duration{0, 100}, 25, 25},
		{[]time.Duration{0, 100}, 99, 99},
		{ten, -5, 1},
		{ten, 250, 10},
	} {
		if got := Percentile(tc.sample, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.sample, tc.p, got, tc.want)
		}
	}
}

// TestPercentileInvariants checks monotonicity and bounds on seeded random
// samples.
func TestPercentileInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 300 {
		n := 1 + rng.IntN(200)
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(rng.Int64N(1e9))
		}
		slices.Sort(s)
		prev := time.Duration(-1)
		for p := 0.0; p <= 100; p += 2.5 {
			v := Percentile(s, p)
			if v < s[0] || v > s[n-1] || v < prev {
				t.Fatalf("n=%d p=%v: %v outside [%v,%v] or below previous %v", n, p, v, s[0], s[n-1], prev)
			}
			prev = v
		}
	}
}

func TestSummarize(t *testing.T) {
	records := []Record{
		// Request 0 (class a): 429 with Retry-After, then success 1s later.
		{Seq: 0, Attempt: 1, Class: "a", Status: 429, Error: "HTTP 429", RetryAfterSet: true, RetryAfter: time.Second, Start: 0, E2E: millis(5)},
		{Seq: 0, Attempt: 2, Final: true, Class: "a", Status: 200, Start: millis(1005), SinceFirstAttempt: millis(1005),
			TTFT: millis(100), E2E: millis(300), ITL: []time.Duration{millis(10), millis(30)}, OutputTokens: 3},
		// Request 1 (class a): fast success.
		{Seq: 1, Attempt: 1, Final: true, Class: "a", Status: 200, Start: millis(10), TTFT: millis(50), E2E: millis(150), ITL: []time.Duration{millis(20)}, OutputTokens: 2},
		// Request 2 (class b): 503 final.
		{Seq: 2, Attempt: 1, Final: true, Class: "b", Status: 503, Error: "HTTP 503", Start: millis(20), E2E: millis(1)},
		// Request 3 (class b): success but broken stream.
		{Seq: 3, Attempt: 1, Final: true, Class: "b", Status: 200, Error: "stream ended without [DONE]", Start: millis(30), E2E: millis(40)},
	}
	s := Summarize(records, SummaryOptions{
		Duration:   2 * time.Second,
		SLOs:       map[string]SLO{"a": {TTFT: Duration(millis(500))}},
		DefaultSLO: SLO{E2E: Duration(10 * time.Second)},
	})
	if len(s.Classes) != 2 || s.Classes[0].Class != "a" || s.Classes[1].Class != "b" {
		t.Fatalf("classes %+v", s.Classes)
	}
	a := s.Classes[0]
	if a.Requests != 2 || a.Attempts != 3 || a.Retried != 1 || a.Succeeded != 2 || a.Failed != 0 || a.Status["200"] != 2 {
		t.Errorf("class a counts %+v", a)
	}
	// Request 0 was shed once and served on its retry.
	if a.Shed != 1 || a.ShedServed != 1 || a.ShedRetryAfter != 1 {
		t.Errorf("class a shed %d, served after shedding %d, told when to retry %d; want 1, 1 and 1", a.Shed, a.ShedServed, a.ShedRetryAfter)
	}
	// Client-perceived TTFT of request 0 includes the retry: 1005+100 ms.
	if a.TTFT.Max != millis(1105) || a.TTFT.Count != 2 || a.E2E.Max != millis(1305) {
		t.Errorf("class a TTFT %+v E2E %+v", a.TTFT, a.E2E)
	}
	if a.ITL.Count != 3 || a.ITL.P50 != millis(20) {
		t.Errorf("class a ITL %+v", a.ITL)
	}
	// Only request 1 meets a's TTFT SLO of 500 ms.
	if a.Good != 1 || a.GoodFraction != 0.5 || a.Goodput != 0.5 || a.Throughput != 1 || a.OutputTokensPerSecond != 2.5 {
		t.Errorf("class a goodput %+v", a)
	}
	if a.SLO.E2E != Duration(10*time.Second) || a.SLO.TTFT != Duration(millis(500)) {
		t.Errorf("class a SLO %+v, want its TTFT plus the default E2E", a.SLO)
	}
	b := s.Classes[1]
	if b.Requests != 2 || b.Succeeded != 0 || b.Failed != 2 || b.Status["503"] != 1 || b.Status["200"] != 1 || b.TTFT.Count != 0 {
		t.Errorf("class b %+v", b)
	}
	// Request 2 was shed (503) and never served; request 3's broken stream is no shedding.
	if b.Shed != 1 || b.ShedServed != 0 || b.ShedRetryAfter != 0 {
		t.Errorf("class b shed %d, served after shedding %d, told when to retry %d; want 1, 0 and 0 (its 503 had no Retry-After)",
			b.Shed, b.ShedServed, b.ShedRetryAfter)
	}
	o := s.Overall
	if o.Class != AllClasses || o.Requests != 4 || o.Attempts != 5 || o.Succeeded != 2 || o.Good != 1 {
		t.Errorf("overall %+v", o)
	}

	var buf bytes.Buffer
	if err := WriteReport(&buf, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"class", "all", "200:2", "503:1", "577.5/1052.2/1094.5"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestSummarizeDurationFromRecords(t *testing.T) {
	s := Summarize([]Record{
		{Seq: 0, Final: true, Class: "a", Status: 200, Start: time.Second, E2E: time.Second},
		{Seq: 1, Final: true, Class: "a", Status: 200, Start: 2 * time.Second, E2E: 2 * time.Second},
	}, SummaryOptions{})
	if s.Duration != 3*time.Second || s.Overall.Throughput != 2.0/3 {
		t.Errorf("duration %v throughput %v", s.Duration, s.Overall.Throughput)
	}
	if empty := Summarize(nil, SummaryOptions{}); empty.Overall.Requests != 0 || len(empty.Classes) != 0 {
		t.Errorf("empty summary %+v", empty)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{" 0 ", 0, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{"99999999", 0, false},
		{now.Add(90 * time.Second).Format(http1123), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http1123), 0, true},
	} {
		got, ok := ParseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

const http1123 = "Mon, 02 Jan 2006 15:04:05 GMT"
