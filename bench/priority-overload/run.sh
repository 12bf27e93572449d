#!/usr/bin/env bash
# Priority overload (issue 4; scenario 5 of the suite): offered load 2x the
# fleet's capacity, 20/50/30 Critical/Standard/Sheddable, clients that honour
# Retry-After (up to 3 attempts). A 2+2 fleet and three contenders:
#   round-robin   a data plane with no EPP
#   upstream-fc   the EPP with upstream v1.5.0's flow control (priority bands)
#   sluice        the EPP with Sluice admission (sluice-policy.yaml)
# plus Critical alone at half the capacity through Sluice: the latency
# Critical should keep under overload. CAPACITY is the fleet's requests/s at
# 512/128 tokens on this machine.
set -euo pipefail
cd "$(dirname "$0")"
FLEET=h100:2,a10g:2
source ../lib.sh
CAPACITY=${CAPACITY:-30}
LOADGEN_ARGS=(--max-attempts 3 --max-retry-wait 10s)
objectives=--inference-objectives-file=objectives.yaml

bench sluice-critical-half-load critical-only.yaml $((CAPACITY / 2)) epp "$objectives" --flow-control-config=sluice-policy.yaml
bench round-robin mix.yaml $((CAPACITY * 2)) rr
bench upstream-fc mix.yaml $((CAPACITY * 2)) epp "$objectives" --config-file=upstream-flowcontrol.yaml
bench sluice mix.yaml $((CAPACITY * 2)) epp "$objectives" --flow-control-config=sluice-policy.yaml
echo "reports in $OUT"
