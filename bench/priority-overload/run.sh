#!/usr/bin/env bash
# Priority overload (issue 4, scenario 5 of the benchmark suite): offered load
# 2x the fleet's capacity, 20/50/30 Critical/Standard/Sheddable, clients that
# honour Retry-After. One fleet, three contenders one after the other:
#   round-robin   a data plane with no EPP
#   upstream-fc   the EPP with upstream v1.5.0's flow control (priority bands)
#   sluice        the EPP with Sluice admission
# plus Critical alone at 0.5x load through Sluice, the latency Critical should
# keep. Reports go to $OUT (JSON per run plus the printed tables).
set -euo pipefail
cd "$(dirname "$0")"
BIN=${BIN:-../../bin}
OUT=${OUT:-$(mktemp -d -t sluice-overload.XXXXXX)}
mkdir -p "$OUT"
CAPACITY=${CAPACITY:-30}   # requests/s the 2+2 fleet serves at 512/128 tokens (measured with examples/local-fleet COMPARE=1)
SECONDS_PER_RUN=${SECONDS_PER_RUN:-30}
BASE_PORT=${BASE_PORT:-28001}
MODEL=meta-llama/Llama-3.1-8B-Instruct

pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
wait_http() { for _ in $(seq 1 600); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "$1 never answered; logs in $OUT" >&2; exit 1; }

endpoints=$(for i in 0 1 2 3; do printf '127.0.0.1:%d,' $((BASE_PORT + i)); done); endpoints=${endpoints%,}
"$BIN/vllm-sim" --host 127.0.0.1 --fleet h100:2,a10g:2 --base-port "$BASE_PORT" --model "$MODEL" --seed 1 >"$OUT/vllm-sim.log" 2>&1 &
pids+=($!)
for i in 0 1 2 3; do wait_http "http://127.0.0.1:$((BASE_PORT + i))/health"; done

start_epp() { # start_epp NAME GRPC_PORT ARGS...
	local name=$1 port=$2; shift 2
	"$BIN/epp" --static-endpoints="$endpoints" --inference-objectives-file=objectives.yaml --secure-serving=false --tracing=false \
		--grpc-port="$port" --grpc-health-port=$((port + 1)) --metrics-port=$((port + 2)) "$@" >"$OUT/epp-$name.log" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$((port + 2))/metrics"
}
start_dataplane() { # start_dataplane NAME LISTEN_PORT ARGS...
	local name=$1 port=$2; shift 2
	"$BIN/dataplane" --listen "127.0.0.1:$port" "$@" >"$OUT/dataplane-$name.log" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$port/v1/models" || true
}
start_epp upstream-fc 29100 --config-file=upstream-flowcontrol.yaml
start_epp sluice 29200 --flow-control-config=sluice-policy.yaml
start_dataplane round-robin 29001 --round-robin --endpoints "$endpoints"
start_dataplane upstream-fc 29002 --epp 127.0.0.1:29100
start_dataplane sluice 29003 --epp 127.0.0.1:29200
sleep 2 # first scrapes

load() { # load NAME PORT MIX RATE
	echo
	echo "== $1: ${SECONDS_PER_RUN}s at $4 requests/s ($3)"
	"$BIN/loadgen" --target "http://127.0.0.1:$2" --mix "$3" --model "$MODEL" --rate "$4" --duration "${SECONDS_PER_RUN}s" \
		--max-attempts 3 --max-retry-wait 10s --seed 11 --out "$OUT/$1.json" 2>&1 | tee "$OUT/$1.txt"
	sleep 5 # let the fleet drain
}
load sluice-critical-half-load 29003 critical-only.yaml $((CAPACITY / 2))
load round-robin 29001 mix.yaml $((CAPACITY * 2))
load upstream-fc 29002 mix.yaml $((CAPACITY * 2))
load sluice 29003 mix.yaml $((CAPACITY * 2))
echo
echo "shed counts by band and reason (Sluice EPP /metrics):"
curl -fsS http://127.0.0.1:29202/metrics | grep -E '^sluice_flowcontrol_(shed|dispatched)_total' || true
echo "reports in $OUT"
