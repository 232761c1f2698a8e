#!/usr/bin/env bash
# The fleet benchmark (issue 41) on the lent H200 (kind nvidia-h200), in one device call on
# a machine where ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site:
#
#   JOBS=sc3x:kv_aware,sc3x:round_robin,... bash loadtest/gpu/fleet_h200.sh
#
# The 2P2D fleet of loadtest/gpu/fleet_shape.sh (PREFILL=3 DECODE=1 for 3P1D, and so on:
# four engines fit; KV_BLOCKS blocks of 16 tokens a worker): the Qwen3-8B shape with its
# EAGLE3 drafter, eager, all on GPU 0. Then loadtest.fleet_bench runs the jobs in JOBS
# (trace:policy, in order) while time is left, and stops everything. Traces (seeded; written to disk, returned):
#   sc3x  llm-d-shaped: 96 tenants x 4,096-token contexts (393k tokens, 3.0x the fleet's
#         4 x 2,048 x 16 = 131k tokens of KV), 256-token queries, 48 output tokens, Poisson
#         QPS 1, 2, 4, 6, 8, 11 (6, 6, 6, 5, 4, 4 s);
#   sc1x  the same with 32 tenants (131k tokens: the fleet's KV, 2x the prefill pool's);
#   mt    multi-turn chat: sessions of 4 turns, 2,048-token start, +128 (answer stand-in)
#         +256 (message) a turn, 0.5-s pauses, QPS 1, 3, 6, 9.
# vLLM's router: carry its wheel in .whl (pip download vllm-router==0.1.17 ...); it is
# installed into /tmp/site by device_env.sh when present.
# Everything comes back in $OUT: fleet_bench.json and fleet.tar.gz (requests, traces, logs).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fleet-out}
RUN=/tmp/fleet-run
T0=$(date +%s)
source loadtest/gpu/device_env.sh 1
mkdir -p "$OUT" "$RUN" /tmp/fleet-traces
python3 -c "import vllm_router" 2>/dev/null && ROUTER=(--vllm-router "python3 -m vllm_router.launch_router") || ROUTER=()
export VLLM_SERVER_DEV_MODE=1  # /reset_prefix_cache between jobs
source loadtest/gpu/fleet_shape.sh
JOBS=${JOBS:-sc3x:kv_aware,sc3x:round_robin,sc3x:prefix_affinity,sc3x:vllm_router_cache_aware,sc3x:colocated_kv_aware,sc3x:kv_aware_conditional_pending,sc3x:kv_aware_conditional,sc3x:least_outstanding}
pack() {
  cp "$RUN"/pdspec-up.log "$RUN"/logs/*.log "$OUT"/ 2>/dev/null
  (cd "$OUT" && tar czf /tmp/fleet.tar.gz --exclude fleet.tar.gz --exclude fleet_bench.json . \
     -C /tmp/fleet-traces . && rm -f -- *.log *.jsonl front-*.log && mv /tmp/fleet.tar.gz fleet.tar.gz)
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>/dev/null
  ls -la "$OUT"; echo "fleet_h200.sh: $(( $(date +%s) - T0 )) s in all"
}
trap pack EXIT
trace() { python3 -m loadtest.fleet_trace "$@" || exit 1; }
trace shared_context --name sc3x --seed 41 --tenants 96 --context 4096 --question 256 --max-tokens 48 \
  --levels 1x6,2x6,4x6,6x5,8x4,11x4 --warmup-requests 48 --warmup-qps 8 --out /tmp/fleet-traces/sc3x.json.gz
trace shared_context --name sc1x --seed 42 --tenants 32 --context 4096 --question 256 --max-tokens 48 \
  --levels 1x6,2x6,4x6,6x5,8x4,11x4 --warmup-requests 48 --warmup-qps 8 --out /tmp/fleet-traces/sc1x.json.gz
trace multi_turn --name mt --seed 43 --turns 4 --start 2048 --answer 128 --message 256 --max-tokens 48 \
  --think-s 0.5 --levels 1x8,3x8,6x6,9x5 --warmup-sessions 8 --out /tmp/fleet-traces/mt.json.gz
# Left for the benchmark: the call's 600 s less what came before, the stop and the packing.
LEFT=$(( ${CALL_S:-590} - ($(date +%s) - T0) - 45 ))
echo "fleet_h200.sh: $LEFT s for the benchmark; ${PREFILL}P${DECODE}D; jobs $JOBS; router: ${ROUTER[*]:-none}"
timeout -s INT -k 20 "$LEFT" python3 -m loadtest.fleet_bench --out "$OUT" --run-dir "$RUN" \
  --trace /tmp/fleet-traces/sc3x.json.gz --trace /tmp/fleet-traces/sc1x.json.gz --trace /tmp/fleet-traces/mt.json.gz \
  --jobs "$JOBS" "${FLEET_ARGS[@]}" "${ROUTER[@]}" \
  --deadline-s $(( LEFT - 40 )) --drain-s 15
echo "fleet_bench exit $?"
