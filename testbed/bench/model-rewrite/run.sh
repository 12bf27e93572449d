#!/usr/bin/env bash
# Model rewrite canary (issue 7): clients ask for "llama"; an
# InferenceModelRewrite (rewrites.yaml, static mode) sends 90% to
# llama-stable and 10% to llama-canary, two base models served by different
# simulator groups behind one EPP (epp.yaml routes each model to its group).
# Reports: the split the fleet observed (requests each group answered) and
# the EPP's decisions, that every streamed chunk names the model the client
# asked for, and that sessions (x-session-id) stick to one group.
set -euo pipefail
cd "$(dirname "$0")"
FLEET=h100:2,h100:2
BASE_PORT=${BASE_PORT:-28301}
DATAPLANE_PORT=${DATAPLANE_PORT:-29301}
EPP_PORT=${EPP_PORT:-29311}
source ../lib.sh
RATE=${RATE:-20}
STREAM_CHECKS=${STREAM_CHECKS:-100}
SESSIONS=${SESSIONS:-40}
FLEET_ARGS=(--fleet-models llama-stable,llama-canary)
RUN=model-rewrite

start_fleet "${FLEET_ARGS[@]}"
start_contender epp --config-file=epp.yaml --model-rewrites-file=rewrites.yaml
wait_listening "$DATAPLANE_PORT"
sleep 2 # the EPP's first scrapes: the filter needs each server's model
URL="http://127.0.0.1:$DATAPLANE_PORT/v1/chat/completions"

echo "== $RUN: ${SECONDS_PER_RUN}s at $RATE requests/s of model \"llama\", streamed"
"$BIN/loadgen" --target "http://127.0.0.1:$DATAPLANE_PORT" --mix mix.yaml --rate "$RATE" --duration "${SECONDS_PER_RUN}s" \
	--seed "$SEED" --out "$OUT/$RUN.json" 2>&1 | tee "$OUT/$RUN.txt"

# group_counter METRIC FIRST COUNT: METRIC summed over COUNT servers from port BASE_PORT+FIRST.
group_counter() {
	local total=0 v
	for ((i = $2; i < $2 + $3; i++)); do
		v=$(curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $NF} END {printf "%d", s}')
		total=$((total + v))
	done
	echo "$total"
}
stable=$(group_counter 'vllm:request_success_total' 0 2)
canary=$(group_counter 'vllm:request_success_total' 2 2)
awk -v s="$stable" -v c="$canary" 'BEGIN {printf "split observed by the fleet: llama-stable %d (%.1f%%), llama-canary %d (%.1f%%); configured 90/10\n", s, 100 * s / (s + c), c, 100 * c / (s + c)}' |
	tee -a "$OUT/$RUN.txt"
curl -fsS "http://127.0.0.1:$((EPP_PORT + 2))/metrics" | grep -E '^sluice_modelrewrite_(decisions|outcomes)_total' | grep -v ' 0$' | tee -a "$OUT/$RUN.txt"

# Every data chunk of a streamed answer must name "llama", never the served model.
request() { # request: one streamed chat request for "llama"; prints the body
	curl -fsS -N -H 'content-type: application/json' "$URL" \
		-d '{"model":"llama","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}'
}
export -f request
export URL
seq "$STREAM_CHECKS" | xargs -P 8 -I{} bash -c request >"$OUT/streams.txt"
awk '/^data: \{/ {n++; if (index($0, "\"model\":\"llama\"")) ok++; else if (index($0, "\"model\":")) bad++}
	END {printf "streamed chunks: %d, naming \"llama\": %d, naming another model: %d\n", n, ok, bad}' "$OUT/streams.txt" | tee -a "$OUT/$RUN.txt"

# Sticky sessions: three requests per session; the served endpoint's port tells the group.
sticky=0
for ((s = 0; s < SESSIONS; s++)); do
	groups=$(for _ in 1 2 3; do
		curl -fsS -o /dev/null -D - -H "x-session-id: user-$s" -H 'content-type: application/json' "$URL" \
			-d '{"model":"llama","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}' |
			awk -v base="$BASE_PORT" -F': ' 'tolower($1) == "x-gateway-destination-endpoint-served" {split($2, a, ":"); print (a[2] - base < 2) ? "stable" : "canary"}'
	done | sort -u | wc -l)
	[[ $groups == 1 ]] && sticky=$((sticky + 1))
done
echo "sessions served by one group across 3 requests: $sticky of $SESSIONS" | tee -a "$OUT/$RUN.txt"
echo "report in $OUT"
