package plugins

import (
	"context"
	"testing"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

func TestSaturationScorerFactory(t *testing.T) {
	for _, raw := range []string{"", "null", "{}"} {
		if _, err := SaturationScorerFactory("s", []byte(raw), nil); err != nil {
			t.Errorf("parameters %q: %v", raw, err)
		}
	}
	if _, err := SaturationScorerFactory("s", []byte(`{"weight":2}`), nil); err == nil {
		t.Error("unknown parameters were accepted")
	}
}

// TestSaturationScorer: with Sluice admission attached the scorer ranks endpoints by admission's saturation, which
// counts a dispatch before any scrape shows it, and spreads the scores when every endpoint is saturated; without
// admission it is neutral.
func TestSaturationScorer(t *testing.T) {
	p, err := SaturationScorerFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*SaturationScorer)
	eps := candidates("10.0.0.1", "10.0.0.2", "10.0.0.3")
	scores := func() []float64 {
		m := s.Score(context.Background(), nil, nil, eps)
		return []float64{m[eps[0]], m[eps[1]], m[eps[2]]}
	}
	if got := scores(); got[0] != 1 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("without admission: scores %v, want all 1", got)
	}

	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	// Default thresholds (queue depth 2, KV 0.8): 10.0.0.1 is idle, 10.0.0.2 has one waiting (0.5), 10.0.0.3 is
	// not in the snapshot (unknown: saturated).
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 1, 0, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	fc.Attach(map[string]fwkplugin.Plugin{"s": s})
	if got := scores(); got[0] != 1 || got[1] != 0.5 || got[2] != 0 {
		t.Fatalf("after the scrape: scores %v, want [1 0.5 0]", got)
	}
	// A dispatch counts at once: admission reserves the least saturated endpoint.
	if err := fc.Admit(context.Background(), requestContext("r1", "t", 100, nil), 0); err != nil {
		t.Fatal(err)
	}
	if got := scores(); got[0] != 0.5 || got[1] != 0.5 {
		t.Fatalf("after one dispatch: scores %v, want [0.5 0.5 0]", got)
	}

	// Every known endpoint saturated (waiting 3 plus the dispatch above, 6, then also 5, of a queue depth of 2): the
	// scores spread their loads (2, 3, 2.5) over [0, 1] instead of all reading 0, so the least loaded is preferred;
	// the unknown endpoint still scores 0.
	pool.set(upstreamEndpoint("10.0.0.1", 3, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 6, 0, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	if got := scores(); got[0] != 1 || got[1] != 0 || got[2] != 0 {
		t.Fatalf("all saturated: scores %v, want [1 0 0]", got)
	}
	pool.set(upstreamEndpoint("10.0.0.1", 3, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 6, 0, clk.Now()),
		upstreamEndpoint("10.0.0.3", 5, 0, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	if got := scores(); got[0] != 1 || got[1] != 0 || got[2] != 0.5 {
		t.Fatalf("all three saturated: scores %v, want [1 0 0.5]", got)
	}
}
