// Package engine is the clock-free core of the vLLM simulator: a continuous-
// batching scheduler over a paged KV cache with automatic prefix caching,
// LoRA slots and recompute preemption, after vLLM v1's scheduler.
//
// # Driving it
//
// An Engine never reads a clock and starts no goroutines. The caller passes
// the time into Submit and Advance and asks NextEvent when to call Advance
// next:
//
//	e.Submit(now, req)           // enqueue; nothing is scheduled yet
//	for {
//		t, ok := e.NextEvent()   // end of the step in flight, or when waiting work can start
//		if !ok { break }         // idle
//		e.Advance(t)             // completes steps ending <= t, starts the next
//	}
//
// The HTTP server (package simulator) calls Advance from one goroutine per
// server with a real clock; a discrete-event benchmark can drive thousands
// of engines in virtual time from one loop, ordering them by NextEvent. Step
// outputs go to the Observer given to NewEngine, once per step, as slices
// of requests: there is no per-token callback, timer or goroutine.
//
// # The model
//
// Each step runs at most MaxNumSeqs requests within a budget of
// MaxNumBatchedTokens tokens. Scheduling at a step's start follows vLLM v1:
// running requests first, in admission order, each taking the tokens it
// still needs (one when decoding; a chunk of its prompt when prefilling); if
// the KV cache has no free block for one, the most recently admitted running
// request is preempted: its blocks are freed and it returns to the front of
// the waiting queue, to recompute prompt and generated tokens later. Then,
// if nothing was preempted, waiting requests are admitted in FIFO order
// while a slot, budget and KV blocks remain; the first one that does not
// fit in the KV cache blocks the queue (head-of-line, as in vLLM), while a
// request whose LoRA adapter cannot get a slot is skipped and keeps its
// place.
//
// A step lasts
//
//	StepBase + DecodePerSeq*decoding sequences + PrefillPerToken*prompt tokens
//	+ LoRALoadTime*adapters loaded by the step
//
// so inter-token latency grows with the running batch and with prefills
// sharing the step, TTFT includes queueing, and a prefix-cache hit removes
// its tokens from the prefill term. All outputs of a step happen at its end:
// each request that completed its prompt (or decoded) emits one token.
//
// KV cache: NumGPUBlocks blocks of BlockSize tokens. A running request holds
// blocks for its computed tokens, prompt and output. kv_cache_usage is the
// fraction of blocks held by requests.
//
// Prefix cache: full prompt blocks are identified by chained hashes
// (HashBlocks; RootHash names the model or adapter, so adapters never share
// KV). When a block is computed it is published under its hash; when its
// last holder finishes it goes to the tail of an LRU free queue but stays
// findable until the block is reused, which evicts it. A request's tail
// blocks are freed first, so they are evicted before its shared head.
// Admission looks up the longest cached prefix (never the prompt's last
// token, which must be recomputed to sample, as in vLLM) and computes only
// the rest. Blocks of generated tokens are not published. Prefix counters
// count tokens, as vLLM's prefix_cache_queries/hits do, once per admission.
//
// LoRA: at most MaxLoRAs distinct adapters run in a step, and an adapter
// must be resident in one of MaxLoRAs GPU slots. Admitting a request whose
// adapter is not resident loads it, evicting the least recently used
// adapter that no running request uses, and adds LoRALoadTime to that step
// (vLLM loads adapters inside the engine step, so the batch pays). Adapters
// may be preloaded (no load counted) and unloaded (at once if idle, else
// when their last running request finishes).
//
// # Invariants
//
//   - every KV block's reference count equals the number of running requests
//     holding it; free blocks (count 0) are exactly those in the free queue;
//   - len(running) <= MaxNumSeqs; distinct running adapters <= MaxLoRAs, all
//     resident;
//   - every submitted request either finishes once, after exactly MaxTokens
//     emitted tokens, or is cancelled and emits nothing more;
//   - an idle engine holds no blocks;
//   - a request that fits MaxModelLen always runs eventually: Validate
//     requires MaxModelLen <= NumGPUBlocks*BlockSize.
//
// # Concurrency
//
// An Engine is not safe for concurrent use; its owner serializes calls
// (package simulator holds a mutex). Times passed in must not go backwards.
package engine
