package conformance

import (
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// Groups is the profile, in the order its groups run.
var Groups = []Group{
	startupGroup,
	endpointPickerGroup,
	fallbackGroup,
	poolMembershipGroup,
	dataParallelGroup,
	objectivesGroup,
	modelRewritesGroup,
	modelServerMetricsGroup,
	healthGroup,
	gatewayManifestGroup,
	hostileGroup,
}

// Run runs every group against every implementation, one implementation
// after the other (side by side they would load each other's EPPs, and a
// starved EPP scrapes its model servers late), and returns the results. A
// case that fails fails t unless Findings lists it for that implementation
// (then a pass fails t: the finding is stale). Fixture failures (an EPP
// that does not start for a group's cases) fail t at once.
func Run(t *testing.T, api *runnertest.APIServer, impls []Implementation) []Result {
	t.Helper()
	var results []Result
	for _, impl := range impls {
		t.Run(impl.Name, func(t *testing.T) {
			env := &Env{Impl: impl, API: api}
			crds := false
			for _, g := range Groups {
				if !g.GIECRDsOnly && !crds && len(impl.CRDs) > 0 {
					api.InstallCRDs(t, impl.CRDs...)
					crds = true
				}
				t.Run(g.Name, func(t *testing.T) {
					f := newFixture(t, env, g.Name, g.Fixture)
					for _, c := range g.Cases {
						t.Run(c.Name, func(t *testing.T) {
							r := runCase(t, impl.Name, g.ID(c), c, f)
							judge(t, r)
							results = append(results, r)
						})
					}
				})
			}
		})
	}
	return results
}

// judge fails t for an unexpected failure, and for an expected one that no
// longer happens.
func judge(t *testing.T, r Result) {
	t.Helper()
	finding, known := findingFor(r.Implementation, r.Case)
	switch {
	case !r.Passed() && known:
		t.Logf("known finding %s: %s (%s)", finding.ID, finding.Summary, r.summary())
	case !r.Passed():
		t.Errorf("%s", r.summary())
	case known:
		t.Errorf("passes, but finding %s says it fails: remove the finding from Findings", finding.ID)
	}
}
