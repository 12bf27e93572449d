package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/go-logr/logr"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/decisiontrace"
)

// TestTracedSchedulerConfigIsUpstreams: the traced configuration has upstream's profiles exactly (filters in order,
// scorers with their weights, the picker), for Sluice's default profile, upstream's default and a profile with an
// unweighted scorer.
func TestTracedSchedulerConfigIsUpstreams(t *testing.T) {
	reg, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	reg.InstallMissing()
	sluiceDefault, err := DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, config string }{
		{"Sluice's default profile", sluiceDefault},
		{"upstream's default", ""},
		{"an unweighted scorer and no picker", `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: ` + ServedModelFilterType + `
- type: ` + LoRAResidencyExtractorType + `
- type: metrics-data-source
schedulingProfiles:
- name: only
  plugins:
  - pluginRef: ` + ServedModelFilterType + `
  - pluginRef: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: ` + LoRAResidencyExtractorType + `
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, _, err := loader.LoadRawConfig([]byte(tt.config), logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			handle := fwkplugin.NewEppHandle(t.Context(), func() []k8stypes.NamespacedName { return nil })
			cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
			if err != nil {
				t.Fatal(err)
			}
			traced, err := TracedSchedulerConfig(raw.SchedulingProfiles, handle.GetAllPluginsWithNames())
			if err != nil {
				t.Fatal(err)
			}
			if got, want := traced.String(), cfg.SchedulerConfig.String(); got != want {
				t.Fatalf("traced configuration\n%s\nis not upstream's\n%s", got, want)
			}
		})
	}
	if _, err := TracedSchedulerConfig(nil, map[string]fwkplugin.Plugin{}); err == nil {
		t.Error("a configuration without a profile handler was accepted")
	}
}

// TestTracedSchedulingRecordsTheDecision routes one request through Sluice admission and the traced default profile
// and checks its record names the band, the headroom, what each filter removed, each scorer's score, the totals and
// the endpoint; the pick is the untraced scheduler's, and a request that is not traced records nothing.
func TestTracedSchedulingRecordsTheDecision(t *testing.T) {
	// 10.0.0.1 serves base without headroom; 10.0.0.2 serves another model and has headroom.
	p := newDefaultProfilePool(t, []modelServer{{"10.0.0.1", "base", 50}, {"10.0.0.2", "other", 0}})
	traced, err := TracedSchedulerConfig(p.raw.SchedulingProfiles, p.plugins)
	if err != nil {
		t.Fatal(err)
	}
	sched := scheduling.NewSchedulerWithConfig(traced)
	rec, err := decisiontrace.New(decisiontrace.Config{Size: 4})
	if err != nil {
		t.Fatal(err)
	}

	untraced, err := p.route(t.Context(), t, p.scheduler, "plain", "base")
	if err != nil {
		t.Fatal(err)
	}
	ctx, tr := rec.Start(t.Context())
	tr.Begin("traced", false)
	got, err := p.route(ctx, t, sched, "traced", "base")
	if err != nil {
		t.Fatal(err)
	}
	if got != untraced || got != "10.0.0.1:8000" {
		t.Fatalf("traced request went to %s, untraced to %s; want 10.0.0.1:8000", got, untraced)
	}
	tr.Routed(got)

	records := rec.Records("", 0)
	if len(records) != 1 {
		t.Fatalf("records %+v, want one", records)
	}
	r := records[0]
	if r.RequestID != "traced" || r.Model != "base" || r.Outcome != decisiontrace.Routed || r.Endpoint != "10.0.0.1:8000" {
		t.Errorf("record %+v", r)
	}
	wantAdmission := &decisiontrace.Admission{Tenant: "tenant", Band: "Standard", Outcome: "dispatched", Headroom: []string{"10.0.0.2:8000"}}
	if !reflect.DeepEqual(r.Admission, wantAdmission) {
		t.Errorf("admission %+v, want %+v", r.Admission, wantAdmission)
	}
	if len(r.Profiles) != 1 {
		t.Fatalf("profiles %+v, want one", r.Profiles)
	}
	prof := r.Profiles[0]
	wantFilters := []decisiontrace.Filter{
		{Plugin: ServedModelFilterType, Kept: 1, Removed: []string{"10.0.0.2:8000"}},
		{Plugin: HeadroomFilterType, Kept: 1}, // no server of base has headroom: the filter passes them all
	}
	if prof.Name != "default" || !reflect.DeepEqual(prof.Candidates, []string{"10.0.0.1:8000", "10.0.0.2:8000"}) ||
		!reflect.DeepEqual(prof.Filters, wantFilters) || !reflect.DeepEqual(prof.Picked, []string{"10.0.0.1:8000"}) {
		js, _ := json.MarshalIndent(prof, "", " ")
		t.Errorf("profile %s\nwant filters %+v", js, wantFilters)
	}
	wantScorers := []decisiontrace.Scorer{{Plugin: SaturationScorerType, Weight: 2}, {Plugin: "queue-scorer", Weight: 2},
		{Plugin: "kv-cache-utilization-scorer", Weight: 2}, {Plugin: PrefixCacheType, Weight: 4}, {Plugin: LoRAAffinityType, Weight: 3}}
	if !reflect.DeepEqual(prof.Scorers, wantScorers) {
		t.Errorf("scorers %+v, want %+v", prof.Scorers, wantScorers)
	}
	if len(prof.Endpoints) != 1 || prof.Endpoints[0].Endpoint != "10.0.0.1:8000" || len(prof.Endpoints[0].Scores) != len(wantScorers) {
		t.Fatalf("endpoint scores %+v, want every scorer's for 10.0.0.1:8000", prof.Endpoints)
	}
	var total float64
	for _, s := range wantScorers {
		total += s.Weight * min(max(prof.Endpoints[0].Scores[s.Plugin], 0), 1)
	}
	if diff := total - prof.Endpoints[0].Total; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("total %v, want the weighted sum of the scores %v", prof.Endpoints[0].Total, total)
	}

	// Not traced: no trace in the context, or one Begin did not select.
	headerOnly, err := decisiontrace.New(decisiontrace.Config{Size: 4, Header: "x-trace"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, tr = headerOnly.Start(context.Background())
	tr.Begin("not-opted-in", false)
	for i, c := range []context.Context{t.Context(), ctx} {
		if _, err := p.route(c, t, sched, fmt.Sprint("untraced-", i), "base"); err != nil {
			t.Fatal(err)
		}
	}
	tr.Routed("10.0.0.1:8000")
	if n := len(rec.Records("", 0)) + len(headerOnly.Records("", 0)); n != 1 {
		t.Errorf("%d records, want only the traced request's", n)
	}
}
