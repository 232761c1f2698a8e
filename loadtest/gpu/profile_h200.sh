#!/usr/bin/env bash
# The fleet planner's engine profile (issue 43) of the Qwen3-8B shape on one lent GPU, in one
# device call on a machine where ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site:
#
#   bash loadtest/gpu/profile_h200.sh eagle3   # EAGLE3 (one layer), K = 0 1 2 3 5
#   bash loadtest/gpu/profile_h200.sh dflash   # DFlash (five layers), K = 0 8 16
#
# Named for the H200 it was written for; it now reads the card at run time (GPU 0:
# nvidia-smi's memory.total and name) and writes $OUT/<label>-qwen3-8b-<drafter>.json with
# `--gpu <label>`, the label the name's model (NVIDIA H200 -> h200, NVIDIA H100 80GB HBM3 ->
# h100; GPU_LABEL=... sets it). Run on an H100 2026-12-06 (loadtest/results/plan/h100-profile).
# `python -m loadtest.engine_profile` with engines built as pdspec's workers build them:
# random weights (the full 151,936-token vocabulary: a real deployment's lm_head), eager
# (CUDA graphs and compilation cost 105-300 s of start-up per engine; six engines must start
# inside one call), each engine at 45% of the GPU (the previous engine's process may still
# hold its memory while the next one starts). One prefill worker engine of a 2,048-token
# budget, one prompt a step of 128-2,048 tokens; one decode worker engine per K, batches of
# 1-128 requests over 512-token contexts, 48 output tokens, two reps a point.
# Acceptance: random drafter weights have every draft rejected (1.0 tokens a step at every
# K); the step times are real, and `pdspec plan --acceptance-rate` gives a drafter's own.
# KV room: an engine given the whole GPU (0.9) holds, computed below from the card's memory
# and the fleet run's (loadtest/results/fleet/h200-qwen3-8b), about 767,000 tokens with
# EAGLE3 and 691,000 with DFlash on the H200 (143,771 MiB), 380,000 and 341,000 on the H100
# (81,559 MiB); the engines measured here hold less (the profile says how much).
# Transfer: the one-GPU push hand-off measured on an H200 on 2026-12-02, passed as given on
# any card (no hand-off probe runs here: on another card the figures are the H200's).
# Everything comes back in $OUT: the profile JSON and the whole log.
set -uo pipefail
cd "$(dirname "$0")/../.."
drafter=${1:?usage: profile_h200.sh eagle3|dflash}
OUT=${OUT:-/tmp/profile-out}
T0=$(date +%s)
source loadtest/gpu/device_env.sh 1
mkdir -p "$OUT"
# The card: GPU 0's total memory (MiB, as nvidia-smi counts it) and its label.
IFS=, read -r gpu_mib gpu_name < <(nvidia-smi -i 0 --query-gpu=memory.total,name --format=csv,noheader,nounits)
gpu_mib=${gpu_mib//[^0-9]/}
gpu_name=${gpu_name# }
# The model out of the name: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA A100-SXM4-80GB" -> a100.
gpu=${GPU_LABEL:-$(awk '{ m = ($1 == "NVIDIA" ? $2 : $1); sub(/-.*/, "", m); print tolower(m) }' <<< "$gpu_name")}
if [ -z "$gpu_mib" ] || [ -z "$gpu" ]; then
  echo "profile_h200.sh: cannot read the GPU's memory and name from nvidia-smi" >&2; exit 1
fi
commas() { sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' <<< "$1"; }  # 81559 -> 81,559
# KV room of an engine at gpu_memory_utilization 0.9: 0.9 x the card's MiB less what an engine
# holds besides its KV, over the bytes of KV a token. Besides its KV: 15,025 MiB in the fleet
# run on the H200 (79,050 MiB for four EAGLE3 engines of 4,737.6 MiB of KV each), whose shapes
# have a 4,096-token vocabulary; these have the full 151,936, which adds 2,310 MiB to the target
# (embedding and lm_head) and 1,155 MiB to EAGLE3's lm_head: 18,490 MiB. DFlash instead of
# the fleet's 544-MiB EAGLE3: five layers of 193M parameters and a 5 x 4096 -> 4096 fc, about
# 2,000 MiB (the target's embedding and lm_head shared): 18,791 MiB. Weights, activations and
# the CUDA context do not grow with the card, so the same figures serve any card (the H100's
# EAGLE3 engines at 0.45 held 138,192 tokens in 19.51 GiB, which at 0.9 is about 390,000: 3%
# above the 380,000 computed). Bytes of KV a token: 4,096 a layer (8 KV heads x 128 x 2,
# bf16), 36 target layers plus the drafter's (EAGLE3 1: 151,552; DFlash 5: 167,936). (The
# shipped H200 EAGLE3 profile's 791,000 left out the vocabulary: about 3% high.)
case "$drafter" in
  eagle3) args=(--drafter deploy/shapes/qwen3-8b-eagle3 --method eagle3 --ks 0 1 2 3 5
                --drafter-name "eagle3 (the one-layer EAGLE3 shape, random weights)")
          besides=18490 token_bytes=151552 ;;
  dflash) args=(--drafter deploy/shapes/qwen3-8b-dflash --method dflash --ks 0 8 16
                --drafter-name "dflash (the five-layer DFlash b16 shape, random weights)")
          besides=18791 token_bytes=167936 ;;
  *) echo "unknown drafter $drafter" >&2; exit 2 ;;
esac
# (0.9 x gpu_mib - besides) / token_bytes, to the nearest thousand (H200: 767,000 and
# 691,000; H100: 380,000 and 341,000).
kv_tokens=$(( ((gpu_mib * 9 * 1048576 / 10 - besides * 1048576) / token_bytes + 500) / 1000 * 1000 ))
if [ "$kv_tokens" -le 0 ]; then
  echo "profile_h200.sh: $gpu_mib MiB leaves no KV room at 0.9 for $drafter" >&2; exit 1
fi
TRANSFER_SOURCE="loadtest/results/handoff/h200-push-eager/NOTES.md: one H200, KV pushed, eager; 1 token: \
the decode worker's first step after a hand-off (vllm:request_prefill_time_seconds, mean 70.3 ms: the \
notification round trip, whatever the size); 4,096 tokens: the decode leg's time to its first token after \
the prefill leg, median 86 ms"
[ "$gpu" = h200 ] || TRANSFER_SOURCE="$TRANSFER_SOURCE (the H200's, not measured on this $gpu)"
KV_SOURCE="computed for an engine at gpu_memory_utilization 0.9: 0.9 x $(commas "$gpu_mib") MiB less $besides MiB an \
engine besides its KV (the fleet run's 15,025 MiB an EAGLE3 engine of the 4,096-token vocabulary, the full \
vocabulary's and the drafter's weights added: loadtest/gpu/profile_h200.sh), over $token_bytes bytes a token"
LEFT=$(( ${CALL_S:-585} - ($(date +%s) - T0) - 15 ))
echo "profile_h200.sh: $drafter on $gpu_name ($gpu, $(commas "$gpu_mib") MiB, KV room $(commas "$kv_tokens") tokens), $LEFT s for the profile"
timeout -s INT -k 15 "$LEFT" python3 -m loadtest.engine_profile \
  --target deploy/shapes/qwen3-8b --dummy --eager --gpu-memory-utilization 0.45 "${args[@]}" \
  --model-shape "Qwen3-8B (random weights)" --gpu "$gpu" \
  --batch 1 8 32 64 128 --decode-context 512 --output-tokens 48 --reps 2 --decode-step-from "${DECODE_STEP_FROM:-itl}" \
  --prefill-one-engine --prefill-mbt 128 256 512 1024 2048 --prefill-prompts 8 --max-model-len 2048 \
  --transfer 1:70.3 4096:86 --transfer-source "$TRANSFER_SOURCE" \
  --kv-tokens "$kv_tokens" --kv-tokens-source "$KV_SOURCE" \
  --out "$OUT/$gpu-qwen3-8b-$drafter.json" > "$OUT/profile-$drafter.log" 2>&1
rc=$?
grep -E "^(prefill|decode|warning)|Error|error:|Traceback|took" "$OUT/profile-$drafter.log" | tail -60
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
echo "engine_profile exit $rc; profile_h200.sh: $(( $(date +%s) - T0 )) s in all"
