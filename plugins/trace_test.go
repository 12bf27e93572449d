package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// TestTracedSchedulerConfigIsUpstreams: the traced configuration has upstream's profiles exactly (filters in order,
// scorers with their weights, the picker), for Sluice's default profile, upstream's default and a profile with an
// unweighted scorer.
func TestTracedSchedulerConfigIsUpstreams(t *testing.T) {
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
			raw, handle, cfg := loadEndpointPickerConfig(t, tt.config)
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
	// Admission's count there includes the untraced request before it and this one, both dispatched and not released.
	wantAdmission := &decisiontrace.Admission{Tenant: "tenant", Band: "Standard", Outcome: "dispatched", Headroom: []string{"10.0.0.2:8000"},
		Reserved: "10.0.0.2:8000", Counts: []decisiontrace.EndpointCount{{Endpoint: "10.0.0.2:8000", InFlight: 2}}}
	if !reflect.DeepEqual(r.Admission, wantAdmission) {
		t.Errorf("admission %+v, want %+v", r.Admission, wantAdmission)
	}
	if len(r.Profiles) != 1 {
		t.Fatalf("profiles %+v, want one", r.Profiles)
	}
	prof := r.Profiles[0]
	wantFilters := []decisiontrace.Filter{
		{Plugin: ServedModelFilterType, Kept: 1, Removed: []string{"10.0.0.2:8000"}},
		{Plugin: OutlierFilterType, Kept: 1},  // no server failed
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

// TestTraceMatchesTheDecision routes requests over seeded random pools of two base models, traced and untraced, and
// holds every record to what the scheduler did: the endpoint it names is the one the request went to and the one
// the untraced scheduler picks; each filter's removals, in order, are what that filter removes when called itself,
// and the served-model filter's are the other model's servers; the headroom filter removed no endpoint admission
// found headroom on; every scorer's score is the scorer's own (for the stateless ones, called again); each total is
// the weighted sum of the clamped scores; and the pick is the highest total. Whenever a server of the requested model
// exists the request goes to one, even when only another model's servers have headroom (the mixed-model regression
// of TestDefaultProfileRoutesToServersOfTheRequestedModel, over random pools).
func TestTraceMatchesTheDecision(t *testing.T) {
	const seed, pools = 18, 40
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 4))
	for i := range pools {
		models := []string{"base", "other"}
		// Distinct queues, so the picker has no tie to break at random, and one idle server, so admission
		// dispatches at once.
		waiting := rng.Perm(60)[:2+rng.IntN(6)]
		if !slices.Contains(waiting, 0) {
			waiting[rng.IntN(len(waiting))] = 0
		}
		servers := make([]modelServer, len(waiting))
		for j := range servers {
			servers[j] = modelServer{fmt.Sprintf("10.0.0.%d", j+1), models[rng.IntN(2)], waiting[j]}
		}
		model := models[rng.IntN(2)]
		t.Run(fmt.Sprintf("pool %d", i), func(t *testing.T) {
			p := newDefaultProfilePool(t, servers)
			traced, err := TracedSchedulerConfig(p.raw.SchedulingProfiles, p.plugins)
			if err != nil {
				t.Fatal(err)
			}
			rec, err := decisiontrace.New(decisiontrace.Config{Size: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, tr := rec.Start(t.Context())
			tr.Begin("req", false)
			got, err := p.route(ctx, t, scheduling.NewSchedulerWithConfig(traced), "req", model)
			if err != nil {
				t.Fatal(err)
			}
			tr.Routed(got)
			req := &fwksched.LLMRequest{RequestId: "req", TargetModel: model, Headers: map[string]string{}, RequestSizeBytes: 100,
				Body: &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: "hello"}}}}
			untraced, err := p.scheduler.Schedule(t.Context(), req, p.candidates) // the same admission decision
			if err != nil {
				t.Fatal(err)
			}
			want := EndpointName(untraced.ProfileResults[untraced.PrimaryProfileName].TargetEndpoints[0].GetMetadata())

			records := rec.Records("", 0)
			if len(records) != 1 || len(records[0].Profiles) != 1 {
				t.Fatalf("records %+v, want one of one profile", records)
			}
			r, prof := records[0], records[0].Profiles[0]
			js, _ := json.MarshalIndent(r, "", " ")
			t.Logf("servers %+v, model %s; record\n%s", servers, model, js)
			if got != want || r.Endpoint != got || !reflect.DeepEqual(prof.Picked, []string{got}) {
				t.Errorf("traced request went to %s, untraced to %s; record says %s, picked %v", got, want, r.Endpoint, prof.Picked)
			}
			if r.Model != model || r.Admission == nil || r.Admission.Outcome != "dispatched" {
				t.Errorf("record of model %q, admission %+v; want %q, dispatched", r.Model, r.Admission, model)
			}

			// Filters: each one's removals are what it removes itself, in the profile's order.
			remaining := p.candidates
			var wantFilters []decisiontrace.Filter
			for _, ref := range p.raw.SchedulingProfiles[0].Plugins {
				f, ok := p.plugins[ref.PluginRef].(fwksched.Filter)
				if !ok {
					continue
				}
				kept := f.Filter(t.Context(), fwksched.NewCycleState(), req, remaining)
				wf := decisiontrace.Filter{Plugin: ref.PluginRef, Kept: len(kept)}
				for _, ep := range remaining {
					if !slices.Contains(kept, ep) {
						wf.Removed = append(wf.Removed, EndpointName(ep.GetMetadata()))
					}
				}
				wantFilters = append(wantFilters, wf)
				remaining = kept
			}
			if !reflect.DeepEqual(prof.Filters, wantFilters) {
				t.Errorf("filters %+v, want %+v", prof.Filters, wantFilters)
			}
			var otherModel []string
			serves := false
			for _, s := range servers {
				if s.model != model {
					otherModel = append(otherModel, s.address+":8000")
				} else {
					serves = true
				}
			}
			if len(prof.Filters) != 3 || prof.Filters[0].Plugin != ServedModelFilterType || prof.Filters[1].Plugin != OutlierFilterType ||
				prof.Filters[2].Plugin != HeadroomFilterType {
				t.Fatalf("filters %+v, want the served-model filter, the outlier filter, then the headroom filter", prof.Filters)
			}
			if serves && slices.Contains(otherModel, got) {
				t.Errorf("a request for %s went to %s, a server of another model", model, got)
			}
			if serves && !slices.Equal(prof.Filters[0].Removed, otherModel) {
				t.Errorf("served-model filter removed %v, want the servers of other models %v", prof.Filters[0].Removed, otherModel)
			}
			for _, removed := range prof.Filters[1].Removed {
				if slices.Contains(r.Admission.Headroom, removed) {
					t.Errorf("headroom filter removed %s, which had headroom (%v)", removed, r.Admission.Headroom)
				}
			}

			// Scores: the scorers' own, weighed as the scheduler weighs them, and the pick is the best total.
			if len(prof.Endpoints) != len(remaining) {
				t.Fatalf("%d endpoints scored, want the %d the filters left", len(prof.Endpoints), len(remaining))
			}
			for _, stateless := range []string{"queue-scorer", "kv-cache-utilization-scorer"} {
				own := p.plugins[stateless].(fwksched.Scorer).Score(t.Context(), fwksched.NewCycleState(), req, remaining)
				for ep, s := range own {
					name := EndpointName(ep.GetMetadata())
					i := slices.IndexFunc(prof.Endpoints, func(e decisiontrace.EndpointScores) bool { return e.Endpoint == name })
					if i < 0 || prof.Endpoints[i].Scores[stateless] != s {
						t.Errorf("%s scored %s %v; the record says %+v", stateless, name, s, prof.Endpoints)
					}
				}
			}
			for _, e := range prof.Endpoints {
				var total float64
				for _, s := range prof.Scorers {
					total += s.Weight * min(max(e.Scores[s.Plugin], 0), 1)
				}
				if math.Abs(total-e.Total) > 1e-9 {
					t.Errorf("%s: total %v, want the weighted sum of its scores %v", e.Endpoint, e.Total, total)
				}
			}
			if prof.Endpoints[0].Endpoint != got {
				t.Errorf("the best total is %s's, but the request went to %s", prof.Endpoints[0].Endpoint, got)
			}
		})
	}
}

// TestTraceRecordsTheQueueWait: a traced request that waits in its band's queue is recorded with the time it waited,
// on the adapter's clock: dispatched when headroom returns, and rejected with its reason and Retry-After when its
// band's queue time runs out.
func TestTraceRecordsTheQueueWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := flowcontrol.DefaultConfig()
		cfg.Bands[flowcontrol.Standard].MaxQueueTime = 2 * time.Second
		pool := &fakePool{}
		fc, clk := newTestFlowControl(t, cfg, pool)
		saturated := func() {
			pool.set(upstreamEndpoint("10.0.0.1", 40, 0.2, clk.Now().Add(time.Hour))) // saturated in both tiers
			if err := fc.SyncEndpoints(); err != nil {
				t.Fatal(err)
			}
		}
		rec, err := decisiontrace.New(decisiontrace.Config{Size: 4, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		// admit starts request id's admission, traced, and returns a function that waits for it and commits its record.
		admit := func(id string) func() error {
			ctx, tr := rec.Start(context.Background())
			tr.Begin(id, false)
			done := make(chan error, 1)
			go func() { done <- fc.Admit(ctx, requestContext(id, "tenant", 100, nil), 0) }()
			synctest.Wait()
			return func() error {
				err := <-done
				tr.End()
				return err
			}
		}

		saturated()
		waited := admit("waited")
		clk.Step(1500 * time.Millisecond)
		pool.set(upstreamEndpoint("10.0.0.1", 0, 0.1, clk.Now().Add(time.Hour)))
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		if err := waited(); err != nil {
			t.Fatalf("the request that waited was not dispatched: %v", err)
		}

		fc.ctrl.Release("waited")
		saturated()
		timedOut := admit("timed-out")
		clk.Step(2 * time.Second)
		synctest.Wait()
		if err := timedOut(); err == nil {
			t.Fatal("the request past its queue time was dispatched")
		}

		want := map[string]decisiontrace.Admission{
			"waited": {Tenant: "tenant", Band: "Standard", Outcome: "dispatched", WaitSeconds: 1.5, Headroom: []string{"10.0.0.1:8000"},
				Reserved: "10.0.0.1:8000", Counts: []decisiontrace.EndpointCount{{Endpoint: "10.0.0.1:8000", InFlight: 1}}},
			"timed-out": {Tenant: "tenant", Band: "Standard", Outcome: "rejected", Reason: "queue_timeout", WaitSeconds: 2},
		}
		for id, w := range want {
			recs := rec.Records(id, 0)
			if len(recs) != 1 || recs[0].Admission == nil {
				t.Fatalf("records of %s: %+v", id, recs)
			}
			got := *recs[0].Admission
			if id == "timed-out" {
				if got.RetryAfterSeconds < 1 {
					t.Errorf("%s: Retry-After %d, want at least 1", id, got.RetryAfterSeconds)
				}
				got.RetryAfterSeconds = 0
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("%s: admission %+v, want %+v", id, got, w)
			}
		}
	})
}
