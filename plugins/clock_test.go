package plugins

import (
	"context"
	"testing"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

// clockHandle is a ClockHandle whose context is done, as the virtual-time engine's is.
type clockHandle struct {
	fwkplugin.Handle
	clock clock.PassiveClock
}

func (h clockHandle) Clock() clock.PassiveClock { return h.clock }

// TestFactoriesReadTheClockHandle: every Sluice plugin that reads the time takes it from a ClockHandle, and from the
// wall clock under any other handle.
func TestFactoriesReadTheClockHandle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fake := clocktesting.NewFakePassiveClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	upstream := fwkplugin.NewEppHandle(ctx, func() []k8stypes.NamespacedName { return nil })
	clockOfPlugin := func(p fwkplugin.Plugin) clock.PassiveClock {
		switch pl := p.(type) {
		case *PrefixCache:
			return pl.clock
		case *LoRAAffinity:
			return pl.clock
		case *LoRAResidencyExtractor:
			return pl.clock
		case *InFlightScorer:
			return pl.clock
		case *OutlierFilter:
			return pl.clock
		}
		t.Fatalf("%T reads no clock", p)
		return nil
	}
	for _, typ := range []string{PrefixCacheType, LoRAAffinityType, LoRAResidencyExtractorType, InFlightScorerType, OutlierFilterType} {
		for _, tc := range []struct {
			name   string
			handle fwkplugin.Handle
			want   clock.PassiveClock
		}{
			{"clock handle", clockHandle{Handle: upstream, clock: fake}, fake},
			{"upstream's handle", upstream, clock.RealClock{}},
			{"no handle", nil, clock.RealClock{}},
		} {
			p, err := sluicePlugins[typ](typ, nil, tc.handle)
			if err != nil {
				t.Fatal(err)
			}
			if got := clockOfPlugin(p); got != tc.want {
				t.Errorf("%s with %s reads %T, want %T", typ, tc.name, got, tc.want)
			}
		}
	}
}
