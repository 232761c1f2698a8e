#!/usr/bin/env bash
# The benchmark client cross-checked on the fleet (issue 41, item 2) on the lent H200, in
# one device call on a machine where ../shared/tools/gpu-stage installed vLLM 0.33 into
# /tmp/site:
#
#   bash loadtest/gpu/client_check_h200.sh
#
# fleet_h200.sh's 2P2D fleet (loadtest/gpu/fleet_shape.sh), one kv_aware proxy in front of
# it, and loadtest.micro.bench_tools through that proxy (loadtest.client_check starts, runs
# and stops the three): `vllm bench serve --dataset-name prefix_repetition` and serve_bench
# on the same texts in the same order, sc3x's shape (NUM_PREFIXES 96 tenants' 4,096-token
# prefixes, 256-token suffixes, 48 output tokens), Poisson arrivals at RATE (4/s),
# NUM_PROMPTS (192: two per tenant, 48 s a run) a run, ROUNDS (2) rounds of the two tools,
# every run from reset prefix caches; TTFT/TPOT p50/p90, throughput, and the prefill pool's
# prefix-cache hit rate compared. Everything comes back in $OUT: bench_tools/ (its json, md
# and png), client_check.json, front-kv_aware.log and logs.tar.gz (pdspec up's and the
# workers' logs).
# DRY_RUN_CPU=1 BASE_PORT=19000 CALL_S=1500: on this CPU with the local model pair and small
# sizes (prefixes of 256 tokens, suffixes of 64, 16 tenants, 32 prompts at 2/s, 16 out): a
# check of the script, not of the figures.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/client-check-out}
RUN=${RUN:-/tmp/client-check-run}
T0=$(date +%s)
source loadtest/gpu/device_env.sh 1 dry-run-ok
source loadtest/gpu/fleet_shape.sh
mkdir -p "$OUT" "$RUN"
if [ -n "$DRY_RUN" ]; then
  SHAPE=(--prefix-len "${PREFIX_LEN:-256}" --suffix-len "${SUFFIX_LEN:-64}" --num-prefixes "${NUM_PREFIXES:-16}"
    --output-len "${OUTPUT_LEN:-16}" --num-prompts "${NUM_PROMPTS:-32}" --request-rate "${RATE:-2}")
else
  SHAPE=(--prefix-len "${PREFIX_LEN:-4096}" --suffix-len "${SUFFIX_LEN:-256}" --num-prefixes "${NUM_PREFIXES:-96}"
    --output-len "${OUTPUT_LEN:-48}" --num-prompts "${NUM_PROMPTS:-192}" --request-rate "${RATE:-4}")
fi
pack() {
  (cd "$RUN" && tar czf "$OUT/logs.tar.gz" pdspec-up.log logs 2>/dev/null)
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>/dev/null
  ls -la "$OUT" "$OUT/bench_tools" 2>/dev/null; echo "client_check_h200.sh: $(( $(date +%s) - T0 )) s in all"
}
trap pack EXIT
# Left for the check: the call's 600 s less what came before, the stop and the packing.
LEFT=$(( ${CALL_S:-590} - ($(date +%s) - T0) - 30 ))
echo "client_check_h200.sh: $LEFT s for the check; ${PREFILL}P${DECODE}D; ${SHAPE[*]}"
# SIGINT to the group on time (client_check stops the front and the fleet), KILL 90 s later.
timeout -s INT -k 90 "$LEFT" python3 -m loadtest.client_check --out "$OUT" --run-dir "$RUN" --policy kv_aware \
  "${FLEET_ARGS[@]}" -- --dataset prefix-repetition "${SHAPE[@]}" --rounds "${ROUNDS:-2}" \
  --tokenizer "$FLEET_TOKENIZER" --seed 41
echo "client_check exit $?"
