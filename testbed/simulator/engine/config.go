package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Config sizes one simulated server: its capacity (slots, KV blocks, LoRA
// slots) and its speed (the step-time model). A Config comes from a hardware
// profile (see Profile) plus per-parameter overrides; Validate must accept it
// before NewEngine does.
type Config struct {
	// MaxNumSeqs is the number of running slots (vLLM --max-num-seqs): the
	// most requests that hold KV blocks and take part in a step.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget (vLLM
	// --max-num-batched-tokens). Decodes take one token each; prefills are
	// chunked to fit what is left.
	MaxNumBatchedTokens int
	// NumGPUBlocks is the size of the KV cache in blocks.
	NumGPUBlocks int
	// BlockSize is the number of tokens per KV block (vLLM --block-size).
	BlockSize int
	// MaxModelLen bounds prompt plus output tokens of one request.
	MaxModelLen int
	// MaxLoRAs is the number of GPU LoRA slots (vLLM --max-loras): at most
	// this many distinct adapters take part in a step.
	MaxLoRAs int
	// LoRALoadTime is added to the step that first schedules a request whose
	// adapter is not resident (vLLM loads adapters inside the engine step, so
	// the whole batch pays it).
	LoRALoadTime time.Duration
	// StepBase is the fixed cost of one engine step (kernel launches,
	// sampling, scheduling).
	StepBase time.Duration
	// DecodePerSeq is added to a step per sequence that decodes in it, which
	// makes inter-token latency grow with the running batch.
	DecodePerSeq time.Duration
	// PrefillPerToken is added to a step per prompt token computed in it;
	// cached prefix tokens are not computed and cost nothing.
	PrefillPerToken time.Duration
	// DisablePrefixCaching turns automatic prefix caching off (vLLM
	// --no-enable-prefix-caching); the zero value keeps it on, as vLLM does.
	DisablePrefixCaching bool
}

// Validate reports every inconsistency in c at once.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	positive("max-num-seqs", c.MaxNumSeqs)
	positive("max-num-batched-tokens", c.MaxNumBatchedTokens)
	positive("num-gpu-blocks", c.NumGPUBlocks)
	positive("block-size", c.BlockSize)
	positive("max-model-len", c.MaxModelLen)
	if c.MaxLoRAs < 0 {
		errs = append(errs, fmt.Errorf("max-loras must not be negative, got %d", c.MaxLoRAs))
	}
	if c.LoRALoadTime < 0 || c.DecodePerSeq < 0 || c.PrefillPerToken < 0 {
		errs = append(errs, errors.New("lora-load-time, decode-per-seq and prefill-per-token must not be negative"))
	}
	if c.StepBase <= 0 {
		errs = append(errs, fmt.Errorf("step-base must be positive (a step must take time), got %v", c.StepBase))
	}
	if c.MaxNumBatchedTokens > 0 && c.MaxNumBatchedTokens < c.MaxNumSeqs {
		errs = append(errs, fmt.Errorf("max-num-batched-tokens (%d) must be >= max-num-seqs (%d), as vLLM requires",
			c.MaxNumBatchedTokens, c.MaxNumSeqs))
	}
	if c.NumGPUBlocks > 0 && c.BlockSize > 0 && c.MaxModelLen > c.NumGPUBlocks*c.BlockSize {
		errs = append(errs, fmt.Errorf("max-model-len (%d) exceeds the KV cache (%d blocks x %d tokens): one request could never run",
			c.MaxModelLen, c.NumGPUBlocks, c.BlockSize))
	}
	return errors.Join(errs...)
}

// profiles are hardware profiles for a Llama-3.1-8B-class model in BF16.
// The KV sizes follow from memory left after weights at
// gpu_memory_utilization 0.9 (128 KiB of KV per token); the speeds are
// typical vLLM measurements rounded to keep arithmetic readable.
var profiles = map[string]Config{
	"h100": {
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		NumGPUBlocks:        24576, // 393k tokens
		BlockSize:           16,
		MaxModelLen:         8192,
		MaxLoRAs:            4,
		LoRALoadTime:        25 * time.Millisecond,
		StepBase:            6 * time.Millisecond,
		DecodePerSeq:        60 * time.Microsecond, // ITL 6 ms alone, ~21 ms at 256 seqs
		PrefillPerToken:     40 * time.Microsecond, // 25k prompt tokens/s
	},
	"a10g": {
		MaxNumSeqs:          128,
		MaxNumBatchedTokens: 4096,
		NumGPUBlocks:        2560, // 41k tokens
		BlockSize:           16,
		MaxModelLen:         4096,
		MaxLoRAs:            2,
		LoRALoadTime:        60 * time.Millisecond,
		StepBase:            18 * time.Millisecond,
		DecodePerSeq:        250 * time.Microsecond, // ITL 18 ms alone, 50 ms at 128 seqs
		PrefillPerToken:     250 * time.Microsecond, // 4k prompt tokens/s
	},
}

// Profile returns the Config of the named hardware profile.
func Profile(name string) (Config, error) {
	c, ok := profiles[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown hardware profile %q (known: %v)", name, ProfileNames())
	}
	return c, nil
}

// ProfileNames lists the known hardware profiles in sorted order.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
