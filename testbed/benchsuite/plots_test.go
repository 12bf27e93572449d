package benchsuite

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	res := fakeSuite(t)
	plots, err := WritePlots(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"steady": {"ttft-cdf", "queue-depth"},                 // one class, no bands
		"prio":   {"ttft-cdf", "queue-depth", "band-latency"}, // critical and sheddable
	}
	for scenario, charts := range want {
		var got []string
		for _, p := range plots[scenario] {
			got = append(got, strings.TrimSuffix(filepath.Base(p.SVG), ".svg"))
			checkSVG(t, filepath.Join(dir, p.SVG))
			checkPNG(t, filepath.Join(dir, p.PNG))
			if p.Title == "" {
				t.Errorf("%s: untitled plot", p.SVG)
			}
		}
		if !slices.Equal(got, charts) {
			t.Errorf("%s: charts %v, want %v", scenario, got, charts)
		}
	}
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("<?xml")) || !bytes.Contains(b, []byte("<svg")) || !bytes.HasSuffix(bytes.TrimSpace(b), []byte("</svg>")) {
		t.Errorf("%s is not a complete SVG document: %.80q", path, b)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if want := int(plotWidth.Dots(pngDPI)); cfg.Width != want {
		t.Errorf("%s: %dx%d pixels, want %d wide", path, cfg.Width, cfg.Height, want)
	}
}

func TestWritePlotsSkipsEmptyCharts(t *testing.T) {
	res := fakeSuite(t)
	s := &res.Scenarios[0]
	for i := range s.Runs {
		s.Runs[i].Result.Samples = nil
		s.Runs[i].Result.Records = nil
	}
	plots, err := WritePlots(t.TempDir(), res)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots["steady"]) != 0 {
		t.Errorf("plots without data: %+v", plots["steady"])
	}
}

func TestCDF(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5}
	pts := cdf(xs, 3)
	if len(pts) != 3 || pts[0].X != 1 || pts[0].Y != 0.2 || pts[2].X != 5 || pts[2].Y != 1 {
		t.Errorf("cdf(5 points, 3) = %v: want the first and last points at 0.2 and 1", pts)
	}
	if pts := cdf(xs, 100); len(pts) != 5 {
		t.Errorf("cdf keeps %d of 5 points with room for 100", len(pts))
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].X < pts[i-1].X || pts[i].Y <= pts[i-1].Y {
			t.Errorf("cdf not increasing at %d: %v", i, pts)
		}
	}
}

func TestLogTicks(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks{}).Ticks(0.015, 0.6) {
		if tk.Value < 0.015 || tk.Value > 0.6 {
			t.Errorf("tick %v outside the range", tk.Value)
		}
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "0.02 0.05 0.1 0.2 0.5" {
		t.Errorf("labels %q", got)
	}
	labels = nil
	for _, tk := range (logTicks{}).Ticks(500, 20000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "500 1000 2000 5000 10000 20000" {
		t.Errorf("labels %q", got)
	}
}

func TestWriteOutputs(t *testing.T) {
	dir := t.TempDir()
	if err := WriteOutputs(dir, fakeSuite(t)); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(filepath.Join(dir, ReportFileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"steady/ttft-cdf.svg", "prio/band-latency.png"} {
		if !bytes.Contains(report, []byte("("+p+")")) {
			t.Errorf("report does not link %s", p)
		}
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, ResultsFileName))
	if err != nil {
		t.Fatal(err)
	}
	var sum SessionSummary
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Scenarios) != 2 || sum.Scenarios[0].Name != "steady" {
		t.Errorf("results.json scenarios %+v", sum.Scenarios)
	}
}
