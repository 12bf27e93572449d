// Package prefixcache predicts which model-server pods hold a prompt's
// prefix in their KV cache, and scores candidate pods by it without letting a
// prefix match outweigh overload. It is pure: plain inputs, time passed in as
// `now`, no I/O, and no Gateway API Inference Extension import (plugins/
// adapts it to the EPP).
//
// # Index
//
// A prompt is rendered to bytes (AppendText for completions; AppendChat for
// chat: tools, then every message in order, length-framed, so each turn of a
// conversation extends its history's rendering) and cut into blocks of
// blockTokens × TokenRule.BytesPerToken bytes, the pod's own KV block size
// converted by a documented rule (default 4 bytes per token). Block i's hash
// chains block i's bytes with hash i−1; the chain's root hashes the salt:
// target model, LoRA adapter and cache_salt. Equal hashes at position i thus
// mean equal prefixes, as in vLLM's own prefix cache.
//
// Each pod's cache is modelled by an LRU of block hashes (lruTable) sized by
// the pod's own vllm:cache_config_info num_gpu_blocks (capped by
// MaxBlocksPerPod) and hashed with the pod's own block_size; pods lacking the
// metric take DefaultPodBlocks and DefaultBlockTokens. Route records a
// routing decision by inserting the prompt's chain into the chosen pod's LRU
// tail first, so that the prefix is the most recent part and, as on the
// server, chains are evicted from their end. A holder table per group of 64
// pods maps each block hash to a bit set of the pods holding it, so scoring
// costs one lookup per block for the whole pool and stops at the first
// block no remaining candidate holds.
//
// A prompt need not be rendered: ChatPrompt and TextPrompt hash the same
// rendering piece by piece where its strings lie (the caller's parsed
// request), so the prompt is not copied, and past MaxPrefixTokens it is only
// counted. A Chains given in the Prompt keeps its chains per salt and block
// size, so one request's scoring (Score, Peek) and its Route hash it once.
//
// # Calibration
//
// Route optimistically assumes the pod will keep what it was sent. Reality
// is checked two ways, both as a ratio r of reported to predicted cached
// fraction of the prompt (fractions, so the token rule's error cancels out):
//   - a response's usage.prompt_tokens_details.cached_tokens / prompt_tokens
//     against the fraction Route predicted for that request (ObserveUsage);
//   - a pod's vllm:prefix_cache_hits_total / queries_total increase against
//     the predicted hit tokens over routed prompt tokens of the same interval
//     (ObserveCounters). A counter decrease means a restart: the pod's
//     entries are dropped.
//
// Each pod has a capacity fraction f ∈ [MinCapacityFraction, 1], starting
// at 1; its LRU keeps max(1, ⌊f·nominal⌋) blocks. A check with
// r < 1 − Tolerance (predictions ran ahead of reality: the pod evicted what
// the index still believes it holds, because other replicas, other traffic or
// memory pressure fill it) sets f ← f·(1 − ShrinkGain·(1 − r)) and trims the
// LRU at once; any other check sets f ← f + GrowGain·(1 − f), so a pod
// recovers its capacity when predictions hold again. Known bias: requests
// that share a prefix and reach a pod before the first has been prefilled
// report fewer cached tokens than predicted; Tolerance and the slow growth
// absorb occasional such checks.
//
// # Guardrails
//
// A match never outweighs overload. A pod's load is the larger of its
// scraped queued+running requests and the requests this index routed to it
// that have not finished (fresher than any scrape, so a burst cannot pile onto
// one pod between scrapes). Its affinity is multiplied by a weight that is 1
// below OverloadRelative × the candidates' mean load, tapers to 0 as the
// excess over the mean goes from TaperStart·OverloadAbsolute to
// OverloadAbsolute, and is 0 at KV utilisation ≥ KVCacheCutoff. A hot prefix
// group therefore spreads: when its holders get busier than the pool, the
// profile's queue and KV scorers choose another pod, Route makes it a holder,
// and the group grows by one pod at a time until its holders keep up. Scores
// are in [0,1] and meant to be weighted with those scorers in a profile.
//
// # Bounds
//
// A pod's LRU is one 16-byte slot per entry at a load of at most 3/4 (~21
// bytes per entry, allocated for the pod's capacity); a holder record is one
// 16-byte map slot per (group of 64 pods, block) (~18–37 bytes with the Go
// map's load factor), shared by all holders in the group. A block held by one
// pod costs at most ~60 bytes; BenchmarkScore reports the measured heap per
// entry (testbed/bench/scenarios/README.md records it beside upstream's).
// Memory is bounded by MaxPods × MaxBlocksPerPod entries (Config.Bounds),
// routed-request bookkeeping by MaxPending entries of age at most PendingTTL.
// Prompts are hashed up to MaxPrefixTokens. Scoring allocates nothing;
// Route (once per request, on the request path) costs about one table update
// and one holder-shard update per block.
//
// # Concurrency
//
// All methods of Index are safe for concurrent use, and scoring takes no
// global lock: the pod set is an immutable snapshot behind an atomic pointer
// (replaced, under a mutex, only when pods join or leave); holder tables are
// sharded, each shard under its own RWMutex held for one map access; in-flight
// counts are atomics. Writes to a pod (Route, calibration, reconfiguration,
// Forget) hold that pod's mutex, then a shard's, always in that order. A
// reader may see a pod's insertion before its eviction or vice versa; the
// index is a prediction and tolerates it.
//
// Pods that leave are forgotten (Forget, Retain): their entries and holder
// bits are cleared before their bit is given to another pod.
//
// # Several EPP replicas
//
// The index lives in one process. With N replicas behind a load balancer
// each sees about 1/N of the traffic and so, alone:
//   - learns only its own routing decisions: a prefix one replica sent to pod
//     A is unknown to the others, which may send its next turn elsewhere, so
//     hit rate degrades towards that of N independent routers (a session
//     pinned to one replica by the gateway keeps its affinity);
//   - sees pods fill with blocks it did not send, so predictions run ahead
//     of reality; calibration measures exactly that and shrinks the pods'
//     effective capacities towards the share this replica actually keeps,
//     which is the correct model of "what is still there for my prompts";
//   - counts only its own in-flight requests; the scraped queue depth, shared
//     by all replicas, still bounds the guardrail, at scrape freshness.
//
// Replicas that exchange summaries (flowcontrol/replication) share their
// inserts instead (share.go): ShareInserts makes Route log the blocks it
// inserts, bounded per exchange interval; TakeInserts hands them to the
// summary and Insert takes a peer's in. Each index then holds, approximately,
// what any replica routed. Approximately: only insertions travel, so a peer
// does not see a held block become recent again, and a pod's calibration and
// in-flight count remain this replica's own.
package prefixcache
