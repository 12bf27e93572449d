#!/usr/bin/env bash
# LoRA-heavy (issue 5; scenario 6 of the suite): 8 H100-like simulated servers
# with 4 LoRA slots each, 40 adapters with Zipf popularity (s=1.0) and 30%
# base-model traffic. Contenders, each on a fresh fleet:
# round-robin, upstream's lora-affinity profile and Sluice's (same weights).
# The mix file is generated: one class per adapter, weight 70% x 1/k^s.
set -euo pipefail
cd "$(dirname "$0")"
FLEET=h100:8
BASE_PORT=${BASE_PORT:-28201}
source ../lib.sh
RATE=${RATE:-40}
ADAPTERS=40

modules=$(for ((k = 0; k < ADAPTERS; k++)); do printf 'adapter-%02d=/adapters/%02d,' "$k" "$k"; done)
{
	echo "api: chat"
	echo "stream: true"
	echo "classes:"
	echo "  - {name: base, model: $MODEL, weight: 30000, prompt_tokens: 256, output_tokens: 64}"
	awk -v n="$ADAPTERS" 'BEGIN { for (k = 1; k <= n; k++) h += 1 / k
		for (k = 1; k <= n; k++) printf "  - {name: adapter-%02d, model: '"$MODEL"', lora: adapter-%02d, weight: %d, prompt_tokens: 256, output_tokens: 64}\n", k - 1, k - 1, 70000 / k / h }'
} >"$OUT/mix.yaml"

FLEET_ARGS=(--lora-modules "${modules%,}")
bench round-robin "$OUT/mix.yaml" "$RATE" rr
bench upstream-lora "$OUT/mix.yaml" "$RATE" epp --config-file=upstream.yaml
bench sluice "$OUT/mix.yaml" "$RATE" epp --config-file=sluice.yaml
echo "reports in $OUT"
