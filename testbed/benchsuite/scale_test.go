package benchsuite

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

func TestRunScale(t *testing.T) {
	var runs []string
	var points int
	st, err := RunScale(t.Context(), ScaleOptions{
		Sizes: []int{2, 4}, Duration: time.Second,
		OnRun:   func(n int, c string) { runs = append(runs, c) },
		OnPoint: func(virtualbench.ScalePoint) { points++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Points) != 2 || points != 2 || len(runs) != 6 || strings.Join(st.Contenders, ",") != "round-robin,upstream-default,sluice" {
		t.Fatalf("study %+v, runs %v", st, runs)
	}
	for i, pt := range st.Points {
		if want := []int{2, 4}[i]; pt.Servers != want || pt.Rate != float64(want)*DefaultScaleRatePerServer {
			t.Errorf("point %d: %d servers at %v req/s", i, pt.Servers, pt.Rate)
		}
		for j, r := range pt.Results {
			if r.Router != st.Contenders[j] || r.Requests == 0 || r.Succeeded != r.Requests {
				t.Errorf("%d servers, %s: %+v", pt.Servers, r.Router, r)
			}
			if want := float64(r.TTFTP99) / float64(pt.Results[0].TTFTP99); r.TTFTP99VsBaseline != want {
				t.Errorf("%d servers, %s: ratio %v, want %v", pt.Servers, r.Router, r.TTFTP99VsBaseline, want)
			}
			if (j == 0) != (r.EPPPerRequest == 0) || (j == 0) != (r.EPPCPUPerRequest == 0) {
				t.Errorf("%d servers, %s: EPP cost %v, %v CPU (only round-robin has none)", pt.Servers, r.Router,
					r.EPPPerRequest, r.EPPCPUPerRequest)
			}
		}
	}
	if _, ok := st.Result(1, Sluice); !ok {
		t.Error("no sluice result at 4 servers")
	}
}

func TestRunScaleOptions(t *testing.T) {
	for _, o := range []ScaleOptions{{Sizes: []int{8, 0}}, {RatePerServer: -1}, {Duration: -time.Second}} {
		if _, err := RunScale(t.Context(), o); err == nil {
			t.Errorf("%+v was accepted", o)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	st, err := RunScale(ctx, ScaleOptions{Sizes: []int{2}})
	if !errors.Is(err, context.Canceled) || st == nil || len(st.Points) != 0 {
		t.Errorf("cancelled study: %+v, %v", st, err)
	}
}

// fakeScale is a finished two-size study.
func fakeScale() *ScaleStudy {
	res := func(name string, p99 time.Duration, ratio float64, cost time.Duration) virtualbench.ScaleResult {
		return virtualbench.ScaleResult{Router: name, Requests: 100, Succeeded: 100, TTFTP50: 40 * time.Millisecond,
			TTFTP99: p99, TTFTP99VsBaseline: ratio, EPPPerRequest: 2 * cost, EPPCPUPerRequest: cost, Virtual: 7 * time.Second,
			Wall: time.Second}
	}
	return &ScaleStudy{
		Fleet: "half h100, half a10g", Mix: "chats", RatePerServer: 7.5, Duration: 5 * time.Second, Seed: 11,
		Contenders: []string{RoundRobin, UpstreamDefault, Sluice},
		Points: []virtualbench.ScalePoint{
			{Servers: 8, Rate: 60, Results: []virtualbench.ScaleResult{res(RoundRobin, time.Second, 1, 0),
				res(UpstreamDefault, 800*time.Millisecond, 0.8, 220*time.Microsecond), res(Sluice, 300*time.Millisecond, 0.3, 90*time.Microsecond)}},
			{Servers: 64, Rate: 480, Results: []virtualbench.ScaleResult{res(RoundRobin, 700*time.Millisecond, 1, 0),
				res(UpstreamDefault, 1400*time.Millisecond, 2, 1500*time.Microsecond), res(Sluice, 350*time.Millisecond, 0.5, 400*time.Microsecond)}},
		},
	}
}

func TestWriteReportScale(t *testing.T) {
	res := &SuiteResult{Engine: VirtualEngineName, Scale: fakeScale()}
	dir := t.TempDir()
	plots, err := WritePlots(dir, res)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots[ScaleName]) != 1 {
		t.Fatalf("scale plots %+v", plots)
	}
	checkSVG(t, filepath.Join(dir, plots[ScaleName][0].SVG))
	checkPNG(t, filepath.Join(dir, plots[ScaleName][0].PNG))

	var buf bytes.Buffer
	if err := WriteReport(&buf, res, plots); err != nil {
		t.Fatal(err)
	}
	report := buf.String()
	for _, want := range []string{
		"## Scale",
		"| Servers | Offered load | upstream-default TTFT P99 vs round-robin | sluice TTFT P99 vs round-robin | upstream-default EPP CPU per decision | sluice EPP CPU per decision | sluice / upstream-default EPP CPU |",
		"| 8 | 60 req/s | 0.80x (-20%) | 0.30x (-70%) | 220 µs | 90.0 µs | 0.41x (-59%) |",
		"| 64 | 480 req/s | 2.00x (+100%) | 0.50x (-50%) | 1500 µs | 400 µs | 0.27x (-73%) |",
		"| 64 | round-robin | 100 | 100 | 40 ms | 700 ms | 0.0% | – | – | 7s | 1s |",
		"| 64 | sluice | 100 | 100 | 40 ms | 350 ms | 0.0% | 400 µs | 800 µs | 7s | 1s |",
		"(scale/scale.svg)",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "## Summary") {
		t.Error("a session without scenarios has a summary table")
	}
	var head bytes.Buffer
	if err := WriteHeadline(&head, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(head.String(), "| 8 | 60 req/s |") || strings.Contains(head.String(), "scale.svg") {
		t.Errorf("headline:\n%s", head.String())
	}
	if sum := Summarize(res); sum.Scale == nil || len(sum.Scale.Points) != 2 {
		t.Errorf("results.json lacks the scale study: %+v", sum.Scale)
	}
}
