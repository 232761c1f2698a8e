"""Pool membership: static URLs, or `dns://name:port` entries re-resolved periodically
(a headless Kubernetes service lists one address per ready pod).

A name that has no address (no such name, no record: no pod is ready) empties its
entry; a lookup that failed (the DNS server timed out or failed) changes nothing, so a
DNS outage does not empty the pools: the health checks still eject workers that left."""

from __future__ import annotations

import asyncio
import logging
import socket
from urllib.parse import urlsplit

from proxy.fleet.pool import WorkerPool

log = logging.getLogger("pdspec.proxy.membership")

# getaddrinfo's answers for a name that resolves to no address; any other error is a
# failed lookup.
NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


async def resolve(entry: str) -> list[str] | None:
    """URLs for one configured entry: itself, or one per address of a dns:// name; None
    when the lookup failed."""
    if not entry.startswith("dns://"):
        return [entry]
    parts = urlsplit(entry)
    host, port = parts.hostname or "", parts.port or 80
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        log.warning("cannot resolve %s: %s", host, exc)
        return [] if exc.errno in NO_ADDRESS else None
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
                resolved = await resolve(entry)
                if resolved is None:  # a failed lookup: this pool stays as it is
                    break
                urls.extend(url for url in resolved if url not in urls)
            else:
                if [w.url for w in pool.workers] != [u.rstrip("/") for u in urls]:
                    if pool.workers:
                        log.warning("%s pool is now %s", pool.name, urls)
                    pool.set_urls(urls)

    async def run(self) -> None:
        if not self.dynamic:
            return
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 (one bad round must not end re-resolution for good)
                log.exception("membership refresh failed; the pools stay as they were")
