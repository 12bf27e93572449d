package simulator

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// TestMetricFamiliesMatchGather holds MetricFamilies equal to what the Server's collector yields through a registry,
// for engines with and without LoRA in idle, busy and adapter-swapping states.
func TestMetricFamiliesMatchGather(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, profile := range engine.ProfileNames() {
		for _, loras := range []int{0, 2} {
			cfg, _ := engine.Profile(profile)
			cfg.MaxLoRAs = loras
			cfg.DisablePrefixCaching = loras == 0
			eng, err := engine.NewEngine(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewPedanticRegistry()
			at := now
			reg.MustRegister(NewMetricsCollector("m", cfg, func() (engine.Stats, time.Time) { return eng.Stats(), at }))
			check := func(stage string) {
				t.Helper()
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				got := MetricFamilies("m", cfg, eng.Stats(), at)
				if len(got) != len(mfs) {
					t.Fatalf("%s/%d loras, %s: %d families, Gather has %d", profile, loras, stage, len(got), len(mfs))
				}
				for _, want := range mfs {
					if !proto.Equal(got[want.GetName()], want) {
						t.Fatalf("%s/%d loras, %s: family %s\n got %v\nwant %v", profile, loras, stage, want.GetName(),
							got[want.GetName()], want)
					}
				}
			}
			check("idle")
			for i := range 40 {
				adapter := ""
				if loras > 0 && i%3 > 0 {
					adapter = fmt.Sprintf("a%d", i%5)
				}
				if err := eng.Submit(at, &engine.Request{ID: uint64(i + 1), Adapter: adapter, PromptTokens: 100 + i,
					MaxTokens: 8}); err != nil {
					t.Fatal(err)
				}
			}
			check("queued")
			for range 5 {
				next, ok := eng.NextEvent()
				if !ok {
					break
				}
				at = next
				eng.Advance(at)
				check("running")
			}
		}
	}
}
