package crds

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluice-gw/sluice/flowcontrol"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func TestToConfigOfEmptySpecIsDefaultConfig(t *testing.T) {
	spec := FlowControlPolicySpec{PoolRef: PoolReference{Name: "pool"}}
	got, err := spec.ToConfig()
	if err != nil {
		t.Fatalf("ToConfig: %v", err)
	}
	if want := flowcontrol.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("ToConfig of an empty spec:\n got %+v\nwant %+v", got, want)
	}
}

func TestToConfigConvertsEveryField(t *testing.T) {
	spec := FlowControlPolicySpec{
		PoolRef: PoolReference{Name: "pool"},
		Bands: &Bands{
			Critical: &CriticalBand{
				MaxQueuedRequests: ptr.To[int64](100), MaxQueuedBytes: ptr.To[int64](1 << 20),
				MaxQueueTime: dur(20 * time.Second), OverShareMaxQueueTime: dur(4 * time.Second), SaturationCeiling: ptr.To(0.95),
				RejectWhenSaturated: ptr.To(true), RetryAfterMin: dur(2 * time.Second),
				RetryAfterMax: dur(10 * time.Second), MayDisplace: ptr.To(false),
			},
			Standard:  &StandardBand{SaturationCeiling: ptr.To(0.9), MaxQueueTime: dur(1500 * time.Millisecond)},
			Sheddable: &SheddableBand{SaturationCeiling: ptr.To(0.5), RejectWhenSaturated: ptr.To(false), MayDisplace: ptr.To(true)},
		},
		MaxQueuedRequests: ptr.To[int64](500),
		MaxQueuedBytes:    ptr.To[int64](1 << 25),
		PriorityMapping:   &PriorityMapping{CriticalMinPriority: ptr.To(10), SheddableMaxPriority: ptr.To(-10)},
		Endpoint: &EndpointThresholds{
			QueueDepthThreshold: ptr.To(8), KVCacheUtilThreshold: ptr.To(0.9),
			RunningThreshold: ptr.To(64), PendingThreshold: ptr.To(3), PendingTimeThreshold: dur(250 * time.Millisecond),
			BurstQueueDepthThreshold: ptr.To(24), BurstPendingTimeThreshold: dur(time.Second),
			MetricsStalenessThreshold: dur(time.Second),
		},
		Tenants: []TenantPolicy{
			{Name: "gold", Weight: ptr.To(4.0)},
			{Name: "batch", MaxBand: ptr.To("Sheddable")},
		},
		DefaultTenant:    &DefaultTenantPolicy{Weight: ptr.To(0.5), MaxBand: ptr.To("Standard")},
		RetryAfterJitter: ptr.To(0.1),
		DrainRateWindow:  dur(30 * time.Second),
	}
	got, err := spec.ToConfig()
	if err != nil {
		t.Fatalf("ToConfig: %v", err)
	}
	want := flowcontrol.DefaultConfig()
	want.Bands[flowcontrol.Critical] = flowcontrol.BandConfig{
		MaxQueuedRequests: 100, MaxQueuedBytes: 1 << 20, MaxQueueTime: 20 * time.Second, OverShareMaxQueueTime: 4 * time.Second,
		SaturationCeiling:   0.95,
		RejectWhenSaturated: true, RetryAfterMin: 2 * time.Second, RetryAfterMax: 10 * time.Second, MayDisplace: false,
	}
	want.Bands[flowcontrol.Standard].SaturationCeiling = 0.9
	want.Bands[flowcontrol.Standard].MaxQueueTime = 1500 * time.Millisecond
	want.Bands[flowcontrol.Sheddable].SaturationCeiling = 0.5
	want.Bands[flowcontrol.Sheddable].RejectWhenSaturated = false
	want.Bands[flowcontrol.Sheddable].MayDisplace = true
	want.MaxQueuedRequests, want.MaxQueuedBytes = 500, 1<<25
	want.CriticalMinPriority, want.SheddableMaxPriority = 10, -10
	want.Endpoint = flowcontrol.EndpointThresholds{QueueDepth: 8, KVCacheUtil: 0.9, Running: 64, Pending: 3,
		PendingTime: 250 * time.Millisecond, BurstQueueDepth: 24, BurstPendingTime: time.Second, MetricsStaleness: time.Second}
	want.Tenants = map[string]flowcontrol.TenantPolicy{
		"gold":  {Weight: 4, MaxBand: flowcontrol.Critical},
		"batch": {Weight: 1, MaxBand: flowcontrol.Sheddable},
	}
	want.DefaultTenant = flowcontrol.TenantPolicy{Weight: 0.5, MaxBand: flowcontrol.Standard}
	want.RetryAfterJitter = 0.1
	want.DrainRateWindow = 30 * time.Second
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ToConfig:\n got %+v\nwant %+v", got, want)
	}
}

// TestToConfigRejects lists, for every rule of the CRD schema, a spec breaking it. ToConfig must reject each too,
// so that a stored object that bypassed the schema is reported rather than applied.
func TestToConfigRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec FlowControlPolicySpec
		want []string
	}{
		{"negative global capacity",
			FlowControlPolicySpec{MaxQueuedRequests: ptr.To[int64](-1), MaxQueuedBytes: ptr.To[int64](-2)},
			[]string{"maxQueuedRequests must not be negative, got -1", "maxQueuedBytes must not be negative, got -2"}},
		{"negative band capacity",
			FlowControlPolicySpec{Bands: &Bands{Standard: &StandardBand{MaxQueuedRequests: ptr.To[int64](-5)}}},
			[]string{"bands.standard.maxQueuedRequests must not be negative, got -5"}},
		{"zero max queue time",
			FlowControlPolicySpec{Bands: &Bands{Sheddable: &SheddableBand{MaxQueueTime: dur(0)}}},
			[]string{"bands.sheddable.maxQueueTime must be positive"}},
		{"zero over-share queue time",
			FlowControlPolicySpec{Bands: &Bands{Standard: &StandardBand{OverShareMaxQueueTime: dur(0)}}},
			[]string{"bands.standard.overShareMaxQueueTime must be positive"}},
		{"ceiling zero",
			FlowControlPolicySpec{Bands: &Bands{Sheddable: &SheddableBand{SaturationCeiling: ptr.To(0.0)}}},
			[]string{"bands.sheddable.saturationCeiling must be positive, got 0"}},
		{"ceiling above one",
			FlowControlPolicySpec{Bands: &Bands{Critical: &CriticalBand{SaturationCeiling: ptr.To(1.5)}}},
			[]string{"bands.critical.saturationCeiling must be in (0, 1], got 1.5"}},
		{"inverted ceilings",
			FlowControlPolicySpec{Bands: &Bands{Standard: &StandardBand{SaturationCeiling: ptr.To(0.4)}}},
			[]string{"inverted ceilings: bands.sheddable.saturationCeiling (0.6) exceeds bands.standard.saturationCeiling (0.4)"}},
		{"retryAfterMin above retryAfterMax",
			FlowControlPolicySpec{Bands: &Bands{Critical: &CriticalBand{RetryAfterMin: dur(20 * time.Second)}}},
			[]string{"bands.critical.retryAfterMin (20s) must not exceed retryAfterMax (15s)"}},
		{"retryAfterMin below 1s",
			FlowControlPolicySpec{Bands: &Bands{Standard: &StandardBand{RetryAfterMin: dur(500 * time.Millisecond)}}},
			[]string{"bands.standard.retryAfterMin must be at least 1s, got 500ms"}},
		{"critical priority not above sheddable",
			FlowControlPolicySpec{PriorityMapping: &PriorityMapping{CriticalMinPriority: ptr.To(0), SheddableMaxPriority: ptr.To(0)}},
			[]string{"priorityMapping.sheddableMaxPriority (0) must be below criticalMinPriority (0)"}},
		{"endpoint thresholds",
			FlowControlPolicySpec{Endpoint: &EndpointThresholds{
				QueueDepthThreshold: ptr.To(0), KVCacheUtilThreshold: ptr.To(1.1), RunningThreshold: ptr.To(-1),
				PendingThreshold: ptr.To(-1), PendingTimeThreshold: dur(-time.Second), MetricsStalenessThreshold: dur(0),
				BurstQueueDepthThreshold: ptr.To(1), BurstPendingTimeThreshold: dur(-time.Second),
			}},
			[]string{"endpoint.queueDepthThreshold must be positive", "endpoint.kvCacheUtilThreshold must be in (0, 1]",
				"endpoint.runningThreshold must not be negative", "endpoint.pendingThreshold must not be negative",
				"endpoint.pendingTimeThreshold must not be negative",
				"endpoint.burstPendingTimeThreshold must not be negative",
				"endpoint.metricsStalenessThreshold must be positive"}},
		{"tenants",
			FlowControlPolicySpec{Tenants: []TenantPolicy{
				{Name: ""}, {Name: "a"}, {Name: "a"}, {Name: "b", MaxBand: ptr.To("Gold")}, {Name: "c", Weight: ptr.To(0.0)},
			}},
			[]string{"tenants[0].name must not be empty", `tenants[2]: duplicate tenant "a"`,
				`tenants[3] ("b").maxBand: unknown band "Gold"`, `tenants["c"].weight must be in (0, 1e6], got 0`}},
		{"default tenant",
			FlowControlPolicySpec{DefaultTenant: &DefaultTenantPolicy{Weight: ptr.To(2e6), MaxBand: ptr.To("Top")}},
			[]string{"defaultTenant.maxBand: unknown band \"Top\"", "defaultTenant.weight must be in (0, 1e6], got 2e+06"}},
		{"jitter and drain window",
			FlowControlPolicySpec{RetryAfterJitter: ptr.To(1.0), DrainRateWindow: dur(-time.Second)},
			[]string{"retryAfterJitter must be in [0, 1), got 1", "drainRateWindow must be positive, got -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.PoolRef = PoolReference{Name: "pool"}
			cfg, err := tc.spec.ToConfig()
			if err == nil {
				t.Fatalf("ToConfig accepted an invalid spec: %+v", cfg)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\ndoes not mention %q", err, want)
				}
			}
		})
	}
}

func TestToConfigDoesNotModifySpec(t *testing.T) {
	spec := &FlowControlPolicySpec{
		PoolRef: PoolReference{Name: "pool"},
		Bands:   &Bands{Standard: &StandardBand{MaxQueuedRequests: ptr.To[int64](3)}},
		Tenants: []TenantPolicy{{Name: "a"}},
	}
	before := spec.DeepCopy()
	if _, err := spec.ToConfig(); err != nil {
		t.Fatalf("ToConfig: %v", err)
	}
	if !reflect.DeepEqual(spec, before) {
		t.Errorf("ToConfig modified its receiver:\n got %+v\nwant %+v", spec, before)
	}
}

// TestSpecMirrorsAPIConfig checks the top level, which Go does not convert as a whole: the spec has every
// flowcontrol.APIConfig field under the same JSON name, and nothing else but poolRef. Nested types are checked by
// the compiler (struct conversions in apiConfig).
func TestSpecMirrorsAPIConfig(t *testing.T) {
	want := jsonNames(reflect.TypeFor[flowcontrol.APIConfig]())
	want["poolRef"] = true
	if got := jsonNames(reflect.TypeFor[FlowControlPolicySpec]()); !reflect.DeepEqual(got, want) {
		t.Errorf("FlowControlPolicySpec JSON fields %v, want flowcontrol.APIConfig's plus poolRef: %v", got, want)
	}
	// DefaultTenantPolicy is APITenantPolicy without the name, which flowcontrol requires to be empty.
	want = jsonNames(reflect.TypeFor[flowcontrol.APITenantPolicy]())
	delete(want, "name")
	if got := jsonNames(reflect.TypeFor[DefaultTenantPolicy]()); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultTenantPolicy JSON fields %v, want %v", got, want)
	}
}

func jsonNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names[name] = true
	}
	return names
}

// TestToConfigMatchesParseConfig checks, on a table and on seeded random specs (many of them invalid), that a spec
// means what the same JSON means to flowcontrol: its JSON without poolRef parses (unknown fields are errors) into
// the same Config, or fails with the same error. The one intended difference is the CRD's upper bound on ceilings.
func TestToConfigMatchesParseConfig(t *testing.T) {
	for name, spec := range map[string]FlowControlPolicySpec{
		"empty":      {},
		"empty subs": {Bands: &Bands{Critical: &CriticalBand{}}, PriorityMapping: &PriorityMapping{}, Endpoint: &EndpointThresholds{}, DefaultTenant: &DefaultTenantPolicy{}},
		"tenants":    {Tenants: []TenantPolicy{{Name: "a", Weight: ptr.To(2.5)}, {Name: "b", MaxBand: ptr.To("Standard")}}},
		"invalid":    {MaxQueuedBytes: ptr.To[int64](-1), Bands: &Bands{Standard: &StandardBand{SaturationCeiling: ptr.To(0.1)}}},
	} {
		t.Run(name, func(t *testing.T) { checkMatchesParseConfig(t, &spec) })
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	valid := 0
	for i := range 2000 {
		spec := randomSpec(rng)
		if _, err := spec.ToConfig(); err == nil {
			valid++
		}
		if !checkMatchesParseConfig(t, spec) {
			t.Fatalf("case %d (seed %d) failed", i, seed)
		}
	}
	// Both outcomes must be exercised, or the comparison says little.
	t.Logf("%d of 2000 random specs valid", valid)
	if valid == 0 || valid == 2000 {
		t.Errorf("%d of 2000 random specs were valid; the generator must produce both valid and invalid specs", valid)
	}
}

// FuzzToConfigMatchesParseConfig is TestToConfigMatchesParseConfig on arbitrary spec JSON.
func FuzzToConfigMatchesParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"bands":{"sheddable":{"saturationCeiling":0.9,"retryAfterMin":"2s"}},"tenants":[{"name":"a"}]}`))
	f.Add([]byte(`{"priorityMapping":{"criticalMinPriority":0},"endpoint":{"kvCacheUtilThreshold":2}}`))
	f.Add([]byte(`{"defaultTenant":{"maxBand":"standard","weight":3},"drainRateWindow":"1m30s"}`))
	f.Add([]byte(`{"tenantHeader":"X-Auth-Tenant","aboveMaxBand":"Reject","tenants":[{"name":"gold","maxBand":"Critical"}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var spec FlowControlPolicySpec
		if json.Unmarshal(raw, &spec) != nil {
			return
		}
		checkMatchesParseConfig(t, &spec)
	})
}

func checkMatchesParseConfig(t *testing.T, spec *FlowControlPolicySpec) bool {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("marshal spec: %v", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatalf("unmarshal spec: %v", err)
	}
	delete(fields, "poolRef")
	raw, err = json.Marshal(fields)
	if err != nil {
		t.Fatalf("marshal fields: %v", err)
	}

	got, gotErr := spec.ToConfig()
	want, wantErr := flowcontrol.ParseConfig(raw)
	if wantErr == nil && ceilingAboveOne(want) {
		if gotErr == nil {
			t.Errorf("ToConfig accepted a ceiling above 1: %s", raw)
			return false
		}
		return true
	}
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Errorf("spec %s:\nToConfig error: %v\nParseConfig error: %v", raw, gotErr, wantErr)
		return false
	case gotErr != nil && !strings.HasPrefix(gotErr.Error(), wantErr.Error()):
		t.Errorf("spec %s:\nToConfig error: %v\nParseConfig error: %v", raw, gotErr, wantErr)
		return false
	case !reflect.DeepEqual(got, want):
		t.Errorf("spec %s:\nToConfig    %+v\nParseConfig %+v", raw, got, want)
		return false
	}
	return true
}

func ceilingAboveOne(cfg *flowcontrol.Config) bool {
	for _, b := range cfg.Bands {
		if b.SaturationCeiling > 1 {
			return true
		}
	}
	return false
}

// randomSpec leaves each field unset half of the time and otherwise draws it from a small set of values around the
// edges of its valid range.
func randomSpec(rng *rand.Rand) *FlowControlPolicySpec {
	maybe := func() bool { return rng.IntN(2) == 0 }
	i64 := func() *int64 {
		if maybe() {
			return nil
		}
		return ptr.To([]int64{-1, 0, 1, 10000, 1 << 30}[rng.IntN(5)])
	}
	i := func(vals ...int) *int {
		if maybe() {
			return nil
		}
		return ptr.To(vals[rng.IntN(len(vals))])
	}
	f := func(vals ...float64) *float64 {
		if maybe() {
			return nil
		}
		return ptr.To(vals[rng.IntN(len(vals))])
	}
	b := func() *bool {
		if maybe() {
			return nil
		}
		return ptr.To(maybe())
	}
	d := func() *metav1.Duration {
		if maybe() {
			return nil
		}
		return dur([]time.Duration{-time.Second, 0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond,
			20 * time.Second, time.Minute}[rng.IntN(7)])
	}
	s := func(vals ...string) *string {
		if maybe() {
			return nil
		}
		return ptr.To(vals[rng.IntN(len(vals))])
	}
	ceilings := []float64{0, 0.5, 0.8, 0.9, 1, 1.2}
	spec := &FlowControlPolicySpec{
		PoolRef:           PoolReference{Name: "pool"},
		MaxQueuedRequests: i64(),
		MaxQueuedBytes:    i64(),
		RetryAfterJitter:  f(-0.1, 0, 0.2, 0.99, 1),
		DrainRateWindow:   d(),
	}
	if maybe() {
		spec.Bands = &Bands{}
		if maybe() {
			spec.Bands.Critical = &CriticalBand{i64(), i64(), d(), d(), f(ceilings...), b(), d(), d(), b()}
		}
		if maybe() {
			spec.Bands.Standard = &StandardBand{i64(), i64(), d(), d(), f(ceilings...), b(), d(), d(), b()}
		}
		if maybe() {
			spec.Bands.Sheddable = &SheddableBand{i64(), i64(), d(), d(), f(ceilings...), b(), d(), d(), b()}
		}
	}
	if maybe() {
		spec.PriorityMapping = &PriorityMapping{i(-2, -1, 0, 1, 2), i(-2, -1, 0, 1, 2)}
	}
	if maybe() {
		spec.Endpoint = &EndpointThresholds{i(-1, 0, 5), i(-1, 0, 2), d(), i(-1, 0, 4, 16), d(), f(0, 0.5, 0.8, 1, 1.5), i(-1, 0, 32), d(), i(-1, 0, 4)}
	}
	for range rng.IntN(4) {
		spec.Tenants = append(spec.Tenants, TenantPolicy{
			Name:    []string{"", "a", "b", "c"}[rng.IntN(4)],
			Weight:  f(0, 0.5, 1, 1e6, 2e6),
			MaxBand: s("Critical", "standard", "Sheddable", "Bronze"),
		})
	}
	if maybe() {
		spec.DefaultTenant = &DefaultTenantPolicy{f(0, 1, 3), s("Critical", "Sheddable", "Bronze")}
	}
	spec.TenantHeader = s("x-auth-tenant", "X-Auth-Tenant", "x auth", "", ":authority")
	spec.AboveMaxBand = s("Lower", "Reject", "reject", "Drop")
	return spec
}
