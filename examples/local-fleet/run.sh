#!/usr/bin/env bash
# run.sh starts a small local inference fleet and shows what Sluice is for:
#   - simulated vLLM servers (bin/vllm-sim): FAST H100-like and SLOW A10G-like,
#   - the Sluice EPP in static-endpoints mode (no Kubernetes) with Sluice admission (priority bands)
#     and Sluice's default profile, the InferenceObjectives critical, standard and sheddable,
#   - the data plane (bin/dataplane), playing Envoy's part, on DATAPLANE_PORT,
#   - a round-robin data plane on DATAPLANE_PORT+1, the baseline,
# then loads the fleet with three priority classes at about twice what it serves (bin/loadgen, the
# priority-overload benchmark scenario's mix), first through Sluice, then through round-robin, and prints
# a table per class: served, shed with Retry-After, failed, TTFT p50/p99.
# Everything stays on 127.0.0.1 and stops on Ctrl-C (or at once with DEMO_ONLY=1).
# `make run` builds the binaries and calls this script.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/bin}
FAST=${FAST:-2}
SLOW=${SLOW:-2}
BASE_PORT=${BASE_PORT:-8001}
DATAPLANE_PORT=${DATAPLANE_PORT:-8080}
EPP_PORT=${EPP_PORT:-9002}
METRICS_PORT=${METRICS_PORT:-9090}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
# The demo: DEMO_RATE requests/s for DEMO_SECONDS through each gateway; requests still unanswered
# DEMO_DRAIN seconds later count as failed. 80/s is twice the 40/s the 2+2 fleet serves at these sizes.
DEMO_SECONDS=${DEMO_SECONDS:-20}
DEMO_RATE=${DEMO_RATE:-80}
DEMO_DRAIN=${DEMO_DRAIN:-20}
SCENARIO=${SCENARIO:-$ROOT/testbed/bench/scenarios/priority-overload}
LOGS=${LOGS:-$(mktemp -d -t sluice-run.XXXXXX)}

pids=()
stop() {
	trap - EXIT INT TERM
	echo
	echo "stopping the fleet, the EPP and the data plane"
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	echo "logs are in $LOGS"
}
trap stop EXIT INT TERM

n=$((FAST + SLOW))
endpoints=()
for ((i = 0; i < n; i++)); do endpoints+=("127.0.0.1:$((BASE_PORT + i))"); done
joined=$(IFS=,; echo "${endpoints[*]}")

wait_http() { # wait_http URL WHAT: poll until URL answers, for at most 60s
	for _ in $(seq 1 600); do
		if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "$2 did not come up; see $LOGS" >&2
	exit 1
}

echo "starting $FAST fast (h100) + $SLOW slow (a10g) simulated vLLM servers on $joined"
"$BIN/vllm-sim" --host 127.0.0.1 --fleet "h100:$FAST,a10g:$SLOW" --base-port "$BASE_PORT" --model "$MODEL" --seed 1 \
	>"$LOGS/vllm-sim.log" 2>&1 &
pids+=($!)
for ep in "${endpoints[@]}"; do wait_http "http://$ep/health" "simulator $ep"; done

echo "starting the Sluice EPP (static endpoints, Sluice admission and default profile, ext_proc on :$EPP_PORT)"
"$BIN/epp" --static-endpoints="$joined" --secure-serving=false --tracing=false \
	--sluice-admission --inference-objectives-file="$SCENARIO/objectives.yaml" \
	--grpc-port="$EPP_PORT" --grpc-health-port="$((EPP_PORT + 1))" --metrics-port="$METRICS_PORT" \
	>"$LOGS/epp.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$METRICS_PORT/metrics" "the EPP"

echo "starting the data plane on 127.0.0.1:$DATAPLANE_PORT"
"$BIN/dataplane" --listen "127.0.0.1:$DATAPLANE_PORT" --epp "127.0.0.1:$EPP_PORT" >"$LOGS/dataplane.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$DATAPLANE_PORT"
for _ in $(seq 1 600); do
	code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -H 'content-type: application/json' \
		-d "{\"model\":\"$MODEL\",\"prompt\":\"ping\",\"max_tokens\":1}" || true)
	[[ $code == 200 ]] && break
	sleep 0.1
done
[[ $code == 200 ]] || { echo "the data plane did not route a request (last status $code); see $LOGS" >&2; exit 1; }

rr_port=$((DATAPLANE_PORT + 1))
"$BIN/dataplane" --listen "127.0.0.1:$rr_port" --round-robin --endpoints "$joined" >"$LOGS/dataplane-rr.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$rr_port/v1/models" "the round-robin data plane"

cat <<MSG

Sluice is routing $url to $n simulated vLLM servers, with priority bands.
Try (x-gateway-inference-objective: critical, standard or sheddable; without it a request is Standard):
  curl -s $url/v1/chat/completions -H 'content-type: application/json' -H 'x-gateway-inference-objective: critical' \\
    -d '{"model":"$MODEL","messages":[{"role":"user","content":"Hello"}],"max_tokens":32}'

Demo: ${DEMO_SECONDS}s at $DEMO_RATE requests/s, about twice what this fleet serves: 20% critical, 50% standard,
30% sheddable streaming chats (512-token prompts, 128-token answers), once through Sluice, then the same
requests through a round-robin load balancer (about $((2 * (DEMO_SECONDS + DEMO_DRAIN) + 10))s at most).
MSG
load() { # load NAME PORT: the demo load through one gateway; the full report goes to $LOGS/demo-NAME.txt
	echo "== $1"
	"$BIN/loadgen" --target "http://127.0.0.1:$2" --mix "$SCENARIO/mix.yaml" --rate "$DEMO_RATE" \
		--duration "${DEMO_SECONDS}s" --drain "${DEMO_DRAIN}s" --seed 7 --out "$LOGS/demo-$1.json" >"$LOGS/demo-$1.txt"
}
load sluice "$DATAPLANE_PORT"
sleep 5 # let the fleet drain before the next gateway
load round-robin "$rr_port"

echo
echo "Per class, the same load through each gateway (served/requests; shed: answered 429/503 at once, in"
echo "parentheses how many carried Retry-After; failed: errors, or no answer within ${DEMO_DRAIN}s of the load's end):"
"$BIN/loadgen" compare sluice="$LOGS/demo-sluice.json" round-robin="$LOGS/demo-round-robin.json"
echo
echo "Full reports: $LOGS/demo-sluice.txt, $LOGS/demo-round-robin.txt; the EPP's metrics: http://127.0.0.1:$METRICS_PORT/metrics"

if [[ ${DEMO_ONLY:-0} == 1 ]]; then exit 0; fi
echo
echo "Press Ctrl-C to stop."
wait "${pids[0]}"
