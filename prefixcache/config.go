package prefixcache

import (
	"errors"
	"fmt"
	"time"
)

// Config parameterises an Index. Build one with DefaultConfig and override
// fields; New validates it.
type Config struct {
	// Tokens is the rule that turns prompt bytes into approximate tokens.
	Tokens TokenRule
	// DefaultBlockTokens is the KV block size assumed for a pod that does not
	// report one (vllm:cache_config_info block_size). vLLM's default is 16.
	DefaultBlockTokens int
	// DefaultPodBlocks is the KV capacity, in blocks, assumed for a pod that
	// does not report vllm:cache_config_info num_gpu_blocks.
	DefaultPodBlocks int
	// MaxBlocksPerPod caps any pod's index, whatever it reports: together
	// with MaxPods it bounds the index's memory (see Bounds).
	MaxBlocksPerPod int
	// MaxPods caps how many pods are indexed at once. Pods beyond it score 0
	// until one of the indexed pods is forgotten.
	MaxPods int
	// MaxPrefixTokens is how much of a prompt is hashed and matched. Two
	// prompts equal up to this length are indistinguishable.
	MaxPrefixTokens int

	Guard       GuardConfig
	Calibration CalibrationConfig

	// PendingTTL is how long a routed request waits for its usage report
	// before its prediction is dropped (and its in-flight count released).
	PendingTTL time.Duration
	// MaxPending caps the routed requests awaiting a usage report. When it
	// is reached new requests are still indexed but not calibrated against.
	MaxPending int
}

// GuardConfig says when load outweighs a prefix match. A pod's load is
// max(queued+running as scraped, requests this index routed to it that have
// not finished); the pool's load is the mean over the scored candidates.
//
// A pod's affinity is multiplied by a weight that is 1 while the pod's load
// is below OverloadRelative × pool mean or its excess over the mean is at most
// TaperStart × OverloadAbsolute, falls linearly to 0 as the excess reaches
// OverloadAbsolute, and is 0 beyond. A pod whose KV utilisation is at least
// KVCacheCutoff gets 0 too.
type GuardConfig struct {
	// OverloadAbsolute is the excess over the pool mean, in requests, at
	// which a pod loses all affinity.
	OverloadAbsolute float64
	// OverloadRelative is the ratio to the pool mean below which a pod keeps
	// full affinity whatever its absolute excess, so that a uniformly busy
	// pool still routes by prefix.
	OverloadRelative float64
	// TaperStart is the fraction of OverloadAbsolute at which the taper
	// starts, in [0,1).
	TaperStart float64
	// KVCacheCutoff is the KV utilisation (0..1] at which a pod gets no
	// affinity: it has no room to keep what it would be sent.
	KVCacheCutoff float64
}

// CalibrationConfig tunes how observed cache hits shrink or restore a pod's
// effective capacity. See doc.go for the model.
type CalibrationConfig struct {
	// Tolerance is how far reality may fall short of a prediction (as a
	// fraction of it) before capacity shrinks; it absorbs the error of the
	// token rule and of chat templates.
	Tolerance float64
	// ShrinkGain scales a shortfall into a multiplicative cut:
	// f ← f·(1 − ShrinkGain·(1 − ratio)).
	ShrinkGain float64
	// GrowGain is the fraction of the gap to nominal capacity recovered per
	// accurate observation: f ← f + GrowGain·(1 − f).
	GrowGain float64
	// MinCapacityFraction is the floor of f.
	MinCapacityFraction float64
	// MinPredictedFraction is the smallest predicted hit fraction of a
	// prompt that counts as a prediction worth checking.
	MinPredictedFraction float64
	// MinCounterQueries is the smallest increase of a pod's
	// prefix_cache_queries counter (tokens) that is compared with the
	// predictions made over the same interval.
	MinCounterQueries float64
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Tokens:             TokenRule{BytesPerToken: 4},
		DefaultBlockTokens: 16,
		DefaultPodBlocks:   31250,
		MaxBlocksPerPod:    1 << 18,
		MaxPods:            1024,
		MaxPrefixTokens:    16384,
		Guard: GuardConfig{
			OverloadAbsolute: 8,
			OverloadRelative: 1.5,
			TaperStart:       0.5,
			KVCacheCutoff:    0.98,
		},
		Calibration: CalibrationConfig{
			Tolerance:            0.2,
			ShrinkGain:           0.25,
			GrowGain:             0.05,
			MinCapacityFraction:  0.05,
			MinPredictedFraction: 0.05,
			MinCounterQueries:    256,
		},
		PendingTTL: 10 * time.Minute,
		MaxPending: 1 << 16,
	}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be > 0, got %d", name, v))
		}
	}
	if !(c.Tokens.BytesPerToken > 0) || c.Tokens.BytesPerToken > 64 {
		errs = append(errs, fmt.Errorf("bytesPerToken must be in (0,64], got %v", c.Tokens.BytesPerToken))
	}
	positive("defaultBlockTokens", c.DefaultBlockTokens)
	positive("defaultPodBlocks", c.DefaultPodBlocks)
	positive("maxBlocksPerPod", c.MaxBlocksPerPod)
	positive("maxPods", c.MaxPods)
	positive("maxPrefixTokens", c.MaxPrefixTokens)
	positive("maxPending", c.MaxPending)
	if c.MaxBlocksPerPod > maxTableEntries {
		errs = append(errs, fmt.Errorf("maxBlocksPerPod must be <= %d, got %d", maxTableEntries, c.MaxBlocksPerPod))
	}
	if c.PendingTTL <= 0 {
		errs = append(errs, fmt.Errorf("pendingTTL must be > 0, got %v", c.PendingTTL))
	}
	g := c.Guard
	if !(g.OverloadAbsolute > 0) {
		errs = append(errs, fmt.Errorf("guard.overloadAbsolute must be > 0, got %v", g.OverloadAbsolute))
	}
	if !(g.OverloadRelative >= 1) {
		errs = append(errs, fmt.Errorf("guard.overloadRelative must be >= 1, got %v", g.OverloadRelative))
	}
	if !(g.TaperStart >= 0 && g.TaperStart < 1) {
		errs = append(errs, fmt.Errorf("guard.taperStart must be in [0,1), got %v", g.TaperStart))
	}
	if !(g.KVCacheCutoff > 0 && g.KVCacheCutoff <= 1) {
		errs = append(errs, fmt.Errorf("guard.kvCacheCutoff must be in (0,1], got %v", g.KVCacheCutoff))
	}
	k := c.Calibration
	in01 := func(name string, v float64, openLow bool) {
		if !(v <= 1) || v < 0 || (openLow && v == 0) {
			errs = append(errs, fmt.Errorf("calibration.%s must be in %s,1], got %v", name, map[bool]string{true: "(0", false: "[0"}[openLow], v))
		}
	}
	in01("tolerance", k.Tolerance, false)
	in01("shrinkGain", k.ShrinkGain, true)
	in01("growGain", k.GrowGain, false)
	in01("minCapacityFraction", k.MinCapacityFraction, true)
	in01("minPredictedFraction", k.MinPredictedFraction, true)
	if !(k.MinCounterQueries >= 0) {
		errs = append(errs, fmt.Errorf("calibration.minCounterQueries must be >= 0, got %v", k.MinCounterQueries))
	}
	return errors.Join(errs...)
}

// Bounds returns the largest number of (pod, block) entries the index can
// hold under c, the unit its memory is bounded by (see doc.go for the bytes).
func (c Config) Bounds() int64 {
	return int64(c.MaxPods) * int64(c.MaxBlocksPerPod)
}
