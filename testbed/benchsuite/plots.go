package benchsuite

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// Plot is one chart written as SVG and PNG; paths are relative to the
// suite's folder.
type Plot struct {
	Title string `json:"title"`
	SVG   string `json:"svg"`
	PNG   string `json:"png"`
}

// Plot geometry.
const (
	plotWidth  = 8 * vg.Inch
	plotHeight = 4.5 * vg.Inch
	pngDPI     = 120
	// cdfPoints bounds the points of a CDF line: enough to look smooth,
	// few enough to keep the SVG small.
	cdfPoints = 400
)

// WritePlots draws every scenario's charts into dir/<scenario>/: the TTFT
// CDF per contender, queue depth over time, and TTFT per band when the mix
// has priority objectives. It returns them by scenario name.
func WritePlots(dir string, res *SuiteResult) (map[string][]Plot, error) {
	out := map[string][]Plot{}
	var errs []error
	for i := range res.Scenarios {
		s := &res.Scenarios[i]
		name := s.Scenario.Name
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return out, err
		}
		charts := []struct {
			file  string
			title string
			draw  func(*ScenarioResult) (func(draw.Canvas), bool)
		}{
			{"ttft-cdf", "TTFT CDF per contender", ttftCDF},
			{"queue-depth", "Queue depth over time", queueDepth},
			{"band-latency", "TTFT per band", bandLatency},
		}
		for _, c := range charts {
			drawFn, ok := c.draw(s)
			if !ok {
				continue
			}
			pl := Plot{
				Title: fmt.Sprintf("%s: %s", s.Scenario.Title, c.title),
				SVG:   filepath.Join(name, c.file+".svg"),
				PNG:   filepath.Join(name, c.file+".png"),
			}
			if err := SavePlot(filepath.Join(dir, pl.SVG), filepath.Join(dir, pl.PNG), plotWidth, plotHeight, drawFn); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", pl.Title, err))
				continue
			}
			out[name] = append(out[name], pl)
		}
	}
	if st := res.Scale; st != nil && len(st.Points) > 0 {
		pl := Plot{
			Title: "Scale: routing quality and EPP cost by fleet size",
			SVG:   filepath.Join(ScaleName, "scale.svg"),
			PNG:   filepath.Join(ScaleName, "scale.png"),
		}
		if err := os.MkdirAll(filepath.Join(dir, ScaleName), 0o755); err != nil {
			return out, err
		}
		if err := SavePlot(filepath.Join(dir, pl.SVG), filepath.Join(dir, pl.PNG), plotWidth, plotHeight, scaleChart(st)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", pl.Title, err))
		} else {
			out[ScaleName] = append(out[ScaleName], pl)
		}
	}
	return out, errors.Join(errs...)
}

// scaleChart draws the scale study: TTFT P99 over round-robin's (left) and
// the EPP's wall time per decision (right) against the fleet size, both on
// log axes. Contenders keep their scenario colours (run order).
func scaleChart(st *ScaleStudy) func(draw.Canvas) {
	panel := func(title, ylabel string, value func(virtualbench.ScaleResult) float64) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "servers (log scale)"
		p.Y.Label.Text = ylabel
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{}, logTicks{}
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		xlo, xhi, ylo, yhi := math.Inf(1), 0.0, math.Inf(1), 0.0
		for ci, name := range st.Contenders[1:] {
			var pts plotter.XYs
			for i, pt := range st.Points {
				r, ok := st.Result(i, name)
				if v := value(r); ok && v > 0 {
					x := float64(pt.Servers)
					pts = append(pts, plotter.XY{X: x, Y: v})
					xlo, xhi, ylo, yhi = min(xlo, x), max(xhi, x), min(ylo, v), max(yhi, v)
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				continue
			}
			line.Color, points.Color = contenderColor(ci+1), contenderColor(ci+1)
			line.Width = vg.Points(1.5)
			p.Add(line, points)
			p.Legend.Add(name, line, points)
		}
		if yhi > 0 {
			// Explicit bounds keep log axes positive for a single point, with
			// room above for the legend.
			p.X.Min, p.X.Max = xlo/1.5, xhi*1.5
			p.Y.Min, p.Y.Max = ylo/2, yhi*4
		}
		return p
	}
	left := panel("TTFT P99 / "+st.Contenders[0]+"'s", "ratio (log scale)",
		func(r virtualbench.ScaleResult) float64 { return r.TTFTP99VsBaseline })
	right := panel("EPP CPU time per decision", "µs (log scale)",
		func(r virtualbench.ScaleResult) float64 {
			return float64(r.EPPCPUPerRequest) / float64(time.Microsecond)
		})
	return sideBySide(left, right)
}

// SavePlot draws a chart of the given size once into an SVG and once into a
// PNG canvas.
func SavePlot(svgPath, pngPath string, width, height vg.Length, drawFn func(draw.Canvas)) error {
	svg := vgsvg.New(width, height)
	drawFn(draw.New(svg))
	if err := writeCanvas(svgPath, svg); err != nil {
		return err
	}
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(pngDPI))
	drawFn(draw.New(img))
	return writeCanvas(pngPath, vgimg.PngCanvas{Canvas: img})
}

func writeCanvas(path string, c io.WriterTo) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = c.WriteTo(f)
	return err
}

// contenderColor gives each contender of a scenario the same colour in
// every chart.
func contenderColor(i int) color.Color { return plotutil.Color(i) }

// ttftCDF plots the distribution of client-side TTFT of successful
// requests, on a log axis.
func ttftCDF(s *ScenarioResult) (func(draw.Canvas), bool) {
	p := plot.New()
	p.Title.Text = s.Scenario.Title + ": time to first token"
	p.X.Label.Text = "TTFT (s, log scale)"
	p.Y.Label.Text = "fraction of successful requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	p.Add(plotter.NewGrid())
	lo, hi := 0.0, 0.0
	for i, run := range s.Runs {
		if run.Result == nil {
			continue
		}
		xs := successfulTTFTs(run.Result)
		if len(xs) == 0 {
			continue
		}
		if lo == 0 || xs[0] < lo {
			lo = xs[0]
		}
		hi = max(hi, xs[len(xs)-1])
		line, err := plotter.NewLine(cdf(xs, cdfPoints))
		if err != nil {
			continue
		}
		line.Color = contenderColor(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(run.Contender.Name, line)
	}
	if hi == 0 {
		return nil, false
	}
	// Explicit bounds keep the log axis positive even for one value.
	p.X.Min, p.X.Max = lo/1.2, hi*1.2
	return p.Draw, true
}

// logTicks marks a log axis at 1..9 x 10^k and labels 1, 2 and 5 x 10^k:
// plot.LogTicks labels powers of ten only, too few for latencies that
// span less than two decades.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for decade := math.Pow(10, math.Floor(math.Log10(lo))); decade <= hi; decade *= 10 {
		for i := 1; i <= 9; i++ {
			v := float64(i) * decade
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			switch {
			case i != 1 && i != 2 && i != 5:
			case v >= 1000: // 1000, not 1e+03
				t.Label = strconv.FormatFloat(v, 'f', 0, 64)
			default:
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// successfulTTFTs returns the client-side TTFT in seconds of successful
// requests (first attempt to first token), ascending.
func successfulTTFTs(r *RunResult) []float64 {
	var xs []float64
	for _, rec := range r.Records {
		if !rec.Final || !rec.OK() || rec.TTFT <= 0 {
			continue
		}
		xs = append(xs, (rec.SinceFirstAttempt + rec.TTFT).Seconds())
	}
	slices.Sort(xs)
	return xs
}

// cdf samples the empirical CDF of an ascending sample at up to n points,
// always including the first and the last.
func cdf(xs []float64, n int) plotter.XYs {
	m := min(n, len(xs))
	pts := make(plotter.XYs, 0, m)
	for k := range m {
		idx := k
		if m > 1 {
			idx = k * (len(xs) - 1) / (m - 1)
		}
		pts = append(pts, plotter.XY{X: xs[idx], Y: float64(idx+1) / float64(len(xs))})
	}
	return pts
}

// queueDepth plots requests waiting at the model servers (solid) and in
// the EPP (dashed) over the run.
func queueDepth(s *ScenarioResult) (func(draw.Canvas), bool) {
	p := plot.New()
	p.Title.Text = s.Scenario.Title + ": requests waiting"
	p.X.Label.Text = "time since the load started (s)"
	p.Y.Label.Text = "requests waiting"
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	entries, peak := 0, 0.0
	for i, run := range s.Runs {
		if run.Result == nil || len(run.Result.Samples) == 0 {
			continue
		}
		col := contenderColor(i)
		servers, epp := make(plotter.XYs, 0, len(run.Result.Samples)), plotter.XYs(nil)
		for _, smp := range run.Result.Samples {
			t := smp.At.Seconds()
			servers = append(servers, plotter.XY{X: t, Y: smp.ServerWaiting})
			if smp.EPPQueued != nil {
				epp = append(epp, plotter.XY{X: t, Y: smp.EPPQueuedTotal()})
			}
		}
		for _, series := range []struct {
			pts    plotter.XYs
			label  string
			dashes []vg.Length
		}{
			{servers, run.Contender.Name + ": model servers", nil},
			{epp, run.Contender.Name + ": EPP queue", []vg.Length{vg.Points(4), vg.Points(3)}},
		} {
			if len(series.pts) == 0 {
				continue
			}
			line, err := plotter.NewLine(series.pts)
			if err != nil {
				continue
			}
			line.Color, line.Dashes, line.Width = col, series.dashes, vg.Points(1.2)
			for _, pt := range series.pts {
				peak = max(peak, pt.Y)
			}
			p.Add(line)
			p.Legend.Add(series.label, line)
			entries++
		}
	}
	if entries == 0 {
		return nil, false
	}
	// Room above the lines for the legend.
	p.Y.Min, p.Y.Max = 0, max(peak, 1)*(1+legendRoom(entries))
	return p.Draw, true
}

// legendRoom is the fraction of a plot's height to add above the data for a
// legend of n entries at the top.
func legendRoom(n int) float64 { return 0.08 * float64(n) }

// bandLatency draws TTFT P50 and P99 per band (the mix's classes with a
// priority objective) side by side, grouped by contender. Only scenarios
// whose classes carry two or more objectives have bands to compare.
func bandLatency(s *ScenarioResult) (func(draw.Canvas), bool) {
	var bands []string
	objectives := map[string]bool{}
	for _, c := range s.Scenario.Mix.Classes {
		if c.Objective != "" {
			bands = append(bands, c.Name)
			objectives[c.Objective] = true
		}
	}
	if len(objectives) < 2 {
		return nil, false
	}
	panel := func(title string, pick func(loadgen.Latency) time.Duration) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = "seconds"
		p.Legend.Top, p.Legend.Left = true, true
		p.NominalX(bands...)
		n := len(s.Runs)
		width := vg.Points(min(60/float64(n), 18))
		peak := 0.0
		for i, run := range s.Runs {
			vals := make(plotter.Values, len(bands))
			for j, b := range bands {
				// A band with no successful request has no bar.
				if cs, ok := classSummary(run.Result, b); ok && cs.TTFT.Count > 0 {
					vals[j] = pick(cs.TTFT).Seconds()
					peak = max(peak, vals[j])
				}
			}
			bars, err := plotter.NewBarChart(vals, width)
			if err != nil {
				continue
			}
			bars.Color = contenderColor(i)
			bars.LineStyle.Width = 0
			bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * width
			p.Add(bars)
			p.Legend.Add(run.Contender.Name, bars)
		}
		p.Y.Min, p.Y.Max = 0, max(peak, 0.001)*(1+legendRoom(n))
		return p
	}
	left := panel(s.Scenario.Title+": TTFT P50 per band", func(l loadgen.Latency) time.Duration { return l.P50 })
	right := panel("TTFT P99 per band", func(l loadgen.Latency) time.Duration { return l.P99 })
	return sideBySide(left, right), true
}

// sideBySide draws two plots next to each other, their axes aligned.
func sideBySide(left, right *plot.Plot) func(draw.Canvas) {
	return func(dc draw.Canvas) {
		tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
			PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
		canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
		left.Draw(canvases[0][0])
		right.Draw(canvases[0][1])
	}
}
