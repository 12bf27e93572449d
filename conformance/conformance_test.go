package conformance

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

var (
	eppFlag       = flag.String("epp", "", "EPP binary to test (any EPP that takes upstream's flags); default: the binaries `make conformance` builds")
	eppArgsFlag   = flag.String("epp-args", "", "extra flags for -epp, space-separated")
	eppNameFlag   = flag.String("epp-name", "epp", "name of -epp in reports")
	referenceFlag = flag.String("reference-epp", "", "with -epp: upstream's EPP binary, to compare -epp with")
	reportDirFlag = flag.String("report-dir", "", "directory for conformance-report-<implementation>.yaml and conformance-table.md (default: a temporary one)")
)

// TestEPPProfile runs the EPP conformance profile against the selected
// implementations on a real API server, checks the differential against
// upstream's EPP and writes the reports.
func TestEPPProfile(t *testing.T) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/sluice-gw/sluice").Output()
	if err != nil {
		t.Fatalf("locating Sluice's repository: %v", err)
	}
	impls, err := Selection{EPP: *eppFlag, EPPArgs: *eppArgsFlag, EPPName: *eppNameFlag, Reference: *referenceFlag,
		SluiceRoot: strings.TrimSpace(string(root))}.Implementations()
	if err != nil {
		t.Fatal(err)
	}
	api := runnertest.StartAPIServer(t, nil, v1alpha2.Install)
	start := time.Now()
	results := Run(t, api, impls)
	divs, problems := Differential(results, impls, Differences)
	for _, p := range problems {
		t.Error(p)
	}
	dir := *reportDirFlag
	if dir == "" {
		dir = t.TempDir()
	}
	if err := WriteReports(dir, results, impls, divs, time.Now()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d results in %v; reports in %s\n%s", len(results), time.Since(start).Round(time.Second), dir, Table(results, impls, divs))
}

// TestNoImplementationFails: with nothing to test, the suite fails instead
// of passing having tested nothing.
func TestNoImplementationFails(t *testing.T) {
	_, err := Selection{Getenv: func(string) string { return "" }}.Implementations()
	if !errors.Is(err, ErrNoImplementation) {
		t.Fatalf("Implementations() = %v, want ErrNoImplementation", err)
	}
	_, err = Selection{EPP: filepath.Join(t.TempDir(), "missing")}.Implementations()
	if err == nil {
		t.Fatal("a missing -epp binary was accepted")
	}
}

// TestSelection: the environment `make test` sets gives the three
// implementations; -epp gives that one, compared with -reference-epp.
func TestSelection(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "epp")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SLUICE_EPP_BINARY": bin, "SLUICE_UPSTREAM_EPP_BINARY": bin}
	impls, err := Selection{Getenv: func(k string) string { return env[k] }}.Implementations()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, im := range impls {
		names = append(names, im.Name)
	}
	if got := strings.Join(names, ","); got != Upstream+","+Sluice+","+SluiceAll || !impls[0].Reference || !impls[2].Compatible {
		t.Errorf("implementations %s (%+v)", got, impls)
	}
	impls, err = Selection{EPP: bin, EPPArgs: "--a --b=1", EPPName: "mine", Reference: bin}.Implementations()
	if err != nil || len(impls) != 2 || impls[1].Name != "mine" || len(impls[1].Args) != 2 || impls[1].Compatible {
		t.Errorf("-epp selection: %+v, %v", impls, err)
	}
}

// TestCitations checks that every case cites a line that says what the
// case claims it says, in the module versions go.mod pins.
func TestCitations(t *testing.T) {
	dirs := map[string]string{}
	for _, m := range []string{"", "conformance"} {
		path := "sigs.k8s.io/gateway-api-inference-extension"
		if m != "" {
			path += "/" + m
		}
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path).Output()
		if err != nil {
			t.Fatalf("locating %s: %v", path, err)
		}
		dirs[m] = strings.TrimSpace(string(out))
	}
	seen := map[string]bool{}
	for _, g := range Groups {
		for _, c := range g.Cases {
			id := g.ID(c)
			if seen[id] {
				t.Errorf("%s: duplicate case", id)
			}
			seen[id] = true
			if c.Requirement == "" || c.Profile == "" {
				t.Errorf("%s: no requirement or profile", id)
			}
			data, err := os.ReadFile(filepath.Join(dirs[c.Ref.Module], c.Ref.Path))
			if err != nil {
				t.Errorf("%s: %v", id, err)
				continue
			}
			lines := strings.Split(string(data), "\n")
			if c.Ref.Line < 1 || c.Ref.Line > len(lines) || c.Ref.Quote == "" || !strings.Contains(lines[c.Ref.Line-1], c.Ref.Quote) {
				t.Errorf("%s cites %s for %q, which is not on that line", id, c.Ref, c.Ref.Quote)
			}
		}
	}
	for _, d := range Differences {
		for _, c := range d.Cases {
			if !seen[c] {
				t.Errorf("difference %s names unknown case %q", d.ID, c)
			}
		}
		if d.Reason == "" || d.ID == "" || len(d.Aspects) == 0 || len(d.Implementations) == 0 {
			t.Errorf("difference %+v lacks an ID, aspects, implementations or a reason", d)
		}
	}
	for _, f := range Findings {
		if !seen[f.Case] || f.Summary == "" {
			t.Errorf("finding %s names case %q (unknown) or has no summary", f.ID, f.Case)
		}
	}
}

// TestDifferential: an unlisted divergence and a listed difference that
// did not occur are both problems; a listed one that occurred is not.
func TestDifferential(t *testing.T) {
	impls := []Implementation{{Name: "ref", Reference: true}, {Name: "s", Compatible: true}, {Name: "other"}}
	res := func(impl, id string, obs map[string]string, failures ...string) Result {
		return Result{Implementation: impl, Case: id, Observed: obs, Failures: failures}
	}
	results := []Result{
		res("ref", "G/A", map[string]string{"status": "503", "body": "text"}),
		res("s", "G/A", map[string]string{"status": "503", "body": "openai-error-json"}),
		res("other", "G/A", map[string]string{"status": "500", "body": "text"}),
		res("ref", "G/B", map[string]string{"status": "429"}),
		res("s", "G/B", map[string]string{"status": "429"}),
		res("ref", "G/C", map[string]string{"x": "1"}),
		res("s", "G/C", map[string]string{"x": "2"}, "failed"),
	}
	intended := []Difference{
		{ID: "D1", Aspects: []string{"body"}, Implementations: []string{"s"}, Reason: "JSON"},
		{ID: "D2", Cases: []string{"G/B"}, Aspects: []string{"status"}, Implementations: []string{"s"}, Reason: "stale"},
	}
	divs, problems := Differential(results, impls, intended)
	if len(divs) != 2 || divs[0].Intended == nil || divs[0].Intended.ID != "D1" || divs[1].Implementation != "other" || divs[1].Intended != nil {
		t.Errorf("divergences %+v", divs)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "D2") {
		t.Errorf("problems %q, want only the stale D2 (other is not compatible; G/C failed)", problems)
	}
	_, problems = Differential(results, impls, intended[1:])
	if len(problems) != 2 {
		t.Errorf("without D1: problems %q, want the unlisted body difference and stale D2", problems)
	}
	table := Table(results, impls, divs)
	for _, want := range []string{"| G/A |", "pass (D1)", "≠ status: 500", "**FAIL**"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestReportShape: the YAML report has upstream's shape and counts.
func TestReportShape(t *testing.T) {
	impl := Implementation{Name: Sluice, Compatible: true, Version: "v9"}
	results := []Result{
		{Implementation: Sluice, Case: "G/A", Profile: EPPProfile},
		{Implementation: Sluice, Case: "G/B", Profile: EPPProfile, Failures: []string{"x"}},
		{Implementation: Sluice, Case: "M/A", Profile: ModelServerProfile},
	}
	r := Report(impl, results, time.Unix(0, 0))
	if r.GatewayAPIInferenceExtensionVersion != GIEVersion || r.Kind != "ConformanceReport" || r.Implementation.Version != "v9" {
		t.Errorf("report header %+v", r)
	}
	if len(r.ProfileReports) != 2 {
		t.Fatalf("profiles %+v", r.ProfileReports)
	}
	epp := r.ProfileReports[0]
	if epp.Name != "EPP" || epp.Core.Passed != 1 || epp.Core.Failed != 1 || epp.Core.Result != "failure" || epp.Core.FailedTests[0] != "G/B" {
		t.Errorf("EPP profile %+v", epp)
	}
	if ms := r.ProfileReports[1]; ms.Name != "ModelServer" || ms.Core.Result != "success" {
		t.Errorf("ModelServer profile %+v", ms)
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil || strings.TrimSpace(string(out)) != GatewayAPIVersion {
		t.Errorf("go.mod has Gateway API %q (%v), reports say %s", out, err, GatewayAPIVersion)
	}
}
