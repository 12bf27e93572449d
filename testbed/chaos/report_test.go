package chaos

import (
	"strings"
	"testing"
	"time"
)

func TestAgainstBaseline(t *testing.T) {
	for _, tc := range []struct {
		name             string
		during, baseline time.Duration
		n, baselineN     int
		target           float64
		want             string
	}{
		{name: "met", during: 90 * time.Millisecond, baseline: 60 * time.Millisecond, n: 30, baselineN: 31, target: 1.5,
			want: "90 ms / 60 ms (1.50x, met: ≤ 1.5x)"},
		{name: "not met", during: 235 * time.Millisecond, baseline: 71 * time.Millisecond, n: 30, baselineN: 31, target: 1.5,
			want: "235 ms / 71 ms (3.31x, not met: ≤ 1.5x)"},
		{name: "no target", during: 60 * time.Millisecond, baseline: 60 * time.Millisecond, n: 3, baselineN: 3,
			want: "60 ms / 60 ms (1.00x)"},
		{name: "no Critical request in the window", during: 0, baseline: 60 * time.Millisecond, n: 0, baselineN: 3, target: 1.5,
			want: "none / 60 ms"},
		{name: "none in the baseline's", during: 60 * time.Millisecond, n: 3, target: 1.5, want: "60 ms / none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := againstBaseline(tc.during, tc.baseline, tc.n, tc.baselineN, tc.target); got != tc.want {
				t.Errorf("againstBaseline = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReportBaselines checks that the report sets a case's window against its baseline's and shows nothing of the
// kind for a case without one.
func TestReportBaselines(t *testing.T) {
	results := []Result{
		{Case: "replica-killed", Mode: Static, CriticalDuring: 120 * time.Millisecond, CriticalDuringP50: 61 * time.Millisecond,
			CriticalDuringN: 32, CriticalUnavailable: 1, Outcomes: map[Outcome]int{OutcomeOK: 210},
			Baseline: &Baseline{Name: "one EPP replica", Target: 1.5, CriticalP50: 60 * time.Millisecond, CriticalP99: 100 * time.Millisecond,
				CriticalN: 33, Outcomes: map[Outcome]int{OutcomeOK: 200, OutcomeShed: 17}}},
		{Case: "server-killed", Mode: Static, Outcomes: map[Outcome]int{OutcomeOK: 210}},
	}
	var b strings.Builder
	if err := WriteReport(&b, results, ShortTimeline); err != nil {
		t.Fatal(err)
	}
	want := "| replica-killed | static | one EPP replica | 61 ms / 60 ms (1.02x, met: ≤ 1.5x) | 120 ms / 100 ms (1.20x, met: ≤ 1.5x) | 32 / 33 | 1 / 0 | 200 × 200, 17 × 429+RA |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("report lacks the baseline row %q:\n%s", want, b.String())
	}
	if n := strings.Count(b.String(), "one EPP replica"); n != 1 {
		t.Errorf("report names a baseline %d times, want once (the case without one has no row)", n)
	}
}

// TestBaselineFailuresFailTheCase: a baseline run that failed fails its case, and the report says so.
func TestBaselineFailuresFailTheCase(t *testing.T) {
	r := Result{Case: "replica-killed", Mode: Static, Outcomes: map[Outcome]int{OutcomeOK: 1},
		Baseline: &Baseline{Name: "one EPP replica", Failures: []string{"the baseline run did not complete (see its subtest)"}}}
	if got := r.Failures(); len(got) != 1 || got[0] != "baseline: the baseline run did not complete (see its subtest)" {
		t.Errorf("Failures() = %q, want the baseline's", got)
	}
	var b strings.Builder
	if err := WriteReport(&b, []Result{r}, ShortTimeline); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "**FAIL**: baseline: the baseline run did not complete") {
		t.Errorf("the report does not fail the case:\n%s", b.String())
	}
}

// TestReportRetries: a case whose clients retry gets a row of what the retries did, beside its baseline's count; a
// case whose clients do not retry gets none.
func TestReportRetries(t *testing.T) {
	results := []Result{
		{Case: "replica-killed", Mode: Static, Outcomes: map[Outcome]int{OutcomeOK: 210},
			Retries:  &Retries{Requests: 2, Outcomes: map[Outcome]int{OutcomeOK: 2}, Critical: 1, CriticalServed: 1, CriticalFirstToken: 1055 * time.Millisecond},
			Baseline: &Baseline{Name: "one EPP replica", Outcomes: map[Outcome]int{OutcomeOK: 210}, Retries: &Retries{}}},
		{Case: "server-killed", Mode: Static, Outcomes: map[Outcome]int{OutcomeOK: 210}},
	}
	var b strings.Builder
	if err := WriteReport(&b, results, ShortTimeline); err != nil {
		t.Fatal(err)
	}
	want := "| replica-killed | static | 2 / 0 | 2 × 200 | 1 / 1 | 1055 ms |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("report lacks the retries row %q:\n%s", want, b.String())
	}
	section := b.String()[strings.Index(b.String(), "## Retries after Retry-After"):]
	section = section[:strings.Index(section, "\n## ")+1]
	if rows := strings.Count(section, "\n| ") - 1; rows != 1 { // the header row aside
		t.Errorf("the retries section has %d rows, want 1 (the case whose clients do not retry has none):\n%s", rows, section)
	}
}
