// Command bench runs Sluice's benchmark suite: every scenario under
// testbed/bench/scenarios (or the ones named) against round-robin, upstream v1.5.0's
// default profile and Sluice, each on a fresh simulated fleet, and writes a
// Markdown report with every figure as a ratio computed within the session,
// SVG and PNG plots, and the raw JSON of every run. See package benchsuite.
//
// Two engines: real-time (real processes on loopback, the default) and
// virtual (the same fleet model, load and EPP plugins as a deterministic
// discrete-event simulation; package virtualbench), which runs every
// scenario in seconds and can also run the scale study and the seed sweep.
//
//	bench                                   # every scenario (make bench)
//	bench --scenario mixed-gpu,bursty       # some, each on all its server shapes (make bench SCENARIO=mixed-gpu)
//	bench --scenario priority-overload-slot-limited   # one shape of a scenario
//	bench --list                            # what there is
//	bench --duration 10s --scenario uniform-steady   # a quick, noisier look
//	bench --engine virtual                  # every scenario in virtual time (make bench ENGINE=virtual)
//	bench --engine virtual --scale          # and the scale study: 8..1000 servers
//	bench --engine virtual --scenario scale --scale-sizes 8,64,256   # the scale study alone
//	bench --engine virtual --seeds 1,2,3,4,5,6,7,8   # and every scenario with 8 other load seeds (make bench ENGINE=virtual SEEDS=1,2,...)
//	bench --compare BASE NEW                # every Sluice figure that moved by more than 5% between two suite runs
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sluice-gw/sluice/testbed/benchsuite"
	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

// Engines --engine accepts.
const (
	engineRealTime = benchsuite.RealTimeEngineName
	engineVirtual  = benchsuite.VirtualEngineName
)

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scenarioDir = fs.String("scenarios", filepath.Join("testbed", "bench", "scenarios"), "folder of scenario folders, each with a "+benchsuite.ScenarioFileName)
		only        = fs.String("scenario", "", "comma-separated scenario names to run (default: all)")
		bin         = fs.String("bin", "bin", "folder with the vllm-sim, epp and dataplane binaries (make build)")
		out         = fs.String("out", "", "output folder (default: bench-results/<UTC time>)")
		engineName  = fs.String("engine", engineRealTime, "engine: real-time (real processes on loopback) or virtual (deterministic simulation in virtual time)")
		duration    = fs.Duration("duration", 0, "override every scenario's load duration (quick looks; shorter runs are noisier)")
		list        = fs.Bool("list", false, "list the scenarios and exit")
		scale       = fs.Bool("scale", false, "also run the scale study (virtual engine; the same as naming the scenario \""+benchsuite.ScaleName+"\")")
		scaleSizes  = fs.String("scale-sizes", joinInts(benchsuite.DefaultScaleSizes), "scale study: comma-separated fleet sizes (an EPP takes minutes at 1000 servers)")
		scaleRate   = fs.Float64("scale-rate", benchsuite.DefaultScaleRatePerServer, "scale study: Poisson requests per second per server")
		scaleDur    = fs.Duration("scale-duration", benchsuite.DefaultScaleDuration, "scale study: virtual issuing window of every run")
		eppProfile  = fs.Bool("epp-cpu-profile", false, "real-time engine: save each EPP's CPU profile over the load into its run folder ("+benchsuite.EPPCPUProfileFile+", for go tool pprof)")
		seedList    = fs.String("seeds", "", "seed sweep (virtual engine): also run every scenario with each of these comma-separated load seeds and report Sluice's ratios across them")
		compare     = fs.Bool("compare", false, "compare two suite output folders given as arguments (BASE NEW): list every figure (TTFT P50/P99, throughput, goodput of each class) that moved by more than --threshold; run nothing")
		threshold   = fs.Float64("threshold", 0.05, "--compare: the ratio's move, either way, that counts (0.05: 5%)")
		contenders  = fs.String("contenders", "sluice", "--compare: compare the contenders whose name starts with this (\"\" for all)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *compare {
		if fs.NArg() != 2 {
			return fmt.Errorf("--compare takes two suite output folders, BASE and NEW; got %d arguments", fs.NArg())
		}
		return compareSuites(stdout, fs.Arg(0), fs.Arg(1), *threshold, *contenders)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if *duration < 0 {
		return fmt.Errorf("--duration must not be negative, got %v", *duration)
	}
	if *engineName != engineRealTime && *engineName != engineVirtual {
		return fmt.Errorf("--engine %q is not %s or %s", *engineName, engineRealTime, engineVirtual)
	}

	scenarios, err := benchsuite.LoadScenarios(*scenarioDir)
	if err != nil {
		return err
	}
	if *list {
		for _, sc := range scenarios {
			fmt.Fprintf(stdout, "%-34s %s (fleet %s, %v)\n", sc.Name, sc.Title, sc.Fleet, sc.Duration)
		}
		fmt.Fprintf(stdout, "%-34s %s\n", benchsuite.ScaleName, "Scale study: mixed fleets of --scale-sizes servers (--engine virtual)")
		return nil
	}
	scenarios, withScale, err := selectScenarios(scenarios, *only)
	if err != nil {
		return err
	}
	withScale = withScale || *scale
	scaleOpts := benchsuite.ScaleOptions{RatePerServer: *scaleRate, Duration: *scaleDur}
	if withScale {
		if *engineName != engineVirtual {
			return fmt.Errorf("the scale study runs in virtual time only: add --engine=%s", engineVirtual)
		}
		if scaleOpts.Sizes, err = parseSizes(*scaleSizes); err != nil {
			return err
		}
		if !(*scaleRate > 0) || *scaleDur <= 0 {
			return fmt.Errorf("--scale-rate and --scale-duration must be positive, got %v and %v", *scaleRate, *scaleDur)
		}
	}
	var seeds []uint64
	if *seedList != "" {
		if *engineName != engineVirtual {
			return fmt.Errorf("the seed sweep runs in virtual time only (a real-time suite per seed would take hours): add --engine=%s", engineVirtual)
		}
		if seeds, err = parseSeeds(*seedList); err != nil {
			return err
		}
		if len(scenarios) == 0 {
			return errors.New("--seeds needs scenarios to run; the scale study has no seed sweep")
		}
	}
	if *duration > 0 {
		for _, sc := range scenarios {
			sc.Duration = *duration
		}
	}

	if *engineName == engineRealTime {
		if err := benchsuite.CheckBinaries(*bin); err != nil {
			return err
		}
	}
	if *out == "" {
		*out = filepath.Join("bench-results", time.Now().UTC().Format("20060102-150405"))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	// A virtual run takes a fraction of a second: a line per run, no live bar.
	bar := benchsuite.NewProgressBar(stderr, isTerminal(stderr) && *engineName == engineRealTime, scenarios)
	var engine benchsuite.Engine = &benchsuite.Virtual{}
	if *engineName == engineRealTime {
		engine = &benchsuite.RealTime{Bin: *bin, OutDir: *out, OnLoadStart: bar.LoadStarted, OnRecord: bar.Record, EPPCPUProfile: *eppProfile}
	}

	runs := 0
	for _, sc := range scenarios {
		runs += len(sc.Contenders)
	}
	switch {
	case *engineName == engineVirtual:
		fmt.Fprintf(stderr, "%d scenarios, %d runs in virtual time; output in %s\n", len(scenarios), runs, *out)
	default:
		fmt.Fprintf(stderr, "%d scenarios, %d runs, about %v on a quiet machine; output in %s\n",
			len(scenarios), runs, benchsuite.PlannedDuration(scenarios).Round(time.Minute), *out)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	suite := &benchsuite.Suite{Engine: engine, EngineName: *engineName, OutDir: *out, Progress: bar}
	res, runErr := suite.Run(ctx, scenarios)
	if withScale && runErr == nil {
		fmt.Fprintf(stderr, "scale study: %s servers, %g req/s per server, %v virtual each\n",
			joinInts(scaleOpts.Sizes), scaleOpts.RatePerServer, scaleOpts.Duration)
		scaleOpts.OnRun = func(servers int, contender string) {
			fmt.Fprintf(stderr, "scale: %d servers · %s ...\n", servers, contender)
		}
		scaleOpts.OnPoint = func(pt virtualbench.ScalePoint) {
			for _, r := range pt.Results {
				fmt.Fprintf(stderr, "scale: %d servers · %s: TTFT p99 %v (%.3f of round-robin's), EPP %v CPU (%v wall) per decision, %v wall\n",
					pt.Servers, r.Router, r.TTFTP99.Round(time.Millisecond), r.TTFTP99VsBaseline,
					r.EPPCPUPerRequest.Round(time.Microsecond), r.EPPPerRequest.Round(time.Microsecond), r.Wall.Round(100*time.Millisecond))
			}
		}
		res.Scale, runErr = benchsuite.RunScale(ctx, scaleOpts)
		res.Wall = time.Since(res.Started)
	}
	if len(seeds) > 0 && runErr == nil {
		fmt.Fprintf(stderr, "seed sweep: %d scenarios × %d seeds\n", len(scenarios), len(seeds))
		res.Seeds, runErr = benchsuite.RunSeeds(ctx, engine, *engineName, scenarios, seeds, bar)
		res.Wall = time.Since(res.Started)
	}
	if len(res.Scenarios) == 0 && (res.Scale == nil || len(res.Scale.Points) == 0) {
		return runErr
	}
	if err := benchsuite.WriteOutputs(*out, res); err != nil {
		return errors.Join(runErr, err)
	}
	if err := benchsuite.WriteHeadline(stdout, res); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(stdout, "\nReport: %s (wall time %v)\n", filepath.Join(*out, benchsuite.ReportFileName), res.Wall.Round(time.Second))
	if runErr != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("the report covers the runs that finished: %w", runErr)
		}
		return fmt.Errorf("interrupted; the report covers the runs that finished: %w", runErr)
	}
	if res.Failed() {
		return errors.New("some runs failed; the report says which and why")
	}
	return nil
}

// selectScenarios keeps the named scenarios, in suite order; scale reports
// whether the names include the scale study (benchsuite.ScaleName), which
// alone selects no scenario.
func selectScenarios(all []*benchsuite.Scenario, names string) (out []*benchsuite.Scenario, scale bool, err error) {
	var known []string
	for _, sc := range all {
		if sc.Name == benchsuite.ScaleName {
			return nil, false, fmt.Errorf("scenario name %q is reserved for the scale study; rename %s", sc.Name, sc.Dir)
		}
		known = append(known, sc.Name)
	}
	if names == "" {
		return all, false, nil
	}
	var want []string
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == benchsuite.ScaleName:
			scale = true
		case !slices.Contains(known, n):
			return nil, false, fmt.Errorf("no scenario %q; there are %s and %s", n, strings.Join(known, ", "), benchsuite.ScaleName)
		default:
			want = append(want, n)
		}
	}
	for _, sc := range all {
		// A scenario file's name selects all its shapes (its first shape has its name too).
		if slices.Contains(want, sc.Name) || slices.Contains(want, sc.Family) {
			out = append(out, sc)
		}
	}
	return out, scale, nil
}

// parseSizes parses --scale-sizes.
// parseSeeds reads a comma-separated list of distinct load seeds.
func parseSeeds(s string) ([]uint64, error) {
	var seeds []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds: %q is not a seed (a non-negative integer)", f)
		}
		if slices.Contains(seeds, n) {
			return nil, fmt.Errorf("--seeds: seed %d twice", n)
		}
		seeds = append(seeds, n)
	}
	return seeds, nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--scale-sizes: %q is not a positive number of servers", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// compareSuites prints every figure that moved between two suite output folders, then the counts.
func compareSuites(w io.Writer, base, next string, threshold float64, contenders string) error {
	cmp, err := benchsuite.CompareRuns(base, next, threshold, contenders)
	if err != nil {
		return err
	}
	for _, run := range cmp.Unmatched {
		fmt.Fprintf(w, "only in one folder: %s\n", run)
	}
	for _, m := range cmp.Moves {
		fmt.Fprintln(w, m)
	}
	worse, better := cmp.Counts()
	fmt.Fprintf(w, "%d worse, %d better by more than %g%%\n", worse, better, threshold*100)
	return nil
}
