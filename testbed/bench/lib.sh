# lib.sh: shared steps of the real-time benchmark scenarios (sourced by
# testbed/bench/<scenario>/run.sh). Everything runs on 127.0.0.1 from bin/; every
# process started here is stopped when the scenario exits.
#
# A scenario sets FLEET (vllm-sim --fleet) and calls bench once per
# contender. Every run gets a fresh fleet: a fleet that served the same
# prompts before would answer them from its prefix cache and favour whoever
# runs later.

BIN=${BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/bin}
OUT=${OUT:-$(mktemp -d -t sluice-bench.XXXXXX)}
mkdir -p "$OUT"
BASE_PORT=${BASE_PORT:-28001}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-30}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
SEED=${SEED:-11}

bench_pids=()
bench_stop() {
	for p in "${bench_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap bench_stop EXIT INT TERM

wait_http() { # wait_http URL: poll for at most 60s; fails the scenario if it never answers
	for _ in $(seq 1 600); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "$1 never answered; logs in $OUT" >&2
	exit 1
}

wait_listening() { # wait_listening PORT: poll until something accepts TCP on 127.0.0.1:PORT
	for _ in $(seq 1 600); do
		(: </dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "nothing listens on $1; logs in $OUT" >&2
	exit 1
}

# start_fleet ARGS...: simulated vLLM servers per $FLEET (e.g. h100:2,a10g:2)
# from $BASE_PORT; sets ENDPOINTS (comma list) and FLEET_SIZE.
start_fleet() {
	local n=0 part
	IFS=, read -ra parts <<<"$FLEET"
	for part in "${parts[@]}"; do n=$((n + ${part#*:})); done
	FLEET_SIZE=$n
	ENDPOINTS=$(for ((i = 0; i < n; i++)); do printf '127.0.0.1:%d,' $((BASE_PORT + i)); done)
	ENDPOINTS=${ENDPOINTS%,}
	"$BIN/vllm-sim" --host 127.0.0.1 --fleet "$FLEET" --base-port "$BASE_PORT" --model "$MODEL" --seed 1 "$@" \
		>"$OUT/vllm-sim.log" 2>&1 &
	bench_pids+=($!)
	for ((i = 0; i < n; i++)); do wait_http "http://127.0.0.1:$((BASE_PORT + i))/health"; done
}

# start_contender MODE [EPP ARGS...]: the data plane on DATAPLANE_PORT. MODE
# rr is round-robin (no EPP); MODE epp asks an EPP started with EPP ARGS on
# EPP_PORT (ext_proc), EPP_PORT+1 (health) and EPP_PORT+2 (metrics).
DATAPLANE_PORT=${DATAPLANE_PORT:-29000}
EPP_PORT=${EPP_PORT:-29100}
start_contender() {
	local mode=$1
	shift
	if [[ $mode == rr ]]; then
		"$BIN/dataplane" --listen "127.0.0.1:$DATAPLANE_PORT" --round-robin --endpoints "$ENDPOINTS" >"$OUT/dataplane-$RUN.log" 2>&1 &
		bench_pids+=($!)
		return
	fi
	"$BIN/epp" --static-endpoints="$ENDPOINTS" --secure-serving=false --tracing=false \
		--grpc-port="$EPP_PORT" --grpc-health-port=$((EPP_PORT + 1)) --metrics-port=$((EPP_PORT + 2)) "$@" >"$OUT/epp-$RUN.log" 2>&1 &
	bench_pids+=($!)
	wait_http "http://127.0.0.1:$((EPP_PORT + 2))/metrics"
	"$BIN/dataplane" --listen "127.0.0.1:$DATAPLANE_PORT" --epp "127.0.0.1:$EPP_PORT" >"$OUT/dataplane-$RUN.log" 2>&1 &
	bench_pids+=($!)
}

# fleet_counter METRIC: the sum of METRIC over the fleet's /metrics pages.
fleet_counter() {
	local total=0 v
	for ((i = 0; i < FLEET_SIZE; i++)); do
		v=$(curl -fsS "http://127.0.0.1:$((BASE_PORT + i))/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $NF} END {printf "%d", s}')
		total=$((total + v))
	done
	echo "$total"
}

# bench NAME MIX RATE MODE [EPP ARGS...]: a fresh fleet, one contender
# (see start_contender), one open-loop Poisson run of ${SECONDS_PER_RUN}s at
# RATE requests/s with the mix file MIX and the loadgen arguments in the
# LOADGEN_ARGS array. Prints the load report, the fleet's prefix-cache hit
# rate and adapter loads, and the EPP's admission counters if it has any.
bench() {
	RUN=$1
	local mix=$2 rate=$3
	shift 3
	local before=${#bench_pids[@]}
	start_fleet ${FLEET_ARGS[@]+"${FLEET_ARGS[@]}"}
	start_contender "$@"
	wait_listening "$DATAPLANE_PORT"
	sleep 2 # the EPP's first scrapes
	echo
	echo "== $RUN: ${SECONDS_PER_RUN}s at $rate requests/s ($(basename "$mix"))"
	"$BIN/loadgen" --target "http://127.0.0.1:$DATAPLANE_PORT" --mix "$mix" --rate "$rate" --duration "${SECONDS_PER_RUN}s" \
		--seed "$SEED" --out "$OUT/$RUN.json" ${LOADGEN_ARGS[@]+"${LOADGEN_ARGS[@]}"} 2>&1 | tee "$OUT/$RUN.txt"
	local hits queries loads
	hits=$(fleet_counter 'vllm:prefix_cache_hits_total')
	queries=$(fleet_counter 'vllm:prefix_cache_queries_total')
	loads=$(fleet_counter 'sluice_sim_lora_loads_total')
	awk -v h="$hits" -v q="$queries" -v l="$loads" 'BEGIN {printf "fleet: prefix-cache hit rate %.1f%% (%d of %d tokens), adapter loads %d\n", (q ? 100 * h / q : 0), h, q, l}' |
		tee -a "$OUT/$RUN.txt"
	if [[ $1 == epp ]]; then
		curl -fsS "http://127.0.0.1:$((EPP_PORT + 2))/metrics" | grep -E '^sluice_flowcontrol_(shed|dispatched)_total' | tee -a "$OUT/$RUN.txt" || true
	fi
	for p in "${bench_pids[@]:before}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	bench_pids=("${bench_pids[@]:0:before}")
}
