"""proxy/fleet/membership.py: static URLs are themselves; a `dns://name:port` entry is one
worker per address of the name, re-resolved every `refresh_s`. A name with no address
empties its entry; a failed lookup leaves the pool as it was.

DNS is a table in the test (socket.getaddrinfo, which the event loop's getaddrinfo runs,
is replaced), and the refresh loop's sleep is driven step by step: no lookup leaves the
process and no test waits on a clock."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from proxy.fleet import membership
from proxy.fleet.membership import Membership, resolve
from proxy.fleet.pool import WorkerPool

GUARD_S = 5  # only against a hang: every wait below ends on an event


class FakeDns:
    """Names (under .invalid, which never resolves for real) to addresses, or to the
    gaierror errno their lookup fails with; a name not in the table does not exist."""

    def __init__(self) -> None:
        self.names: dict[str, list[str] | int] = {}
        self.lookups: list[tuple] = []

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        self.lookups.append((host, port, type))
        answer = self.names.get(host, socket.EAI_NONAME)
        if isinstance(answer, int):
            raise socket.gaierror(answer, f"fake lookup of {host} failed")
        infos = []
        for address in answer:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return infos


@pytest.fixture
def dns(monkeypatch) -> FakeDns:
    fake = FakeDns()
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    return fake


class SteppedSleep:
    """Stands in for asyncio.sleep in proxy.fleet.membership: each sleep lasts until `tick()`,
    which returns once the loop is asleep again, its refresh done."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._asleep: asyncio.Queue = asyncio.Queue()
        self._wake: asyncio.Queue = asyncio.Queue()

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await self._asleep.put(None)
        await self._wake.get()

    async def asleep(self) -> None:
        await asyncio.wait_for(self._asleep.get(), GUARD_S)

    async def tick(self) -> None:
        await self._wake.put(None)
        await self.asleep()


class AsyncioWithSleep:
    """The asyncio module as proxy.fleet.membership sees it, with its sleep replaced."""

    def __init__(self, sleep) -> None:
        self.sleep = sleep

    def __getattr__(self, name):
        return getattr(asyncio, name)


@pytest.fixture
def stepped(monkeypatch) -> SteppedSleep:
    clock = SteppedSleep()
    monkeypatch.setattr(membership, "asyncio", AsyncioWithSleep(clock.sleep))
    return clock


def urls(pool: WorkerPool) -> list[str]:
    return [w.url for w in pool.workers]


# resolve(): one configured entry


async def test_a_static_url_is_itself_and_never_looked_up(dns):
    assert await resolve("http://10.0.0.1:8100") == ["http://10.0.0.1:8100"]
    assert await resolve("http://prefill.invalid:8100/") == ["http://prefill.invalid:8100/"]
    assert dns.lookups == []


async def test_a_name_is_one_url_per_address_sorted_without_duplicates(dns):
    dns.names["prefill.invalid"] = ["10.0.0.9", "10.0.0.10", "10.0.0.9"]
    assert await resolve("dns://prefill.invalid:8100") == ["http://10.0.0.10:8100", "http://10.0.0.9:8100"]
    assert dns.lookups == [("prefill.invalid", 8100, socket.SOCK_STREAM)]


async def test_ipv6_addresses_are_bracketed(dns):
    dns.names["decode.invalid"] = ["fd00::2", "10.0.0.3"]
    assert await resolve("dns://decode.invalid:8200") == ["http://10.0.0.3:8200", "http://[fd00::2]:8200"]


async def test_a_name_without_a_port_is_looked_up_on_80(dns):
    dns.names["decode.invalid"] = ["10.0.0.3"]
    assert await resolve("dns://decode.invalid") == ["http://10.0.0.3:80"]
    assert dns.lookups[0][1] == 80


@pytest.mark.parametrize("errno", [socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)])
async def test_a_name_with_no_address_gives_no_worker_and_a_warning(dns, caplog, errno):
    dns.names["gone.invalid"] = errno
    with caplog.at_level(logging.WARNING, logger="pdspec.proxy.membership"):
        assert await resolve("dns://gone.invalid:8100") == []
    assert any("cannot resolve gone.invalid" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("errno", [socket.EAI_AGAIN, socket.EAI_FAIL])
async def test_a_failed_lookup_is_none_not_an_empty_list(dns, caplog, errno):
    dns.names["prefill.invalid"] = errno
    with caplog.at_level(logging.WARNING, logger="pdspec.proxy.membership"):
        assert await resolve("dns://prefill.invalid:8100") is None
    assert any("cannot resolve prefill.invalid" in r.getMessage() for r in caplog.records)


# Membership.refresh(): the pools


async def test_static_entries_fill_the_pool_once_and_keep_its_workers(dns):
    pool = WorkerPool.from_urls("prefill", [])
    m = Membership({pool: ["http://10.0.0.1:8100/", "http://10.0.0.2:8100"]}, refresh_s=10)
    assert not m.dynamic
    await m.refresh()
    assert urls(pool) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]  # trailing slash dropped
    first = pool.workers[0]
    first.healthy, first.outstanding = True, 2
    await m.refresh()
    assert pool.workers[0] is first and first.outstanding == 2
    assert dns.lookups == []


async def test_new_members_take_no_traffic_before_a_health_check(dns):
    dns.names["prefill.invalid"] = ["10.0.0.1"]
    pool = WorkerPool.from_urls("prefill", [])
    await Membership({pool: ["dns://prefill.invalid:8100"]}, refresh_s=10).refresh()
    (worker,) = pool.workers
    assert (worker.healthy, worker.admitted, worker.seen_healthy) == (False, False, False)
    assert pool.healthy() == []


async def test_entries_of_one_pool_are_merged_in_order_without_duplicates(dns):
    dns.names["prefill.invalid"] = ["10.0.0.2", "10.0.0.1"]
    pool = WorkerPool.from_urls("prefill", [])
    m = Membership({pool: ["http://10.0.0.1:8100", "dns://prefill.invalid:8100"]}, refresh_s=10)
    assert m.dynamic
    await m.refresh()
    assert urls(pool) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]


async def test_a_failed_lookup_leaves_its_pool_as_it_was_and_others_still_follow_dns(dns):
    """A DNS outage must not empty the pools (every request would be a 503, and every
    worker would come back as new, unadmitted until its next health check)."""
    dns.names.update({"prefill.invalid": ["10.0.0.1", "10.0.0.2"], "decode.invalid": ["10.0.1.1"]})
    prefill, decode = WorkerPool.from_urls("prefill", []), WorkerPool.from_urls("decode", [])
    m = Membership(
        {prefill: ["http://10.0.0.7:8100", "dns://prefill.invalid:8100"], decode: ["dns://decode.invalid:8200"]},
        refresh_s=10,
    )
    await m.refresh()
    kept = list(prefill.workers)
    dns.names.update({"prefill.invalid": socket.EAI_AGAIN, "decode.invalid": ["10.0.1.1", "10.0.1.2"]})
    await m.refresh()
    assert prefill.workers == kept and len(kept) == 3
    assert urls(decode) == ["http://10.0.1.1:8200", "http://10.0.1.2:8200"]


async def test_a_name_that_no_longer_exists_empties_its_entry(dns):
    dns.names["decode.invalid"] = ["10.0.1.1"]
    pool = WorkerPool.from_urls("decode", [])
    m = Membership({pool: ["http://10.0.0.5:8200", "dns://decode.invalid:8200"]}, refresh_s=10)
    await m.refresh()
    del dns.names["decode.invalid"]
    await m.refresh()
    assert urls(pool) == ["http://10.0.0.5:8200"]


# Membership.run(): the periodic loop


async def test_static_membership_has_no_loop(dns, stepped):
    pool = WorkerPool.from_urls("prefill", [])
    await asyncio.wait_for(Membership({pool: ["http://10.0.0.1:8100"]}, refresh_s=10).run(), GUARD_S)
    assert stepped.delays == [] and pool.workers == []  # the first fill is the caller's refresh()


async def test_names_are_re_resolved_every_refresh_interval(dns, stepped, caplog):
    dns.names["prefill.invalid"] = ["10.0.0.1"]
    pool = WorkerPool.from_urls("prefill", [])
    m = Membership({pool: ["dns://prefill.invalid:8100"]}, refresh_s=7.5)
    await m.refresh()  # as the app's start-up does
    first = pool.workers[0]
    first.healthy = True
    task = asyncio.create_task(m.run())
    try:
        await stepped.asleep()
        assert len(dns.lookups) == 1  # it waits first: start-up has just resolved

        dns.names["prefill.invalid"] = ["10.0.0.1", "10.0.0.2"]  # scaled up
        with caplog.at_level(logging.WARNING, logger="pdspec.proxy.membership"):
            await stepped.tick()
        assert urls(pool) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
        assert pool.workers[0] is first and first.healthy  # a known worker keeps its state
        assert any("prefill pool is now" in r.getMessage() for r in caplog.records)

        dns.names["prefill.invalid"] = socket.EAI_AGAIN  # DNS down: nothing changes
        await stepped.tick()
        assert urls(pool) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]

        dns.names["prefill.invalid"] = ["10.0.0.2"]  # back, and scaled down
        await stepped.tick()
        assert urls(pool) == ["http://10.0.0.2:8100"]

        del dns.names["prefill.invalid"]  # no pod ready: the name is gone
        await stepped.tick()
        assert pool.workers == []

        assert not task.done()  # the loop lives on through all of it
        assert stepped.delays == [7.5] * 5 and len(dns.lookups) == 5
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
