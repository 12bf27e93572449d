#!/usr/bin/env bash
# run.sh starts a small local inference fleet and shows Sluice routing it:
#   - simulated vLLM servers (bin/vllm-sim): FAST H100-like and SLOW A10G-like,
#   - the Sluice EPP in static-endpoints mode (no Kubernetes),
#   - the data plane (bin/dataplane), playing Envoy's part, on DATAPLANE_PORT,
# then sends a short demo load (bin/loadgen) and prints where requests went.
# Everything stays on 127.0.0.1 and stops on Ctrl-C (or at once with DEMO_ONLY=1).
# COMPARE=1 then loads the same fleet through a round-robin data plane and
# through the EPP, one after the other, and prints both reports.
# `make run` builds the binaries and calls this script.
set -euo pipefail

BIN=${BIN:-bin}
FAST=${FAST:-2}
SLOW=${SLOW:-2}
BASE_PORT=${BASE_PORT:-8001}
DATAPLANE_PORT=${DATAPLANE_PORT:-8080}
EPP_PORT=${EPP_PORT:-9002}
METRICS_PORT=${METRICS_PORT:-9090}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
DEMO_SECONDS=${DEMO_SECONDS:-15}
DEMO_RATE=${DEMO_RATE:-6}
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

echo "starting the Sluice EPP (static endpoints, ext_proc on :$EPP_PORT)"
"$BIN/epp" --static-endpoints="$joined" --secure-serving=false --tracing=false \
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

cat <<MSG

Sluice is routing $url to $n simulated vLLM servers.
Try:
  curl -s $url/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"$MODEL","messages":[{"role":"user","content":"Hello"}],"max_tokens":32}'

Sending a ${DEMO_SECONDS}s demo load ($DEMO_RATE requests/s, Poisson, streaming chat)...
MSG
"$BIN/loadgen" --target "$url" --model "$MODEL" --rate "$DEMO_RATE" --duration "${DEMO_SECONDS}s" \
	--prompt-tokens 256 --output-tokens 64 --seed 1 --out "$LOGS/demo-load.json" 2>&1 | tee "$LOGS/loadgen.log"

echo
echo "where the requests went (vllm:request_success_total per server):"
for ((i = 0; i < n; i++)); do
	ep=${endpoints[$i]}
	kind=h100
	((i >= FAST)) && kind=a10g
	count=$(curl -fsS "http://$ep/metrics" | awk '/^vllm:request_success_total/ {s += $NF} END {printf "%d", s}')
	printf '  %-16s %-5s %6s requests\n' "$ep" "$kind" "$count"
done

if [[ ${COMPARE:-0} == 1 ]]; then
	# Same fleet, one contender after the other: round-robin (a data plane
	# with no EPP) against the EPP with upstream's default profile.
	rate=${COMPARE_RATE:-30}
	secs=${COMPARE_SECONDS:-30}
	rr_port=$((DATAPLANE_PORT + 1))
	"$BIN/dataplane" --listen "127.0.0.1:$rr_port" --round-robin --endpoints "$joined" >"$LOGS/dataplane-rr.log" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$rr_port/v1/models" "the round-robin data plane"
	for contender in round-robin:$rr_port epp:$DATAPLANE_PORT; do
		name=${contender%%:*}
		echo
		echo "== $name: ${secs}s at $rate requests/s (Poisson, streaming chat, 512-token prompts, 128-token outputs)"
		"$BIN/loadgen" --target "http://127.0.0.1:${contender##*:}" --model "$MODEL" --rate "$rate" --duration "${secs}s" \
			--prompt-tokens 512 --output-tokens 128 --seed 7 --out "$LOGS/compare-$name.json" 2>&1 | tee "$LOGS/compare-$name.log"
		sleep 5 # let the fleet drain before the next contender
	done
fi

if [[ ${DEMO_ONLY:-0} == 1 ]]; then exit 0; fi
echo
echo "Press Ctrl-C to stop."
wait "${pids[0]}"
