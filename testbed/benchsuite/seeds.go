package benchsuite

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// SeedSweep is every scenario run again with other seeds of its load (arrival
// times, prompts, groups, adapters): a ratio that holds for the scenario's own
// seed but not for the next one is luck, not a property of the router. In the
// virtual engine each seed's result is exact, so the spread across seeds is the
// load's variance alone, without the machine's noise.
type SeedSweep struct {
	Seeds     []uint64       `json:"seeds"`
	Scenarios []SeedScenario `json:"scenarios"`
}

// SeedScenario is one scenario across the sweep's seeds.
type SeedScenario struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// OwnSeed is the seed the scenario file gives (the main runs' seed).
	OwnSeed uint64    `json:"own_seed"`
	Runs    []SeedRun `json:"runs"`
}

// SeedRun is one scenario with one seed: each contender's figures (absent when
// its run failed or was skipped, with the reason in Errors) and the targets.
type SeedRun struct {
	Seed    uint64                  `json:"seed"`
	Figures map[string]FigureValues `json:"figures"`
	Errors  map[string]string       `json:"errors,omitempty"`
	Targets []TargetResult          `json:"targets"`
}

// Ratios returns Sluice's ratio against baseline for f in every seed where
// both ran, in seed order.
func (s *SeedScenario) Ratios(baseline string, f Figure) []float64 {
	var out []float64
	for _, r := range s.Runs {
		if x, ok := Ratio(r.Figures[Sluice], r.Figures[baseline], f); ok {
			out = append(out, x)
		}
	}
	return out
}

// TargetsMet returns, per target of the scenario (in its order), in how many
// seeds it was met.
func (s *SeedScenario) TargetsMet() []int {
	if len(s.Runs) == 0 {
		return nil
	}
	met := make([]int, len(s.Runs[0].Targets))
	for _, r := range s.Runs {
		for i, t := range r.Targets {
			if i < len(met) && t.Met {
				met[i]++
			}
		}
	}
	return met
}

// RunSeeds runs every scenario's contenders once per seed on engine, one run at
// a time, and keeps each run's figures only (no run.json: the sweep is for
// ratios, and the records of a whole suite per seed would be tens of
// megabytes). progress, if set, follows the runs. Cancelling ctx stops the
// sweep; the result then holds the seeds finished so far.
func RunSeeds(ctx context.Context, engine Engine, engineName string, scenarios []*Scenario, seeds []uint64, progress Progress) (*SeedSweep, error) {
	if len(seeds) == 0 {
		return nil, fmt.Errorf("a seed sweep needs at least one seed")
	}
	sweep := &SeedSweep{Seeds: slices.Clone(seeds)}
	for _, sc := range scenarios {
		sweep.Scenarios = append(sweep.Scenarios, SeedScenario{Name: sc.Name, Title: sc.Title, OwnSeed: sc.Seed})
	}
	for _, seed := range seeds {
		seeded := make([]*Scenario, len(scenarios))
		for i, sc := range scenarios {
			c := *sc
			c.Seed = seed
			seeded[i] = &c
		}
		suite := &Suite{Engine: engine, EngineName: engineName, Progress: progress}
		res, err := suite.Run(ctx, seeded)
		if err != nil {
			return sweep, fmt.Errorf("seed %d: %w", seed, err)
		}
		for i := range res.Scenarios {
			sr := &res.Scenarios[i]
			run := SeedRun{Seed: seed, Figures: map[string]FigureValues{}, Targets: sr.Targets}
			for _, cr := range sr.Runs {
				switch {
				case cr.Result != nil:
					run.Figures[cr.Contender.Name] = FiguresOf(cr.Result.Summary.Overall)
				default:
					if run.Errors == nil {
						run.Errors = map[string]string{}
					}
					run.Errors[cr.Contender.Name] = cr.Error + cr.Skipped
				}
			}
			sweep.Scenarios[i].Runs = append(sweep.Scenarios[i].Runs, run)
		}
	}
	return sweep, nil
}

// writeSeeds renders the seed sweep: per scenario and figure, Sluice's ratio
// against round-robin and upstream-default as the median and range over the
// seeds, then in how many seeds each target was met.
func writeSeeds(b *bufio.Writer, sw *SeedSweep) {
	if sw == nil || len(sw.Scenarios) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	seeds := make([]string, len(sw.Seeds))
	for i, s := range sw.Seeds {
		seeds[i] = strconv.FormatUint(s, 10)
	}
	p("\n<a id=\"across-seeds\"></a>\n## Across seeds\n\n")
	p("Every scenario again with load seeds %s (arrival times, prompts, prefix groups, adapters; the other "+
		"sections use each scenario's own seed). Sluice's ratio per figure as the median over the seeds, with the "+
		"lowest and highest in brackets; a ratio that holds for one seed and not for the next is the load's luck, "+
		"not the router's.\n\n", strings.Join(seeds, ", "))
	p("| Scenario | Figure | vs %s | vs %s |\n|---|---|---|---|\n", RoundRobin, UpstreamDefault)
	for i := range sw.Scenarios {
		s := &sw.Scenarios[i]
		for _, f := range Figures {
			p("| %s | %s | %s | %s |\n", s.Name, f.Label(), spread(s.Ratios(RoundRobin, f)), spread(s.Ratios(UpstreamDefault, f)))
		}
	}
	p("\n| Scenario | Target | Met in |\n|---|---|---|\n")
	for i := range sw.Scenarios {
		s := &sw.Scenarios[i]
		if len(s.Runs) == 0 {
			continue
		}
		for j, met := range s.TargetsMet() {
			p("| %s | %s | %d of %d seeds |\n", s.Name, s.Runs[0].Targets[j].Target, met, len(s.Runs))
		}
	}
}

// spread renders ratios as "0.42x (0.30–0.51x)", their median and range; one
// ratio alone, or "no run".
func spread(ratios []float64) string {
	switch len(ratios) {
	case 0:
		return "no run"
	case 1:
		return trimRatio(ratios[0]) + "x"
	}
	s := slices.Sorted(slices.Values(ratios))
	n := len(s)
	median := s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return fmt.Sprintf("%sx (%s–%sx)", trimRatio(median), trimRatio(s[0]), trimRatio(s[n-1]))
}
