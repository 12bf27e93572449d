package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// tinyConfig makes step times easy to compute by hand: a step costs
// 10ms + 1ms per decoding sequence + 1ms per prefill token (+100ms per load).
func tinyConfig() Config {
	return Config{
		MaxNumSeqs: 2, MaxNumBatchedTokens: 64, NumGPUBlocks: 64, BlockSize: 4, MaxModelLen: 64,
		MaxLoRAs: 1, LoRALoadTime: 100 * ms,
		StepBase: 10 * ms, DecodePerSeq: 1 * ms, PrefillPerToken: 1 * ms,
	}
}

// recorder collects step outputs and checks that no request emits after it
// finished or emits more than MaxTokens tokens.
type recorder struct {
	t        *testing.T
	emits    map[uint64][]time.Time
	finished map[uint64]int
	preempts int
	steps    int
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, emits: map[uint64][]time.Time{}, finished: map[uint64]int{}}
}

func (rec *recorder) StepDone(out *StepOutput) {
	rec.steps++
	rec.preempts += len(out.Preempted)
	for _, r := range out.Emitted {
		if rec.finished[r.ID] > 0 {
			rec.t.Errorf("request %d emitted after it finished", r.ID)
		}
		rec.emits[r.ID] = append(rec.emits[r.ID], out.End)
		if len(rec.emits[r.ID]) != r.Generated() {
			rec.t.Errorf("request %d: %d emits recorded, Generated()=%d", r.ID, len(rec.emits[r.ID]), r.Generated())
		}
	}
	for _, r := range out.Finished {
		rec.finished[r.ID]++
		if r.Generated() != r.MaxTokens {
			rec.t.Errorf("request %d finished with %d of %d tokens", r.ID, r.Generated(), r.MaxTokens)
		}
	}
}

func newEngine(t *testing.T, cfg Config) (*Engine, *recorder) {
	t.Helper()
	rec := newRecorder(t)
	e, err := NewEngine(cfg, rec)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e, rec
}

// drain advances e event by event until it is idle.
func drain(t *testing.T, e *Engine) time.Time {
	t.Helper()
	var now time.Time
	for i := 0; ; i++ {
		next, ok := e.NextEvent()
		if !ok {
			return now
		}
		if i > 1_000_000 {
			t.Fatalf("engine did not go idle")
		}
		now = next
		e.Advance(now)
		checkInvariants(t, e)
	}
}

func submit(t *testing.T, e *Engine, now time.Time, r *Request) *Request {
	t.Helper()
	if err := e.Submit(now, r); err != nil {
		t.Fatalf("Submit(%d): %v", r.ID, err)
	}
	return r
}

// tokens returns n synthetic prompt tokens starting at id base.
func tokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

func prompt(id uint64, adapter string, toks []uint32, maxTokens, blockSize int) *Request {
	return &Request{
		ID: id, Adapter: adapter, PromptTokens: len(toks), MaxTokens: maxTokens,
		BlockHashes: HashBlocks(RootHash(adapter), toks, blockSize),
	}
}

// checkInvariants verifies the KV cache and LoRA bookkeeping against the
// requests that hold resources.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	refs := make([]int32, e.kv.numBlocks())
	adapters := map[int32]int32{}
	for _, r := range e.running {
		if r.state != stateRunning {
			t.Fatalf("request %d in running list with state %d", r.ID, r.state)
		}
		for _, b := range r.blocks {
			refs[b]++
		}
		if r.adapter != noAdapter {
			adapters[r.adapter]++
		}
	}
	free := 0
	for b, n := range refs {
		if e.kv.ref[b] != n {
			t.Fatalf("block %d: ref %d, held by %d requests", b, e.kv.ref[b], n)
		}
		if n == 0 {
			free++
		}
	}
	queued := 0
	for b := e.kv.head; b >= 0; b = e.kv.next[b] {
		if e.kv.ref[b] != 0 {
			t.Fatalf("block %d in free queue with ref %d", b, e.kv.ref[b])
		}
		queued++
	}
	if free != e.kv.numFree || queued != free {
		t.Fatalf("free blocks: counted %d, queued %d, numFree %d", free, queued, e.kv.numFree)
	}
	for h, b := range e.kv.byHash {
		if !e.kv.hashed[b] || e.kv.hash[b] != h {
			t.Fatalf("prefix cache maps %x to block %d holding %x", h, b, e.kv.hash[b])
		}
	}
	for b, hashed := range e.kv.hashed {
		if hashed && e.kv.byHash[e.kv.hash[b]] != int32(b) {
			t.Fatalf("block %d is marked hashed but does not own %x", b, e.kv.hash[b])
		}
	}
	if len(e.running) > e.cfg.MaxNumSeqs {
		t.Fatalf("%d running > max-num-seqs %d", len(e.running), e.cfg.MaxNumSeqs)
	}
	distinct := 0
	for id, n := range e.lora.running {
		if adapters[int32(id)] != n {
			t.Fatalf("adapter %s: %d running counted, %d actual", e.lora.names[id], n, adapters[int32(id)])
		}
		if n > 0 {
			distinct++
			if !e.lora.isResident(int32(id)) {
				t.Fatalf("adapter %s runs but is not resident", e.lora.names[id])
			}
		}
	}
	if distinct != e.lora.distinctRunning || distinct > e.cfg.MaxLoRAs || len(e.lora.resident) > e.cfg.MaxLoRAs {
		t.Fatalf("LoRA slots: distinct %d (tracked %d), resident %d, max %d",
			distinct, e.lora.distinctRunning, len(e.lora.resident), e.cfg.MaxLoRAs)
	}
}

func TestQueueingWhenSlotsAreFull(t *testing.T) {
	tests := []struct {
		name       string
		slots      int
		requests   int
		wantQueued []time.Duration // per request: ScheduledAt - Arrival
	}{
		// Step 1 prefills two 4-token prompts (10+8ms), step 2 decodes both
		// (10+2ms) and finishes them, so the third starts at 30ms.
		{name: "third waits for a slot", slots: 2, requests: 3, wantQueued: []time.Duration{0, 0, 30 * ms}},
		{name: "enough slots", slots: 3, requests: 3, wantQueued: []time.Duration{0, 0, 0}},
		{name: "one slot serializes", slots: 1, requests: 3, wantQueued: []time.Duration{0, 25 * ms, 50 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.MaxNumSeqs = tt.slots
			e, rec := newEngine(t, cfg)
			var reqs []*Request
			for i := range tt.requests {
				reqs = append(reqs, submit(t, e, t0, prompt(uint64(i), "", tokens(100*i, 4), 2, cfg.BlockSize)))
			}
			e.Advance(t0)
			st := e.Stats()
			wantRunning := min(tt.slots, tt.requests)
			if st.Running != wantRunning || st.Waiting != tt.requests-wantRunning {
				t.Errorf("after first step: running %d waiting %d, want %d and %d",
					st.Running, st.Waiting, wantRunning, tt.requests-wantRunning)
			}
			drain(t, e)
			for i, r := range reqs {
				if got := r.ScheduledAt().Sub(r.Arrival()); got != tt.wantQueued[i] {
					t.Errorf("request %d queued %v, want %v", i, got, tt.wantQueued[i])
				}
				if rec.finished[r.ID] != 1 {
					t.Errorf("request %d finished %d times", i, rec.finished[r.ID])
				}
			}
		})
	}
}

func TestKVPressure(t *testing.T) {
	// Four requests of 24 prompt tokens (6 blocks each) that grow to 35
	// tokens (9 blocks), and 8 slots.
	tests := []struct {
		name         string
		blocks       int
		wantRunning  int
		wantWaiting  int
		wantKVUsage  float64
		wantPreempts bool
	}{
		{name: "roomy cache", blocks: 64, wantRunning: 4, wantWaiting: 0, wantKVUsage: 24.0 / 64},
		{name: "cache fits two", blocks: 16, wantRunning: 2, wantWaiting: 2, wantKVUsage: 12.0 / 16, wantPreempts: true},
		{name: "cache fits one", blocks: 10, wantRunning: 1, wantWaiting: 3, wantKVUsage: 6.0 / 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.MaxNumSeqs, cfg.NumGPUBlocks, cfg.MaxModelLen, cfg.MaxNumBatchedTokens = 8, tt.blocks, 40, 128
			e, rec := newEngine(t, cfg)
			for i := range 4 {
				submit(t, e, t0, prompt(uint64(i), "", tokens(1000*i, 24), 12, cfg.BlockSize))
			}
			e.Advance(t0)
			st := e.Stats()
			if st.Running != tt.wantRunning || st.Waiting != tt.wantWaiting || st.KVUsage != tt.wantKVUsage {
				t.Errorf("running %d waiting %d kv %.3f, want %d %d %.3f",
					st.Running, st.Waiting, st.KVUsage, tt.wantRunning, tt.wantWaiting, tt.wantKVUsage)
			}
			drain(t, e)
			if got := rec.preempts > 0; got != tt.wantPreempts {
				t.Errorf("preemptions %d, want some: %v", rec.preempts, tt.wantPreempts)
			}
			if len(rec.finished) != 4 {
				t.Errorf("%d requests finished, want 4", len(rec.finished))
			}
			if st := e.Stats(); st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
				t.Errorf("idle engine holds resources: %+v", st)
			}
		})
	}
}

func TestPrefixCacheHitLowersTTFT(t *testing.T) {
	first := tokens(0, 32) // 8 blocks of 4
	tests := []struct {
		name       string
		second     []uint32
		adapter    string
		noCaching  bool
		wantCached int
	}{
		// A full hit still recomputes the last token, so 7 of 8 blocks hit.
		{name: "same prompt", second: first, wantCached: 28},
		{name: "shared half", second: append(append([]uint32{}, first[:16]...), tokens(500, 16)...), wantCached: 16},
		{name: "partial block is not shared", second: append(append([]uint32{}, first[:18]...), tokens(500, 14)...), wantCached: 16},
		{name: "different first token", second: append([]uint32{9999}, first[1:]...), wantCached: 0},
		{name: "other adapter", second: first, adapter: "a", wantCached: 0},
		{name: "caching disabled", second: first, noCaching: true, wantCached: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.DisablePrefixCaching = tt.noCaching
			e, _ := newEngine(t, cfg)
			if err := e.PreloadAdapter("a"); err != nil {
				t.Fatal(err)
			}
			a := submit(t, e, t0, prompt(1, "", first, 1, cfg.BlockSize))
			end := drain(t, e)
			b := submit(t, e, end, prompt(2, tt.adapter, tt.second, 1, cfg.BlockSize))
			drain(t, e)
			if b.CachedTokens() != tt.wantCached {
				t.Errorf("cached tokens %d, want %d", b.CachedTokens(), tt.wantCached)
			}
			ttftA := a.FirstTokenAt().Sub(a.Arrival())
			ttftB := b.FirstTokenAt().Sub(b.Arrival())
			if want := 10*ms + time.Duration(32-tt.wantCached)*ms; ttftB != want {
				t.Errorf("TTFT %v, want %v (first request: %v)", ttftB, want, ttftA)
			}
			st := e.Stats()
			if st.PrefixHitTokens != uint64(tt.wantCached) || st.PrefixQueryTokens != 64 {
				t.Errorf("prefix counters hits %d queries %d, want %d and 64", st.PrefixHitTokens, st.PrefixQueryTokens, tt.wantCached)
			}
		})
	}
}

func TestPrefixCacheEvictsLeastRecentlyFreed(t *testing.T) {
	cfg := tinyConfig()
	cfg.NumGPUBlocks, cfg.MaxModelLen = 16, 64
	e, _ := newEngine(t, cfg)
	a := tokens(0, 32)    // 8 blocks
	b := tokens(1000, 32) // 8 blocks
	submit(t, e, t0, prompt(1, "", a, 1, cfg.BlockSize))
	now := drain(t, e)
	submit(t, e, now, prompt(2, "", b, 1, cfg.BlockSize))
	now = drain(t, e)
	// c needs 8 new blocks: the free queue holds a's blocks before b's, so
	// a is evicted and b stays cached.
	submit(t, e, now, prompt(3, "", tokens(5000, 32), 1, cfg.BlockSize))
	now = drain(t, e)
	hitB := submit(t, e, now, prompt(4, "", b, 1, cfg.BlockSize))
	now = drain(t, e)
	missA := submit(t, e, now, prompt(5, "", a, 1, cfg.BlockSize))
	drain(t, e)
	if hitB.CachedTokens() != 28 || missA.CachedTokens() != 0 {
		t.Errorf("cached: b %d (want 28), a %d (want 0)", hitB.CachedTokens(), missA.CachedTokens())
	}
}

func TestLoRA(t *testing.T) {
	// Prompts of 4 tokens and 2 output tokens: a cold request's first step
	// costs 10 + 4 + 100 (load) ms.
	tests := []struct {
		name      string
		maxLoRAs  int
		preload   []string
		adapters  []string // submitted together at t0
		wantTTFT  []time.Duration
		wantLoads uint64
	}{
		{name: "base model never loads", maxLoRAs: 1, adapters: []string{""}, wantTTFT: []time.Duration{14 * ms}},
		{name: "miss pays the load", maxLoRAs: 1, adapters: []string{"a"}, wantTTFT: []time.Duration{114 * ms}, wantLoads: 1},
		{name: "preloaded adapter is free", maxLoRAs: 1, preload: []string{"a"}, adapters: []string{"a"}, wantTTFT: []time.Duration{14 * ms}},
		{name: "two requests share one load", maxLoRAs: 1, adapters: []string{"a", "a"}, wantTTFT: []time.Duration{118 * ms, 118 * ms}, wantLoads: 1},
		// b waits until a is done (114 + 11 ms), then loads.
		{name: "slot busy: wait then load", maxLoRAs: 1, adapters: []string{"a", "b"}, wantTTFT: []time.Duration{114 * ms, 125*ms + 114*ms}, wantLoads: 2},
		{name: "two slots load in one step", maxLoRAs: 2, adapters: []string{"a", "b"}, wantTTFT: []time.Duration{218 * ms, 218 * ms}, wantLoads: 2},
		// base requests are not held back by the busy slot.
		{name: "base model skips LoRA queue", maxLoRAs: 1, adapters: []string{"a", "b", ""}, wantTTFT: []time.Duration{118 * ms, 130*ms + 114*ms, 118 * ms}, wantLoads: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.MaxLoRAs, cfg.MaxNumSeqs = tt.maxLoRAs, 4
			e, _ := newEngine(t, cfg)
			for _, p := range tt.preload {
				if err := e.PreloadAdapter(p); err != nil {
					t.Fatal(err)
				}
			}
			var reqs []*Request
			for i, a := range tt.adapters {
				reqs = append(reqs, submit(t, e, t0, prompt(uint64(i), a, tokens(10*i, 4), 2, cfg.BlockSize)))
			}
			drain(t, e)
			for i, r := range reqs {
				if got := r.FirstTokenAt().Sub(r.Arrival()); got != tt.wantTTFT[i] {
					t.Errorf("request %d (%q): TTFT %v, want %v", i, r.Adapter, got, tt.wantTTFT[i])
				}
			}
			if got := e.Stats().AdapterLoads; got != tt.wantLoads {
				t.Errorf("loads %d, want %d", got, tt.wantLoads)
			}
		})
	}
}

func TestLoRAStatsAndUnload(t *testing.T) {
	cfg := tinyConfig()
	cfg.MaxLoRAs, cfg.MaxNumSeqs = 1, 4
	e, _ := newEngine(t, cfg)
	submit(t, e, t0, prompt(1, "a", tokens(0, 4), 4, cfg.BlockSize))
	submit(t, e, t0, prompt(2, "b", tokens(10, 4), 4, cfg.BlockSize))
	e.Advance(t0)
	st := e.Stats()
	if fmt.Sprint(st.RunningAdapters, st.WaitingAdapters, st.ResidentAdapters) != "[a] [b] [a]" {
		t.Errorf("running %v waiting %v resident %v, want [a] [b] [a]", st.RunningAdapters, st.WaitingAdapters, st.ResidentAdapters)
	}
	e.UnloadAdapter("a") // in use: evicted when its request finishes
	if got := e.Stats().ResidentAdapters; fmt.Sprint(got) != "[a]" {
		t.Errorf("resident after deferred unload %v, want [a]", got)
	}
	drain(t, e)
	if got := e.Stats().ResidentAdapters; fmt.Sprint(got) != "[b]" {
		t.Errorf("resident at the end %v, want [b]", got)
	}
	e.UnloadAdapter("b")
	if got := e.Stats().ResidentAdapters; len(got) != 0 {
		t.Errorf("resident after unload %v, want none", got)
	}
}

func TestChunkedPrefill(t *testing.T) {
	cfg := tinyConfig()
	cfg.MaxNumBatchedTokens = 16
	e, _ := newEngine(t, cfg)
	r := submit(t, e, t0, prompt(1, "", tokens(0, 40), 2, cfg.BlockSize))
	drain(t, e)
	// 16 + 16 + 8 prompt tokens over three steps, then one decode.
	if got, want := r.FirstTokenAt().Sub(t0), (10+16+10+16+10+8)*ms; got != want {
		t.Errorf("TTFT %v, want %v", got, want)
	}
}

func TestPreemption(t *testing.T) {
	// 8 blocks of 4 tokens; two requests that each grow to 24 tokens cannot
	// both stay resident, so the later one is preempted and recomputes.
	cfg := tinyConfig()
	cfg.NumGPUBlocks, cfg.MaxModelLen = 8, 32
	e, rec := newEngine(t, cfg)
	r1 := submit(t, e, t0, prompt(1, "", tokens(0, 4), 20, cfg.BlockSize))
	r2 := submit(t, e, t0, prompt(2, "", tokens(100, 4), 20, cfg.BlockSize))
	drain(t, e)
	if r1.Preemptions() != 0 || r2.Preemptions() == 0 {
		t.Errorf("preemptions: first %d (want 0), second %d (want > 0)", r1.Preemptions(), r2.Preemptions())
	}
	if got := e.Stats().Preemptions; got != uint64(rec.preempts) || got == 0 {
		t.Errorf("stats preemptions %d, observed %d", got, rec.preempts)
	}
	for _, r := range []*Request{r1, r2} {
		if len(rec.emits[r.ID]) != 20 || rec.finished[r.ID] != 1 {
			t.Errorf("request %d: %d tokens, finished %d times", r.ID, len(rec.emits[r.ID]), rec.finished[r.ID])
		}
	}
	if !r2.FirstTokenAt().Before(rec.emits[r1.ID][19]) {
		t.Errorf("second request should have started before the first finished")
	}
}

func TestCancel(t *testing.T) {
	cfg := tinyConfig()
	cfg.MaxNumSeqs = 1
	e, rec := newEngine(t, cfg)
	running := submit(t, e, t0, prompt(1, "", tokens(0, 8), 10, cfg.BlockSize))
	waiting := submit(t, e, t0, prompt(2, "", tokens(100, 8), 10, cfg.BlockSize))
	e.Advance(t0)
	e.Cancel(waiting)
	if st := e.Stats(); st.Waiting != 0 || st.Running != 1 {
		t.Errorf("after cancelling the waiting request: %+v", st)
	}
	e.Cancel(running) // mid-step
	checkInvariants(t, e)
	drain(t, e)
	if st := e.Stats(); st.Running != 0 || st.UsedBlocks != 0 || st.GenerationTokens != 0 {
		t.Errorf("after cancelling both: %+v", st)
	}
	if len(rec.emits) != 0 {
		t.Errorf("cancelled requests emitted tokens: %v", rec.emits)
	}
	e.Cancel(running) // idempotent
	other, _ := newEngine(t, cfg)
	other.Cancel(running) // not owned: no-op
	checkInvariants(t, other)
}

func TestIdleEngineStartsAtArrivalAndCatchesUp(t *testing.T) {
	e, _ := newEngine(t, tinyConfig())
	if _, ok := e.NextEvent(); ok {
		t.Fatal("idle engine reports an event")
	}
	arrival := t0.Add(5 * ms)
	r := submit(t, e, arrival, prompt(1, "", tokens(0, 4), 3, 4))
	if next, ok := e.NextEvent(); !ok || !next.Equal(arrival) {
		t.Fatalf("NextEvent %v %v, want %v", next, ok, arrival)
	}
	// A late Advance runs every step at its own time.
	e.Advance(arrival.Add(time.Hour))
	if !r.Done() {
		t.Fatal("request not done after a late Advance")
	}
	if got, want := r.FirstTokenAt(), arrival.Add(14*ms); !got.Equal(want) {
		t.Errorf("first token at %v, want %v", got, want)
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := tinyConfig()
	tests := []struct {
		name string
		req  *Request
		cfg  func(*Config)
		want error
	}{
		{name: "empty prompt", req: &Request{PromptTokens: 0, MaxTokens: 1}, want: ErrInvalidRequest},
		{name: "no output", req: &Request{PromptTokens: 1, MaxTokens: 0}, want: ErrInvalidRequest},
		{name: "too long", req: &Request{PromptTokens: 60, MaxTokens: 5}, want: ErrContextLength},
		{name: "too many hashes", req: &Request{PromptTokens: 4, MaxTokens: 1, BlockHashes: []uint64{1, 2}}, want: ErrInvalidRequest},
		{name: "LoRA disabled", req: &Request{PromptTokens: 4, MaxTokens: 1, Adapter: "a"}, cfg: func(c *Config) { c.MaxLoRAs = 0 }, want: ErrLoRADisabled},
		{name: "fits exactly", req: &Request{PromptTokens: 60, MaxTokens: 4}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			e, _ := newEngine(t, c)
			if err := e.Submit(t0, tt.req); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Submit: %v, want %v", err, tt.want)
			}
		})
	}
	e, _ := newEngine(t, cfg)
	r := submit(t, e, t0, &Request{PromptTokens: 4, MaxTokens: 1})
	if err := e.Submit(t0, r); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("second Submit of the same request: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, name := range ProfileNames() {
		c, err := Profile(name)
		if err != nil || c.Validate() != nil {
			t.Errorf("profile %s: %v %v", name, err, c.Validate())
		}
	}
	if _, err := Profile("tpu"); err == nil {
		t.Error("unknown profile accepted")
	}
	bad := tinyConfig()
	bad.MaxNumSeqs, bad.StepBase, bad.MaxModelLen = 0, 0, 1<<20
	err := bad.Validate()
	for _, want := range []string{"max-num-seqs", "step-base", "max-model-len"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want mention of %s", err, want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestRandomizedInvariants drives engines with seeded random workloads
// (shared prefixes, adapters, cancellations, tiny caches that force
// preemption) and checks the bookkeeping after every step and that every
// request ends exactly once.
func TestRandomizedInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			cfg := tinyConfig()
			cfg.MaxNumSeqs = 1 + rng.IntN(8)
			cfg.MaxNumBatchedTokens = cfg.MaxNumSeqs + rng.IntN(64)
			cfg.NumGPUBlocks = 16 + rng.IntN(64)
			cfg.MaxModelLen = 64
			cfg.MaxLoRAs = 1 + rng.IntN(3)
			e, rec := newEngine(t, cfg)
			now := t0
			var reqs []*Request
			cancelled := map[uint64]bool{}
			for i := range 300 {
				now = now.Add(time.Duration(rng.IntN(20)) * ms)
				e.Advance(now)
				checkInvariants(t, e)
				adapter := []string{"", "", "a", "b", "c", "d"}[rng.IntN(6)]
				toks := tokens(1000*rng.IntN(4), 1+rng.IntN(40)) // 4 prefix groups
				r := prompt(uint64(i), adapter, toks, 1+rng.IntN(64-len(toks)), cfg.BlockSize)
				submit(t, e, now, r)
				reqs = append(reqs, r)
				if rng.IntN(10) == 0 {
					victim := reqs[rng.IntN(len(reqs))]
					if !victim.Done() {
						cancelled[victim.ID] = true
					}
					e.Cancel(victim)
				}
			}
			drain(t, e)
			for _, r := range reqs {
				switch {
				case cancelled[r.ID]:
					if rec.finished[r.ID] != 0 {
						t.Errorf("cancelled request %d finished", r.ID)
					}
				case rec.finished[r.ID] != 1 || len(rec.emits[r.ID]) != r.MaxTokens:
					t.Errorf("request %d: finished %d times with %d/%d tokens",
						r.ID, rec.finished[r.ID], len(rec.emits[r.ID]), r.MaxTokens)
				}
			}
			if st := e.Stats(); st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 || len(st.RunningAdapters) != 0 {
				t.Errorf("idle engine holds resources: %+v", st)
			}
		})
	}
}
