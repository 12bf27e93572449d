package plugins

import (
	"encoding/json"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-gw/sluice/lora"
)

// The configuration of the sluice-lora-affinity-scorer: its JSON parameters, their defaults (lora.DefaultConfig) and
// their validation, which reports every violated constraint by JSON field name.

// loraAffinityAPIConfig is the JSON schema of LoRAAffinity's parameters.
type loraAffinityAPIConfig struct {
	// SpillQueueDepth: a pod holding the adapter with more waiting requests
	// than this is overloaded, and a pod with a free slot wins. Default 5.
	SpillQueueDepth *int `json:"spillQueueDepth,omitempty"`
	// LoadBound is epsilon of bounded-load rendezvous placement: the chosen
	// pod's load stays within (1+epsilon) times the average. Default 0.25.
	LoadBound *float64 `json:"loadBound,omitempty"`
	// MemoryHalfLife: a remembered send weighs half after this. Default 30s.
	MemoryHalfLife *metav1.Duration `json:"memoryHalfLife,omitempty"`
	// MemoryTTL: a remembered send is forgotten after this. Default 2m.
	MemoryTTL *metav1.Duration `json:"memoryTTL,omitempty"`
	// MemoryCapacity bounds the remembered (adapter, pod) sends. Default 4096.
	MemoryCapacity *int `json:"memoryCapacity,omitempty"`
	// BaseModels names the models served without an adapter. Requests for
	// them are never scored by adapter state. Names reported by the
	// residency extractor's base-model label are added at scoring time.
	BaseModels []string `json:"baseModels,omitempty"`
}

// loraAffinityConfig is the validated configuration of a LoRAAffinity.
type loraAffinityConfig struct {
	scorer     lora.Config
	baseModels map[string]struct{}
}

func applyLoRAAffinityDefaults(c *loraAffinityAPIConfig) {
	d := lora.DefaultConfig()
	if c.SpillQueueDepth == nil {
		c.SpillQueueDepth = &d.SpillQueueDepth
	}
	if c.LoadBound == nil {
		c.LoadBound = &d.LoadBound
	}
	if c.MemoryHalfLife == nil {
		c.MemoryHalfLife = &metav1.Duration{Duration: d.MemoryHalfLife}
	}
	if c.MemoryTTL == nil {
		c.MemoryTTL = &metav1.Duration{Duration: d.MemoryTTL}
	}
	if c.MemoryCapacity == nil {
		c.MemoryCapacity = &d.MemoryCapacity
	}
}

// validateLoRAAffinityConfig reports, by JSON field name, every constraint a
// defaulted configuration violates.
func validateLoRAAffinityConfig(c *loraAffinityAPIConfig) error {
	var errs []error
	if *c.SpillQueueDepth < 0 {
		errs = append(errs, fmt.Errorf("spillQueueDepth must be >= 0, got %d", *c.SpillQueueDepth))
	}
	if lb := *c.LoadBound; !(lb > 0) || lb > 1e6 {
		errs = append(errs, fmt.Errorf("loadBound must be in (0, 1e6], got %v", lb))
	}
	if c.MemoryHalfLife.Duration <= 0 {
		errs = append(errs, fmt.Errorf("memoryHalfLife must be > 0, got %v", c.MemoryHalfLife.Duration))
	}
	if c.MemoryTTL.Duration < c.MemoryHalfLife.Duration {
		errs = append(errs, fmt.Errorf("memoryTTL (%v) must be >= memoryHalfLife (%v)", c.MemoryTTL.Duration, c.MemoryHalfLife.Duration))
	}
	if *c.MemoryCapacity <= 0 {
		errs = append(errs, fmt.Errorf("memoryCapacity must be > 0, got %d", *c.MemoryCapacity))
	}
	for i, m := range c.BaseModels {
		if m == "" {
			errs = append(errs, fmt.Errorf("baseModels[%d] must not be empty", i))
		}
	}
	return errors.Join(errs...)
}

// parseLoRAAffinityConfig turns raw plugin parameters into a validated
// configuration. Unknown fields are rejected so a typo is not silently a
// default.
func parseLoRAAffinityConfig(raw json.RawMessage) (loraAffinityConfig, error) {
	var api loraAffinityAPIConfig
	if err := decodeParams(raw, &api); err != nil {
		return loraAffinityConfig{}, fmt.Errorf("parsing %s parameters: %w", LoRAAffinityType, err)
	}
	applyLoRAAffinityDefaults(&api)
	if err := validateLoRAAffinityConfig(&api); err != nil {
		return loraAffinityConfig{}, fmt.Errorf("invalid %s parameters: %w", LoRAAffinityType, err)
	}
	cfg := loraAffinityConfig{
		scorer: lora.Config{
			SpillQueueDepth: *api.SpillQueueDepth,
			LoadBound:       *api.LoadBound,
			MemoryHalfLife:  api.MemoryHalfLife.Duration,
			MemoryTTL:       api.MemoryTTL.Duration,
			MemoryCapacity:  *api.MemoryCapacity,
		},
		baseModels: make(map[string]struct{}, len(api.BaseModels)),
	}
	for _, m := range api.BaseModels {
		cfg.baseModels[m] = struct{}{}
	}
	return cfg, nil
}
