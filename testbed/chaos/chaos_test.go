package chaos

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var (
	full = flag.Bool("chaos.full", false, "run every case in every mode on the full timeline (make chaos) instead of the short one")
	all  = flag.Bool("chaos.all", false, "run every case in every mode (make chaos SHORT=1); without it (make test) only the smoke cases run, in static mode")
	out  = flag.String("chaos.out", "", "write the report, the raw results and the processes' logs into this folder")
)

// TestChaos runs every case in every mode it applies to, each on a fresh
// stack, and fails a case on any answer its fault does not make
// unavoidable (hung and lost ones always), a queue entry or reservation
// left in the EPP, or a failed case check. Timing targets are reported,
// never asserted. `make test` runs the smoke cases in static mode on the
// short timeline (about 40 s; every case would take 4-5 minutes); `make
// chaos` every case in both modes on the full one, with a report.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	bin := Binaries(t)
	tl, every := ShortTimeline, *all || *full
	if *full {
		tl = FullTimeline
	}
	modes := []Mode{Static}
	if every {
		modes = append(modes, Kubernetes)
	}
	dir := *out
	if dir == "" {
		dir = t.TempDir()
	}
	base := StackOptions{Bin: bin, Dir: filepath.Join(dir, "logs"), Servers: 3, ServerArgs: serverArgs, DecisionTrace: true}
	var results []Result
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			opts := base
			if mode == Kubernetes {
				// One API server for every Kubernetes run; each run creates and deletes its pool and pods.
				opts.Cluster = StartCluster(t)
			}
			for _, c := range Cases() {
				if !slices.Contains(c.Modes, mode) || !every && !c.Smoke {
					continue
				}
				t.Run(c.Name, func(t *testing.T) {
					res := RunCase(t, c, mode, tl, opts)
					results = append(results, res)
					for _, f := range res.Failures() {
						t.Error(f)
					}
				})
			}
		})
	}
	SortResults(results)
	var b strings.Builder
	if err := WriteReport(&b, results, tl); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	if *out != "" {
		if err := WriteOutputs(*out, results, tl); err != nil {
			t.Fatal(err)
		}
	}
}
