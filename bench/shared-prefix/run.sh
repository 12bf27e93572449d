#!/usr/bin/env bash
# Shared prompt prefixes (issue 6; scenario 3 of the suite): 8 A10G-like
# simulated servers (slow prefill, so a cache hit matters), Zipf-skewed prefix
# groups and multi-turn chats. Contenders:
# round-robin, upstream's default profile (queue + KV + prefix, run in the
# Sluice binary with no config) and Sluice's profile (sluice.yaml), each on a
# fresh fleet.
set -euo pipefail
cd "$(dirname "$0")"
FLEET=a10g:8
BASE_PORT=${BASE_PORT:-28101}
source ../lib.sh
RATE=${RATE:-12}

bench round-robin mix.yaml "$RATE" rr
bench upstream-default mix.yaml "$RATE" epp
bench sluice mix.yaml "$RATE" epp --config-file=sluice.yaml
echo "reports in $OUT"
