package flowcontrol

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestDefaultConfig(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	want := map[Band]BandConfig{
		Critical: {MaxQueuedRequests: 10000, MaxQueuedBytes: 1 << 30, MaxQueueTime: 30 * time.Second, OverShareMaxQueueTime: 10 * time.Second,
			SaturationCeiling: 1, RetryAfterMin: time.Second, RetryAfterMax: 15 * time.Second, MayDisplace: true},
		Standard: {MaxQueuedRequests: 10000, MaxQueuedBytes: 1 << 30, MaxQueueTime: 15 * time.Second, OverShareMaxQueueTime: 5 * time.Second,
			SaturationCeiling: 0.8, RetryAfterMin: time.Second, RetryAfterMax: 30 * time.Second, MayDisplace: true},
		Sheddable: {MaxQueuedRequests: 10000, MaxQueuedBytes: 1 << 30, MaxQueueTime: 15 * time.Second, OverShareMaxQueueTime: 5 * time.Second,
			SaturationCeiling: 0.6, RejectWhenSaturated: true, RetryAfterMin: time.Second, RetryAfterMax: time.Minute},
	}
	for b, w := range want {
		if cfg.Bands[b] != w {
			t.Errorf("band %s defaults = %+v, want %+v", b, cfg.Bands[b], w)
		}
	}
	if cfg.Endpoint != (EndpointThresholds{QueueDepth: 2, KVCacheUtil: 0.8, PendingTime: 100 * time.Millisecond,
		BurstQueueDepth: 16, BurstPendingTime: 400 * time.Millisecond, MetricsStaleness: 200 * time.Millisecond}) {
		t.Errorf("endpoint defaults = %+v", cfg.Endpoint)
	}
	if cfg.DefaultTenant != (TenantPolicy{Weight: 1, MaxBand: Critical}) {
		t.Errorf("default tenant = %+v", cfg.DefaultTenant)
	}
	if cfg.RetryAfterJitter != 0.2 || cfg.DrainRateWindow != 10*time.Second || cfg.MaxQueuedRequests != 10000 {
		t.Errorf("globals = jitter %v window %v maxReq %d", cfg.RetryAfterJitter, cfg.DrainRateWindow, cfg.MaxQueuedRequests)
	}
	// By default the tenant is what the client sends in GIE's fairness header, and a cap lowers the band.
	if cfg.TenantHeader != "x-gateway-inference-fairness-id" || cfg.AboveMaxBand != CapLower {
		t.Errorf("identity defaults = header %q, aboveMaxBand %s", cfg.TenantHeader, cfg.AboveMaxBand)
	}
}

func TestBandFor(t *testing.T) {
	def := DefaultConfig()
	custom, err := ParseConfig([]byte(`{"priorityMapping":{"criticalMinPriority":10,"sheddableMaxPriority":-5}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg      *Config
		priority int
		want     Band
	}{
		{def, 0, Standard}, {def, 1, Critical}, {def, 100, Critical}, {def, -1, Sheddable}, {def, -100, Sheddable},
		{custom, 9, Standard}, {custom, 10, Critical}, {custom, -4, Standard}, {custom, -5, Sheddable},
	} {
		if got := tc.cfg.BandFor(tc.priority); got != tc.want {
			t.Errorf("BandFor(%d) with mapping [%d, %d] = %s, want %s", tc.priority,
				tc.cfg.SheddableMaxPriority, tc.cfg.CriticalMinPriority, got, tc.want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{
		"bands": {"sheddable": {"saturationCeiling": 0.5, "maxQueueTime": "2s", "rejectWhenSaturated": false},
		          "critical": {"retryAfterMax": "5s", "mayDisplace": false}},
		"maxQueuedRequests": 7,
		"endpoint": {"queueDepthThreshold": 3, "metricsStalenessThreshold": "1s"},
		"tenants": [{"name": "free", "maxBand": "standard"}, {"name": "gold", "weight": 4}],
		"retryAfterJitter": 0,
		"drainRateWindow": "30s",
		"tenantHeader": "X-Auth-Tenant",
		"aboveMaxBand": "reject"
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Bands[Sheddable]; s.SaturationCeiling != 0.5 || s.MaxQueueTime != 2*time.Second ||
		s.RejectWhenSaturated || s.RetryAfterMax != time.Minute {
		t.Errorf("sheddable = %+v", s)
	}
	if c := cfg.Bands[Critical]; c.RetryAfterMax != 5*time.Second || c.MayDisplace || c.MaxQueueTime != 30*time.Second {
		t.Errorf("critical = %+v", c)
	}
	if cfg.MaxQueuedRequests != 7 || cfg.Endpoint.QueueDepth != 3 || cfg.Endpoint.KVCacheUtil != 0.8 ||
		cfg.Endpoint.MetricsStaleness != time.Second || cfg.RetryAfterJitter != 0 || cfg.DrainRateWindow != 30*time.Second {
		t.Errorf("globals = %+v", cfg)
	}
	if cfg.TenantHeader != "x-auth-tenant" || cfg.AboveMaxBand != CapReject {
		t.Errorf("identity = header %q, aboveMaxBand %s; want the header lower-cased and Reject", cfg.TenantHeader, cfg.AboveMaxBand)
	}
	if cfg.Tenants["free"] != (TenantPolicy{Weight: 1, MaxBand: Standard}) ||
		cfg.Tenants["gold"] != (TenantPolicy{Weight: 4, MaxBand: Critical}) {
		t.Errorf("tenants = %+v", cfg.Tenants)
	}

	if _, err := ParseConfig(nil); err != nil {
		t.Errorf("empty config: %v", err)
	}
	if _, err := ParseConfig([]byte(`{"bands": {"critcal": {}}}`)); err == nil || !strings.Contains(err.Error(), "critcal") {
		t.Errorf("unknown field error = %v, want it to name the field", err)
	}
}

// TestBurstThresholdsFollowNormalOnes: the burst tier is never stricter than the normal one. A policy that raises a
// normal threshold past a burst default (as one written before the burst tier may) is accepted with the burst
// threshold raised to match, explicit burst values below the normal ones act as them, and 0 keeps its meaning.
func TestBurstThresholdsFollowNormalOnes(t *testing.T) {
	d := func(s string) *metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Duration{Duration: v}
	}
	for _, tc := range []struct {
		name      string
		endpoint  APIEndpointThresholds
		wantDepth int
		wantTime  time.Duration
	}{
		{"defaults", APIEndpointThresholds{}, 16, 400 * time.Millisecond},
		{"normal thresholds above the burst defaults", APIEndpointThresholds{QueueDepthThreshold: ptr.To(20),
			PendingTimeThreshold: d("1s")}, 20, time.Second},
		{"burst values below the normal ones", APIEndpointThresholds{QueueDepthThreshold: ptr.To(4),
			BurstQueueDepthThreshold: ptr.To(3), PendingTimeThreshold: d("200ms"), BurstPendingTimeThreshold: d("100ms")},
			4, 200 * time.Millisecond},
		{"burst tier off, burst time off", APIEndpointThresholds{QueueDepthThreshold: ptr.To(20),
			BurstQueueDepthThreshold: ptr.To(0), BurstPendingTimeThreshold: d("0s")}, 0, 0},
		{"no normal time", APIEndpointThresholds{PendingTimeThreshold: d("0s")}, 16, 400 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := NewConfig(&APIConfig{Endpoint: &tc.endpoint})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Endpoint.BurstQueueDepth != tc.wantDepth || cfg.Endpoint.BurstPendingTime != tc.wantTime {
				t.Errorf("burst thresholds %d, %v; want %d, %v", cfg.Endpoint.BurstQueueDepth, cfg.Endpoint.BurstPendingTime,
					tc.wantDepth, tc.wantTime)
			}
		})
	}
}

func TestNewConfigDoesNotMutateInput(t *testing.T) {
	api := &APIConfig{Bands: &APIBands{Standard: &APIBandConfig{MaxQueuedRequests: ptr.To[int64](3)}}}
	if _, err := NewConfig(api); err != nil {
		t.Fatal(err)
	}
	if api.Bands.Critical != nil || api.Bands.Standard.MaxQueueTime != nil || api.MaxQueuedBytes != nil {
		t.Errorf("NewConfig wrote defaults into its input: %+v", api)
	}
}

func TestConfigValidation(t *testing.T) {
	d := func(s string) *metav1.Duration { v, _ := time.ParseDuration(s); return &metav1.Duration{Duration: v} }
	for _, tc := range []struct {
		name string
		api  APIConfig
		want []string // every one must appear in the joined error
	}{
		{"negative capacities", APIConfig{
			MaxQueuedRequests: ptr.To[int64](-1), MaxQueuedBytes: ptr.To[int64](-2),
			Bands: &APIBands{Standard: &APIBandConfig{MaxQueuedRequests: ptr.To[int64](-3), MaxQueuedBytes: ptr.To[int64](-4)}},
		}, []string{"maxQueuedRequests must not be negative, got -1", "maxQueuedBytes must not be negative, got -2",
			"bands.standard.maxQueuedRequests must not be negative, got -3", "bands.standard.maxQueuedBytes must not be negative, got -4"}},
		{"inverted ceilings", APIConfig{Bands: &APIBands{
			Standard: &APIBandConfig{SaturationCeiling: ptr.To(0.5)}, Sheddable: &APIBandConfig{SaturationCeiling: ptr.To(0.9)},
		}}, []string{"inverted ceilings: bands.sheddable.saturationCeiling (0.9) exceeds bands.standard.saturationCeiling (0.5)"}},
		{"retry min above max", APIConfig{Bands: &APIBands{Critical: &APIBandConfig{RetryAfterMin: d("20s"), RetryAfterMax: d("10s")}}},
			[]string{"bands.critical.retryAfterMin (20s) must not exceed retryAfterMax (10s)"}},
		{"retry min below one second", APIConfig{Bands: &APIBands{Critical: &APIBandConfig{RetryAfterMin: d("500ms")}}},
			[]string{"bands.critical.retryAfterMin must be at least 1s"}},
		{"non-positive times and ceilings", APIConfig{Bands: &APIBands{Sheddable: &APIBandConfig{
			MaxQueueTime: d("0s"), SaturationCeiling: ptr.To(0.0)}, Standard: &APIBandConfig{OverShareMaxQueueTime: d("0s")}},
			DrainRateWindow: d("-1s")},
			[]string{"bands.sheddable.maxQueueTime must be positive", "bands.sheddable.saturationCeiling must be positive",
				"bands.standard.overShareMaxQueueTime must be positive", "drainRateWindow must be positive"}},
		{"priority mapping overlaps", APIConfig{PriorityMapping: &APIPriorityMapping{CriticalMinPriority: ptr.To(0), SheddableMaxPriority: ptr.To(0)}},
			[]string{"sheddableMaxPriority (0) must be below criticalMinPriority (0)"}},
		{"endpoint thresholds", APIConfig{Endpoint: &APIEndpointThresholds{QueueDepthThreshold: ptr.To(0),
			KVCacheUtilThreshold: ptr.To(1.5), RunningThreshold: ptr.To(-1), MetricsStalenessThreshold: d("0s")}},
			[]string{"queueDepthThreshold must be positive", "kvCacheUtilThreshold must be in (0, 1]",
				"runningThreshold must not be negative", "metricsStalenessThreshold must be positive"}},
		{"negative burst thresholds", APIConfig{Endpoint: &APIEndpointThresholds{BurstQueueDepthThreshold: ptr.To(-1),
			BurstPendingTimeThreshold: d("-1s")}},
			[]string{"burstQueueDepthThreshold must be 0 (no burst tier) or at least queueDepthThreshold (2), got -1",
				"burstPendingTimeThreshold must not be negative, got -1s"}},
		{"tenants", APIConfig{Tenants: []APITenantPolicy{{Name: ""}, {Name: "a", MaxBand: ptr.To("gold")},
			{Name: "b", Weight: ptr.To(0.0)}, {Name: "b"}}, DefaultTenant: &APITenantPolicy{Name: "x"}},
			[]string{"tenants[0].name must not be empty", `tenants[1] ("a").maxBand: unknown band "gold"`,
				`tenants["b"].weight must be in (0, 1e6]`, `tenants[3]: duplicate tenant "b"`, `defaultTenant.name must be empty`}},
		{"jitter", APIConfig{RetryAfterJitter: ptr.To(1.0)}, []string{"retryAfterJitter must be in [0, 1)"}},
		{"tenant header with a space", APIConfig{TenantHeader: ptr.To("x auth")}, []string{`tenantHeader must be a lower-case HTTP header name of at most 256 bytes, got "x auth"`}},
		{"empty tenant header", APIConfig{TenantHeader: ptr.To("")}, []string{`tenantHeader must be a lower-case HTTP header name of at most 256 bytes, got ""`}},
		{"long tenant header", APIConfig{TenantHeader: ptr.To(strings.Repeat("x", 257))}, []string{`tenantHeader must be a lower-case HTTP header name`}},
		{"pseudo-header as tenant header", APIConfig{TenantHeader: ptr.To(":authority")}, []string{`tenantHeader must be a lower-case HTTP header name`}},
		{"unknown cap action", APIConfig{AboveMaxBand: ptr.To("drop")}, []string{`aboveMaxBand: unknown action "drop" (want Lower or Reject)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewConfig(&tc.api)
			if err == nil {
				t.Fatal("NewConfig accepted an invalid configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseBand(t *testing.T) {
	for _, s := range []string{"Critical", "critical", "CRITICAL"} {
		if b, err := ParseBand(s); err != nil || b != Critical {
			t.Errorf("ParseBand(%q) = %v, %v", s, b, err)
		}
	}
	if _, err := ParseBand("urgent"); err == nil {
		t.Error("ParseBand accepted an unknown band")
	}
	var b Band
	if err := b.UnmarshalText([]byte("Sheddable")); err != nil || b != Sheddable {
		t.Errorf("UnmarshalText = %v, %v", b, err)
	}
	if txt, err := Standard.MarshalText(); err != nil || string(txt) != "Standard" {
		t.Errorf("MarshalText = %q, %v", txt, err)
	}
	if _, err := Band(7).MarshalText(); err == nil {
		t.Error("MarshalText accepted an invalid band")
	}
}
