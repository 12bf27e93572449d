// Package lora scores model-server pods for a request that targets a LoRA
// adapter, so that an adapter lives on as few pods as its load needs and is not
// loaded again and again on every pod of the pool.
//
// # Decision
//
// For a request targeting adapter A, every pod gets a residency confidence
// c in [0,1]: 1 when the server says A is resident (a residency gauge) or has
// requests for A in flight (running or waiting), otherwise the decayed weight
// of the EPP's own Memory of having sent A to that pod. The memory covers the
// gap that vLLM's lora_requests_info leaves: an adapter whose requests just
// finished disappears from that metric but usually stays in GPU memory.
// Memory is ignored when every adapter slot of the pod is held by other
// in-flight adapters (A cannot be resident then), and, when the server exports
// a residency gauge, for sends older than that scrape (the gauge already
// reflects them).
//
// Then, in order:
//   - Base-model requests (Request.Adapter == "") score every pod Neutral:
//     adapter state never penalises them.
//   - If no pod carries any LoRA information and the Memory knows nothing,
//     every pod scores Neutral: missing metrics mean "no information", not 0.
//   - A pod holding A scores 0.5+0.5c unless it is overloaded (its queue is
//     deeper than Config.SpillQueueDepth), then 0.4c.
//   - If no pod holds A with confidence >= 0.5 and a healthy queue, A needs a
//     placement (cold start, or spill away from overloaded holders). Among the
//     pods that can load A without waiting for a slot, bounded-load rendezvous
//     hashing picks one target (score 1): the highest hash weight w(A,pod) whose
//     load+1 stays within ceil((1+Config.LoadBound)·(total load+1)/candidates).
//     The other candidates score 0.3+0.3·w/2^64, so every replica also agrees
//     on the runner-up order. When A has a healthy holder, free-slot pods
//     score 0.2: loading A a second time is not needed yet.
//   - A pod with a known adapter limit and no free slot scores 0; a pod with
//     no LoRA information scores Neutral.
//
// # Invariants
//
//   - Scores are in [0,1], one per input pod, in input order.
//   - The decision depends only on the inputs, the Memory and now; it does not
//     depend on the order of pods, so EPP replicas that see the same pods pick
//     the same target.
//   - The placement target's load+1 never exceeds the bounded-load capacity.
//   - Memory never holds more than Config.MemoryCapacity entries and never
//     reports an entry older than Config.MemoryTTL.
//
// # Concurrency
//
// A Scorer and its Memory are safe for concurrent use: Score takes a read
// lock on the Memory once per call and Record takes the write lock. Score
// does no I/O and allocates only its result slice.
package lora
