package conformance

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Difference is an intended difference between Sluice and upstream's EPP:
// in Cases (every case when empty), Aspects are observed differently on
// Implementations, for Reason.
type Difference struct {
	ID              string
	Cases, Aspects  []string
	Implementations []string
	Reason          string
}

func (d Difference) covers(id, aspect, impl string) bool {
	return (len(d.Cases) == 0 || slices.Contains(d.Cases, id)) && slices.Contains(d.Aspects, aspect) &&
		slices.Contains(d.Implementations, impl)
}

// Differences is Sluice's compatibility statement: every observable way in
// which Sluice's EPP, with its defaults or with every feature on, behaves
// differently from upstream's v1.5.0 EPP in this profile, and why. The
// differential fails on any difference not listed here and on any entry
// that no longer differs, so the list stays exact.
var Differences = []Difference{
	{
		ID: "D1", Aspects: []string{"body", "content-type"}, Implementations: []string{Sluice, SluiceAll},
		Reason: "Errors the EPP answers itself carry an OpenAI-style JSON body ({\"error\":{\"message\",\"type\",...}}) " +
			"with content-type application/json, which OpenAI clients and SDKs parse; upstream sends its error text as a " +
			"plain body without a content type. The status codes are upstream's.",
	},
	{
		ID: "D2", Cases: []string{"EndpointPicker/BodyOverLimit"}, Aspects: []string{"outcome", "status", "retry-after"},
		Implementations: []string{Sluice, SluiceAll},
		Reason: "Sluice holds a request's body while it chooses the model (InferenceModelRewrites) and bounds what it holds " +
			"(--model-selection-max-body-bytes, 64 MiB): a larger body gets 413. Upstream buffers any body and routes it.",
	},
	{
		ID: "D3", Cases: []string{"InferenceObjectives/SheddableRejectedUnderLoad", "InferenceObjectives/PriorityChangedLive",
			"PoolMembership/NoReadyEndpoint"},
		Aspects: []string{"retry-after"}, Implementations: []string{SluiceAll},
		Reason: "Sluice admission's own answers (429 for a shed request, 503 when no endpoint can take it, e.g. none is " +
			"Ready) carry a Retry-After computed from how fast the pool drains, and x-sluice-shed-reason, so clients back " +
			"off for as long as needed; upstream's 429 and 503 have no Retry-After.",
	},
	{
		ID: "D4", Cases: []string{"ModelServerMetrics/NoEndpointMetrics"}, Aspects: []string{"outcome", "status", "retry-after"},
		Implementations: []string{SluiceAll},
		Reason: "Sluice admission dispatches only onto endpoints whose load it has read within the policy's " +
			"metricsStalenessThreshold (200 ms by default): requests wait for late metrics, and once no endpoint of the " +
			"pool has been scraped for ten thresholds (2 s) it answers 503 with Retry-After rather than route without " +
			"knowing the load. Upstream routes on the last metrics it read.",
	},
}

// Finding is a case an implementation fails, known and kept: a defect to
// fix (in Sluice) or to report (upstream). The suite reports the case as
// failed and does not fail the run; it fails once the case passes, so the
// entry is removed with the fix.
type Finding struct {
	ID             string
	Implementation string
	Case           string
	Summary        string
}

// Findings lists the known failures.
var Findings = []Finding{
	{
		ID: "U1", Implementation: Upstream, Case: "DataParallel/SubsetHintNamesOneRank",
		Summary: "upstream's subset filter (pkg/epp/requestcontrol/candidates.go) matches the hint's IP only and drops " +
			"the port, so on a data-parallel pool a hint naming one rank (ip:port) can be routed to a sibling rank on the " +
			"same IP, against proposal 004's \"MUST only select endpoints from the specified list\".",
	},
	{
		ID: "S1", Implementation: Sluice, Case: "DataParallel/SubsetHintNamesOneRank",
		Summary: "Sluice inherits U1: it uses upstream's endpoint candidates for the subset hint.",
	},
	{
		ID: "S2", Implementation: SluiceAll, Case: "DataParallel/SubsetHintNamesOneRank",
		Summary: "Sluice inherits U1 with every feature on too.",
	},
}

func findingFor(impl, id string) (Finding, bool) {
	i := slices.IndexFunc(Findings, func(f Finding) bool { return f.Implementation == impl && f.Case == id })
	if i < 0 {
		return Finding{}, false
	}
	return Findings[i], true
}

func differenceFor(intended []Difference, id, aspect, impl string) (Difference, bool) {
	i := slices.IndexFunc(intended, func(d Difference) bool { return d.covers(id, aspect, impl) })
	if i < 0 {
		return Difference{}, false
	}
	return intended[i], true
}

// Divergence is one observation that differs from the reference's.
type Divergence struct {
	Implementation, Case, Aspect string
	Reference, Observed          string
	// Intended is the listed difference that explains it; nil when none does.
	Intended *Difference
}

// Differential compares every implementation's observations with the
// reference implementation's, case by case (cases either side failed are
// left out: their observations are incomplete). It returns the divergences
// and, for compatible implementations, the problems: divergences intended
// (the suite passes Differences) does not explain, and listed differences
// that did not occur although a case they cover observed their aspect on
// both sides.
func Differential(results []Result, impls []Implementation, intended []Difference) (divs []Divergence, problems []string) {
	ri := slices.IndexFunc(impls, func(i Implementation) bool { return i.Reference })
	if ri < 0 {
		return nil, nil
	}
	ref := impls[ri].Name
	byKey := map[[2]string]Result{}
	for _, r := range results {
		byKey[[2]string{r.Implementation, r.Case}] = r
	}
	occurred := map[string]bool{}     // difference ID/implementation
	compared := map[string][]string{} // implementation/case (both passed) -> the aspects either observed
	for _, impl := range impls {
		if impl.Reference {
			continue
		}
		for _, r := range results {
			rr, ok := byKey[[2]string{ref, r.Case}]
			if r.Implementation != impl.Name || !ok || !rr.Passed() || !r.Passed() {
				continue
			}
			compared[impl.Name+"/"+r.Case] = aspects(rr.Observed, r.Observed)
			for _, aspect := range aspects(rr.Observed, r.Observed) {
				want, got := valueOr(rr.Observed, aspect), valueOr(r.Observed, aspect)
				if want == got {
					continue
				}
				div := Divergence{Implementation: impl.Name, Case: r.Case, Aspect: aspect, Reference: want, Observed: got}
				if d, ok := differenceFor(intended, r.Case, aspect, impl.Name); ok {
					div.Intended = &d
					occurred[d.ID+"/"+impl.Name] = true
				} else if impl.Compatible {
					problems = append(problems, fmt.Sprintf("%s: %s %s is %q, but %q on %s, and Differences does not list it",
						impl.Name, r.Case, aspect, got, want, ref))
				}
				divs = append(divs, div)
			}
		}
	}
	for _, d := range intended {
		for _, name := range d.Implementations {
			i := slices.IndexFunc(impls, func(im Implementation) bool { return im.Name == name })
			if i < 0 || !impls[i].Compatible || occurred[d.ID+"/"+name] {
				continue
			}
			for _, r := range results {
				observed := compared[name+"/"+r.Case]
				if slices.ContainsFunc(d.Aspects, func(a string) bool { return slices.Contains(observed, a) }) &&
					(len(d.Cases) == 0 || slices.Contains(d.Cases, r.Case)) {
					problems = append(problems, fmt.Sprintf("difference %s (%s on %s) did not occur: remove it from Differences",
						d.ID, strings.Join(d.Aspects, ", "), name))
					break
				}
			}
		}
	}
	return divs, problems
}

func aspects(a, b map[string]string) []string {
	set := map[string]bool{}
	for k := range a {
		set[k] = true
	}
	for k := range b {
		set[k] = true
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func valueOr(m map[string]string, k string) string {
	if v, ok := m[k]; ok {
		return v
	}
	return "(not observed)"
}
