#!/usr/bin/env bash
# Issue 21's method check on the lent H200 (kind nvidia-h200): do the phases of one policy
# agree within 1% when 1P1D shares one GPU? One device call, after ../shared/tools/gpu-stage
# installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   bash loadtest/gpu/phases_h200.sh
#
# `pdspec bench` runs the seed's mbt-512 row (EAGLE3 K=3; 8,192-token random prompts,
# 8 out, concurrency 32; `auto` and `always` phases interleaved) on
# deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml with the settings of
# deploy/profiles/one-gpu-1p1d.toml (both workers on GPU 0 at 40%, KV pushed, admission
# by KV room and queued prefill time), both workers EAGER: a cold compile of two engines
# does not fit one call with the phases, and what this checks is how well phases agree,
# not the compiled speed. PHASES phases per policy of NUM_PROMPTS prompts (the seed: 3 of
# 128; 3 of 48 fit one call). bench.md has each phase's saturated-window prefill rate and
# saturation share, the pair ratios and the bootstrap interval. VARIANTS=mbt2048 runs the
# other row. COMPILED=1: both workers with CUDA graphs (the profile's own setting); on a
# fresh machine the first call only warms the compile cache (READY_TIMEOUT=520), a second
# call on the same warm machine measures. Admission's queue wait is 300 s (as
# one_gpu_admission_h200.sh): with the default, legs held past it were refused (503) in
# the first runs. Everything comes back in $OUT.
# DRY_RUN_CPU=1 with PROFILES= SET= WORKLOAD=cpu-seed: on this CPU with the local model pair (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/phases-out}
BUDGET=${BUDGET:-540}            # seconds for `pdspec bench`, start to results written
RUN_ROOT=/tmp/pdspec-phases      # logs (kept for a later call on this machine)
RESULTS=/tmp/pdspec-phases-results
source loadtest/gpu/device_env.sh 1 dry-run-ok
mkdir -p "$OUT" "$RESULTS"
# A dry run on the CPU sets PROFILES and SET to nothing (the local model pair) and WORKLOAD=cpu-seed.
PROFILES=${PROFILES-"deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml"}
SET=${SET-"prefill.cuda_visible_devices=0 decode.cuda_visible_devices=0 prefill.gpu_memory_utilization=0.4
  decode.gpu_memory_utilization=0.4 model.kv_transfer=push
  proxy.admission.prefill_kv=true proxy.admission.queue_timeout_s=300"}
[ -n "$SET" ] && [ -z "${COMPILED:-}" ] && SET="$SET prefill.enforce_eager=true decode.enforce_eager=true"
set_args=()
[ -n "$SET" ] && set_args=(--set $SET)

nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$RESULTS/nvidia-smi.txt" 2>&1
# The GPU's clocks, power and utilization each second: whether a slow phase was a slow GPU.
sampler=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 1000 > "$OUT/gpu-clocks.csv" 2>&1 &
  sampler=$!
fi
set -x
stop_after=$((BUDGET + 30 < 570 ? BUDGET + 30 : 570))
# shellcheck disable=SC2086  # PROFILES is words on purpose
timeout -k 10 $stop_after python3 -m pdspec.cli bench $PROFILES --workload "${WORKLOAD:-seed}" \
  --variants "${VARIANTS:-mbt512}" "${set_args[@]}" --out "$RESULTS" --run-root "$RUN_ROOT" \
  --budget-s $((BUDGET - 40)) --ready-timeout "${READY_TIMEOUT:-330}" --no-progress \
  -- --num-prompts "${NUM_PROMPTS:-48}" --phases "${PHASES:-3}" --warmup "${WARMUP:-8}"
code=$?
set +x
[ -n "$sampler" ] && kill "$sampler"

# Anything `pdspec up` started and did not stop (each child runs in its own session, so it
# would outlive this call and hold GPU memory): end it by the PID its log names.
for log in "$RUN_ROOT"/*/pdspec-up.log; do
  [ -f "$log" ] || continue
  for pid in $(grep -o 'pid [0-9]*' "$log" | cut -d' ' -f2); do
    kill -0 "$pid" 2>/dev/null && { echo "left running: $pid ($log)"; kill -9 -- "-$pid" 2>/dev/null; }
  done
done

cp "$RESULTS"/bench.md "$RESULTS"/bench.json "$OUT"/ 2>/dev/null
for d in "$RESULTS"/*/; do
  [ -f "$d/serve_bench_ab.png" ] && cp "$d/serve_bench_ab.png" "$OUT/$(basename "$d")_ab.png"
  [ -f "$d/serve_bench.json" ] && cp "$d/serve_bench.json" "$OUT/$(basename "$d")_serve_bench.json"
done
tar czf "$OUT/logs.tar.gz" -C "$RUN_ROOT" . "$RESULTS/nvidia-smi.txt" 2>/dev/null
cat "$RESULTS/bench.md" 2>/dev/null | head -60
exit $code
