#!/usr/bin/env bash
# Stage a newer NCCL for the lent GPU machines, after ../shared/tools/gpu-stage.
#
# vLLM 0.33's own NCCL wrapper (pynccl) needs NCCL >= 2.29.7 (it binds ncclCommSuspend);
# torch 2.11's NCCL on the device image is older, so pynccl turns itself off silently, and
# an MoE model with data parallelism then fails its first forward (`assert pynccl_comm is
# not None and not pynccl_comm.disabled` in the all-gather of the MoE dispatch; seen
# 2026-11-30). Dense models, and everything with one data-parallel rank, do not need it.
#
# Usage (from the repository root, here):
#   bash loadtest/gpu/stage_nccl.sh
# then the device calls it prints, back to back on the warm machine after gpu-stage's;
# the last one leaves /tmp/nccl/libnccl.so.2 there, which loadtest/gpu/device_env.sh
# hands to vLLM (VLLM_NCCL_SO_PATH).
set -euo pipefail
VERSION=${NCCL_VERSION:-2.31.2}
ROOT=$(git rev-parse --show-toplevel)
OUT="$ROOT/.gpu-stage-nccl"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
grep -qx '/.gpu-stage-nccl/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu-stage-nccl/' >> "$ROOT/.git/info/exclude"
rm -rf "$OUT"; mkdir -p "$OUT"

PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$WORK" "nvidia-nccl-cu13==$VERSION"
(cd "$WORK" && python3 -m zipfile -e nvidia_nccl_cu13-*.whl x)
# The library is mostly device code for every GPU generation, which barely compresses:
# a fast level loses little.
xz -1 -T0 -c "$WORK/x/nvidia/nccl/lib/libnccl.so.2" > "$WORK/libnccl.so.2.xz"
split -b 40m -d -a 2 "$WORK/libnccl.so.2.xz" "$OUT/part."

n=$(ls "$OUT" | wc -l)
echo "NCCL $VERSION in $n parts under .gpu-stage-nccl/. Device calls, back to back:"
i=0
for p in "$OUT"/part.*; do
  b=$(basename "$p"); i=$((i+1))
  cmd="mkdir -p /tmp/nccl && cp .gpu-stage-nccl/$b /tmp/nccl/"
  [ "$i" = "$n" ] && cmd="$cmd && cat /tmp/nccl/part.* | xz -dc > /tmp/nccl/libnccl.so.2 && rm /tmp/nccl/part.*"
  echo "  $i. carry [\".gpu-stage-nccl/$b\"]  command: $cmd"
done
