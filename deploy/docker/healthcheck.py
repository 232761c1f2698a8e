#!/usr/bin/env python3
"""`pdspec-healthcheck URL`: exit 0 when URL answers 200 (Docker health checks; the
images have Python but no curl)."""

import sys
import urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 5.0) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception as exc:  # any failure is "unhealthy"; say why in `docker inspect`
    print(f"{sys.argv[1]}: {exc}", file=sys.stderr)
    sys.exit(1)
