"""Pool membership: static URLs, or `dns://name:port` entries re-resolved periodically
(a headless Kubernetes service lists one address per ready pod)."""

from __future__ import annotations

import asyncio
import logging
import socket
from urllib.parse import urlsplit

from proxy.pool import WorkerPool

log = logging.getLogger("pdspec.proxy.membership")


async def resolve(entry: str) -> list[str]:
    """URLs for one configured entry: itself, or one per address of a dns:// name."""
    if not entry.startswith("dns://"):
        return [entry]
    parts = urlsplit(entry)
    host, port = parts.hostname or "", parts.port or 80
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        log.warning("cannot resolve %s: %s", host, exc)
        return []
    addresses = sorted({info[4][0] for info in infos})
    return [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addresses]


class Membership:
    def __init__(self, entries: dict[WorkerPool, list[str]], refresh_s: float) -> None:
        self.entries = entries
        self.refresh_s = refresh_s
        self.dynamic = any(e.startswith("dns://") for urls in entries.values() for e in urls)

    async def refresh(self) -> None:
        for pool, entries in self.entries.items():
            urls: list[str] = []
            for entry in entries:
                urls.extend(url for url in await resolve(entry) if url not in urls)
            if [w.url for w in pool.workers] != [u.rstrip("/") for u in urls]:
                if pool.workers:
                    log.warning("%s pool is now %s", pool.name, urls)
                pool.set_urls(urls)

    async def run(self) -> None:
        if not self.dynamic:
            return
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()
