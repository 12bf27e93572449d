package benchsuite

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func writeSuiteRun(t *testing.T, dir, scenario, contender string, overall loadgen.ClassSummary, classes ...loadgen.ClassSummary) {
	t.Helper()
	d := filepath.Join(dir, scenario, contender)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	run := RunResult{Scenario: scenario, Contender: contender, Summary: loadgen.Summary{Overall: overall, Classes: classes}}
	if err := writeJSON(filepath.Join(d, RunFileName), run); err != nil {
		t.Fatal(err)
	}
}

func classLine(class string, p50, p99 time.Duration, throughput, goodput float64) loadgen.ClassSummary {
	return loadgen.ClassSummary{Class: class, TTFT: loadgen.Latency{P50: p50, P99: p99}, Throughput: throughput, Goodput: goodput}
}

func TestCompareRuns(t *testing.T) {
	ms := time.Millisecond
	base, next := t.TempDir(), t.TempDir()
	writeSuiteRun(t, base, "priority-overload", "sluice", classLine("all", 100*ms, 1000*ms, 10, 8),
		classLine("critical", 50*ms, 90*ms, 2, 2))
	writeSuiteRun(t, next, "priority-overload", "sluice", classLine("all", 104*ms, 1200*ms, 9, 8.8),
		classLine("critical", 40*ms, 90*ms, 2, 2))
	writeSuiteRun(t, base, "priority-overload", "round-robin", classLine("all", 100*ms, 1000*ms, 10, 8))
	writeSuiteRun(t, next, "priority-overload", "round-robin", classLine("all", 900*ms, 9000*ms, 1, 1))
	writeSuiteRun(t, base, "bursty", "sluice", classLine("all", 0, 0, 0, 0))
	writeSuiteRun(t, next, "bursty", "sluice", classLine("all", 10*ms, 10*ms, 1, 1))
	writeSuiteRun(t, next, "long-prompt", "sluice", classLine("all", 10*ms, 10*ms, 1, 1))
	writeSuiteRun(t, base, "tenant-fairness", "sluice", classLine("all", 10*ms, 10*ms, 1, 1),
		classLine("heavy", 10*ms, 10*ms, 1, 1), classLine("light", 10*ms, 10*ms, 1, 1))
	writeSuiteRun(t, next, "tenant-fairness", "sluice", classLine("all", 10*ms, 10*ms, 1, 1),
		classLine("heavy", 0, 0, 0, 0), classLine("lite", 10*ms, 10*ms, 1, 1))

	tests := []struct {
		name      string
		threshold float64
		prefix    string
		want      []string
		unmatched []string
		worse     int
	}{
		{
			name: "sluice at 5%", threshold: 0.05, prefix: "sluice",
			want: []string{
				"WORSE  priority-overload/sluice/all ttft_p99 1s -> 1.2s 1.20x",
				"WORSE  priority-overload/sluice/all throughput 10.00 -> 9.00 0.90x",
				"better priority-overload/sluice/all goodput 8.00 -> 8.80 1.10x",
				"better priority-overload/sluice/critical ttft_p50 50ms -> 40ms 0.80x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p50 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p99 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy throughput 1.00 -> 0.00 0.00x",
				"WORSE  tenant-fairness/sluice/heavy goodput 1.00 -> 0.00 0.00x",
			},
			unmatched: []string{"long-prompt/sluice", "tenant-fairness/sluice/lite", "tenant-fairness/sluice/light"},
			worse:     6,
		},
		{
			name: "a wider threshold", threshold: 0.15, prefix: "sluice",
			want: []string{
				"WORSE  priority-overload/sluice/all ttft_p99 1s -> 1.2s 1.20x",
				"better priority-overload/sluice/critical ttft_p50 50ms -> 40ms 0.80x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p50 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p99 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy throughput 1.00 -> 0.00 0.00x",
				"WORSE  tenant-fairness/sluice/heavy goodput 1.00 -> 0.00 0.00x",
			},
			unmatched: []string{"long-prompt/sluice", "tenant-fairness/sluice/lite", "tenant-fairness/sluice/light"},
			worse:     5,
		},
		{
			name: "every contender", threshold: 0.5, prefix: "",
			want: []string{
				"WORSE  priority-overload/round-robin/all ttft_p50 100ms -> 900ms 9.00x",
				"WORSE  priority-overload/round-robin/all ttft_p99 1s -> 9s 9.00x",
				"WORSE  priority-overload/round-robin/all throughput 10.00 -> 1.00 0.10x",
				"WORSE  priority-overload/round-robin/all goodput 8.00 -> 1.00 0.12x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p50 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy ttft_p99 10ms -> 0s 0.00x",
				"WORSE  tenant-fairness/sluice/heavy throughput 1.00 -> 0.00 0.00x",
				"WORSE  tenant-fairness/sluice/heavy goodput 1.00 -> 0.00 0.00x",
			},
			unmatched: []string{"long-prompt/sluice", "tenant-fairness/sluice/lite", "tenant-fairness/sluice/light"},
			worse:     8,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmp, err := CompareRuns(base, next, tc.threshold, tc.prefix)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range cmp.Moves {
				got = append(got, m.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("moves:\n%q\nwant\n%q", got, tc.want)
			}
			if !slices.Equal(cmp.Unmatched, tc.unmatched) {
				t.Errorf("unmatched %q, want %q", cmp.Unmatched, tc.unmatched)
			}
			if worse, _ := cmp.Counts(); worse != tc.worse {
				t.Errorf("worse %d, want %d", worse, tc.worse)
			}
		})
	}
}

func TestCompareRunsErrors(t *testing.T) {
	empty := t.TempDir()
	suite := t.TempDir()
	writeSuiteRun(t, suite, "bursty", "sluice", classLine("all", time.Millisecond, time.Millisecond, 1, 1))
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "bursty", "sluice"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "bursty", "sluice", RunFileName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		base      string
		next      string
		threshold float64
	}{
		{"no runs", empty, suite, 0.05},
		{"not JSON", suite, bad, 0.05},
		{"negative threshold", suite, suite, -0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := CompareRuns(tc.base, tc.next, tc.threshold, ""); err == nil {
				t.Fatal("no error")
			}
		})
	}
}
