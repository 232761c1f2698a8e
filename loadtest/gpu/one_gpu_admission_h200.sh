#!/usr/bin/env bash
# The one-GPU 1P1D profile under the seed's load, with and without admission (KV room and
# queued prefill time), on the lent H200 (kind nvidia-h200). One device call, after ../shared/tools/gpu-stage
# installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   bash loadtest/gpu/one_gpu_admission_h200.sh
#
# `pdspec up` starts deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml with the settings of
# deploy/profiles/one-gpu-1p1d.toml (both workers on GPU 0 at 40% each, the KV pushed,
# admission on its proxy), EAGER (a fresh machine compiles each engine for about
# 5 minutes, which does not fit one call; what this checks is where a prefill leg waits
# under overload, not speed). A second proxy in front of the same workers has admission off. The seed's load
# (8,192-token prompts, 8 output tokens, concurrency 32; ROUNDS x 48 requests) goes through
# the proxy without admission first, then through the one with it. Reported per proxy:
# requests completed and failed (by status), and the proxies' own counters (prefill leg
# failures, KV-room waits). Everything comes back in $OUT: up-log.txt, the two serve_bench
# folders, the workers' and proxies' metrics, the worker logs (one-gpu-admission.tar.gz).
# DRY_RUN_CPU=1 with STACK=: on this CPU with the local model pair (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/one-gpu-admission-out}
READY_S=${READY_S:-300}
source loadtest/gpu/device_env.sh 1 dry-run-ok
RESULTS=/tmp/one-gpu-admission-results
rm -rf "$RESULTS" && mkdir -p "$OUT" "$RESULTS"
admitting=http://127.0.0.1:8000 plain=http://127.0.0.1:8001 prefill=http://127.0.0.1:8100 decode=http://127.0.0.1:8200
# STACK (a dry run on the CPU sets it to nothing: the local model pair) picks the stack.
STACK=${STACK-"--config deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml"}
one_gpu_pair 0.4
GPU_ARGS+=(--model.kv_transfer push)
[ -z "$STACK" ] && GPU_ARGS=()
INPUT_LEN=${INPUT_LEN:-8192}

started=$(date +%s)
# shellcheck disable=SC2086  # STACK is words on purpose
setsid python3 -m pdspec.cli $STACK up "${GPU_ARGS[@]}" --prefill.enforce_eager --decode.enforce_eager \
  --proxy.admission.prefill_kv --proxy.admission.queue_timeout_s 300 \
  --restart never --ready_timeout_s "$READY_S" > "$RESULTS/up-log.txt" 2>&1 &
up=$!
EXTRA_PIDS=
source loadtest/gpu/stack_lifecycle.sh
pack() {
  cp "$RESULTS/up-log.txt" "$OUT/" 2>/dev/null
  cp "$PDSPEC_HOME"/run/logs/*.log "$RESULTS/" 2>/dev/null
  tar czf "$OUT/one-gpu-admission.tar.gz" -C "$RESULTS" . 2>/dev/null
  cp "$RESULTS"/*.txt "$OUT/" 2>/dev/null
  ls -la "$OUT"
}
trap 'pack; stop_stack; pack' EXIT  # pack first: a timeout's KILL may come before the stop ends
trap 'exit 143' TERM INT  # a timeout still stops the stack and packs what there is

wait_ready $admitting /ready "$READY_S" || exit 1
echo "stack ready at $(( $(date +%s) - started )) s"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$RESULTS/nvidia-smi.txt" 2>&1
# The same proxy settings as pdspec up's but admission off (pdspec up adds its prefill
# worker's side-channel port to kv_transfer.source_ports; the default range holds it).
PDSPEC_PROXY="{\"port\": 8001, \"prefill_urls\": [\"$prefill\"], \"decode_urls\": [\"$decode\"], \"admission\": {\"prefill_kv\": false}}" \
  setsid python3 -m pdspec.cli proxy > "$RESULTS/plain-proxy-log.txt" 2>&1 &
EXTRA_PIDS=$!
wait_ready $plain /ready 60 || exit 1

load=(--input-len "$INPUT_LEN" --output-len 8 --num-prompts $(( ${ROUNDS:-1} * 48 )) --concurrency 32
      --no-progress --prefill-url $prefill --decode-url $decode --run-dir "$PDSPEC_HOME/run" --timeout 240)
python3 -m loadtest.serve_bench --url $plain "${load[@]}" --seed 1 --label no-admission --out "$RESULTS/no-admission"
echo "no-admission done at $(( $(date +%s) - started )) s"
python3 -m loadtest.serve_bench --url $admitting "${load[@]}" --seed 2 --label admission --out "$RESULTS/admission"
echo "admission done at $(( $(date +%s) - started )) s"
for pair in prefill=$prefill decode=$decode admitting-proxy=$admitting plain-proxy=$plain; do
  python3 -c "import httpx, sys; sys.stdout.write(httpx.get(sys.argv[1] + '/metrics', timeout=10).text)" "${pair#*=}" \
    > "$RESULTS/${pair%%=*}-metrics.txt"
done
grep -E "^pdspec_proxy_(leg_failures|kv_room_waits|prefill_outcomes|requests)_total" \
  "$RESULTS"/*proxy-metrics.txt | head -60
