package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"
	"unsafe"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	reqdataprodprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
	latencyproducer "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/predictedlatency"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/predictedlatency"
)

// This file holds what makes an EndpointPickerConfig deterministic in process (see InProcessPicker): every place
// where upstream's plugins read the wall clock, draw from an unseeded random source, or work in the background is
// either neutralised here or refused with a clear error.

// nondeterministicTypes are plugin types whose decisions depend on wall time or on a random source no caller can
// seed; an InProcessPicker refuses them.
var nondeterministicTypes = map[string]string{
	picker.RandomPickerType:                     "picks from upstream's wall-clock-seeded random source",
	picker.WeightedRandomPickerType:             "picks from upstream's wall-clock-seeded random source",
	prefixcacheaffinity.PluginType:              "explores with math/rand's global random source",
	sloheadroomtier.PluginType:                  "explores with math/rand's global random source",
	predictedlatency.PredictedLatencyPluginType: "times requests with the wall clock and trains in background goroutines",
	latencyproducer.LatencyDataProviderPluginType: "times requests with the wall clock and trains in background " +
		"goroutines",
}

// inProcessHandle is the fwkplugin.Handle an InProcessPicker loads its configuration with. Unlike upstream's, it
// lists plugins in the order they were added (configuration order, then the loader's defaults), so the request
// hooks run in a fixed order. Its context is already done: plugins that maintain themselves in background goroutines
// on wall-clock tickers stop them at once (the picker runs the maintenance that matters on its own clock). As
// plugins are added it wraps the max-score picker in a seeded tie-break and gives Sluice's plugins the picker's
// clock.
type inProcessHandle struct {
	ctx     context.Context
	clock   clock.PassiveClock
	seed    uint64
	podList func() []types.NamespacedName
	names   []string
	plugins map[string]fwkplugin.Plugin
	errs    []error
}

func (h *inProcessHandle) Context() context.Context                            { return h.ctx }
func (h *inProcessHandle) PodList() []types.NamespacedName                     { return h.podList() }
func (h *inProcessHandle) Plugin(name string) fwkplugin.Plugin                 { return h.plugins[name] }
func (h *inProcessHandle) GetAllPluginsWithNames() map[string]fwkplugin.Plugin { return h.plugins }

// GetAllPlugins lists the plugins in the order they were added.
func (h *inProcessHandle) GetAllPlugins() []fwkplugin.Plugin {
	out := make([]fwkplugin.Plugin, 0, len(h.names))
	for _, n := range h.names {
		out = append(out, h.plugins[n])
	}
	return out
}

// AddPlugin implements fwkplugin.HandlePlugins.
func (h *inProcessHandle) AddPlugin(name string, p fwkplugin.Plugin) {
	if why, refused := nondeterministicTypes[p.TypedName().Type]; refused {
		h.errs = append(h.errs, fmt.Errorf("plugin %q of type %s %s: it cannot run deterministically in process",
			name, p.TypedName().Type, why))
	}
	switch pl := p.(type) {
	case *picker.MaxScorePicker:
		p = &seededTieBreak{Picker: pl, seed: h.seed}
	case *PrefixCache:
		pl.clock = h.clock
	case *LoRAAffinity:
		pl.clock = h.clock
	case *LoRAResidencyExtractor:
		pl.clock = h.clock
	case *InFlightScorer:
		pl.clock = h.clock
	}
	if _, ok := h.plugins[name]; !ok {
		h.names = append(h.names, name)
	}
	h.plugins[name] = p
}

var _ fwkplugin.Handle = (*inProcessHandle)(nil)

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

// asyncIndexWait returns a function that waits for the work plugin p leaves running in the background after its
// PreRequest hook, or nil if p leaves none. Upstream's approximate prefix-cache producer records each routing
// decision in its index from a goroutine, so whether the next request sees it depends on the Go scheduler; waiting
// for it makes the next request see it, as it practically always does in a real EPP, where requests are
// milliseconds apart. Its WaitGroup is unexported (upstream's tests wait on it), hence the reflection; a version of
// upstream without it is an error, not a silent race.
func asyncIndexWait(p fwkplugin.Plugin) (func(), error) {
	if p.TypedName().Type != reqdataprodprefix.ApproxPrefixCachePluginType {
		return nil, nil
	}
	v := reflect.ValueOf(p)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil, fmt.Errorf("plugin %s (%T): cannot find the WaitGroup of its background index updates", p.TypedName(), p)
	}
	f := v.FieldByName("wg")
	if !f.IsValid() || f.Type() != reflect.TypeFor[sync.WaitGroup]() || !f.CanAddr() {
		return nil, fmt.Errorf("plugin %s (%T): cannot find the WaitGroup of its background index updates", p.TypedName(), p)
	}
	wg := (*sync.WaitGroup)(unsafe.Pointer(f.UnsafeAddr()))
	return wg.Wait, nil
}

// prefixCacheMaintenance returns what PrefixCache.syncPods does every podSyncInterval, to run on the picker's clock
// instead of a wall-clock ticker, and that interval.
func prefixCacheMaintenance(p *PrefixCache, raw json.RawMessage, pods func() []types.NamespacedName) (func(now time.Time), time.Duration, error) {
	cfg, err := parsePrefixCacheConfig(raw)
	if err != nil {
		return nil, 0, err
	}
	return func(now time.Time) {
		p.forgetAbsent(pods())
		p.index.Expire(now)
	}, cfg.podSyncInterval, nil
}
