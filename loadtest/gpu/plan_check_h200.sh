#!/usr/bin/env bash
# The fleet planner checked on the lent H200 (issue 43's "H200 1P1D on one GPU"), in one
# device call on a machine where ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site,
# with simpy's wheel carried in .whl (device_env.sh's require_modules says how to get it):
#
#   bash loadtest/gpu/plan_check_h200.sh
#
# deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml (Qwen3-8B shape, EAGLE3 K=3, random
# weights) with both workers on GPU 0 at 40% each, EAGER (as the shipped profile
# h200-qwen3-8b-eagle3 was measured), KV pushed (on one GPU a pull goes over TCP), prefill
# chunks of 2,048 tokens on both. Once the proxy is ready:
# 1. loadtest.handoff_probe, one request at a time (INPUT_LEN tokens, 4 out): the idle TTFT
#    through the stack, for the profile's serving term
#    (loadtest.engine_bench.serving_overhead, written to $OUT/profile-with-serving.json);
# 2. loadtest.serve_bench, Poisson phases at RATES (NUM_PROMPTS each, INPUT_LEN in, 64 out,
#    goodput under TTFT 2 s / TPOT 100 ms);
# 3. loadtest.plan_check: the fleet model with that profile beside each phase, the two
#    engines on one device (--devices 1), and the goodput of both.
# Everything comes back in $OUT/logs.tar.gz (probe.json, serving_overhead.json, serve_bench/, check/,
# check-light/, the logs); beside it the two checks' tables (plan_check.md, plan_check-light.md),
# serve_bench/serve_bench.json, up-log.txt and the profile with its serving term.
# DRY_RUN_CPU=1 STACK= PROFILE=cpu-2core-pdspec-tiny-eagle3 INPUT_LEN=512 RATES="2 8" MODEL=pdspec-tiny:
# on this CPU with the local model pair (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/plan-check-out}
T0=$(date +%s)
READY_S=${READY_S:-300}   # two eager engines of the 8B shape, one after another: about 250 s
source loadtest/gpu/device_env.sh 1 dry-run-ok
require_modules simpy  # the fleet model (serving_overhead, plan_check); its wheel carried in .whl
RESULTS=/tmp/plan-check-results
rm -rf "$RESULTS" && mkdir -p "$OUT" "$RESULTS"
proxy=http://127.0.0.1:8000 prefill=http://127.0.0.1:8100 decode=http://127.0.0.1:8200
model=${MODEL:-Qwen3-8B-dummy}
input_len=${INPUT_LEN:-2048}
PROFILE=${PROFILE:-h200-qwen3-8b-eagle3}
K=${K:-3}
# Eager 8B on one shared GPU: a 2,048-token prefill step about 52 ms, a K=3 decode step
# 25-86 ms at batch 1-128. Measured 2026-12-05 (loadtest/results/plan/check-h200-1p1d): at
# 20/s with 40-prompt phases the TTFT p90 was still 1.4 s, so the sweep goes to 40/s with
# 80 prompts a phase, for the rate at which the SLO binds.
RATES=${RATES:-"1 4 8 16 24 32 40"}
STACK=${STACK-"--config deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml"}
one_gpu_pair 0.4 eager
[ -z "$STACK" ] && GPU_ARGS=()

# shellcheck disable=SC2086  # STACK is words on purpose
setsid python3 -m pdspec.cli $STACK up "${GPU_ARGS[@]}" \
  --prefill.max_num_batched_tokens 2048 --decode.max_num_batched_tokens 2048 \
  --model.kv_transfer "${KV_TRANSFER:-push}" \
  --restart never --ready_timeout_s "$READY_S" > "$RESULTS/up-log.txt" 2>&1 &
up=$!
source loadtest/gpu/stack_lifecycle.sh
pack() {
  cp "$RESULTS/up-log.txt" "$OUT/" 2>/dev/null
  cp "$PDSPEC_HOME"/run/logs/*.log "$RESULTS/" 2>/dev/null
  tar czf "$OUT/logs.tar.gz" -C "$RESULTS" . 2>/dev/null
  # A device call returns at most 8 files: everything is in logs.tar.gz, and beside it what
  # is read first (on 2026-12-05 the serve_bench folder was left out as the 9th-11th file).
  cp "$RESULTS"/check/plan_check.md "$OUT/plan_check.md" 2>/dev/null
  cp "$RESULTS"/check-light/plan_check.md "$OUT/plan_check-light.md" 2>/dev/null
  mkdir -p "$OUT/serve_bench" && cp "$RESULTS"/serve_bench/serve_bench.json "$OUT/serve_bench/" 2>/dev/null
  ls -la "$OUT"; echo "plan_check_h200.sh: $(( $(date +%s) - T0 )) s in all"
}
trap 'pack; stop_stack; pack' EXIT  # pack first: a timeout's KILL may come before the stop ends
trap 'exit 143' TERM INT

wait_ready $proxy /ready "$READY_S" || exit 1
echo "ready at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$RESULTS/nvidia-smi.txt" 2>&1

python3 -m loadtest.handoff_probe --proxy-url $proxy --prefill-url $prefill --decode-url $decode \
  --model "$model" --requests "${REQUESTS:-12}" --input-len "$input_len" --out "$RESULTS/probe.json" || exit 1
python3 -m loadtest.engine_bench.serving_overhead --profile "$PROFILE" --probe "$RESULTS/probe.json" --k "$K" \
  --source "$(date -u +%F): loadtest/gpu/plan_check_h200.sh's probe ($input_len-token prompts, 4 out, one at a time; \
both workers eager on one GPU at 40%, KV pushed)" \
  --out "$OUT/profile-with-serving.json" | tee "$RESULTS/serving_overhead.json" || exit 1
echo "probe done at $(( $(date +%s) - T0 )) s"

# shellcheck disable=SC2086  # RATES is words on purpose
python3 -m loadtest.serve_bench --url $proxy --model "$model" --input-len "$input_len" --output-len 64 \
  --num-prompts "${NUM_PROMPTS:-80}" --request-rate $RATES --warmup 8 --goodput ttft:2000 tpot:100 \
  --label "h200-1p1d-eager-k$K" --no-progress --prefill-url $prefill --decode-url $decode \
  --run-dir "$PDSPEC_HOME/run" --out "$RESULTS/serve_bench"
echo "phases done at $(( $(date +%s) - T0 )) s"

python3 -m loadtest.plan_check --profile "$OUT/profile-with-serving.json" --layout 1p1d --k "$K" --devices 1 \
  --goodput-slo 2000 100 --results "$RESULTS/serve_bench/serve_bench.json" --out "$RESULTS/check"
grep -A40 "^Goodput" "$RESULTS/check/plan_check.md"
# The serving term taken under load (the lowest rate's TTFT p50), the others the check: the
# idle probe's term was 145-290 ms short of what the stack paid (check-h200-1p1d-r2).
python3 -m loadtest.plan_check --profile "$OUT/profile-with-serving.json" --layout 1p1d --k "$K" --devices 1 \
  --goodput-slo 2000 100 --serving-from-rate "$(printf '%s\n' $RATES | sort -n | head -1)" --results "$RESULTS/serve_bench/serve_bench.json" \
  --out "$RESULTS/check-light" | tail -3
