#!/usr/bin/env bash
# The 1P1D hand-off on the lent H200 (kind nvidia-h200): both workers of
# deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml on GPU 0 at 40% each (the share of
# deploy/profiles/one-gpu-1p1d.toml), CUDA graphs on both, started by `pdspec up` itself
# (workers sharing a GPU start one after another). One device call, after
# ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   bash loadtest/gpu/handoff_h200.sh
#
# Once the proxy is ready:
# - loadtest.handoff_probe: 4,096-token prompts one at a time, where the hand-off's time
#   goes (the proxy's TTFT, the prefill leg alone, the decode leg's pull alone, the decode
#   worker prefilling locally: colocated on one engine), with the decode worker's NIXL
#   and queue means over the pulled legs;
# - loadtest.serve_bench at concurrency 1, 4, 16 and 32 (4,096 tokens in, 64 out, the
#   latency workload's shape at 16 prompts a level), once through the proxy (1P1D) and
#   once at the decode worker alone with other prompts (--seed 100: the decode worker holds
#   the first sweep's prompts in its prefix cache), prefilling locally: one engine.
# Prefill chunks are 2,048 tokens on both workers (the latency workload's mbt).
# EARLY=1: the stack's proxy sends the decode leg with the prefill leg (proxy.kv_transfer.early_decode),
# and a second proxy without it, on port 8001 in front of the same workers, is timed in the
# probe's loop (`other_proxy_ttft_ms`) and swept last, time allowing (label 1p1d-usual).
# Everything comes back in $OUT/handoff.tar.gz, with up-log.txt and the probe's JSON.
# DRY_RUN_CPU=1 with STACK=: on this CPU with the local model pair (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/handoff-out}
# pdspec up's start: 218 s with both engines' compile cache warm; cold, 414 s on 2026-12-03
# (213 + 201, READY_S=565: the probe and two sweeps fit the call) but up to about 600 s
# before (the first engine alone took 342 s). If a cold start does not fit, run the script
# twice on the warm machine (the first call warms the cache), or with EAGER=1 (both workers
# eager: about 250 s to start).
READY_S=${READY_S:-440}
EAGER_ARGS=()
[ -n "${EAGER:-}" ] && EAGER_ARGS=(--prefill.enforce_eager --decode.enforce_eager)
EARLY_ARGS=()
[ -n "${EARLY:-}" ] && EARLY_ARGS=(--proxy.kv_transfer.early_decode)
source loadtest/gpu/device_env.sh 1 dry-run-ok
RESULTS=/tmp/handoff-results
rm -rf "$RESULTS" && mkdir -p "$OUT" "$RESULTS"
proxy=http://127.0.0.1:8000 prefill=http://127.0.0.1:8100 decode=http://127.0.0.1:8200
model=${MODEL:-Qwen3-8B-dummy}
input_len=${INPUT_LEN:-4096}
# STACK (a dry run on the CPU sets it to nothing: the local model pair) picks the stack.
STACK=${STACK-"--config deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml"}
one_gpu_pair 0.4
[ -z "$STACK" ] && GPU_ARGS=()
# push, as deploy/profiles/one-gpu-1p1d.toml: on one GPU UCX serves a pull's READ over TCP
# (the 2026-12-01 runs, KV_TRANSFER=pull: 1.3-1.6 s for a 4,096-token prompt's KV).
KV_TRANSFER=${KV_TRANSFER:-push}

started=$(date +%s)
# shellcheck disable=SC2086  # STACK is words on purpose
setsid python3 -m pdspec.cli $STACK up "${GPU_ARGS[@]}" "${EAGER_ARGS[@]}" "${EARLY_ARGS[@]}" \
  --prefill.max_num_batched_tokens 2048 --decode.max_num_batched_tokens 2048 \
  --model.kv_transfer "$KV_TRANSFER" \
  --restart never --ready_timeout_s "$READY_S" > "$RESULTS/up-log.txt" 2>&1 &
up=$!
source loadtest/gpu/stack_lifecycle.sh
pack() {
  cp "$RESULTS/up-log.txt" "$OUT/" 2>/dev/null
  cp "$PDSPEC_HOME"/run/logs/*.log "$RESULTS/" 2>/dev/null
  tar czf "$OUT/handoff.tar.gz" -C "$RESULTS" . 2>/dev/null
  cp "$RESULTS"/probe.json "$OUT/" 2>/dev/null
  ls -la "$OUT"
}
other_proxy=""
stop_other() { [ -n "$other_proxy" ] && kill "$other_proxy" 2>/dev/null; }
trap 'pack; stop_other; stop_stack; pack' EXIT  # pack first: a timeout's KILL may come before the stop ends
trap 'exit 143' TERM INT  # a timeout still stops the stack and packs what there is

wait_ready $proxy /ready "$READY_S" || exit 1
echo "ready at $(( $(date +%s) - started )) s"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$RESULTS/nvidia-smi.txt" 2>&1

OTHER_ARGS=()
if [ -n "${EARLY:-}" ]; then
  usual=http://127.0.0.1:8001
  PDSPEC_PROXY="{\"port\": 8001, \"prefill_urls\": [\"$prefill\"], \"decode_urls\": [\"$decode\"]}" \
    python3 -m pdspec.cli proxy > "$RESULTS/usual-proxy.log" 2>&1 &
  other_proxy=$!
  wait_ready $usual /ready 60 || exit 1
  OTHER_ARGS=(--other-proxy-url $usual)
fi
python3 -m loadtest.handoff_probe --proxy-url $proxy --prefill-url $prefill --decode-url $decode \
  --model $model --requests "${REQUESTS:-12}" --input-len "$input_len" --out "$RESULTS/probe.json" "${OTHER_ARGS[@]}"
echo "probe done at $(( $(date +%s) - started )) s"
sweep=(--model $model --input-len "$input_len" --output-len 64 --num-prompts "${NUM_PROMPTS:-16}" --concurrency 1 4 16 32
       --warmup 4 --no-progress --prefill-url $prefill --decode-url $decode --run-dir "$PDSPEC_HOME/run")
# A sweep took 105-120 s pulling on one GPU (transfers queue); one that would begin after
# LAST_SWEEP_START_S is skipped, so the call ends inside the device's 600 s.
LAST_SWEEP_START_S=${LAST_SWEEP_START_S:-420}
if [ $(( $(date +%s) - started )) -lt "$LAST_SWEEP_START_S" ]; then
  python3 -m loadtest.serve_bench --url $proxy "${sweep[@]}" --label 1p1d --out "$RESULTS/1p1d"
  echo "1p1d sweep done at $(( $(date +%s) - started )) s"
fi
if [ $(( $(date +%s) - started )) -lt "$LAST_SWEEP_START_S" ]; then
  python3 -m loadtest.serve_bench --url $decode "${sweep[@]}" --seed 100 --label decode-worker-alone --no-worker-metrics \
    --out "$RESULTS/decode-alone"
  echo "decode-alone sweep done at $(( $(date +%s) - started )) s"
fi
if [ -n "${EARLY:-}" ] && [ $(( $(date +%s) - started )) -lt "$LAST_SWEEP_START_S" ]; then
  python3 -m loadtest.serve_bench --url $usual "${sweep[@]}" --seed 200 --label 1p1d-usual --out "$RESULTS/1p1d-usual"
  echo "1p1d-usual sweep done at $(( $(date +%s) - started )) s"
fi
for pair in prefill=$prefill decode=$decode proxy=$proxy; do
  python3 -c "import httpx, sys; sys.stdout.write(httpx.get(sys.argv[1] + '/metrics', timeout=10).text)" "${pair#*=}" \
    > "$RESULTS/${pair%%=*}-metrics.txt"
done
