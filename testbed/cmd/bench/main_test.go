package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/testbed/benchsuite"
)

func TestSelectScenarios(t *testing.T) {
	all := []*benchsuite.Scenario{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	cases := []struct {
		names, want string
		scale       bool
		err         string
	}{
		{"", "a,b,c", false, ""},
		{"c,a", "a,c", false, ""}, // suite order, not argument order
		{" b ", "b", false, ""},
		{"scale", "", true, ""},
		{"b,scale", "b", true, ""},
		{"a,nope", "", false, `no scenario "nope"; there are a, b, c and scale`},
	}
	for _, tc := range cases {
		got, scale, err := selectScenarios(all, tc.names)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: error %v, want %q", tc.names, err, tc.err)
			}
			continue
		}
		var names []string
		for _, sc := range got {
			names = append(names, sc.Name)
		}
		if err != nil || strings.Join(names, ",") != tc.want || scale != tc.scale {
			t.Errorf("%q: %v, scale %v, %v; want %s, scale %v", tc.names, names, scale, err, tc.want, tc.scale)
		}
	}
	if _, _, err := selectScenarios([]*benchsuite.Scenario{{Name: "scale", Dir: "x/scale"}}, ""); err == nil {
		t.Error("a scenario named scale was accepted")
	}
}

func TestRunFlags(t *testing.T) {
	scenarios := filepath.Join("..", "..", "bench", "scenarios")
	var out, errOut bytes.Buffer
	if err := run([]string{"--scenarios", scenarios, "--list"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "mixed-gpu") || !strings.Contains(out.String(), "fleet h100:2,a10g:2") {
		t.Errorf("--list:\n%s", out.String())
	}
	for args, want := range map[string]string{
		"--scenarios " + scenarios + " --engine bogus":                              `--engine "bogus" is not real-time or virtual`,
		"--scenarios " + scenarios + " --scale":                                     "virtual time only",
		"--scenarios " + scenarios + " --engine virtual --scale-sizes 8,0 --scale":  "--scale-sizes",
		"--scenarios " + scenarios + " --scenario nope":                             `no scenario "nope"`,
		"--scenarios " + scenarios + " --bin " + t.TempDir():                        "run make build",
		"--scenarios " + scenarios + " --seeds 1,2":                                 "virtual time only",
		"--scenarios " + scenarios + " --engine virtual --seeds 1,x":                `"x" is not a seed`,
		"--scenarios " + scenarios + " --engine virtual --seeds 3,3":                "seed 3 twice",
		"--scenarios " + scenarios + " --engine virtual --scenario scale --seeds 1": "the scale study has no seed sweep",
		"--duration -1s": "must not be negative",
		"extra":          "unexpected arguments",
	} {
		err := run(append(strings.Fields(args), "--out", t.TempDir()), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--compare", t.TempDir()}, "--compare takes two suite output folders"},
		{[]string{"--compare", t.TempDir(), t.TempDir()}, "not a suite's output folder"},
		{[]string{"--compare", "--threshold", "-1", t.TempDir(), t.TempDir()}, "threshold must not be negative"},
	} {
		if err := run(tc.args, &out, &errOut); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestRunVirtual runs one short scenario, a two-size scale study and a two-seed sweep end to end in virtual time and
// checks the report has all three.
func TestRunVirtual(t *testing.T) {
	scenarios := filepath.Join("..", "..", "bench", "scenarios")
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"--scenarios", scenarios, "--engine", "virtual", "--scenario", "uniform-steady,scale",
		"--duration", "2s", "--scale-sizes", "2,4", "--scale-duration", "1s", "--seeds", "1,2", "--out", out}
	if err := run(args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	report, err := os.ReadFile(filepath.Join(out, benchsuite.ReportFileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Engine: virtual", "## Scale", "| 4 | 30 req/s |", "(`uniform-steady`)", "scale/scale.svg",
		"## Across seeds", "| uniform-steady | TTFT P99 | ", "| uniform-steady | every figure vs round-robin no worse by more than 5% | "} {
		if !strings.Contains(string(report), want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if !strings.Contains(stdout.String(), "## Scale") {
		t.Errorf("the headline lacks the scale study:\n%s", stdout.String())
	}
}
