#!/usr/bin/env bash
# kv_hold_wait on vLLM 0.33: is it on, and what does a prefill worker holding KV for a
# read cost in CPU, with it (HOLD_POLL_S=0.2, the default) and without (HOLD_POLL_S=0)?
# On the lent H200 (kind nvidia-h200), one device call per setting, after
# ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   HOLD_POLL_S=0.2 bash loadtest/gpu/kv_hold_h200.sh
#
# `pdspec up` with the local model pair, 1P1D on GPU 0 at 10% each, eager, then
# loadtest.kv_hold_cpu (4 held prompts of 960 tokens), then one request through the proxy.
# $OUT/kv_hold-<poll>.json and the logs.
# DRY_RUN_CPU=1 (with the venv on PATH): the same on this CPU, without GPU arguments (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kv-hold-out}
POLL=${HOLD_POLL_S:-0.2}
source loadtest/gpu/device_env.sh 1 dry-run-ok
one_gpu_pair 0.1 eager
RESULTS=/tmp/kv-hold-results
rm -rf "$RESULTS" && mkdir -p "$OUT" "$RESULTS"
setsid python3 -m pdspec.cli up --run_dir /tmp/kv-hold-run "${GPU_ARGS[@]}" --prefill.kv_hold_poll_s "$POLL" \
  --restart never --ready_timeout_s "${READY_S:-400}" > "$RESULTS/up-log.txt" 2>&1 &
up=$!
source loadtest/gpu/stack_lifecycle.sh
trap 'cp "$RESULTS/up-log.txt" "$OUT/up-log-$POLL.txt" 2>/dev/null; stop_stack' EXIT
trap 'exit 143' TERM INT
wait_ready http://127.0.0.1:8000 /ready "${READY_S:-400}" || exit 1
python3 -m loadtest.kv_hold_cpu --prompts 4 --out "$OUT/kv_hold-$POLL.json"
echo "kv_hold_cpu exit $?"
curl -s -o "$OUT/completion-$POLL.json" -w "proxy completion: HTTP %{http_code}\n" http://127.0.0.1:8000/v1/completions \
  -H 'content-type: application/json' -d '{"model": "pdspec-tiny", "prompt": "def add(a, b):", "max_tokens": 16}'
