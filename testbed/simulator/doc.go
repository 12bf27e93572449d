// Package simulator is a simulated vLLM model server: it looks like vLLM to
// OpenAI clients and to the Gateway API Inference Extension's endpoint
// picker, and its latencies come from a continuous-batching model
// (package engine) instead of a GPU. Command vllm-sim runs many of them in
// one process.
//
// # HTTP API
//
//	POST /v1/completions          prompt: string, [string] or [token ids]
//	POST /v1/chat/completions     messages: content string or text parts
//	GET  /v1/models               base model and registered adapters
//	GET  /health                  200, or 503 while shutting down
//	GET  /metrics                 Prometheus text, this server's registry only
//	POST /v1/load_lora_adapter    {"lora_name","lora_path"}: registers an adapter
//	POST /v1/unload_lora_adapter  {"lora_name"}: unregisters and evicts it
//	GET|POST /admin/faults        read or replace the injected faults
//
// Both generation endpoints stream with "stream": true as server-sent
// events: one chunk per token (chat opens with a role chunk), finish_reason
// on the last token chunk, then, with stream_options.include_usage, a chunk
// with empty choices and the usage, then "data: [DONE]". Usage always
// includes prompt_tokens_details.cached_tokens (the prefix-cache hit).
// Successful answers carry two headers vLLM does not send, the server's
// own account of the request's start in seconds: x-sim-queue-seconds
// (arrival to first scheduling into the running batch) and
// x-sim-first-token-seconds (arrival to first token); benchmarks split a
// client's time to first token with them. "model" names the base model or
// a registered adapter; empty means the
// base model (vLLM's default). max_tokens (chat: max_completion_tokens or
// max_tokens) fixes the output length exactly (finish_reason "length", as
// with ignore_eos), or, with Options.OutputLength OutputCeiling
// (--output-length ceiling), bounds it as real clients mean it: the answer
// stops at a seeded uniform length in [1, max_tokens]; without it the length is uniform in
// [1, DefaultMaxTokens], capped by the context, with finish_reason "stop".
// Sampling parameters are accepted and ignored. load_lora_adapter only
// registers the adapter (as vLLM, it is not put in a GPU slot until a
// request needs it).
//
// Errors are OpenAI-style JSON with vLLM's types,
// {"error":{"message","type","param","code":<status>}}: 400 BadRequestError
// for malformed JSON, wrong types, missing prompt/messages, max_tokens < 1,
// n != 1, stream_options without stream and context-length overflow; 404
// NotFoundError for an unknown model (as vLLM), path or adapter; 405 for a
// wrong method; 413 for bodies over 16 MiB; 500 InternalServerError for the
// error_rate fault; 503 ServiceUnavailableError after Close. Every request
// ends in exactly one answer: a response, an error, a cut connection (the
// crash and drop faults) or nothing when the client left first (its engine
// request is cancelled and its KV blocks freed).
//
// # Token approximation
//
// There is no tokenizer: text is one token per 4 bytes of UTF-8, rounded
// up, and a token's identity is its 4 bytes (ApproximateTokens). Chat
// messages are first rendered with a ChatML template
// ("<|im_start|>role\ncontent<|im_end|>\n" per message, then
// "<|im_start|>assistant\n"). Prompts that share a byte prefix therefore
// share a token prefix and hit the same prefix-cache blocks, as with a real
// tokenizer. Output tokens are 4-byte words chosen from the seed and request
// id, so the rule holds for output too.
//
// # Profiles
//
// h100 and a10g are hardware profiles for a Llama-3.1-8B-class model in
// BF16; slot4, slot24 and kvbound are server shapes that run out of
// something else first (see engine.Profile for what each stands for):
//
//	profile  slots  batched-tokens  KV blocks (x16 tokens)  max-model-len  LoRA slots  load
//	h100     256    8192            24576 (393k tokens)     131072         4           25ms
//	a10g     128    4096            2560  (41k tokens)      4096           2           60ms
//	slot4    4      2048            2560  (41k tokens)      4096           2           60ms
//	slot24   24     2048            2560  (41k tokens)      4096           2           60ms
//	kvbound  256    8192            400   (6.4k tokens)     4096           2           50ms
//
//	profile  step-base  decode-per-seq  prefill-per-token
//	h100     6ms        60µs            40µs  (25k prompt tokens/s; ITL 6ms alone, 21ms at 256)
//	a10g     18ms       250µs           250µs (4k prompt tokens/s; ITL 18ms alone, 50ms at 128)
//	slot4    12ms       6ms             50µs  (ITL 18ms alone, 36ms at 4: the step time doubles as the batch fills)
//	slot24   12ms       500µs           50µs  (ITL 12.5ms alone, 24ms at 24)
//	kvbound  22ms       150µs           150µs (a 70B-class model in FP8: ~10 requests of 640 tokens fill its KV)
//
// Serving 512/128-token chats at saturation (virtual time), one server of
// each serves about: h100 31.6 req/s, a10g 4.1, slot4 0.8, slot24 6.6,
// kvbound 2.6. Any parameter can be overridden per process by flag. The
// a10g profile is KV-bound too, at a larger scale: 128 requests of more
// than ~320 tokens do not fit, so mixed fleets show both slot and KV
// pressure.
//
// # Metrics
//
// Each server registers on its own registry (Options.Registry). With vLLM
// v1's names, labels {model_name, engine="0"} unless stated, buckets as in
// vLLM:
//
//	vllm:num_requests_running, vllm:num_requests_waiting      gauges
//	vllm:kv_cache_usage_perc                                  gauge, 0..1
//	vllm:cache_config_info{block_size,num_gpu_blocks,enable_prefix_caching,engine} = 1
//	vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}
//	    = scrape time in Unix seconds (readers take the newest series);
//	    comma-separated sorted adapter names; only when max-loras > 0
//	vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total   tokens
//	vllm:num_preemptions_total, vllm:prompt_tokens_total, vllm:generation_tokens_total
//	vllm:request_success_total{finished_reason="stop"|"length"}
//	vllm:time_to_first_token_seconds   histogram, arrival to first token (queue included)
//	vllm:inter_token_latency_seconds   histogram
//	vllm:e2e_request_latency_seconds   histogram
//	vllm:request_queue_time_seconds    histogram, arrival to first scheduling
//
// and two simulator metrics: vllm:lora_adapter_loaded{model_name,lora_name}
// = 1 for each adapter resident in a GPU slot (absent otherwise), and
// sluice_sim_lora_loads_total{model_name}, the adapter loads requests
// caused (preloads excluded). Gauges and counters are read from the engine
// at scrape time; latencies are engine times, so they are exact in virtual
// time too.
//
// # Faults
//
// Set by flag at start or at runtime with POST /admin/faults, whose body
// replaces all faults (unknown fields are rejected):
//
//	{"crash":false,"hang":false,"error_rate":0.0,"drop_stream_rate":0.0,"metrics_delay":"0s","slowdown":0}
//
// crash: every endpoint except /admin/faults closes the connection
// unanswered; in-flight requests are cut and the engine restarts empty (KV,
// prefix cache and resident adapters lost; registered adapters kept).
// hang: new requests block unanswered until cleared (then proceed normally)
// or until the client leaves; in-flight requests continue. error_rate: that
// fraction of inference requests get a 500. drop_stream_rate: that fraction
// of streams are cut after half their tokens, without [DONE]. metrics_delay:
// /metrics answers late. slowdown: every engine step from now on takes that
// many times its modelled duration (a throttled GPU; 0 or 1 is normal).
// Random decisions use the seeded generator.
//
// # Concurrency
//
// A Server has one mutex over its engine and in-flight table and one driver
// goroutine that advances the engine to the injected clock, sleeping until
// the engine's next step ends or a handler submits or cancels. Handlers
// wait on a one-slot channel per request that the step observer signals.
// Close stops the driver; handlers still waiting answer 503 (or cut their
// stream). Tests run servers in testing/synctest bubbles, where the real
// clock is virtual.
//
// # Flags of vllm-sim
//
//	--model NAME                served base model (meta-llama/Llama-3.1-8B-Instruct)
//	--host ADDR                 bind address (all interfaces)
//	--port N --replicas K       K servers of --profile on ports N..N+K-1 (8000, 1)
//	--ports 8001-8004|8001,8003 explicit ports for --profile servers
//	--fleet h100:2,a10g:2       mixed fleet on consecutive ports from --base-port
//	--profile NAME              profile: h100, a10g, slot4, slot24, kvbound (h100)
//	--seed N                    server i uses seed N+i (0)
//	--lora-modules a=/p,b=/q    adapters registered at start
//	--preload-loras a,b         registered adapters resident at start
//	--default-max-tokens N      output bound without max_tokens (128)
//	--output-length exact|ceiling  answers with max_tokens: exactly that long, or uniform in [1, max_tokens] (exact)
//	--max-num-seqs, --max-num-batched-tokens, --num-gpu-blocks, --block-size,
//	--max-model-len, --max-loras, --lora-load-time, --step-base,
//	--decode-per-seq, --prefill-per-token, --no-enable-prefix-caching
//	                            override the profile
//	--fault-crash, --fault-hang, --fault-error-rate P, --fault-drop-stream-rate P,
//	--fault-metrics-delay D, --fault-slowdown X
//	                            faults at start
//	--shutdown-timeout D        drain time on SIGTERM (10s)
package simulator
