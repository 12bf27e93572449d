package plugins

import (
	"context"
	"errors"
	"fmt"
	"slices"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// TracedSchedulerConfig builds the scheduler configuration that upstream's loader builds from profiles (the
// configuration's scheduling profiles after loader.InstantiateAndConfigure completed them) and the instantiated
// plugins, with every filter, scorer and picker of the profiles, and each profile, wrapped to add to the request's
// decisiontrace.Trace: the candidates, what each filter removed, each scorer's scores, the weighted totals and the
// pick. The wrappers call the plugins unchanged, and do nothing more for a request that is not traced.
//
// Upstream v1.5.0 exposes no hook that sees a profile's per-scorer scores or each filter's effect (its scheduling
// result holds only the picked endpoints), hence the wrapping. Only the scheduler sees the wrappers: the plugins
// themselves stay as they are for every other extension point and for Attach. The EPP uses this configuration only
// when the decision trace is on, so that off it runs upstream's own.
func TracedSchedulerConfig(profiles []configapi.SchedulingProfile, plugins map[string]fwkplugin.Plugin) (*scheduling.SchedulerConfig, error) {
	var handler fwksched.ProfileHandler
	for _, p := range plugins {
		if ph, ok := p.(fwksched.ProfileHandler); ok {
			if handler != nil {
				return nil, fmt.Errorf("multiple profile handlers: %s, %s", handler.TypedName(), ph.TypedName())
			}
			handler = ph
		}
	}
	if handler == nil {
		return nil, errors.New("no profile handler configured")
	}
	traced := make(map[string]fwksched.SchedulerProfile, len(profiles))
	for _, prof := range profiles {
		sp := scheduling.NewSchedulerProfile()
		for _, ref := range prof.Plugins {
			p, ok := plugins[ref.PluginRef]
			if !ok {
				return nil, fmt.Errorf("plugin %q of profile %q is not configured", ref.PluginRef, prof.Name)
			}
			// As upstream's loader adds a plugin to a profile: a scorer with its weight, and, as well, a filter or
			// a picker.
			var roles []fwkplugin.Plugin
			if s, ok := p.(fwksched.Scorer); ok {
				weight := loader.DefaultScorerWeight
				if ref.Weight != nil {
					weight = *ref.Weight
				}
				roles = append(roles, scheduling.NewWeightedScorer(tracedScorer{inner: s, weight: weight}, weight))
			}
			if f, ok := p.(fwksched.Filter); ok {
				roles = append(roles, tracedFilter{inner: f})
			}
			if pk, ok := p.(fwksched.Picker); ok {
				roles = append(roles, tracedPicker{inner: pk})
			}
			if err := sp.AddPlugins(roles...); err != nil {
				return nil, fmt.Errorf("profile %q: %w", prof.Name, err)
			}
		}
		traced[prof.Name] = &tracedProfile{name: prof.Name, inner: sp}
	}
	return scheduling.NewSchedulerConfig(handler, traced), nil
}

// tracedProfile records a profile's candidates and outcome around upstream's profile.
type tracedProfile struct {
	name  string
	inner *scheduling.SchedulerProfile
}

// Run implements fwksched.SchedulerProfile.
func (p *tracedProfile) Run(ctx context.Context, request *fwksched.LLMRequest, cycleState *fwksched.CycleState,
	candidates []fwksched.Endpoint) (*fwksched.ProfileRunResult, error) {
	t := decisiontrace.FromContext(ctx)
	if !t.Active() {
		return p.inner.Run(ctx, request, cycleState, candidates)
	}
	if request != nil {
		t.Request(request.TargetModel, "", request.Objectives.Priority)
	}
	t.BeginProfile(p.name, endpointNames(candidates))
	result, err := p.inner.Run(ctx, request, cycleState, candidates)
	var picked []string
	if result != nil {
		picked = endpointNames(result.TargetEndpoints)
	}
	t.EndProfile(picked, err)
	return result, err
}

// String is the profile's as upstream prints it.
func (p *tracedProfile) String() string { return p.inner.String() }

type tracedFilter struct{ inner fwksched.Filter }

func (f tracedFilter) TypedName() fwkplugin.TypedName { return f.inner.TypedName() }

func (f tracedFilter) Filter(ctx context.Context, cycleState *fwksched.CycleState, request *fwksched.LLMRequest,
	endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	kept := f.inner.Filter(ctx, cycleState, request, endpoints)
	if t := decisiontrace.FromContext(ctx); t.Active() {
		t.Filtered(f.inner.TypedName().Name, endpointNames(endpoints), endpointNames(kept))
	}
	return kept
}

type tracedScorer struct {
	inner  fwksched.Scorer
	weight float64
}

func (s tracedScorer) TypedName() fwkplugin.TypedName    { return s.inner.TypedName() }
func (s tracedScorer) Category() fwksched.ScorerCategory { return s.inner.Category() }

func (s tracedScorer) Score(ctx context.Context, cycleState *fwksched.CycleState, request *fwksched.LLMRequest,
	endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	scores := s.inner.Score(ctx, cycleState, request, endpoints)
	if t := decisiontrace.FromContext(ctx); t.Active() {
		byName := make(map[string]float64, len(scores))
		for ep, score := range scores {
			byName[EndpointName(ep.GetMetadata())] = score
		}
		t.Scored(s.inner.TypedName().Name, s.weight, byName)
	}
	return scores
}

type tracedPicker struct{ inner fwksched.Picker }

func (p tracedPicker) TypedName() fwkplugin.TypedName { return p.inner.TypedName() }

func (p tracedPicker) Pick(ctx context.Context, cycleState *fwksched.CycleState, scored []*fwksched.ScoredEndpoint) *fwksched.ProfileRunResult {
	if t := decisiontrace.FromContext(ctx); t.Active() {
		totals := make(map[string]float64, len(scored))
		for _, s := range scored {
			totals[EndpointName(s.GetMetadata())] = s.Score
		}
		t.Weighed(totals)
	}
	return p.inner.Pick(ctx, cycleState, scored)
}

func endpointNames(eps []fwksched.Endpoint) []string {
	names := make([]string, len(eps))
	for i, ep := range eps {
		names[i] = EndpointName(ep.GetMetadata())
	}
	return names
}

// traceAdmission adds Sluice admission's decision d about reqCtx (admitted at priority, for tenant) to the request's
// decision trace, if it is traced, with counts' counts of the endpoints it had room on.
func traceAdmission(ctx context.Context, reqCtx *handlers.RequestContext, priority int, tenant string, d flowcontrol.Decision,
	counts func(names []string) []flowcontrol.EndpointCount) {
	t := decisiontrace.FromContext(ctx)
	if !t.Active() {
		return
	}
	t.Request(reqCtx.TargetModelName, reqCtx.ObjectiveKey, priority)
	a := decisiontrace.Admission{
		Tenant: tenant, Band: d.Band.String(), Capped: d.Capped, Outcome: d.Outcome.String(), Reason: d.Reason.String(),
		WaitSeconds: d.Waited.Seconds(), Burst: d.Burst, Headroom: slices.Clone(d.Endpoints), Reserved: d.Reserved,
		RetryAfterSeconds: d.RetryAfterSeconds(),
	}
	// Nothing to count without endpoints. counts is called here only and never kept, so the method value an untraced
	// request passes stays on its stack.
	if len(d.Endpoints) > 0 {
		for _, c := range counts(d.Endpoints) {
			a.Counts = append(a.Counts, decisiontrace.EndpointCount{Endpoint: c.Name, InFlight: c.InFlight, Foreign: c.Foreign,
				Peer: c.Peer, Seats: c.Seats, Capacity: c.Capacity, Known: c.Known, Adopted: c.Adopted})
		}
	}
	t.Admitted(a)
}
