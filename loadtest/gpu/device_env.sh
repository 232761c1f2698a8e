# Sourced by the device scripts in this folder, from the repository root, after
# ../shared/tools/gpu-stage installed vLLM 0.33 into /tmp/site on the same warm machine.
# Usage: source loadtest/gpu/device_env.sh MIN_GPUS [dry-run-ok]
# A script that can run on this CPU as a check of itself passes `dry-run-ok`; then
# DRY_RUN_CPU=1 sets only PYTHONPATH, and `one_gpu_pair` gives no GPU arguments. Elsewhere
# DRY_RUN_CPU is ignored (a stray one must not skip the GPU check).
# Both ways: PDSPEC_HOME and VLLM_CACHE_ROOT under /tmp unless set (the local models and the
# compile cache, kept for the next call on a warm machine).
export PDSPEC_HOME=${PDSPEC_HOME:-/tmp/pdspec-home} VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/pdspec-vllm-cache}

DRY_RUN=
[ -n "${DRY_RUN_CPU:-}" ] && [ "${2:-}" = dry-run-ok ] && DRY_RUN=1

# one_gpu_pair MEMORY_FRACTION [eager]: GPU_ARGS, `pdspec up`'s arguments for a prefill and
# a decode worker both on GPU 0 with MEMORY_FRACTION of its memory each (`eager`: no CUDA
# graphs); none on a dry run.
one_gpu_pair() {
  GPU_ARGS=()
  [ -n "$DRY_RUN" ] && return 0
  GPU_ARGS=(--prefill.cuda_visible_devices 0 --decode.cuda_visible_devices 0
    --prefill.gpu_memory_utilization "$1" --decode.gpu_memory_utilization "$1")
  [ "${2:-}" = eager ] && GPU_ARGS+=(--prefill.enforce_eager --decode.enforce_eager)
  return 0
}

# require_modules MODULE...: stop (exit 1) before anything starts unless python3 imports each
# MODULE. pdspec needs a few packages the staged vLLM does not bring (simpy, the fleet
# model's event loop: 2026-12-05 a plan check ran its whole load and then could not
# simulate); carry their wheels in .whl (WHL), which this file installs into /tmp/site:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl simpy==4.1.2
require_modules() {
  local module missing=()
  for module in "$@"; do
    python3 -c "import $module" 2>/dev/null || missing+=("$module")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "missing Python modules: ${missing[*]}; carry their wheels in ${WHL:-.whl}" \
    "(python3 -m pip download --no-deps --only-binary=:all: -d .whl ${missing[*]}) and name it in carry" >&2
  exit 1
}

if [ -n "$DRY_RUN" ]; then
  export PYTHONPATH=$PWD
  return 0
fi

export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# Wheels carried in .whl (WHL): vLLM's router for the fleet benchmark, simpy for the planner.
if ls "${WHL:-.whl}"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${WHL:-.whl}"/*.whl \
    || echo "device_env.sh: installing ${WHL:-.whl}/*.whl failed"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# NVLink multicast stays off on the lent machines (a program using it can take the
# host's shared GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# The staged FlashInfer has no precompiled kernels (no flashinfer-cubin, no JIT cache), so
# its top-k/top-p sampler builds itself with nvcc when an engine first samples: minutes on
# a fresh machine (seen 2026-12-02: still building 51 s in, with the call's time running
# out). vLLM's own sampler needs no build; speed of the sampling step is not what these
# runs measure.
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}

# vLLM finds pdspec's general plugin (NIXL progress delay, the DP vote, the KV-only pass)
# through an entry point; this checkout is not pip-installed there, so give it the
# metadata alone.
dist=/tmp/site/pdspec-0.1.0.dist-info
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: pdspec\nVersion: 0.1.0\n' > "$dist/METADATA"
printf '[vllm.general_plugins]\npdspec = pdspec.worker.plugin:register\n' > "$dist/entry_points.txt"
MIN_GPUS=${1:-1} python3 - <<'PY' || exit 1
import importlib.metadata as md, os, torch, vllm
eps = [e.value for e in md.entry_points(group="vllm.general_plugins")]
print("vllm", vllm.__version__, "torch", torch.__version__, "gpus", torch.cuda.device_count(), "plugins", eps)
assert "pdspec.worker.plugin:register" in eps and torch.cuda.device_count() >= int(os.environ["MIN_GPUS"])
PY
# vLLM's own NCCL wrapper (pynccl: the all-gather of an MoE model's data-parallel
# dispatch) needs NCCL >= 2.29.7, newer than torch 2.11's there: loadtest/gpu/stage_nccl.sh
# stages one into /tmp/nccl. Without it pynccl turns itself off (dense models do not mind).
if [ -z "${VLLM_NCCL_SO_PATH:-}" ] && [ -f /tmp/nccl/libnccl.so.2 ]; then
  export VLLM_NCCL_SO_PATH=/tmp/nccl/libnccl.so.2
fi
echo "VLLM_NCCL_SO_PATH=${VLLM_NCCL_SO_PATH:-unset, the NCCL torch loads}"
