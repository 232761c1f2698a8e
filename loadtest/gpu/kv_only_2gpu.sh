#!/usr/bin/env bash
# Two kv_only_h200.sh jobs at once on the lent 2 x H200 (kind nvidia-h200-x2), one per GPU,
# in one device call after gpu-stage installed vLLM 0.33 into /tmp/site. From the
# repository root:
#
#   bash loadtest/gpu/kv_only_2gpu.sh profile dflash512    # GPU 0: profile, GPU 1: DFlash
#   bash loadtest/gpu/kv_only_2gpu.sh bench512 bench2048   # then the two benchmarks
#
# Each job sees only its GPU and keeps its own vLLM compile cache per GPU, so a later call
# on the same warm machine starts warm on that GPU (run profile before bench512 on GPU 0).
# The two jobs share the host (32 cores): each measures ratios within its own engine(s),
# and both modes of a ratio see the other job alike. Both end by BUDGET_S (540 s) so the
# results are packed inside the call's 600 s: $OUT/JOB.tar.gz per job, and a summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kv-only-2gpu-out}
work=/tmp/kv-only-2gpu
rm -rf "$work"; mkdir -p "$work" "$OUT"
jobs=("${1:?usage: kv_only_2gpu.sh JOB_ON_GPU0 JOB_ON_GPU1}" "${2:?}")

for gpu in 0 1; do
  job=${jobs[$gpu]}
  (
    export CUDA_VISIBLE_DEVICES=$gpu OUT=$work/$job VLLM_CACHE_ROOT=/tmp/pdspec-vllm-cache-gpu$gpu
    # timeout ends the job's whole process group (engine cores included) at the budget.
    timeout -k 10 "${BUDGET_S:-540}" bash loadtest/gpu/kv_only_h200.sh "$job" 2>&1 | sed -u "s/^/[gpu$gpu $job] /"
  ) &
done
wait

for job in "${jobs[@]}"; do
  [ -d "$work/$job" ] && tar czf "$OUT/$job.tar.gz" -C "$work" "$job"
  echo "=== $job"
  cat "$work/$job"/*.md 2>/dev/null | head -60
  grep -h "k0/no-drafter\|KV-only drafter pass" "$work/$job"/*-log.txt 2>/dev/null | sort | uniq -c | head -8
done
ls -la "$OUT"
