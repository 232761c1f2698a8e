#!/usr/bin/env bash
# Serving benchmarks on the lent 2 x H200 (kind nvidia-h200-x2), one device call each,
# after gpu-stage installed vLLM 0.33 into /tmp/site. Run from the repository root:
#
#   bash loadtest/gpu/serve_bench_2gpu.sh eagle3    # the seed table, EAGLE3 K=3: mbt 512 and 2048, auto/always
#   bash loadtest/gpu/serve_bench_2gpu.sh dflash    # the same with DFlash K=16
#   bash loadtest/gpu/serve_bench_2gpu.sh latency   # TTFT / ITL, 1P1D vs colocated (EAGLE3), concurrency 1-32
#
# Each call must end inside the device's 10-minute limit, engine start included (105-330 s
# with vLLM's compile, cold on a fresh machine), so:
# - the two stacks of a call start together (one start-up wait): for the seed, stack
#   mbt512 has its prefill worker on GPU 0 and its decode worker on GPU 1, stack mbt2048
#   the other way round, every worker at 40% of its GPU (the one-GPU 1P1D share that
#   was validated); they are benchmarked one after the other, the idle one waiting;
# - the seed runs 48 prompts per phase (not 128; the recorded run, 2026-11-30, took 432 s) and 2 phases per policy (not 3),
#   interleaved auto, always, always, auto; NUM_PROMPTS and PHASES change that, and
#   VARIANTS=mbt512 (or mbt2048) runs one stack alone (its prefill worker on GPU 0).
#   The seed's phase size for one row, NUM_PROMPTS=128 PHASES=3 VARIANTS=mbt512
#   BUDGET=565, fit 4 of its 6 phases in one call (2026-11-30: ready after 311 s cold,
#   34-40 s a phase; `--budget-s` skipped the last pair);
# - the seed's decode workers run eager (only the prefill worker's figures are the table);
# - `pdspec bench --budget-s` gives each stack an equal share of the time left after the
#   start and skips any phase that would not end in it, and says so in bench.md.
# At most 8 files come back from $OUT: bench.md, bench.json, the plots, logs.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:?usage: serve_bench_2gpu.sh eagle3|dflash|latency}
OUT=${OUT:-/tmp/serve-bench-out}
BUDGET=${BUDGET:-530}            # seconds for `pdspec bench`, start to results written
RUN_ROOT=/tmp/pdspec-bench       # logs and compile caches (kept for a later call on this machine)
RESULTS=/tmp/pdspec-bench-results/$what
source loadtest/gpu/device_env.sh 2
mkdir -p "$OUT" "$RESULTS"

share="prefill.gpu_memory_utilization=0.4 decode.gpu_memory_utilization=0.4"
case "$what" in
  eagle3|dflash)
    profiles="deploy/profiles/dummy/qwen3-8b-$what-1p1d.toml"
    # The decode workers run eager: the table is the prefill worker's, and two engines
    # compiling instead of four shortens the cold start.
    bench_args=(--workload seed --together --alternate-gpus --set $share decode.enforce_eager=true)
    [ -n "${VARIANTS:-}" ] && bench_args+=(--variants $VARIANTS)
    serve_args=(-- --num-prompts "${NUM_PROMPTS:-48}" --phases "${PHASES:-2}" --warmup 8) ;;
  latency)
    profiles="deploy/profiles/dummy/qwen3-8b-eagle3-1p1d.toml deploy/profiles/dummy/qwen3-8b-eagle3-colocated.toml"
    # The colocated server shares GPU 1 with the (then idle) 1P1D decode worker.
    bench_args=(--workload latency --together --set $share colocated.gpu_memory_utilization=0.4 colocated.cuda_visible_devices=1)
    serve_args=() ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac

nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$RESULTS/nvidia-smi.txt" 2>&1
set -x
# The bench stops itself at --budget-s; this timeout is the backstop, capped so the
# copying below still ends inside the device call's 600 s.
stop_after=$((BUDGET + 30 < 560 ? BUDGET + 30 : 560))
timeout -k 10 $stop_after python3 -m pdspec.cli bench $profiles "${bench_args[@]}" \
  --out "$RESULTS" --run-root "$RUN_ROOT" --budget-s $((BUDGET - 70)) --ready-timeout 420 --no-progress \
  "${serve_args[@]}"
code=$?
set +x

# Anything `pdspec up` started and did not stop (each child runs in its own session, so
# it would outlive this call and hold GPU memory): end it by the PID its log names.
for log in "$RUN_ROOT"/*/pdspec-up.log; do
  [ -f "$log" ] || continue
  for pid in $(cat "${log%.log}.pid" 2>/dev/null) $(grep -o 'pid [0-9]*' "$log" | cut -d' ' -f2); do
    kill -0 "$pid" 2>/dev/null && { echo "left running: $pid ($log)"; kill -9 -- "-$pid" 2>/dev/null; }
  done
done

cp "$RESULTS"/bench.md "$RESULTS"/bench.json "$OUT"/ 2>/dev/null
[ -f "$RESULTS/bench_latency.png" ] && cp "$RESULTS/bench_latency.png" "$OUT/"
for d in "$RESULTS"/*/; do
  name=$(basename "$d")
  [ -f "$d/serve_bench_ab.png" ] && cp "$d/serve_bench_ab.png" "$OUT/${name}_ab.png"
done
{
  cat "$RESULTS/nvidia-smi.txt"
  for log in "$RUN_ROOT"/*/pdspec-up.log "$RUN_ROOT"/*/logs/*.log; do
    [ -f "$log" ] || continue
    echo "=== $log"; grep -E 'ERROR|Error|Traceback|ready|KV cache|Available|compil|took' "$log" | tail -40; tail -15 "$log"
  done
} > "$OUT/logs.txt" 2>&1
ls -la "$OUT"
exit $code
