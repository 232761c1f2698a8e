#!/usr/bin/env bash
# The KV-only drafter pass on the lent H200 (kind nvidia-h200), one device call each,
# after ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm
# machine. Run from the repository root:
#
#   bash loadtest/gpu/kv_only_h200.sh profile    # a K=0 step, torch profiler: with and without the pass (one engine)
#   bash loadtest/gpu/kv_only_h200.sh bench512   # prefill_bench --baseline, mbt 512: auto (KV-only), full, no drafter
#   bash loadtest/gpu/kv_only_h200.sh bench2048  # the same at mbt 2048
#   bash loadtest/gpu/kv_only_h200.sh dflash512  # DFlash K=16 (vLLM's own K=0 path), mbt 512: auto vs no drafter
#   bash loadtest/gpu/kv_only_h200.sh worker512  # bench512 with both engines built as a prefill worker
#   bash loadtest/gpu/kv_only_h200.sh worker2048 #   (--as-prefill-worker: NixlConnector kv_producer, KV released at once)
#   bash loadtest/gpu/kv_only_h200.sh dflashworker512  # dflash512 with both engines built as a prefill worker
#   bash loadtest/gpu/kv_only_h200.sh dflashworker2048 #   the same at mbt 2048
#   bash loadtest/gpu/kv_only_h200.sh dflashprofile    # a DFlash K=0 step, torch profiler (where its time goes)
#
# Qwen3-8B shape with random weights (deploy/shapes), EAGLE3 K=3, 16,384-token prompts,
# V2 model runner, FLASH_ATTN. Each call must end inside the device's 10-minute limit,
# engine start included (105-130 s with a warm compile cache, up to 300 s cold), so:
# - the profile call runs 4 prompts (128 K=0 steps at mbt 512) and profiles one run with
#   the pass and one without it on the same engine; it also warms the compile cache;
# - a bench call starts two engines (no drafter, then EAGLE3; 40% of the GPU each) and
#   runs REPS (3) interleaved reps of each mode on 32 x 16,384 tokens (about 18 s each);
#   every rep is printed as it ends, so a call cut short still shows its reps.
# Files come back from $OUT: the profile tables, prefill_bench.{md,json,png}, logs.
# MODES picks the drafter engine's modes (worker*: "auto full"; dflash*: "auto"). For DFlash,
# `auto` replays the K=0 context step's CUDA graph and `full` runs vLLM's eager K=0 path;
# PDSPEC_TEST_DFLASH_GRAPH_VERIFY_STEPS=N checks the first N graph steps' drafter KV
# against the eager path's (warm-up steps; the count is printed). Every rep also prints the
# engine's CPU share and busiest threads, GC time and the GPU's clock, power and temperature
# (rep_diagnostics).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:?usage: kv_only_h200.sh profile|bench512|bench2048|dflash512|worker512|worker2048|dflashworker512|dflashworker2048|dflashprofile}
OUT=${OUT:-/tmp/kv-only-out}
source loadtest/gpu/device_env.sh 1
mkdir -p "$OUT"

shape=(--target deploy/shapes/qwen3-8b --drafter deploy/shapes/qwen3-8b-eagle3 --dummy --method eagle3 --k 3)
dflash=(--target deploy/shapes/qwen3-8b --drafter deploy/shapes/qwen3-8b-dflash --dummy --method dflash --k 16)
case "$what" in
  profile)
    python3 -m loadtest.profile_k0 "${shape[@]}" --prompts "${PROMPTS:-4}" --prompt-tokens 16384 --mbt 512 \
      --kv-only both --gpu-memory-utilization 0.8 --out "$OUT" 2>&1 | tee "$OUT/profile-log.txt" | grep -v " INFO " ;;
  bench512|bench2048)
    mbt=${what#bench}
    python3 -m loadtest.prefill_bench "${shape[@]}" --prompts "${PROMPTS:-32}" --prompt-tokens 16384 --mbt "$mbt" \
      --reps "${REPS:-3}" --baseline --modes auto full --gpu-memory-utilization 0.4 --out "$OUT" 2>&1 \
      | tee "$OUT/bench-log.txt" | grep -v " INFO " ;;
  worker512|worker2048)
    # The configuration users run: the engines a `pdspec prefill` worker builds (issue 22).
    mbt=${what#worker}
    python3 -m loadtest.prefill_bench "${shape[@]}" --prompts "${PROMPTS:-32}" --prompt-tokens 16384 --mbt "$mbt" \
      --reps "${REPS:-3}" --baseline --modes ${MODES:-auto full} --as-prefill-worker --gpu-memory-utilization 0.4 \
      --out "$OUT" 2>&1 | tee "$OUT/bench-log.txt" | grep -v " INFO " ;;
  dflash512|dflashworker512|dflashworker2048)
    # vLLM 0.33's V2 DFlash speculator already runs only the context K/V precompute on
    # K=0 steps (no query pass): this measures what is left against no drafter.
    worker=(); case "$what" in dflashworker*) worker=(--as-prefill-worker) ;; esac
    mbt=${what##*[a-z]}
    python3 -m loadtest.prefill_bench "${dflash[@]}" --prompts "${PROMPTS:-16}" --prompt-tokens 16384 --mbt "$mbt" \
      --reps "${REPS:-3}" --baseline --modes ${MODES:-auto} "${worker[@]}" --gpu-memory-utilization 0.4 --out "$OUT" 2>&1 \
      | tee "$OUT/bench-log.txt" | grep -v " INFO " ;;
  dflashprofile)
    python3 -m loadtest.profile_k0 "${dflash[@]}" --prompts "${PROMPTS:-4}" --prompt-tokens 16384 --mbt 512 \
      --kv-only "${KV_ONLY:-on}" --gpu-memory-utilization 0.8 --out "$OUT" 2>&1 | tee "$OUT/profile-log.txt" | grep -v " INFO " ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
grep -h "KV-only drafter pass\|context step captured\|context graph" "$OUT"/*-log.txt | sed 's/.*pdspec:/pdspec:/' \
  | sort | uniq -c | head -8  # on, off, or why not; DFlash's context graphs
ls -la "$OUT"
