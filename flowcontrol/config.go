package flowcontrol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Defaults. They are sane with no policy at all: Critical and Standard queue up to their maximum queue time,
// Sheddable is held back below 80% of an endpoint's saturation thresholds and shed at once above it.
const (
	DefaultMaxQueuedRequests int64 = 10000
	DefaultMaxQueuedBytes    int64 = 1 << 30 // 1 GiB of request bodies held in the EPP.

	DefaultCriticalMinPriority  = 1
	DefaultSheddableMaxPriority = -1

	DefaultQueueDepthThreshold       = 2
	DefaultPendingThreshold          = 0
	DefaultPendingTimeThreshold      = 100 * time.Millisecond
	DefaultBurstQueueDepthThreshold  = 16
	DefaultBurstPendingTimeThreshold = 400 * time.Millisecond
	DefaultKVCacheUtilThreshold      = 0.8
	DefaultMetricsStalenessThreshold = 200 * time.Millisecond

	DefaultRetryAfterJitter = 0.2
	DefaultDrainRateWindow  = 10 * time.Second
	DefaultRetryAfterMin    = time.Second
	DefaultTenantWeight     = 1.0

	// DefaultTenantHeader is the request header the tenant is read from unless a policy names another: GIE's
	// fairness-ID header, which clients may set themselves.
	DefaultTenantHeader = "x-gateway-inference-fairness-id"
)

// maxHeaderNameLen bounds TenantHeader, as the FlowControlPolicy CRD does.
const maxHeaderNameLen = 256

// defaultBands holds each band's defaults, indexed by Band.
var defaultBands = [NumBands]BandConfig{
	Critical: {
		MaxQueuedRequests: DefaultMaxQueuedRequests, MaxQueuedBytes: DefaultMaxQueuedBytes,
		MaxQueueTime: 30 * time.Second, OverShareMaxQueueTime: 10 * time.Second, SaturationCeiling: 1.0,
		RetryAfterMin: DefaultRetryAfterMin, RetryAfterMax: 15 * time.Second, MayDisplace: true,
	},
	Standard: {
		MaxQueuedRequests: DefaultMaxQueuedRequests, MaxQueuedBytes: DefaultMaxQueuedBytes,
		MaxQueueTime: 15 * time.Second, OverShareMaxQueueTime: 5 * time.Second, SaturationCeiling: 0.8,
		RetryAfterMin: DefaultRetryAfterMin, RetryAfterMax: 30 * time.Second, MayDisplace: true,
	},
	Sheddable: {
		MaxQueuedRequests: DefaultMaxQueuedRequests, MaxQueuedBytes: DefaultMaxQueuedBytes,
		MaxQueueTime: 15 * time.Second, OverShareMaxQueueTime: 5 * time.Second, SaturationCeiling: 0.6, RejectWhenSaturated: true,
		RetryAfterMin: DefaultRetryAfterMin, RetryAfterMax: 60 * time.Second,
	},
}

// Config is the validated, defaulted configuration the Controller runs on. Build it with NewConfig, ParseConfig or
// DefaultConfig; a hand-built Config must pass Validate.
type Config struct {
	Bands             [NumBands]BandConfig
	MaxQueuedRequests int64
	MaxQueuedBytes    int64

	CriticalMinPriority  int
	SheddableMaxPriority int

	Endpoint EndpointThresholds

	Tenants       map[string]TenantPolicy
	DefaultTenant TenantPolicy

	RetryAfterJitter float64
	DrainRateWindow  time.Duration

	// TenantHeader is the lower-case name of the header the caller reads each request's tenant from; the controller
	// itself only sees Request.Tenant.
	TenantHeader string
	// AboveMaxBand decides requests whose priority maps above their tenant's MaxBand.
	AboveMaxBand CapAction
}

// CapAction is what happens to a request whose priority maps above its tenant's MaxBand.
type CapAction uint8

const (
	// CapLower serves the request in its tenant's MaxBand (Decision.Capped).
	CapLower CapAction = iota
	// CapReject rejects the request with ReasonBandNotAllowed.
	CapReject
)

var capActionNames = [...]string{CapLower: "Lower", CapReject: "Reject"}

// String returns the action's policy name ("Lower", "Reject").
func (a CapAction) String() string {
	if int(a) < len(capActionNames) {
		return capActionNames[a]
	}
	return fmt.Sprintf("CapAction(%d)", uint8(a))
}

// ParseCapAction parses a policy's aboveMaxBand value, case-insensitively.
func ParseCapAction(s string) (CapAction, error) {
	for i, name := range capActionNames {
		if strings.EqualFold(s, name) {
			return CapAction(i), nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want %s or %s)", s, CapLower, CapReject)
}

// BandConfig is one band's validated configuration. See APIBandConfig for the meaning of each field.
type BandConfig struct {
	MaxQueuedRequests int64
	MaxQueuedBytes    int64
	MaxQueueTime      time.Duration
	// OverShareMaxQueueTime replaces MaxQueueTime for a tenant sharing its band's drain (sharesDrainLocked), capped
	// by MaxQueueTime.
	OverShareMaxQueueTime time.Duration
	SaturationCeiling     float64
	RejectWhenSaturated   bool
	RetryAfterMin         time.Duration
	RetryAfterMax         time.Duration
	MayDisplace           bool
}

// overShareQueueTime is OverShareMaxQueueTime capped by MaxQueueTime: how long a request of a tenant sharing the
// band's drain may be predicted to wait.
func (bc *BandConfig) overShareQueueTime() time.Duration {
	return min(bc.OverShareMaxQueueTime, bc.MaxQueueTime)
}

// EndpointThresholds is the validated form of APIEndpointThresholds.
type EndpointThresholds struct {
	QueueDepth  int
	KVCacheUtil float64
	Running     int
	Pending     int
	PendingTime time.Duration
	// BurstQueueDepth and BurstPendingTime replace QueueDepth and PendingTime in the burst tier; BurstQueueDepth 0
	// disables it.
	BurstQueueDepth  int
	BurstPendingTime time.Duration
	MetricsStaleness time.Duration
	// Concurrency is the stated concurrency of every endpoint; 0 learns it.
	Concurrency int
}

// TenantPolicy is one tenant's validated policy.
type TenantPolicy struct {
	Weight  float64
	MaxBand Band
}

// DefaultConfig returns the configuration used when no policy exists.
func DefaultConfig() *Config {
	cfg, err := NewConfig(nil)
	if err != nil {
		panic("flowcontrol: defaults do not validate: " + err.Error())
	}
	return cfg
}

// ParseConfig decodes a JSON APIConfig (unknown fields are errors), applies defaults and validates it. Empty input
// yields the defaults.
func ParseConfig(raw []byte) (*Config, error) {
	var api APIConfig
	if len(bytes.TrimSpace(raw)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&api); err != nil {
			return nil, fmt.Errorf("invalid flow control configuration: %w", err)
		}
	}
	return NewConfig(&api)
}

// NewConfig applies defaults to a copy of api (nil means all defaults), validates it and returns the plain Config.
// All validation failures are reported together.
func NewConfig(api *APIConfig) (*Config, error) {
	var safe APIConfig
	if api != nil {
		safe = *api
	}
	applyDefaults(&safe)
	cfg, convErr := toConfig(&safe)
	if err := errors.Join(convErr, cfg.Validate()); err != nil {
		return nil, fmt.Errorf("invalid flow control configuration: %w", err)
	}
	return cfg, nil
}

// applyDefaults fills unset fields. Nested structs are copied before being written, so the caller's APIConfig is
// never modified.
func applyDefaults(api *APIConfig) {
	bands := APIBands{}
	if api.Bands != nil {
		bands = *api.Bands
	}
	for _, b := range allBands {
		slot := bands.slot(b)
		bc := APIBandConfig{}
		if *slot != nil {
			bc = **slot
		}
		d := defaultBands[b]
		bc.MaxQueuedRequests = orDefault(bc.MaxQueuedRequests, d.MaxQueuedRequests)
		bc.MaxQueuedBytes = orDefault(bc.MaxQueuedBytes, d.MaxQueuedBytes)
		bc.MaxQueueTime = orDefaultDuration(bc.MaxQueueTime, d.MaxQueueTime)
		bc.OverShareMaxQueueTime = orDefaultDuration(bc.OverShareMaxQueueTime, d.OverShareMaxQueueTime)
		bc.SaturationCeiling = orDefault(bc.SaturationCeiling, d.SaturationCeiling)
		bc.RejectWhenSaturated = orDefault(bc.RejectWhenSaturated, d.RejectWhenSaturated)
		bc.RetryAfterMin = orDefaultDuration(bc.RetryAfterMin, d.RetryAfterMin)
		bc.RetryAfterMax = orDefaultDuration(bc.RetryAfterMax, d.RetryAfterMax)
		bc.MayDisplace = orDefault(bc.MayDisplace, d.MayDisplace)
		*slot = &bc
	}
	api.Bands = &bands

	api.MaxQueuedRequests = orDefault(api.MaxQueuedRequests, DefaultMaxQueuedRequests)
	api.MaxQueuedBytes = orDefault(api.MaxQueuedBytes, DefaultMaxQueuedBytes)

	pm := APIPriorityMapping{}
	if api.PriorityMapping != nil {
		pm = *api.PriorityMapping
	}
	pm.CriticalMinPriority = orDefault(pm.CriticalMinPriority, DefaultCriticalMinPriority)
	pm.SheddableMaxPriority = orDefault(pm.SheddableMaxPriority, DefaultSheddableMaxPriority)
	api.PriorityMapping = &pm

	ep := APIEndpointThresholds{}
	if api.Endpoint != nil {
		ep = *api.Endpoint
	}
	ep.QueueDepthThreshold = orDefault(ep.QueueDepthThreshold, DefaultQueueDepthThreshold)
	ep.KVCacheUtilThreshold = orDefault(ep.KVCacheUtilThreshold, DefaultKVCacheUtilThreshold)
	ep.RunningThreshold = orDefault(ep.RunningThreshold, 0)
	ep.PendingThreshold = orDefault(ep.PendingThreshold, DefaultPendingThreshold)
	ep.PendingTimeThreshold = orDefaultDuration(ep.PendingTimeThreshold, DefaultPendingTimeThreshold)
	ep.BurstQueueDepthThreshold = orDefault(ep.BurstQueueDepthThreshold, DefaultBurstQueueDepthThreshold)
	ep.BurstPendingTimeThreshold = orDefaultDuration(ep.BurstPendingTimeThreshold, DefaultBurstPendingTimeThreshold)
	ep.MetricsStalenessThreshold = orDefaultDuration(ep.MetricsStalenessThreshold, DefaultMetricsStalenessThreshold)
	ep.Concurrency = orDefault(ep.Concurrency, 0)
	api.Endpoint = &ep

	tenants := make([]APITenantPolicy, len(api.Tenants))
	for i, t := range api.Tenants {
		t.Weight = orDefault(t.Weight, DefaultTenantWeight)
		t.MaxBand = orDefault(t.MaxBand, Critical.String())
		tenants[i] = t
	}
	api.Tenants = tenants

	dt := APITenantPolicy{}
	if api.DefaultTenant != nil {
		dt = *api.DefaultTenant
	}
	dt.Weight = orDefault(dt.Weight, DefaultTenantWeight)
	dt.MaxBand = orDefault(dt.MaxBand, Critical.String())
	api.DefaultTenant = &dt

	api.RetryAfterJitter = orDefault(api.RetryAfterJitter, DefaultRetryAfterJitter)
	api.DrainRateWindow = orDefaultDuration(api.DrainRateWindow, DefaultDrainRateWindow)
	api.TenantHeader = orDefault(api.TenantHeader, DefaultTenantHeader)
	api.AboveMaxBand = orDefault(api.AboveMaxBand, CapLower.String())
}

func (b *APIBands) slot(band Band) **APIBandConfig {
	switch band {
	case Critical:
		return &b.Critical
	case Standard:
		return &b.Standard
	default:
		return &b.Sheddable
	}
}

func orDefault[T any](v *T, def T) *T {
	if v == nil {
		return ptr.To(def)
	}
	return v
}

func orDefaultDuration(v *metav1.Duration, def time.Duration) *metav1.Duration {
	if v == nil {
		return &metav1.Duration{Duration: def}
	}
	return v
}

// burstThreshold is a burst-tier threshold as configured, raised to the normal one: the burst tier is never stricter
// than the normal tier, so a policy that raises a normal threshold past the burst default (or an older policy written
// before the burst tier existed) keeps working. Negative values are left for Validate to report.
func burstThreshold[T int | time.Duration](burst, normal T) T {
	if burst > 0 && burst < normal {
		return normal
	}
	return burst
}

// toConfig converts a defaulted APIConfig. It reports what cannot be represented (unknown band names, duplicate
// tenants); range checks are Validate's job.
func toConfig(api *APIConfig) (*Config, error) {
	var errs []error
	cfg := &Config{
		MaxQueuedRequests:    *api.MaxQueuedRequests,
		MaxQueuedBytes:       *api.MaxQueuedBytes,
		CriticalMinPriority:  *api.PriorityMapping.CriticalMinPriority,
		SheddableMaxPriority: *api.PriorityMapping.SheddableMaxPriority,
		Endpoint: EndpointThresholds{
			QueueDepth:       *api.Endpoint.QueueDepthThreshold,
			KVCacheUtil:      *api.Endpoint.KVCacheUtilThreshold,
			Running:          *api.Endpoint.RunningThreshold,
			Pending:          *api.Endpoint.PendingThreshold,
			PendingTime:      api.Endpoint.PendingTimeThreshold.Duration,
			BurstQueueDepth:  burstThreshold(*api.Endpoint.BurstQueueDepthThreshold, *api.Endpoint.QueueDepthThreshold),
			BurstPendingTime: burstThreshold(api.Endpoint.BurstPendingTimeThreshold.Duration, api.Endpoint.PendingTimeThreshold.Duration),
			MetricsStaleness: api.Endpoint.MetricsStalenessThreshold.Duration,
			Concurrency:      *api.Endpoint.Concurrency,
		},
		Tenants:          make(map[string]TenantPolicy, len(api.Tenants)),
		RetryAfterJitter: *api.RetryAfterJitter,
		DrainRateWindow:  api.DrainRateWindow.Duration,
		TenantHeader:     strings.ToLower(*api.TenantHeader),
	}
	for _, b := range allBands {
		bc := *api.Bands.slot(b)
		cfg.Bands[b] = BandConfig{
			MaxQueuedRequests:     *bc.MaxQueuedRequests,
			MaxQueuedBytes:        *bc.MaxQueuedBytes,
			MaxQueueTime:          bc.MaxQueueTime.Duration,
			OverShareMaxQueueTime: bc.OverShareMaxQueueTime.Duration,
			SaturationCeiling:     *bc.SaturationCeiling,
			RejectWhenSaturated:   *bc.RejectWhenSaturated,
			RetryAfterMin:         bc.RetryAfterMin.Duration,
			RetryAfterMax:         bc.RetryAfterMax.Duration,
			MayDisplace:           *bc.MayDisplace,
		}
	}
	for i, t := range api.Tenants {
		if t.Name == "" {
			errs = append(errs, fmt.Errorf("tenants[%d].name must not be empty", i))
			continue
		}
		if _, dup := cfg.Tenants[t.Name]; dup {
			errs = append(errs, fmt.Errorf("tenants[%d]: duplicate tenant %q", i, t.Name))
			continue
		}
		band, err := ParseBand(*t.MaxBand)
		if err != nil {
			errs = append(errs, fmt.Errorf("tenants[%d] (%q).maxBand: %w", i, t.Name, err))
			continue
		}
		cfg.Tenants[t.Name] = TenantPolicy{Weight: *t.Weight, MaxBand: band}
	}
	if api.DefaultTenant.Name != "" {
		errs = append(errs, fmt.Errorf("defaultTenant.name must be empty, got %q", api.DefaultTenant.Name))
	}
	band, err := ParseBand(*api.DefaultTenant.MaxBand)
	if err != nil {
		errs = append(errs, fmt.Errorf("defaultTenant.maxBand: %w", err))
	}
	cfg.DefaultTenant = TenantPolicy{Weight: *api.DefaultTenant.Weight, MaxBand: band}
	if cfg.AboveMaxBand, err = ParseCapAction(*api.AboveMaxBand); err != nil {
		errs = append(errs, fmt.Errorf("aboveMaxBand: %w", err))
	}
	return cfg, errors.Join(errs...)
}

// Validate checks every constraint and reports all violations together.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxQueuedRequests < 0 {
		errs = append(errs, fmt.Errorf("maxQueuedRequests must not be negative, got %d", c.MaxQueuedRequests))
	}
	if c.MaxQueuedBytes < 0 {
		errs = append(errs, fmt.Errorf("maxQueuedBytes must not be negative, got %d", c.MaxQueuedBytes))
	}
	for _, b := range allBands {
		bc := c.Bands[b]
		p := "bands." + lowerFirst(b.String()) + "."
		if bc.MaxQueuedRequests < 0 {
			errs = append(errs, fmt.Errorf("%smaxQueuedRequests must not be negative, got %d", p, bc.MaxQueuedRequests))
		}
		if bc.MaxQueuedBytes < 0 {
			errs = append(errs, fmt.Errorf("%smaxQueuedBytes must not be negative, got %d", p, bc.MaxQueuedBytes))
		}
		if bc.MaxQueueTime <= 0 {
			errs = append(errs, fmt.Errorf("%smaxQueueTime must be positive, got %v", p, bc.MaxQueueTime))
		}
		if bc.OverShareMaxQueueTime <= 0 {
			errs = append(errs, fmt.Errorf("%soverShareMaxQueueTime must be positive, got %v", p, bc.OverShareMaxQueueTime))
		}
		if !(bc.SaturationCeiling > 0) {
			errs = append(errs, fmt.Errorf("%ssaturationCeiling must be positive, got %v", p, bc.SaturationCeiling))
		}
		if bc.RetryAfterMin < time.Second {
			errs = append(errs, fmt.Errorf("%sretryAfterMin must be at least 1s, got %v", p, bc.RetryAfterMin))
		}
		if bc.RetryAfterMin > bc.RetryAfterMax {
			errs = append(errs, fmt.Errorf("%sretryAfterMin (%v) must not exceed retryAfterMax (%v)",
				p, bc.RetryAfterMin, bc.RetryAfterMax))
		}
		if b > Critical && bc.SaturationCeiling > c.Bands[b-1].SaturationCeiling {
			errs = append(errs, fmt.Errorf("inverted ceilings: bands.%s.saturationCeiling (%v) exceeds bands.%s.saturationCeiling (%v); "+
				"a lower band must not get headroom a higher band lacks", lowerFirst(b.String()), bc.SaturationCeiling,
				lowerFirst((b-1).String()), c.Bands[b-1].SaturationCeiling))
		}
	}
	if c.SheddableMaxPriority >= c.CriticalMinPriority {
		errs = append(errs, fmt.Errorf("priorityMapping.sheddableMaxPriority (%d) must be below criticalMinPriority (%d)",
			c.SheddableMaxPriority, c.CriticalMinPriority))
	}
	if c.Endpoint.QueueDepth <= 0 {
		errs = append(errs, fmt.Errorf("endpoint.queueDepthThreshold must be positive, got %d", c.Endpoint.QueueDepth))
	}
	if !(c.Endpoint.KVCacheUtil > 0 && c.Endpoint.KVCacheUtil <= 1) {
		errs = append(errs, fmt.Errorf("endpoint.kvCacheUtilThreshold must be in (0, 1], got %v", c.Endpoint.KVCacheUtil))
	}
	if c.Endpoint.Running < 0 {
		errs = append(errs, fmt.Errorf("endpoint.runningThreshold must not be negative, got %d", c.Endpoint.Running))
	}
	if c.Endpoint.Pending < 0 {
		errs = append(errs, fmt.Errorf("endpoint.pendingThreshold must not be negative, got %d", c.Endpoint.Pending))
	}
	if c.Endpoint.PendingTime < 0 {
		errs = append(errs, fmt.Errorf("endpoint.pendingTimeThreshold must not be negative, got %v", c.Endpoint.PendingTime))
	}
	if b := c.Endpoint.BurstQueueDepth; b < 0 || (b > 0 && b < c.Endpoint.QueueDepth) {
		errs = append(errs, fmt.Errorf("endpoint.burstQueueDepthThreshold must be 0 (no burst tier) or at least queueDepthThreshold (%d), got %d",
			c.Endpoint.QueueDepth, b))
	}
	if b := c.Endpoint.BurstPendingTime; b < 0 {
		errs = append(errs, fmt.Errorf("endpoint.burstPendingTimeThreshold must not be negative, got %v", b))
	} else if b > 0 && b < c.Endpoint.PendingTime {
		errs = append(errs, fmt.Errorf("endpoint.burstPendingTimeThreshold must be 0 or at least pendingTimeThreshold (%v), got %v",
			c.Endpoint.PendingTime, b))
	}
	if c.Endpoint.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("endpoint.concurrency must not be negative, got %d", c.Endpoint.Concurrency))
	}
	if c.Endpoint.MetricsStaleness <= 0 {
		errs = append(errs, fmt.Errorf("endpoint.metricsStalenessThreshold must be positive, got %v", c.Endpoint.MetricsStaleness))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tenants)) {
		errs = append(errs, validateTenant(fmt.Sprintf("tenants[%q]", name), c.Tenants[name])...)
	}
	errs = append(errs, validateTenant("defaultTenant", c.DefaultTenant)...)
	if !(c.RetryAfterJitter >= 0 && c.RetryAfterJitter < 1) {
		errs = append(errs, fmt.Errorf("retryAfterJitter must be in [0, 1), got %v", c.RetryAfterJitter))
	}
	if c.DrainRateWindow <= 0 {
		errs = append(errs, fmt.Errorf("drainRateWindow must be positive, got %v", c.DrainRateWindow))
	}
	if !httpguts.ValidHeaderFieldName(c.TenantHeader) || c.TenantHeader != strings.ToLower(c.TenantHeader) ||
		len(c.TenantHeader) > maxHeaderNameLen {
		errs = append(errs, fmt.Errorf("tenantHeader must be a lower-case HTTP header name of at most %d bytes, got %q",
			maxHeaderNameLen, c.TenantHeader))
	}
	if int(c.AboveMaxBand) >= len(capActionNames) {
		errs = append(errs, fmt.Errorf("aboveMaxBand is not a valid action: %v", c.AboveMaxBand))
	}
	return errors.Join(errs...)
}

func validateTenant(path string, t TenantPolicy) []error {
	var errs []error
	if !(t.Weight > 0) || t.Weight > 1e6 {
		errs = append(errs, fmt.Errorf("%s.weight must be in (0, 1e6], got %v", path, t.Weight))
	}
	if !t.MaxBand.Valid() {
		errs = append(errs, fmt.Errorf("%s.maxBand is not a valid band: %v", path, t.MaxBand))
	}
	return errs
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]|0x20) + s[1:]
}

// BandFor maps an InferenceObjective priority to a band.
func (c *Config) BandFor(priority int) Band {
	switch {
	case priority >= c.CriticalMinPriority:
		return Critical
	case priority <= c.SheddableMaxPriority:
		return Sheddable
	default:
		return Standard
	}
}

// clone returns a copy that shares nothing mutable with c.
func (c *Config) clone() *Config {
	cp := *c
	cp.Tenants = maps.Clone(c.Tenants)
	return &cp
}

// tenantPolicy returns the policy of a tenant (fairness ID).
func (c *Config) tenantPolicy(tenant string) TenantPolicy {
	if p, ok := c.Tenants[tenant]; ok {
		return p
	}
	return c.DefaultTenant
}
