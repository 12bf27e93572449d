package engine

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of Submit; match them with errors.Is.
var (
	// ErrInvalidRequest: the request's fields are inconsistent.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrContextLength: prompt plus output tokens exceed MaxModelLen.
	ErrContextLength = errors.New("context length exceeded")
	// ErrLoRADisabled: the request names an adapter but MaxLoRAs is 0.
	ErrLoRADisabled = errors.New("LoRA is disabled")
)

type reqState uint8

const (
	stateNew reqState = iota
	stateWaiting
	stateRunning
	stateFinished
	stateCancelled
)

// Request is one generation request. The caller fills the exported fields
// and hands it to Submit; from then on the Engine owns it, and the caller
// reads progress only through the methods, and only while it holds whatever
// serializes its calls into the Engine.
type Request struct {
	// ID is the caller's identifier, opaque to the engine.
	ID uint64
	// Adapter is the LoRA adapter name, "" for the base model.
	Adapter string
	// PromptTokens is the number of prompt tokens, at least 1.
	PromptTokens int
	// BlockHashes are the chained hashes of the prompt's full blocks (see
	// HashBlocks); nil disables prefix caching for this request.
	BlockHashes []uint64
	// MaxTokens is the number of output tokens to generate, at least 1.
	MaxTokens int

	owner        *Engine
	state        reqState
	adapter      int32
	arrival      time.Time
	scheduledAt  time.Time // first admission to the running batch
	firstTokenAt time.Time
	blocks       []int32
	numHashed    int // blocks[:numHashed] are published in the prefix cache
	computed     int // tokens whose KV is computed
	generated    int // output tokens emitted
	newTokens    int // tokens scheduled in the current step
	cachedTokens int // prefix-cache hit at first admission
	admitted     bool
	preemptions  int
}

// Generated is the number of output tokens emitted so far.
func (r *Request) Generated() int { return r.generated }

// CachedTokens is the number of prompt tokens found in the prefix cache when
// the request was first scheduled (usage.prompt_tokens_details.cached_tokens).
func (r *Request) CachedTokens() int { return r.cachedTokens }

// Arrival is the time of Submit.
func (r *Request) Arrival() time.Time { return r.arrival }

// ScheduledAt is when the request first entered the running batch (zero
// before); ScheduledAt - Arrival is vLLM's queue time.
func (r *Request) ScheduledAt() time.Time { return r.scheduledAt }

// FirstTokenAt is when the first output token was emitted (zero before).
func (r *Request) FirstTokenAt() time.Time { return r.firstTokenAt }

// Preemptions counts how often the request was preempted.
func (r *Request) Preemptions() int { return r.preemptions }

// Done reports whether the request has emitted all MaxTokens tokens.
func (r *Request) Done() bool { return r.state == stateFinished }

// StepOutput is what one engine step produced. Its slices are reused by the
// next step: an Observer must copy what it keeps.
type StepOutput struct {
	// Start and End bound the step; End is also the time of its outputs.
	Start, End time.Time
	// Emitted requests produced one output token each at End.
	Emitted []*Request
	// Finished requests emitted their last token at End and left the engine;
	// they are also in Emitted.
	Finished []*Request
	// Preempted requests lost their KV blocks at Start and went back to the
	// front of the waiting queue; they resume by recomputing.
	Preempted []*Request
	// Batch is the number of requests that took part; PrefillTokens and
	// DecodeSeqs split the work that set the step's duration.
	Batch, PrefillTokens, DecodeSeqs int
	// AdapterLoads is the number of LoRA loads the step paid for.
	AdapterLoads int
}

// Observer receives every step's output. It is called synchronously from
// Advance and must not call back into the Engine.
type Observer interface {
	StepDone(out *StepOutput)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(out *StepOutput)

// StepDone calls f(out).
func (f ObserverFunc) StepDone(out *StepOutput) { f(out) }

var _ Observer = ObserverFunc(nil)

// Stats is a snapshot of an Engine's state and counters.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of KV blocks referenced by requests (0..1).
	KVUsage    float64
	UsedBlocks int
	// RunningAdapters and WaitingAdapters are the distinct adapters of
	// running and waiting requests; ResidentAdapters hold GPU slots. Sorted.
	RunningAdapters, WaitingAdapters, ResidentAdapters []string
	// Prefix cache counters in tokens, as vLLM counts them.
	PrefixQueryTokens, PrefixHitTokens uint64
	AdapterLoads, Preemptions          uint64
	PromptTokens, GenerationTokens     uint64
	Steps                              uint64
}

// Engine is one simulated vLLM engine: a continuous-batching scheduler over
// a paged KV cache with prefix caching and LoRA slots. It has no clock and no
// goroutines: callers pass the time into Submit, Cancel and Advance, and ask
// NextEvent when to call Advance again. It is not safe for concurrent use.
type Engine struct {
	cfg      Config
	observer Observer
	kv       *kvCache
	lora     *loraSlots

	waiting    deque // may hold cancelled requests, skipped lazily
	numWaiting int   // waiting requests not cancelled
	running    []*Request

	inStep  bool
	lastEnd time.Time // end of the last completed step
	// slowdown multiplies step durations when above 1 (SetSlowdown).
	slowdown float64
	out      StepOutput
	sched    []*Request // requests in the current step
	skipped  []*Request // scratch: LoRA-blocked waiting requests

	prefixQueries, prefixHits uint64
	preemptions               uint64
	promptTokens, genTokens   uint64
	steps                     uint64
}

// NewEngine returns an idle engine. A nil observer discards step outputs.
func NewEngine(cfg Config, observer Observer) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid engine config: %w", err)
	}
	if observer == nil {
		observer = ObserverFunc(func(*StepOutput) {})
	}
	return &Engine{
		cfg:      cfg,
		observer: observer,
		kv:       newKVCache(cfg.NumGPUBlocks, cfg.BlockSize, !cfg.DisablePrefixCaching),
		lora:     newLoRASlots(cfg.MaxLoRAs),
	}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// SetSlowdown makes every step that starts from now on take factor times
// its modelled duration, as a throttled or failing GPU would; 1 (or 0)
// restores normal speed. A step in progress keeps its end.
func (e *Engine) SetSlowdown(factor float64) { e.slowdown = factor }

// Submit enqueues r at now. The request is scheduled by a later Advance; the
// caller should consult NextEvent. Times passed to an Engine must not go
// backwards.
func (e *Engine) Submit(now time.Time, r *Request) error {
	switch {
	case r.state != stateNew || r.owner != nil:
		return fmt.Errorf("%w: request %d was already submitted", ErrInvalidRequest, r.ID)
	case r.PromptTokens < 1:
		return fmt.Errorf("%w: prompt must have at least 1 token, got %d", ErrInvalidRequest, r.PromptTokens)
	case r.MaxTokens < 1:
		return fmt.Errorf("%w: max tokens must be at least 1, got %d", ErrInvalidRequest, r.MaxTokens)
	case len(r.BlockHashes) > r.PromptTokens/e.cfg.BlockSize:
		return fmt.Errorf("%w: %d block hashes for %d prompt tokens in blocks of %d",
			ErrInvalidRequest, len(r.BlockHashes), r.PromptTokens, e.cfg.BlockSize)
	case r.PromptTokens+r.MaxTokens > e.cfg.MaxModelLen:
		return fmt.Errorf("%w: this model's maximum context length is %d tokens, but %d prompt and %d output tokens were requested",
			ErrContextLength, e.cfg.MaxModelLen, r.PromptTokens, r.MaxTokens)
	case r.Adapter != "" && e.cfg.MaxLoRAs == 0:
		return fmt.Errorf("%w: request names adapter %q but max-loras is 0", ErrLoRADisabled, r.Adapter)
	}
	r.owner = e
	r.state = stateWaiting
	r.arrival = now
	r.adapter = e.lora.intern(r.Adapter)
	e.waiting.pushBack(r)
	e.addWaiting(r)
	return nil
}

func (e *Engine) addWaiting(r *Request) {
	e.numWaiting++
	if r.adapter != noAdapter {
		e.lora.waiting[r.adapter]++
	}
}

func (e *Engine) removeWaiting(r *Request) {
	e.numWaiting--
	if r.adapter != noAdapter {
		e.lora.waiting[r.adapter]--
	}
}

// Cancel removes r (a client went away) and frees what it holds. Cancelling
// a request that is finished, already cancelled or not owned by e is a no-op,
// so a caller may cancel unconditionally on its way out.
func (e *Engine) Cancel(r *Request) {
	if r.owner != e {
		return
	}
	switch r.state {
	case stateWaiting:
		r.state = stateCancelled
		e.removeWaiting(r)
		if e.numWaiting == 0 {
			e.waiting.clear()
		}
	case stateRunning:
		r.state = stateCancelled
		for i, q := range e.running {
			if q == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.kv.release(r)
		e.lora.release(r.adapter)
	}
}

// NextEvent returns when Advance has work to do: the end of the step in
// flight, or, when idle with waiting work, the time that work can start
// (which may be in the past: call Advance at once).
func (e *Engine) NextEvent() (time.Time, bool) {
	if e.inStep {
		return e.out.End, true
	}
	if len(e.running) > 0 {
		return e.lastEnd, true
	}
	if e.numWaiting > 0 {
		e.dropCancelledHead()
		return later(e.lastEnd, e.waiting.front().arrival), true
	}
	return time.Time{}, false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (e *Engine) dropCancelledHead() {
	for e.waiting.len() > 0 && e.waiting.front().state == stateCancelled {
		e.waiting.popFront()
	}
}

// Advance completes every step that ends at or before now, in order, and
// starts the next one, so after it returns NextEvent is after now or there
// is no work. Steps run back to back while there is work; an idle engine
// starts a step when the first waiting request arrived.
func (e *Engine) Advance(now time.Time) {
	for {
		if e.inStep {
			if e.out.End.After(now) {
				return
			}
			e.completeStep()
		}
		start, ok := e.NextEvent()
		if !ok || start.After(now) {
			return
		}
		if !e.startStep(start) {
			return
		}
	}
}

// startStep schedules one step at start, as vLLM v1's scheduler does:
// running requests first, in admission order, each taking the tokens it
// still needs (1 when decoding) within the token budget, preempting the
// latest-admitted running request when KV blocks run out; then, unless it
// preempted, waiting requests in FIFO order while slots, budget, LoRA slots
// and KV blocks allow.
func (e *Engine) startStep(start time.Time) bool {
	budget := e.cfg.MaxNumBatchedTokens
	out := &e.out
	out.Emitted, out.Finished, out.Preempted = out.Emitted[:0], out.Finished[:0], out.Preempted[:0]
	out.PrefillTokens, out.DecodeSeqs, out.AdapterLoads = 0, 0, 0
	e.sched = e.sched[:0]

	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(r.PromptTokens+r.generated-r.computed, budget)
		for !e.kv.grow(r, r.computed+n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			if victim == r {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		e.schedule(r, n)
		budget -= n
	}

	if len(out.Preempted) == 0 {
		e.admitWaiting(start, budget)
	}
	if len(e.sched) == 0 {
		return false
	}
	d := e.cfg.StepBase +
		time.Duration(out.DecodeSeqs)*e.cfg.DecodePerSeq +
		time.Duration(out.PrefillTokens)*e.cfg.PrefillPerToken +
		time.Duration(out.AdapterLoads)*e.cfg.LoRALoadTime
	if e.slowdown > 1 {
		d = time.Duration(float64(d) * e.slowdown)
	}
	out.Start, out.End = start, start.Add(d)
	out.Batch = len(e.sched)
	e.inStep = true
	return true
}

func (e *Engine) schedule(r *Request, n int) {
	r.newTokens = n
	if n == 1 && r.generated > 0 && r.computed == r.PromptTokens+r.generated-1 {
		e.out.DecodeSeqs++
	} else {
		e.out.PrefillTokens += n
	}
	e.sched = append(e.sched, r)
}

func (e *Engine) admitWaiting(start time.Time, budget int) {
	skipped := e.skipped[:0]
	for budget > 0 && e.waiting.len() > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting.front()
		if r.state == stateCancelled {
			e.waiting.popFront()
			continue
		}
		if r.arrival.After(start) {
			break
		}
		if !e.lora.canRun(r.adapter) {
			skipped = append(skipped, e.waiting.popFront())
			continue
		}
		total := r.PromptTokens + r.generated
		// vLLM recomputes at least the last token to get logits, so a full
		// hit still leaves one token to compute.
		hits, hitsFree := e.kv.lookup(r.BlockHashes, (total-1)/e.cfg.BlockSize)
		hitTokens := len(hits) * e.cfg.BlockSize
		n := min(total-hitTokens, budget)
		need := e.kv.blocksFor(hitTokens+n) - len(hits)
		if need > e.kv.numFree-hitsFree {
			break // head-of-line blocking on KV space, as vLLM does
		}
		e.waiting.popFront()
		e.removeWaiting(r)
		e.kv.take(r, hits)
		e.kv.grow(r, hitTokens+n)
		r.computed = hitTokens
		r.state = stateRunning
		if e.lora.acquire(r.adapter) {
			e.out.AdapterLoads++
		}
		e.prefixQueries += uint64(total)
		e.prefixHits += uint64(hitTokens)
		if !r.admitted {
			r.admitted = true
			r.scheduledAt = start
			r.cachedTokens = hitTokens
			e.promptTokens += uint64(r.PromptTokens)
		}
		e.running = append(e.running, r)
		e.schedule(r, n)
		budget -= n
	}
	for i := len(skipped) - 1; i >= 0; i-- {
		e.waiting.pushFront(skipped[i])
		skipped[i] = nil
	}
	e.skipped = skipped[:0]
}

// preempt frees r's blocks and puts it at the front of the waiting queue;
// it will recompute its prompt and the tokens generated so far (vLLM's
// recompute preemption), finding its prompt blocks in the prefix cache if
// they were not evicted meanwhile.
func (e *Engine) preempt(r *Request) {
	e.kv.release(r)
	e.lora.release(r.adapter)
	r.computed = 0
	r.newTokens = 0
	r.state = stateWaiting
	r.preemptions++
	e.preemptions++
	e.waiting.pushFront(r)
	e.addWaiting(r)
	e.out.Preempted = append(e.out.Preempted, r)
}

func (e *Engine) completeStep() {
	out := &e.out
	for _, r := range e.sched {
		if r.state != stateRunning { // cancelled during the step
			continue
		}
		r.computed += r.newTokens
		r.newTokens = 0
		e.kv.register(r)
		if r.computed < r.PromptTokens+r.generated {
			continue // a prefill chunk: no token yet
		}
		r.generated++
		e.genTokens++
		if r.generated == 1 {
			r.firstTokenAt = out.End
		}
		out.Emitted = append(out.Emitted, r)
		if r.generated >= r.MaxTokens {
			r.state = stateFinished
			e.kv.release(r)
			e.lora.release(r.adapter)
			out.Finished = append(out.Finished, r)
		}
	}
	if len(out.Finished) > 0 {
		kept := e.running[:0]
		for _, r := range e.running {
			if r.state == stateRunning {
				kept = append(kept, r)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	e.inStep = false
	e.lastEnd = out.End
	e.steps++
	e.observer.StepDone(out)
}

// PreloadAdapter makes an adapter resident without a request paying for it
// (vLLM serving an adapter that is already hot).
func (e *Engine) PreloadAdapter(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty adapter name", ErrInvalidRequest)
	}
	return e.lora.preload(name)
}

// UnloadAdapter frees an adapter's GPU slot, at once if no running request
// uses it, else when the last one finishes.
func (e *Engine) UnloadAdapter(name string) { e.lora.unload(name) }

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Running:           len(e.running),
		Waiting:           e.numWaiting,
		KVUsage:           e.kv.usage(),
		UsedBlocks:        e.kv.numBlocks() - e.kv.numFree,
		RunningAdapters:   e.lora.namesWhere(e.lora.running),
		WaitingAdapters:   e.lora.namesWhere(e.lora.waiting),
		ResidentAdapters:  e.lora.residentNames(),
		PrefixQueryTokens: e.prefixQueries,
		PrefixHitTokens:   e.prefixHits,
		AdapterLoads:      e.lora.loads,
		Preemptions:       e.preemptions,
		PromptTokens:      e.promptTokens,
		GenerationTokens:  e.genTokens,
		Steps:             e.steps,
	}
}
