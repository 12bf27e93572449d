// Package loadgen generates OpenAI-style LLM traffic against a gateway on
// the local machine and measures it: time to first token (TTFT),
// inter-token latency (ITL), end-to-end latency, status and Retry-After per
// request, and per-class percentiles, throughput and goodput.
//
// # Layers
//
//   - Pure and seeded: ParseMix (mix files), Generator (the request
//     sequence), Arrivals (open-loop arrival times), Summarize and
//     Percentile (statistics), ParseRetryAfter. They take plain inputs, do
//     no I/O, read no clock and are unit-tested and fuzzed.
//   - Run drives the traffic: open loop (Poisson, constant or bursty on/off
//     arrivals, independent of completions) or closed loop (N users, each
//     sending its next request when the previous ended), optionally honouring
//     Retry-After like a well-behaved SDK.
//   - WriteReport and WriteJSON render results; cmd/loadgen is the CLI. A
//     benchmark suite calls Run and Summarize in-process.
//
// # Mix files
//
// YAML or JSON, unknown fields rejected:
//
//	api: chat            # default API: chat | completions
//	stream: true         # default streaming mode
//	ignore_eos: true     # ask vLLM for exactly max_tokens tokens
//	prompt_text: words   # words (default) | realistic: prose and code with escapes
//	classes:
//	  - name: critical-chat
//	    weight: 3                      # relative share, default 1
//	    model: llama-3-8b
//	    lora: sql-adapter              # optional; sent as "model"
//	    objective: critical            # x-gateway-inference-objective
//	    tenant: team-a                 # x-gateway-inference-fairness-id
//	    headers: {x-extra: "1"}
//	    prompt_tokens: {min: 100, max: 300}   # or a number
//	    output_tokens: 128
//	    shared_prefix: {groups: 16, tokens: 512, zipf_s: 1.1}
//	    multi_turn: {turns: 4, concurrent: 8}
//	    slo: {ttft: 500ms, itl: 50ms, e2e: 20s}
//
// Token lengths follow one documented rule, CharsPerToken: a token is 4
// characters. Generated text is 3-letter pseudo-words plus a space, so N
// tokens are exactly 4N characters (bytes); with prompt_text: realistic each
// token is 4 bytes of prose or code instead (TextRealistic); a real tokenizer will count differently,
// which matters little because every system under comparison sees the same
// text.
//
// # Determinism
//
// With the same mix and seed, Generator yields the same requests in the same
// order and Arrivals the same offsets. Shared-prefix text depends only on
// (seed, class, group), so all requests of a group share byte-identical
// prefixes. Multi-turn histories use synthetic assistant replies, not what
// the server said. In closed loop, which user sends which request depends on
// completion order; the sequence itself does not.
//
// # Invariants
//
//   - Traffic goes only to loopback addresses: the target URL (or every URL
//     of Targets, several gateways dealt requests in turns, each round
//     visiting every one once) must name one, and the default client's dialer
//     refuses any other address and never follows redirects. A request's
//     retries go to the target its first attempt went to.
//   - A run ends by itself: issuing stops at Duration or MaxRequests,
//     requests still running get Drain to finish and are then cancelled.
//   - Every issued request yields exactly one Final record; each retry
//     attempt yields one more, non-final record.
//
// # Concurrency
//
// Run is safe to call concurrently with itself. Within a run, requests run
// in their own goroutines; Generator and Arrivals are used from one
// goroutine at a time; OnRecord is called concurrently.
package loadgen
