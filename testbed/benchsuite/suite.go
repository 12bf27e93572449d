package benchsuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// Progress follows a suite as it runs. Suite calls it from one goroutine.
type Progress interface {
	// StartRun announces run index (0-based) of total.
	StartRun(index, total int, sc *Scenario, c Contender)
	// EndRun reports how it went; exactly one of res and err is nil.
	EndRun(res *RunResult, err error)
}

// Suite runs scenarios against their contenders, one run at a time.
type Suite struct {
	Engine Engine
	// EngineName is recorded in the result ("real-time", "virtual").
	EngineName string
	// OutDir receives <scenario>/<contender>/run.json, the raw result of
	// every run, as soon as it finishes.
	OutDir string
	// Progress, if set, is told about every run.
	Progress Progress
}

// SuiteResult is one session: every run of every scenario, and the targets
// evaluated on them.
type SuiteResult struct {
	Engine  string        `json:"engine"`
	Started time.Time     `json:"started"`
	Wall    time.Duration `json:"wall_ns"`
	// CPUs and Platform describe the machine (runtime.NumCPU, GOOS/GOARCH).
	CPUs      int              `json:"cpus"`
	Platform  string           `json:"platform"`
	Scenarios []ScenarioResult `json:"scenarios"`
	// Scale is the scale study, nil when it did not run.
	Scale *ScaleStudy `json:"scale,omitempty"`
	// Seeds is the seed sweep, nil when it did not run.
	Seeds *SeedSweep `json:"seeds,omitempty"`
}

// ScenarioResult is one scenario's runs, in contender order.
type ScenarioResult struct {
	Scenario *Scenario `json:"scenario"`
	// Runs holds one entry per contender; Runs[i].Result is nil when the
	// run failed (Runs[i].Error says why).
	Runs    []ContenderRun `json:"runs"`
	Targets []TargetResult `json:"targets"`
}

// ContenderRun is one contender's run in a scenario: a Result, an Error,
// or Skipped, the reason the engine could not run the contender.
type ContenderRun struct {
	Contender Contender  `json:"contender"`
	Result    *RunResult `json:"result,omitempty"`
	Error     string     `json:"error,omitempty"`
	Skipped   string     `json:"skipped,omitempty"`
}

// Result returns the named contender's run, nil when it did not succeed.
func (s *ScenarioResult) Result(contender string) *RunResult {
	for _, r := range s.Runs {
		if r.Contender.Name == contender {
			return r.Result
		}
	}
	return nil
}

// Figures returns the named contender's figures; ok is false when its run
// did not succeed.
func (s *ScenarioResult) Figures(contender string) (FigureValues, bool) {
	r := s.Result(contender)
	if r == nil {
		return nil, false
	}
	return FiguresOf(r.Summary.Overall), true
}

// ClassFigures returns the named contender's figures over class's requests ("" for all), the ratio figures and
// the CountFigures; ok is false when its run did not succeed or had no request of the class.
func (s *ScenarioResult) ClassFigures(contender, class string) (FigureValues, bool) {
	r := s.Result(contender)
	if r == nil {
		return nil, false
	}
	line, ok := r.Summary.Overall, true
	if class != "" {
		line, ok = classSummary(r, class)
	}
	if !ok {
		return nil, false
	}
	v := FiguresOf(line)
	for f, x := range RecordFigures(r.Records, class, s.Scenario.Arrival, s.Scenario.Capacity) {
		v[f] = x
	}
	if rate, ok := r.Fleet.PrefixHitRate(); ok && class == "" {
		v[FigurePrefixHitRate] = rate
	}
	return v, true
}

// EvaluateTargets holds Sluice's figures against the baselines the
// scenario's targets name. A target whose runs failed is not met.
func (s *ScenarioResult) EvaluateTargets() []TargetResult {
	var out []TargetResult
	for _, t := range s.Scenario.Targets {
		sluice, _ := s.ClassFigures(t.subject(), t.Class)
		var base FigureValues
		switch t.Versus {
		case "":
		case Unloaded: // the reference ran its class alone
			base, _ = s.ClassFigures(Unloaded, "")
		default:
			base, _ = s.ClassFigures(t.Versus, t.Class)
		}
		out = append(out, t.Evaluate(sluice, base))
	}
	return out
}

// Failed reports whether any run failed. Targets not met are findings, not
// failures: the report marks them; nor are skipped runs.
func (r *SuiteResult) Failed() bool {
	for _, s := range r.Scenarios {
		for _, run := range s.Runs {
			if run.Result == nil && run.Skipped == "" {
				return true
			}
		}
	}
	return false
}

// Run runs every scenario's contenders in order. A failed run is recorded
// and the suite goes on, as is a run the engine skips (SkippedError); cancelling ctx stops it, and the result then holds
// the runs finished so far (the error is ctx's).
func (s *Suite) Run(ctx context.Context, scenarios []*Scenario) (*SuiteResult, error) {
	res := &SuiteResult{
		Engine: s.EngineName, Started: time.Now(),
		CPUs: runtime.NumCPU(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	total := 0
	for _, sc := range scenarios {
		total += len(sc.Contenders)
	}
	index := 0
	var err error
scenarios:
	for _, sc := range scenarios {
		sr := ScenarioResult{Scenario: sc}
		var together map[string]interleavedRun
		for _, c := range sc.Contenders {
			if s.Progress != nil {
				s.Progress.StartRun(index, total, sc, c)
			}
			index++
			var run *RunResult
			var runErr error
			if ie, ok := s.Engine.(InterleavingEngine); ok && sc.Interleave && !c.Unloaded {
				if together == nil {
					together = runInterleaved(ctx, ie, sc)
				}
				run, runErr = together[c.Name].res, together[c.Name].err
			} else {
				run, runErr = s.Engine.Run(ctx, sc, c)
			}
			if runErr == nil {
				runErr = s.writeRun(run)
			}
			if s.Progress != nil {
				if runErr != nil {
					s.Progress.EndRun(nil, runErr)
				} else {
					s.Progress.EndRun(run, nil)
				}
			}
			if ctxErr := ctx.Err(); ctxErr != nil {
				err = ctxErr
				if len(sr.Runs) > 0 {
					sr.Targets = sr.EvaluateTargets()
					res.Scenarios = append(res.Scenarios, sr)
				}
				break scenarios
			}
			cr := ContenderRun{Contender: c, Result: run}
			var skipped *SkippedError
			switch {
			case errors.As(runErr, &skipped):
				cr.Result, cr.Skipped = nil, skipped.Reason
			case runErr != nil:
				cr.Result, cr.Error = nil, runErr.Error()
			}
			sr.Runs = append(sr.Runs, cr)
		}
		sr.Targets = sr.EvaluateTargets()
		res.Scenarios = append(res.Scenarios, sr)
	}
	res.Wall = time.Since(res.Started)
	return res, err
}

// interleavedRun is one contender's part of an interleaved load.
type interleavedRun struct {
	res *RunResult
	err error
}

// runInterleaved runs sc's contenders but the unloaded reference in one
// load; a failure fails every one of them.
func runInterleaved(ctx context.Context, ie InterleavingEngine, sc *Scenario) map[string]interleavedRun {
	var cs []Contender
	for _, c := range sc.Contenders {
		if !c.Unloaded {
			cs = append(cs, c)
		}
	}
	out := make(map[string]interleavedRun, len(cs))
	res, err := ie.RunInterleaved(ctx, sc, cs)
	for i, c := range cs {
		if err != nil {
			out[c.Name] = interleavedRun{err: err}
		} else {
			out[c.Name] = interleavedRun{res: res[i]}
		}
	}
	return out
}

// writeRun writes a run's raw result to <out>/<scenario>/<contender>/run.json.
func (s *Suite) writeRun(run *RunResult) error {
	if s.OutDir == "" {
		return nil
	}
	dir := filepath.Join(s.OutDir, run.Scenario, run.Contender)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, RunFileName), run)
}

// RunFileName is the raw result of a run inside its folder.
const RunFileName = "run.json"

func writeJSON(path string, v any) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	enc := json.NewEncoder(f)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteOutputs writes the session's report (ReportFileName), its summary
// JSON (ResultsFileName: figures, ratios and targets, without the records
// that every run.json holds) and its plots into dir.
func WriteOutputs(dir string, res *SuiteResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plots, plotErr := WritePlots(dir, res)
	f, err := os.Create(filepath.Join(dir, ReportFileName))
	if err != nil {
		return err
	}
	werr := WriteReport(f, res, plots)
	cerr := f.Close()
	jerr := writeJSON(filepath.Join(dir, ResultsFileName), Summarize(res))
	return errors.Join(plotErr, werr, cerr, jerr)
}

// Output file names in the suite's folder.
const (
	ReportFileName  = "report.md"
	ResultsFileName = "results.json"
)
