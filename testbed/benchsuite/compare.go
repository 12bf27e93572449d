package benchsuite

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Comparing two suite runs figure by figure: issue targets of the form "no scenario gets worse than today's figures by
// more than 5%" are checked by running the suite before and after a change and listing every figure that moved. The
// report's own ratios are within one run; this is across two, so it suits the virtual engine (deterministic) and not
// real time, where two runs differ by the machine's load.

// CompareFigure names a figure CompareRuns reads from each class line of a run's summary.
type CompareFigure string

// The figures compared: TTFT is better lower, throughput and goodput higher.
const (
	CompareTTFTP50    CompareFigure = "ttft_p50"
	CompareTTFTP99    CompareFigure = "ttft_p99"
	CompareThroughput CompareFigure = "throughput"
	CompareGoodput    CompareFigure = "goodput"
)

var compareFigures = []CompareFigure{CompareTTFTP50, CompareTTFTP99, CompareThroughput, CompareGoodput}

func (f CompareFigure) lowerIsBetter() bool { return f == CompareTTFTP50 || f == CompareTTFTP99 }

func (f CompareFigure) of(c loadgen.ClassSummary) float64 {
	switch f {
	case CompareTTFTP50:
		return float64(c.TTFT.P50)
	case CompareTTFTP99:
		return float64(c.TTFT.P99)
	case CompareThroughput:
		return c.Throughput
	default:
		return c.Goodput
	}
}

func (f CompareFigure) format(v float64) string {
	if f.lowerIsBetter() {
		return time.Duration(v).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.2f", v)
}

// FigureMove is a figure of one class of one run that moved between two suite runs by more than the threshold.
type FigureMove struct {
	Scenario, Contender, Class string
	Figure                     CompareFigure
	Before, After              float64
	// Worse says the move is a loss: TTFT up, throughput or goodput down.
	Worse bool
}

// Ratio is After over Before.
func (m FigureMove) Ratio() float64 { return m.After / m.Before }

func (m FigureMove) String() string {
	verdict := "better"
	if m.Worse {
		verdict = "WORSE "
	}
	return fmt.Sprintf("%s %s/%s/%s %s %s -> %s %.2fx", verdict, m.Scenario, m.Contender, m.Class, m.Figure,
		m.Figure.format(m.Before), m.Figure.format(m.After), m.Ratio())
}

// Comparison is what CompareRuns found.
type Comparison struct {
	// Moves are in scenario, contender, class and figure order.
	Moves []FigureMove
	// Unmatched names the runs (scenario/contender) and classes (scenario/contender/class) found in one folder only.
	Unmatched []string
}

// Counts returns how many moves are worse and how many better.
func (c Comparison) Counts() (worse, better int) {
	for _, m := range c.Moves {
		if m.Worse {
			worse++
		} else {
			better++
		}
	}
	return worse, better
}

// CompareRuns compares every run of the suite output folder next with the same scenario and contender under base
// (each <scenario>/<contender>/run.json), for contenders whose name starts with contenderPrefix ("" for all), and
// returns every class's figure whose ratio after/before moved by more than threshold either way. A figure zero
// before (no successful request) is not compared; a TTFT zero after (none now) is worse.
func CompareRuns(base, next string, threshold float64, contenderPrefix string) (Comparison, error) {
	if !(threshold >= 0) {
		return Comparison{}, fmt.Errorf("threshold must not be negative, got %v", threshold)
	}
	before, err := readSummaries(base, contenderPrefix)
	if err != nil {
		return Comparison{}, err
	}
	after, err := readSummaries(next, contenderPrefix)
	if err != nil {
		return Comparison{}, err
	}
	var cmp Comparison
	for _, key := range sortedKeys(before, after) {
		b, inBase := before[key]
		a, inNext := after[key]
		if !inBase || !inNext {
			cmp.Unmatched = append(cmp.Unmatched, key)
			continue
		}
		scenario, contender, _ := strings.Cut(key, "/")
		for _, ca := range a.Classes {
			if !slices.ContainsFunc(b.Classes, func(c loadgen.ClassSummary) bool { return c.Class == ca.Class }) {
				cmp.Unmatched = append(cmp.Unmatched, key+"/"+ca.Class)
			}
		}
		for _, cb := range append([]loadgen.ClassSummary{b.Overall}, b.Classes...) {
			i := slices.IndexFunc(a.Classes, func(c loadgen.ClassSummary) bool { return c.Class == cb.Class })
			ca := a.Overall
			if cb.Class != b.Overall.Class {
				if i < 0 {
					cmp.Unmatched = append(cmp.Unmatched, key+"/"+cb.Class)
					continue
				}
				ca = a.Classes[i]
			}
			for _, f := range compareFigures {
				x, y := f.of(cb), f.of(ca)
				if x == 0 {
					continue
				}
				r := y / x
				if r > 1-threshold && r < 1+threshold {
					continue
				}
				// A TTFT of zero after is no request served, not an instant one.
				worse := (r > 1) == f.lowerIsBetter() || f.lowerIsBetter() && y == 0
				cmp.Moves = append(cmp.Moves, FigureMove{Scenario: scenario, Contender: contender, Class: cb.Class,
					Figure: f, Before: x, After: y, Worse: worse})
			}
		}
	}
	return cmp, nil
}

// readSummaries reads the summary of every run under dir whose contender starts with prefix, keyed
// "scenario/contender".
func readSummaries(dir, prefix string) (map[string]loadgen.Summary, error) {
	paths, err := fs.Glob(os.DirFS(dir), filepath.ToSlash(filepath.Join("*", "*", RunFileName)))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s holds no <scenario>/<contender>/%s: not a suite's output folder", dir, RunFileName)
	}
	out := make(map[string]loadgen.Summary, len(paths))
	for _, p := range paths {
		parts := strings.Split(p, "/")
		if !strings.HasPrefix(parts[1], prefix) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			return nil, err
		}
		var run struct {
			Summary loadgen.Summary `json:"summary"`
		}
		if err := json.Unmarshal(raw, &run); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, p), err)
		}
		out[parts[0]+"/"+parts[1]] = run.Summary
	}
	return out, nil
}

func sortedKeys(maps ...map[string]loadgen.Summary) []string {
	var keys []string
	for _, m := range maps {
		for k := range m {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}
