package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/yaml"

	inferenceconformance "sigs.k8s.io/gateway-api-inference-extension/conformance"
)

// GIEVersion is the Gateway API Inference Extension release the profile
// checks against (go.mod pins it).
const GIEVersion = "v1.5.0"

// Report is the implementation's results in the shape of upstream's
// conformance report (GatewayAPIInferenceExtensionConformanceReport: a
// Gateway API ConformanceReport with one profile report per profile).
func Report(impl Implementation, results []Result, now time.Time) inferenceconformance.GatewayAPIInferenceExtensionConformanceReport {
	var profiles []confv1.ProfileReport
	for _, p := range []Profile{EPPProfile, ModelServerProfile} {
		var st confv1.Status
		var known []string
		for _, r := range results {
			if r.Implementation != impl.Name || r.Profile != p {
				continue
			}
			if r.Passed() {
				st.Passed++
				continue
			}
			st.Failed++
			st.FailedTests = append(st.FailedTests, r.Case)
			if f, ok := findingFor(r.Implementation, r.Case); ok {
				known = append(known, f.ID)
			}
		}
		st.Result = confv1.Success
		summary := "Core tests succeeded."
		if st.Failed > 0 {
			st.Result = confv1.Failure
			summary = fmt.Sprintf("Core tests failed with %d test failures.", st.Failed)
			if len(known) > 0 {
				summary += " Known findings: " + strings.Join(known, ", ") + "."
			}
		}
		profiles = append(profiles, confv1.ProfileReport{Name: string(p), Summary: summary, Core: st})
	}
	org, project, url := "sluice-gw", "sluice", "https://github.com/sluice-gw/sluice"
	switch {
	case impl.Reference:
		org, project, url = "kubernetes-sigs", "gateway-api-inference-extension", "https://github.com/kubernetes-sigs/gateway-api-inference-extension"
	case !impl.Compatible:
		org, project, url = "unknown", impl.Name, impl.Binary
	}
	version := impl.Version
	if version == "" {
		version = "unknown"
	}
	return inferenceconformance.GatewayAPIInferenceExtensionConformanceReport{
		GatewayAPIInferenceExtensionVersion: GIEVersion,
		ConformanceReport: confv1.ConformanceReport{
			TypeMeta: metav1.TypeMeta{APIVersion: confv1.GroupVersion.String(), Kind: "ConformanceReport"},
			Implementation: confv1.Implementation{
				Organization: org, Project: project, URL: url, Version: version,
				Contact: []string{url + "/issues"},
			},
			Date:              now.UTC().Format(time.RFC3339),
			GatewayAPIVersion: GatewayAPIVersion,
			GatewayAPIChannel: "standard",
			Mode:              impl.Name,
			ProfileReports:    profiles,
		},
	}
}

// GatewayAPIVersion is the Gateway API release GIE v1.5.0's conformance
// module is built on (go.mod; TestReportShape checks it).
const GatewayAPIVersion = "v1.5.1"

// Table is the Markdown table of cases x implementations: pass, FAIL, or
// FAIL (finding); a cell whose observations differ from the reference's
// names the differences (intended ones by ID, unexplained ones as "≠").
// The list of differences and findings follows.
func Table(results []Result, impls []Implementation, divs []Divergence) string {
	byKey := map[[2]string]Result{}
	var cases []string
	for _, r := range results {
		byKey[[2]string{r.Implementation, r.Case}] = r
		if !slices.Contains(cases, r.Case) {
			cases = append(cases, r.Case)
		}
	}
	var b strings.Builder
	b.WriteString("| case | checks |")
	for _, im := range impls {
		fmt.Fprintf(&b, " %s |", im.Name)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(impls)) + "\n")
	for _, id := range cases {
		var ref Ref
		for _, im := range impls {
			if r, ok := byKey[[2]string{im.Name, id}]; ok {
				ref = r.Ref
				break
			}
		}
		fmt.Fprintf(&b, "| %s | %s |", id, shortRef(ref))
		for _, im := range impls {
			r, ok := byKey[[2]string{im.Name, id}]
			cell := "not run"
			switch {
			case !ok:
			case r.Passed():
				cell = "pass"
			default:
				cell = "**FAIL**"
				if f, ok := findingFor(im.Name, id); ok {
					cell = "FAIL (" + f.ID + ")"
				}
			}
			var notes []string
			for _, d := range divs {
				if d.Implementation == im.Name && d.Case == id {
					if d.Intended != nil {
						notes = append(notes, d.Intended.ID)
					} else {
						notes = append(notes, fmt.Sprintf("≠ %s: %s", d.Aspect, d.Observed))
					}
				}
			}
			slices.Sort(notes)
			notes = slices.Compact(notes)
			if len(notes) > 0 {
				cell += " (" + strings.Join(notes, ", ") + ")"
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n## Intended differences (Sluice's compatibility statement)\n\n")
	for _, d := range Differences {
		cases := "every case"
		if len(d.Cases) > 0 {
			cases = strings.Join(d.Cases, ", ")
		}
		fmt.Fprintf(&b, "- **%s** (%s; %s; on %s): %s\n", d.ID, cases, strings.Join(d.Aspects, ", "),
			strings.Join(d.Implementations, ", "), d.Reason)
	}
	if len(Differences) == 0 {
		b.WriteString("None.\n")
	}
	b.WriteString("\n## Known findings\n\n")
	for _, f := range Findings {
		fmt.Fprintf(&b, "- **%s** %s fails %s: %s\n", f.ID, f.Implementation, f.Case, f.Summary)
	}
	if len(Findings) == 0 {
		b.WriteString("None.\n")
	}
	return b.String()
}

func shortRef(r Ref) string {
	p := r.Path
	switch {
	case strings.HasPrefix(p, "docs/proposals/"):
		p = strings.SplitN(strings.TrimPrefix(p, "docs/proposals/"), "-", 2)[0]
	case r.Module != "":
		p = r.Module + ":" + p
	}
	return fmt.Sprintf("%s:%d", p, r.Line)
}

// WriteReports writes conformance-report-<implementation>.yaml for each
// implementation and conformance-table.md into dir.
func WriteReports(dir string, results []Result, impls []Implementation, divs []Divergence, now time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, im := range impls {
		raw, err := yaml.Marshal(Report(im, results, now))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "conformance-report-"+im.Name+".yaml"), raw, 0o644); err != nil {
			return err
		}
	}
	table := "# EPP conformance: cases x implementations\n\nGateway API Inference Extension " + GIEVersion +
		", generated " + now.UTC().Format(time.RFC3339) + ".\n\n" + Table(results, impls, divs)
	return os.WriteFile(filepath.Join(dir, "conformance-table.md"), []byte(table), 0o644)
}
