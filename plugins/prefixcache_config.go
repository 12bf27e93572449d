package plugins

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-gw/sluice/prefixcache"
)

// The configuration of the sluice-prefix-cache-scorer: its JSON parameters, their defaults (prefixcache.DefaultConfig)
// and their validation, which reports every violated constraint at once.

// prefixCacheAPIConfig is the JSON schema of PrefixCache's parameters. Every
// field is optional; see prefixcache.Config for meanings and defaults.
type prefixCacheAPIConfig struct {
	// BytesPerToken is the token rule: prompt bytes per approximate token.
	BytesPerToken      *float64 `json:"bytesPerToken,omitempty"`
	DefaultBlockTokens *int     `json:"defaultBlockTokens,omitempty"`
	DefaultPodBlocks   *int     `json:"defaultPodBlocks,omitempty"`
	MaxBlocksPerPod    *int     `json:"maxBlocksPerPod,omitempty"`
	MaxPods            *int     `json:"maxPods,omitempty"`
	MaxPrefixTokens    *int     `json:"maxPrefixTokens,omitempty"`

	OverloadAbsolute *float64 `json:"overloadAbsolute,omitempty"`
	OverloadRelative *float64 `json:"overloadRelative,omitempty"`
	TaperStart       *float64 `json:"taperStart,omitempty"`
	KVCacheCutoff    *float64 `json:"kvCacheCutoff,omitempty"`

	CalibrationTolerance *float64 `json:"calibrationTolerance,omitempty"`
	ShrinkGain           *float64 `json:"shrinkGain,omitempty"`
	GrowGain             *float64 `json:"growGain,omitempty"`
	MinCapacityFraction  *float64 `json:"minCapacityFraction,omitempty"`
	MinPredictedFraction *float64 `json:"minPredictedFraction,omitempty"`
	MinCounterQueries    *float64 `json:"minCounterQueries,omitempty"`

	PendingTTL *metav1.Duration `json:"pendingTTL,omitempty"`
	MaxPending *int             `json:"maxPending,omitempty"`

	// PodSyncInterval is how often pods that left the pool are forgotten
	// and unanswered requests expired. Default 30s.
	PodSyncInterval *metav1.Duration `json:"podSyncInterval,omitempty"`
	// HitsMetric and QueriesMetric name the model server's cumulative
	// prefix-cache counters (in tokens) read by the extractor. Defaults
	// vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total.
	HitsMetric    *string `json:"hitsMetric,omitempty"`
	QueriesMetric *string `json:"queriesMetric,omitempty"`
}

// prefixCacheConfig is the validated configuration of a PrefixCache.
type prefixCacheConfig struct {
	index           prefixcache.Config
	podSyncInterval time.Duration
	hitsMetric      string
	queriesMetric   string
}

func applyPrefixCacheDefaults(c *prefixCacheAPIConfig) {
	d := prefixcache.DefaultConfig()
	setDefault(&c.BytesPerToken, d.Tokens.BytesPerToken)
	setDefault(&c.DefaultBlockTokens, d.DefaultBlockTokens)
	setDefault(&c.DefaultPodBlocks, d.DefaultPodBlocks)
	setDefault(&c.MaxBlocksPerPod, d.MaxBlocksPerPod)
	setDefault(&c.MaxPods, d.MaxPods)
	setDefault(&c.MaxPrefixTokens, d.MaxPrefixTokens)
	setDefault(&c.OverloadAbsolute, d.Guard.OverloadAbsolute)
	setDefault(&c.OverloadRelative, d.Guard.OverloadRelative)
	setDefault(&c.TaperStart, d.Guard.TaperStart)
	setDefault(&c.KVCacheCutoff, d.Guard.KVCacheCutoff)
	setDefault(&c.CalibrationTolerance, d.Calibration.Tolerance)
	setDefault(&c.ShrinkGain, d.Calibration.ShrinkGain)
	setDefault(&c.GrowGain, d.Calibration.GrowGain)
	setDefault(&c.MinCapacityFraction, d.Calibration.MinCapacityFraction)
	setDefault(&c.MinPredictedFraction, d.Calibration.MinPredictedFraction)
	setDefault(&c.MinCounterQueries, d.Calibration.MinCounterQueries)
	setDefault(&c.PendingTTL, metav1.Duration{Duration: d.PendingTTL})
	setDefault(&c.MaxPending, d.MaxPending)
	setDefault(&c.PodSyncInterval, metav1.Duration{Duration: 30 * time.Second})
	setDefault(&c.HitsMetric, "vllm:prefix_cache_hits_total")
	setDefault(&c.QueriesMetric, "vllm:prefix_cache_queries_total")
}

func setDefault[T any](field **T, v T) {
	if *field == nil {
		*field = &v
	}
}

// validatePrefixCacheConfig turns a defaulted configuration into a
// prefixCacheConfig, reporting every violated constraint at once.
func validatePrefixCacheConfig(c *prefixCacheAPIConfig) (prefixCacheConfig, error) {
	cfg := prefixCacheConfig{
		index: prefixcache.Config{
			Tokens:             prefixcache.TokenRule{BytesPerToken: *c.BytesPerToken},
			DefaultBlockTokens: *c.DefaultBlockTokens,
			DefaultPodBlocks:   *c.DefaultPodBlocks,
			MaxBlocksPerPod:    *c.MaxBlocksPerPod,
			MaxPods:            *c.MaxPods,
			MaxPrefixTokens:    *c.MaxPrefixTokens,
			Guard: prefixcache.GuardConfig{
				OverloadAbsolute: *c.OverloadAbsolute,
				OverloadRelative: *c.OverloadRelative,
				TaperStart:       *c.TaperStart,
				KVCacheCutoff:    *c.KVCacheCutoff,
			},
			Calibration: prefixcache.CalibrationConfig{
				Tolerance:            *c.CalibrationTolerance,
				ShrinkGain:           *c.ShrinkGain,
				GrowGain:             *c.GrowGain,
				MinCapacityFraction:  *c.MinCapacityFraction,
				MinPredictedFraction: *c.MinPredictedFraction,
				MinCounterQueries:    *c.MinCounterQueries,
			},
			PendingTTL: c.PendingTTL.Duration,
			MaxPending: *c.MaxPending,
		},
		podSyncInterval: c.PodSyncInterval.Duration,
		hitsMetric:      *c.HitsMetric,
		queriesMetric:   *c.QueriesMetric,
	}
	errs := []error{cfg.index.Validate()}
	if cfg.podSyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("podSyncInterval must be > 0, got %v", cfg.podSyncInterval))
	}
	if cfg.hitsMetric == "" || cfg.queriesMetric == "" {
		errs = append(errs, errors.New("hitsMetric and queriesMetric must not be empty"))
	}
	return cfg, errors.Join(errs...)
}

// parsePrefixCacheConfig decodes raw (unknown fields are errors), applies
// defaults and validates.
func parsePrefixCacheConfig(raw json.RawMessage) (prefixCacheConfig, error) {
	var api prefixCacheAPIConfig
	if err := decodeParams(raw, &api); err != nil {
		return prefixCacheConfig{}, fmt.Errorf("%s parameters: %w", PrefixCacheType, err)
	}
	applyPrefixCacheDefaults(&api)
	cfg, err := validatePrefixCacheConfig(&api)
	if err != nil {
		return prefixCacheConfig{}, fmt.Errorf("%s parameters: %w", PrefixCacheType, err)
	}
	return cfg, nil
}
