package plugins

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// RoundRobinPickerType is the plugin type of RoundRobinPicker.
const RoundRobinPickerType = "sluice-round-robin-picker"

var _ fwksched.Picker = (*RoundRobinPicker)(nil)

// RoundRobinPicker ignores scores and takes the candidates in turn, ordered by endpoint address. It is the control
// for measuring what the EPP hop itself costs: a profile with only this picker routes as a round-robin data plane
// does, so any difference between the two is the ext_proc exchange, not the routing. Upstream v1.5.0 has random and
// score-based pickers but no rotation.
//
// With a candidate set that changes between requests (filters, endpoints coming and going) the rotation is over
// whatever set each request sees: one shared counter, taken modulo the number of candidates.
//
// Concurrency: safe for concurrent use.
type RoundRobinPicker struct {
	typedName fwkplugin.TypedName
	// maxEndpoints is how many endpoints a pick returns: the next in turn first, then the ones after it, which the
	// data plane tries in order when connecting to the first fails.
	maxEndpoints int
	next         atomic.Uint64
}

// roundRobinPickerParameters are RoundRobinPicker's parameters; the name matches upstream's pickers.
type roundRobinPickerParameters struct {
	MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
}

// RoundRobinPickerFactory builds a RoundRobinPicker. Its one parameter, maxNumOfEndpoints (default 1), must be
// positive.
func RoundRobinPickerFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	params := roundRobinPickerParameters{MaxNumOfEndpoints: 1}
	if err := decodeParams(raw, &params); err != nil {
		return nil, fmt.Errorf("%s parameters: %w", RoundRobinPickerType, err)
	}
	if params.MaxNumOfEndpoints < 1 {
		return nil, fmt.Errorf("%s: maxNumOfEndpoints must be at least 1, got %d", RoundRobinPickerType, params.MaxNumOfEndpoints)
	}
	if name == "" {
		name = RoundRobinPickerType
	}
	return &RoundRobinPicker{
		typedName:    fwkplugin.TypedName{Type: RoundRobinPickerType, Name: name},
		maxEndpoints: params.MaxNumOfEndpoints,
	}, nil
}

// TypedName implements fwkplugin.Plugin.
func (p *RoundRobinPicker) TypedName() fwkplugin.TypedName { return p.typedName }

// Pick implements fwksched.Picker. It sorts the candidates it is given (the scheduler hands each picker its own
// slice) and returns none when there are none.
func (p *RoundRobinPicker) Pick(_ context.Context, _ *fwksched.CycleState, scored []*fwksched.ScoredEndpoint) *fwksched.ProfileRunResult {
	n := len(scored)
	if n == 0 {
		return &fwksched.ProfileRunResult{}
	}
	slices.SortFunc(scored, func(a, b *fwksched.ScoredEndpoint) int {
		return cmp.Compare(EndpointName(a.GetMetadata()), EndpointName(b.GetMetadata()))
	})
	first := int((p.next.Add(1) - 1) % uint64(n))
	targets := make([]fwksched.Endpoint, min(p.maxEndpoints, n))
	for i := range targets {
		targets[i] = scored[(first+i)%n]
	}
	return &fwksched.ProfileRunResult{TargetEndpoints: targets}
}
