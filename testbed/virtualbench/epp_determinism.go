package virtualbench

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	latencyproducer "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/predictedlatency"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/predictedlatency"

	"github.com/sluice-gw/sluice/plugins"
)

// This file holds what makes an EndpointPickerConfig's plugins deterministic in process (see inProcessEPP): the
// handle they are loaded with, which gives Sluice's plugins the EPP's clock, lists plugins in configuration order
// and seeds the max-score picker's tie-breaks; and the plugin types refused because they read the wall clock or draw
// from a random source no caller can seed. Background work is epp_hooks.go's, staleness checks epp_staleness.go's.

// nondeterministicTypes are plugin types whose decisions depend on wall time or on a random source no caller can
// seed; an inProcessEPP refuses them.
var nondeterministicTypes = map[string]string{
	picker.RandomPickerType:                     "picks from upstream's wall-clock-seeded random source",
	picker.WeightedRandomPickerType:             "picks from upstream's wall-clock-seeded random source",
	prefixcacheaffinity.PluginType:              "explores with math/rand's global random source",
	sloheadroomtier.PluginType:                  "explores with math/rand's global random source",
	predictedlatency.PredictedLatencyPluginType: "times requests with the wall clock and trains in background goroutines",
	latencyproducer.LatencyDataProviderPluginType: "times requests with the wall clock and trains in background " +
		"goroutines",
}

// eppHandle is the fwkplugin.Handle an inProcessEPP loads its configuration with. Unlike upstream's, it lists
// plugins in the order they were added (configuration order, then the loader's defaults), so the request hooks run in
// a fixed order. Its context is already done: plugins that maintain themselves in background goroutines on
// wall-clock tickers stop them at once (the EPP runs the maintenance that matters on its own clock). It is a
// plugins.ClockHandle, so Sluice's plugins read the EPP's clock, and as plugins are added it wraps the max-score
// picker in a seeded tie-break.
type eppHandle struct {
	ctx     context.Context
	clock   clock.PassiveClock
	seed    uint64
	podList func() []types.NamespacedName
	names   []string
	plugins map[string]fwkplugin.Plugin
	errs    []error
}

func (h *eppHandle) Context() context.Context                            { return h.ctx }
func (h *eppHandle) Clock() clock.PassiveClock                           { return h.clock }
func (h *eppHandle) PodList() []types.NamespacedName                     { return h.podList() }
func (h *eppHandle) Plugin(name string) fwkplugin.Plugin                 { return h.plugins[name] }
func (h *eppHandle) GetAllPluginsWithNames() map[string]fwkplugin.Plugin { return h.plugins }

// GetAllPlugins lists the plugins in the order they were added.
func (h *eppHandle) GetAllPlugins() []fwkplugin.Plugin {
	out := make([]fwkplugin.Plugin, 0, len(h.names))
	for _, n := range h.names {
		out = append(out, h.plugins[n])
	}
	return out
}

// AddPlugin implements fwkplugin.HandlePlugins.
func (h *eppHandle) AddPlugin(name string, p fwkplugin.Plugin) {
	if why, refused := nondeterministicTypes[p.TypedName().Type]; refused {
		h.errs = append(h.errs, fmt.Errorf("plugin %q of type %s %s: it cannot run deterministically in process",
			name, p.TypedName().Type, why))
	}
	if pl, ok := p.(*picker.MaxScorePicker); ok {
		p = &seededTieBreak{Picker: pl, seed: h.seed}
	}
	if _, ok := h.plugins[name]; !ok {
		h.names = append(h.names, name)
	}
	h.plugins[name] = p
}

var _ plugins.ClockHandle = (*eppHandle)(nil)

// seededTieBreak is upstream's max-score picker with ties broken by a seeded hash instead of a shuffle drawn from
// the wall-clock-seeded source upstream's pickers share. Before delegating to upstream's Pick it replaces the scores
// with their rank in (score descending, hash of (seed, decision number, endpoint name)) order, so upstream's shuffle
// and stable sort can only produce that order; the original scores are restored afterwards. Among equal scores each
// endpoint is equally likely to win, as upstream intends, but the choice is a function of the seed.
type seededTieBreak struct {
	fwksched.Picker
	seed      uint64
	decisions uint64
	ranked    []rankedEndpoint
}

type rankedEndpoint struct {
	ep    *fwksched.ScoredEndpoint
	score float64
	key   uint64
}

// Pick implements fwksched.Picker.
func (p *seededTieBreak) Pick(ctx context.Context, cs *fwksched.CycleState, scored []*fwksched.ScoredEndpoint) *fwksched.ProfileRunResult {
	p.decisions++
	salt := mix64(p.seed ^ mix64(p.decisions))
	ranked := p.ranked[:0]
	for _, s := range scored {
		ranked = append(ranked, rankedEndpoint{ep: s, score: s.Score, key: mix64(salt ^ nameHash(s.Endpoint))})
	}
	slices.SortFunc(ranked, func(a, b rankedEndpoint) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	for i := range ranked {
		ranked[i].ep.Score = float64(len(ranked) - i)
	}
	res := p.Picker.Pick(ctx, cs, scored)
	for _, r := range ranked {
		r.ep.Score = r.score
	}
	clear(ranked)
	p.ranked = ranked[:0]
	return res
}

// nameHash is FNV-1a of the endpoint's namespaced name.
func nameHash(ep fwksched.Endpoint) uint64 {
	h := uint64(14695981039346656037)
	if md := ep.GetMetadata(); md != nil {
		for _, s := range [2]string{md.NamespacedName.Namespace, md.NamespacedName.Name} {
			for i := 0; i < len(s); i++ {
				h ^= uint64(s[i])
				h *= 1099511628211
			}
			h ^= '/'
			h *= 1099511628211
		}
	}
	return h
}

// mix64 is SplitMix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
