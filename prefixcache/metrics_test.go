package prefixcache

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPrometheusRecorder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	rec, err := NewPrometheusRecorder(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewPrometheusRecorder(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	c := testConfig()
	c.Guard.OverloadAbsolute = 2
	ix, err := New(c, WithRecorder(rec))
	if err != nil {
		t.Fatal(err)
	}
	cs := cands(2)
	p := textPrompt("0123456789abcdef")
	ix.Route(t0, "", p, cs[0])
	cs[0].Load.Queued = 10 // overloaded holder
	score(ix, p, cs)
	ix.Route(t0, "r", p, cs[0])
	ix.ObserveUsage(t0, "r", Usage{PromptTokens: 17, CachedTokens: 0, CachedReported: true})

	// The routed prompt was predicted cached on its holder, and the server reported none of it cached: ratio 0.
	// Every label value of a closed set is exported from the start, at zero.
	const want = `
# HELP sluice_prefixcache_calibration_ratio Reported over predicted cached fraction of prompts, by source; below 1 means predictions ran ahead.
# TYPE sluice_prefixcache_calibration_ratio histogram
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="0"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="0.25"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="0.5"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="0.8"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="0.9"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="1"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="1.1"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="1.25"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="2"} 0
sluice_prefixcache_calibration_ratio_bucket{source="counters",le="+Inf"} 0
sluice_prefixcache_calibration_ratio_sum{source="counters"} 0
sluice_prefixcache_calibration_ratio_count{source="counters"} 0
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="0"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="0.25"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="0.5"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="0.8"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="0.9"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="1"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="1.1"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="1.25"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="2"} 1
sluice_prefixcache_calibration_ratio_bucket{source="usage",le="+Inf"} 1
sluice_prefixcache_calibration_ratio_sum{source="usage"} 0
sluice_prefixcache_calibration_ratio_count{source="usage"} 1
# HELP sluice_prefixcache_guard_total Prefix matches whose affinity the load guard reduced or removed, by action.
# TYPE sluice_prefixcache_guard_total counter
sluice_prefixcache_guard_total{action="kv_full"} 0
sluice_prefixcache_guard_total{action="overload"} 1
sluice_prefixcache_guard_total{action="taper"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
