package chaos

import (
	"flag"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

var soak = flag.Duration("chaos.soak", 0, "run the soak (make soak) with an overload of this length; 0 skips it")

// TestSoak runs the soak when -chaos.soak is set: Factor times the fleet's
// capacity for the given time, then the checks of SoakResult.Failures.
// `make test` skips it.
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("the soak runs with -chaos.soak=DURATION (make soak)")
	}
	dir := *out
	if dir == "" {
		dir = t.TempDir()
	}
	base := StackOptions{Bin: Binaries(t), Dir: filepath.Join(dir, "logs"), Servers: 3, ServerArgs: serverArgs}
	start := time.Now()
	res := Soak(t, base, DefaultSoakOptions(*soak))
	t.Logf("soak took %v\n%s", time.Since(start).Round(time.Second), SoakSummary(res))
	if err := WriteSoakOutputs(dir, res); err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Failures() {
		t.Error(f)
	}
}

// TestSoakFailures: each check of the soak fails on its own.
func TestSoakFailures(t *testing.T) {
	healthy := func() SoakResult {
		return SoakResult{
			Outcomes:     map[Outcome]int{OutcomeOK: 90, OutcomeShed: 8, OutcomeUnavailable: 2},
			ProbeAnswers: map[string]int{"200": 5, "404": 5},
			Baseline:     SoakSample{RSS: 100 << 20, Goroutines: 100},
			After:        SoakSample{RSS: 120 << 20, Goroutines: 115},
			SeriesGrowth: map[string]int{"go_gc_duration_seconds": maxSeriesGrowth},
		}
	}
	tests := []struct {
		name  string
		spoil func(*SoakResult)
		want  string
	}{
		{"healthy", func(*SoakResult) {}, ""},
		{"missing final", func(r *SoakResult) { r.Missing = 1 }, "did not end in exactly one"},
		{"hung", func(r *SoakResult) { r.Outcomes[OutcomeHung] = 1 }, "did not end in exactly one"},
		{"other", func(r *SoakResult) { r.Outcomes[OutcomeOther] = 1 }, "did not end in exactly one"},
		{"probe unanswered", func(r *SoakResult) { r.ProbeAnswers["hung"] = 1 }, "probe requests got no answer"},
		{"goroutines left", func(r *SoakResult) { r.After.Goroutines = 121 }, "goroutines 121 after the cool-down"},
		{"memory kept", func(r *SoakResult) { r.After.RSS = 126 << 20 }, "RSS 126.0 MiB"},
		{"series growing", func(r *SoakResult) { r.SeriesGrowth["inference_objective_request_total"] = 40 }, "gained 40 series"},
		{"leak", func(r *SoakResult) { r.Leak = "1 requests queued" }, "leak: 1 requests queued"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := healthy()
			tt.spoil(&r)
			got := strings.Join(r.Failures(), "; ")
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("Failures = %q, want one containing %q", got, tt.want)
			}
		})
	}
}

// TestPeakAndGrowth: growth compares the last sample of the load's first
// half with its last sample, ignoring the cool-down.
func TestPeakAndGrowth(t *testing.T) {
	smp := func(at time.Duration, rss float64, fams map[string]int) SoakSample {
		n := 0
		for _, v := range fams {
			n += v
		}
		return SoakSample{At: at, RSS: rss, Series: n, families: fams}
	}
	samples := []SoakSample{
		smp(10*time.Second, 50, map[string]int{"a": 3, "b": 1}),
		smp(30*time.Second, 80, map[string]int{"a": 3, "b": 2}), // middle
		smp(50*time.Second, 70, map[string]int{"a": 3, "b": 4, "c": 1}),
		smp(60*time.Second, 60, map[string]int{"a": 3, "b": 6, "c": 1}), // end of the load
		smp(90*time.Second, 40, map[string]int{"a": 3, "b": 9, "c": 1}), // cool-down
	}
	peak, growth := peakAndGrowth(samples, time.Minute)
	if peak.RSS != 80 || peak.Series != 13 {
		t.Errorf("peak = RSS %v, series %d; want 80, 13 (the cool-down counts)", peak.RSS, peak.Series)
	}
	if want := map[string]int{"b": 4, "c": 1}; !maps.Equal(growth, want) {
		t.Errorf("growth = %v, want %v", growth, want)
	}
}

// TestWriteSoakOutputs renders a small soak's summary, figures and plot.
func TestWriteSoakOutputs(t *testing.T) {
	r := SoakResult{Capacity: 10, Offered: 30, Load: time.Minute, Requests: 2, Attempts: 3,
		Outcomes: map[Outcome]int{OutcomeOK: 1, OutcomeShed: 1},
		Records: []loadgen.Record{
			{Seq: 0, Attempt: 1, Start: time.Second, E2E: time.Second, Status: 429, RetryAfterSet: true},
			{Seq: 0, Attempt: 2, Final: true, Start: 3 * time.Second, E2E: time.Second, Status: 200},
			{Seq: 1, Attempt: 1, Final: true, Start: 15 * time.Second, E2E: time.Second, Status: 429, RetryAfterSet: true},
		},
		Samples: []SoakSample{{At: 2 * time.Second, RSS: 50 << 20, Goroutines: 90, Series: 400}, {At: 20 * time.Second, RSS: 60 << 20, Goroutines: 120, Series: 410}},
	}
	dir := t.TempDir()
	if err := WriteSoakOutputs(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{SoakReportFileName, SoakResultsFileName, SoakPlotName + ".svg", SoakPlotName + ".png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	summary, err := os.ReadFile(filepath.Join(dir, SoakReportFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(summary), "3.0x the measured capacity of 10.0 requests/s") {
		t.Errorf("summary:\n%s", summary)
	}
}
