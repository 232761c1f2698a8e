#!/bin/bash
# Speculative decoding as AIC models it (nextn = draft length K, nextn-accepted = mean accepted drafts/step, user-supplied).
# Acceptance values are ILLUSTRATIVE (not measured): K=3 -> 1.5 accepted (2.5 tokens/step).
export PYTHONWARNINGS=ignore
A=/work/aic-venv/bin/aiconfigurator
COMMON="--model-path Qwen/Qwen3-8B --system h200_sxm --backend vllm --ttft 2000 --tpot 50 --top-n 5 --no-color"
run() { name=$1; shift; echo "== $name: $A cli default $COMMON $*" ; s=$(date +%s); timeout 180 $A cli default $COMMON "$@" --save-dir raw/$name > raw/$name.log 2>&1; echo "rc=$? secs=$(( $(date +%s)-s ))"; }
run chat_8gpu_K3_acc1.5 --total-gpus 8 --isl 1000 --osl 300 --nextn 3 --nextn-accepted 1.5
run rag_8gpu_K3_acc1.5  --total-gpus 8 --isl 8000 --osl 200 --nextn 3 --nextn-accepted 1.5
run chat_1gpu_K3_acc1.5 --total-gpus 1 --isl 1000 --osl 300 --serving-mode agg --nextn 3 --nextn-accepted 1.5
run chat_8gpu_K3_acc0   --total-gpus 8 --isl 1000 --osl 300 --nextn 3 --nextn-accepted 0
