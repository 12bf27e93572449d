package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/sluice-gw/sluice/testbed/benchsuite"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Soak output files, in the output folder.
const (
	SoakReportFileName  = "soak.md"
	SoakResultsFileName = "soak.json"
	SoakPlotName        = "soak" // .svg and .png
)

// throughputBucket is the width of the soak plot's rate bins.
const throughputBucket = 10 * time.Second

// WriteSoakOutputs writes the soak's summary, raw figures and plot into dir.
func WriteSoakOutputs(dir string, r SoakResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := benchsuite.SavePlot(filepath.Join(dir, SoakPlotName+".svg"), filepath.Join(dir, SoakPlotName+".png"),
		10*vg.Inch, 7*vg.Inch, soakChart(r)); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, SoakResultsFileName), raw, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, SoakReportFileName), []byte(SoakSummary(r)), 0o644)
}

// SoakSummary renders the soak's figures as Markdown.
func SoakSummary(r SoakResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak\n\n%v at %.1f requests/s offered (%.1fx the measured capacity of %.1f requests/s), "+
		"20%% Critical, 50%% Standard, 30%% Sheddable, clients retrying after Retry-After (4 attempts at most); "+
		"a probe sent a request with a new tenant and model every 200 ms; before the baseline, a warm-up sent %d requests "+
		"with a new tenant and model each, at light load, to fill the EPP's bounded label spaces.\n\n", r.Load, r.Offered, r.Offered/r.Capacity, r.Capacity, r.WarmUpProbes)
	fmt.Fprintf(&b, "- Requests: %d (%d attempts); final answers: ", r.Requests, r.Attempts)
	var parts []string
	for _, o := range Outcomes {
		if n := r.Outcomes[o]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
	}
	fmt.Fprintf(&b, "%s; without exactly one final answer: %d.\n", strings.Join(parts, ", "), r.Missing)
	fmt.Fprintf(&b, "- Probe: %d requests, answers %v.\n", r.Probes, r.ProbeAnswers)
	fmt.Fprintf(&b, "- EPP RSS: %.1f MiB idle after the capacity run, %.1f MiB idle after the label warm-up (the baseline), "+
		"%.1f MiB peak, %.1f MiB after the cool-down; Go heap in use %.1f, %.1f, %.1f MiB (cold, baseline, after).\n",
		mib(r.Cold.RSS), mib(r.Baseline.RSS), mib(r.Peak.RSS), mib(r.After.RSS), mib(r.Cold.HeapInuse), mib(r.Baseline.HeapInuse), mib(r.After.HeapInuse))
	fmt.Fprintf(&b, "- EPP goroutines: %.0f before, %.0f peak, %.0f after.\n", r.Baseline.Goroutines, r.Peak.Goroutines, r.After.Goroutines)
	fmt.Fprintf(&b, "- EPP /metrics series: %d cold, %d before, %d peak, %d after; families that grew in the second half of the load: %v.\n",
		r.Cold.Series, r.Baseline.Series, r.Peak.Series, r.After.Series, r.SeriesGrowth)
	fmt.Fprintf(&b, "- EPP log: %.0f bytes per request (%.0f per attempt).\n", r.LogBytesPerRequest, r.LogBytesPerAttempt)
	if f := r.Failures(); len(f) > 0 {
		fmt.Fprintf(&b, "\n**Failed**: %s\n", strings.Join(f, "; "))
	} else {
		b.WriteString("\nEvery check passed.\n")
	}
	fmt.Fprintf(&b, "\n![soak](%s.png)\n", SoakPlotName)
	return b.String()
}

// soakChart draws four panels over time: the clients' rates, and the EPP's
// RSS, goroutines and /metrics series.
func soakChart(r SoakResult) func(draw.Canvas) {
	rates := plot.New()
	rates.Title.Text = fmt.Sprintf("Soak: %.1fx capacity for %v", r.Offered/r.Capacity, r.Load)
	rates.X.Label.Text, rates.Y.Label.Text = "time since the load started (s)", "requests/s"
	rates.Legend.Top = true
	for i, line := range rateLines(r.Records) {
		addLine(rates, line.name, line.pts, i)
	}
	panel := func(title, unit string, pick func(SoakSample) float64) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text, p.Y.Label.Text = "time since the load started (s)", unit
		pts := make(plotter.XYs, 0, len(r.Samples))
		for _, smp := range r.Samples {
			pts = append(pts, plotter.XY{X: smp.At.Seconds(), Y: pick(smp)})
		}
		addLine(p, "", pts, 0)
		p.Y.Min = 0
		return p
	}
	rss := panel("EPP resident memory", "MiB", func(s SoakSample) float64 { return mib(s.RSS) })
	gor := panel("EPP goroutines", "goroutines", func(s SoakSample) float64 { return s.Goroutines })
	ser := panel("EPP /metrics series", "series", func(s SoakSample) float64 { return float64(s.Series) })
	return func(dc draw.Canvas) {
		tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 2,
			PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
		grid := [][]*plot.Plot{{rates, rss}, {gor, ser}}
		canvases := plot.Align(grid, tiles, dc)
		for i, row := range grid {
			for j, p := range row {
				p.Draw(canvases[i][j])
			}
		}
	}
}

type rateLine struct {
	name string
	pts  plotter.XYs
}

// rateLines bins the attempts sent and the final answers by class of
// outcome into requests per second.
func rateLines(recs []loadgen.Record) []rateLine {
	bins := map[string]map[int]int{}
	count := func(name string, at time.Duration) {
		if bins[name] == nil {
			bins[name] = map[int]int{}
		}
		bins[name][int(at/throughputBucket)]++
	}
	last := 0
	for _, r := range recs {
		count("attempts sent", r.Start)
		if r.Final {
			count("final "+string(Classify(r)), r.Start+r.E2E)
		}
		last = max(last, int((r.Start+r.E2E)/throughputBucket))
	}
	var out []rateLine
	for _, name := range []string{"attempts sent", "final 200", "final 429+RA", "final 503+RA", "final other"} {
		if bins[name] == nil {
			continue
		}
		pts := make(plotter.XYs, 0, last+1)
		for i := 0; i <= last; i++ {
			pts = append(pts, plotter.XY{X: (float64(i) + 0.5) * throughputBucket.Seconds(), Y: float64(bins[name][i]) / throughputBucket.Seconds()})
		}
		out = append(out, rateLine{name, pts})
	}
	return out
}

func addLine(p *plot.Plot, name string, pts plotter.XYs, i int) {
	if len(pts) == 0 {
		return
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return
	}
	l.Color, l.Width = plotutil.Color(i), vg.Points(1.2)
	p.Add(l)
	if name != "" {
		p.Legend.Add(name, l)
	}
}
