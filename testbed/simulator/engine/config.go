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

// profiles are the simulated servers. h100 and a10g are hardware profiles for a Llama-3.1-8B-class model in BF16:
// the KV sizes follow from memory left after weights at gpu_memory_utilization 0.9 (128 KiB of KV per token); the
// speeds are typical vLLM measurements rounded to keep arithmetic readable. Both run 128-256 sequences at once, so
// under load prompts contend in prefill long before a server has no slot left.
//
// The other profiles are server shapes that run out of something else first:
//
//   - slot4 and slot24 are slot-limited: vLLM run with --max-num-seqs 4 or 24 (latency-bound deployments cap the
//     batch), KV to spare, and a step time that doubles from one running sequence to a full batch, the slow-down
//     llm-d-inference-sim models with time-factor-under-load 2 (its TTFT and ITL grow linearly with the running
//     count up to max-num-seqs). Under load such a server keeps its own FIFO waiting queue, and a request sent to it
//     starts only when a running one finishes.
//   - kvbound is KV-bound: a 70B-class model in FP8 on one 80 GB GPU, where the weights leave about 6k tokens of
//     KV (400 blocks of 16; 320 KiB per token) for 256 slots. About ten 512/128-token requests fit; vLLM admits
//     waiting requests while their prompt's blocks fit (the queue's head blocks the rest), and when a decoding
//     request needs a block and none is free it preempts the latest admitted one, which recomputes later.
var profiles = map[string]Config{
	"h100": {
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		NumGPUBlocks:        24576, // 393k tokens
		BlockSize:           16,
		MaxModelLen:         131072, // Llama 3.1's context; its KV fits three such requests
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
	"slot4": {
		MaxNumSeqs:          4,
		MaxNumBatchedTokens: 2048, // vLLM's default for online serving below H100-class GPUs
		NumGPUBlocks:        2560, // 41k tokens: never the limit at 4 sequences
		BlockSize:           16,
		MaxModelLen:         4096,
		MaxLoRAs:            2,
		LoRALoadTime:        60 * time.Millisecond,
		StepBase:            12 * time.Millisecond,
		DecodePerSeq:        6 * time.Millisecond,  // ITL 18 ms alone, 36 ms at 4 seqs
		PrefillPerToken:     50 * time.Microsecond, // a 512-token prompt alone: first token after 38 ms
	},
	"slot24": {
		MaxNumSeqs:          24,
		MaxNumBatchedTokens: 2048,
		NumGPUBlocks:        2560, // 41k tokens: 24 sequences of 1.7k fit
		BlockSize:           16,
		MaxModelLen:         4096,
		MaxLoRAs:            2,
		LoRALoadTime:        60 * time.Millisecond,
		StepBase:            12 * time.Millisecond,
		DecodePerSeq:        500 * time.Microsecond, // ITL 12.5 ms alone, 24 ms at 24 seqs
		PrefillPerToken:     50 * time.Microsecond,
	},
	"kvbound": {
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		NumGPUBlocks:        400, // 6.4k tokens: about ten 512/128-token requests
		BlockSize:           16,
		MaxModelLen:         4096,
		MaxLoRAs:            2,
		LoRALoadTime:        50 * time.Millisecond,
		StepBase:            22 * time.Millisecond,
		DecodePerSeq:        150 * time.Microsecond, // ITL 22 ms alone, 24 ms at 10 seqs
		PrefillPerToken:     150 * time.Microsecond, // 6.7k prompt tokens/s
	},
}

// Profile returns the Config of the named profile.
func Profile(name string) (Config, error) {
	c, ok := profiles[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown hardware profile %q (known: %v)", name, ProfileNames())
	}
	return c, nil
}

// ProfileNames lists the known profiles in sorted order.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
