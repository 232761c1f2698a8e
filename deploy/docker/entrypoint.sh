#!/bin/sh
# Entry point of the pdspec images: `pdspec <command> [options]`, configured through
# PDSPEC_* environment variables. A worker's NIXL side channel must be advertised at an
# address its peers reach: unless PDSPEC_WORKER__SIDE_CHANNEL_HOST is set (Kubernetes
# sets it from the pod IP), it is this container's own address on its network.
set -eu
case "${1:-}" in
    prefill|decode)
        if [ -z "${PDSPEC_WORKER__SIDE_CHANNEL_HOST:-}" ]; then
            PDSPEC_WORKER__SIDE_CHANNEL_HOST=$(hostname -i | cut -d' ' -f1)
            export PDSPEC_WORKER__SIDE_CHANNEL_HOST
        fi
        ;;
esac
exec pdspec "$@"
