#!/bin/bash
# Runs aiconfigurator cli default for pdspec issue 43 workloads. Each run capped at 180 s.
export PYTHONWARNINGS=ignore
A=/work/aic-venv/bin/aiconfigurator
COMMON="--model-path Qwen/Qwen3-8B --system h200_sxm --backend vllm --ttft 2000 --tpot 50 --top-n 5 --no-color"
run() { name=$1; shift; echo "== $name: $A cli default $COMMON $*" ; s=$(date +%s); timeout 180 $A cli default $COMMON "$@" --save-dir raw/$name > raw/$name.log 2>&1; echo "rc=$? secs=$(( $(date +%s)-s ))"; }
run rag_8gpu    --total-gpus 8  --isl 8000 --osl 200
run chat_64gpu  --total-gpus 64 --isl 1000 --osl 300
run rag_64gpu   --total-gpus 64 --isl 8000 --osl 200
run chat_1gpu   --total-gpus 1  --isl 1000 --osl 300 --serving-mode agg
run rag_1gpu    --total-gpus 1  --isl 8000 --osl 200 --serving-mode agg
run chat_2gpu_disagg --total-gpus 2 --isl 1000 --osl 300
run rag_2gpu_disagg  --total-gpus 2 --isl 8000 --osl 200
