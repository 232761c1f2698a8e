"""The health checker's failure policy: a probe that raises what the worker client never
should (the RuntimeError uvloop raised on a write to a just-reset connection, before
proxy/upstream/client.py caught that case) fails that worker's check, and the rounds go on."""

import asyncio

from proxy.fleet.health import HealthChecker
from proxy.fleet.pool import WorkerPool
from proxy.routing import registry
from proxy.upstream.client import UpstreamError
from tests.standin import metrics_text


class Response:
    status = 200
    headers: dict = {}

    def __init__(self, body: bytes = b""):
        self.body = body

    async def read(self) -> bytes:
        return self.body


class Client:
    """Answers 200 with an empty body, except for the workers in `broken` (raises
    RuntimeError on `broken_path`, any path by default) and `down` (a connect error)."""

    def __init__(self, broken=(), down=(), broken_path=None):
        self.broken, self.down, self.broken_path, self.calls = set(broken), set(down), broken_path, 0

    async def request(self, origin, method, path, body=None, headers=None, timeout_s=None, on_sent=None):
        self.calls += 1
        if origin in self.broken and self.broken_path in (None, path):
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
        if origin in self.down:
            raise UpstreamError("connect_error", "refused")
        return Response()


def checked_pool():
    pool = WorkerPool.from_urls(
        "prefill", ["http://10.0.0.1:8100", "http://10.0.0.2:8100"], registry.make("round_robin")
    )
    for worker in pool.workers:
        worker.healthy = worker.seen_healthy = True
        worker.info_read_at = float("inf")  # no /metrics read due: /health only
    return pool


async def test_a_probe_that_raises_unexpectedly_fails_that_worker_only():
    pool = checked_pool()
    broken, fine = pool.workers
    checker = HealthChecker(
        Client(broken=[broken.url]), [pool], interval_s=1, timeout_s=1, eject_after=2, readmit_after=2
    )
    assert await checker.probe(broken) is False
    assert await checker.probe(fine) is True
    for _ in range(2):
        await checker.check_all()
    assert not broken.healthy and fine.healthy


async def test_reading_one_workers_info_that_raises_fails_that_worker_only():
    """Its info is read after a good /health (here: due for both); the read raising must
    not take the round, and every other worker's check, with it."""
    pool = checked_pool()
    broken, fine = pool.workers
    for worker in pool.workers:
        worker.info_read_at = None
    checker = HealthChecker(
        Client(broken=[broken.url], broken_path="/metrics"),
        [pool],
        interval_s=1,
        timeout_s=1,
        eject_after=1,
        readmit_after=1,
    )
    await checker.check_all()
    assert not broken.healthy and fine.healthy and fine.info_read_at is not None


async def test_the_rounds_go_on_after_a_round_that_raised(monkeypatch):
    pool = checked_pool()
    gone = pool.workers[0]
    client = Client(down=[gone.url])
    checker = HealthChecker(client, [pool], interval_s=0.001, timeout_s=1, eject_after=2, readmit_after=2)
    rounds = {"n": 0}
    check_all = checker.check_all

    async def first_round_raises():
        rounds["n"] += 1
        if rounds["n"] == 1:
            raise RuntimeError("a bug in a round")
        await check_all()

    monkeypatch.setattr(checker, "check_all", first_round_raises)
    task = asyncio.ensure_future(checker.run())
    try:
        deadline = asyncio.get_running_loop().time() + 5
        while gone.healthy:  # ejected only if rounds kept running after the first one raised
            assert asyncio.get_running_loop().time() < deadline, rounds
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert rounds["n"] >= 3 and pool.workers[1].healthy


class MetricsClient:
    """/health 200, and /metrics the text of `metrics[url]`."""

    def __init__(self, metrics: dict[str, str]):
        self.metrics = metrics

    async def request(self, origin, method, path, body=None, headers=None, timeout_s=None, on_sent=None):
        return Response(self.metrics[origin].encode() if path == "/metrics" else b"")


async def test_each_workers_kv_size_is_read_with_its_info():
    """From the same /metrics text as its pdspec_worker_info: num_gpu_blocks x block_size;
    unknown (None) where the series is missing, as on plain stand-ins, and at the next
    reading that lacks it."""
    pool = checked_pool()
    sized, unsized = pool.workers
    for worker in pool.workers:
        worker.info_read_at = None
    cache_info = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="2048"} 1.0\n'
    metrics = {
        sized.url: metrics_text({"role": "prefill"}) + cache_info,
        unsized.url: metrics_text({"role": "prefill"}),
    }
    checker = HealthChecker(MetricsClient(metrics), [pool], interval_s=1, timeout_s=1, eject_after=1, readmit_after=1)
    await checker.check_all()
    assert (sized.kv_tokens, unsized.kv_tokens) == (32_768, None)
    assert sized.info == {"role": "prefill"}
    metrics[sized.url] = metrics_text({"role": "prefill"})  # another engine now, exporting no size
    await checker.read_info(sized)
    assert sized.kv_tokens is None
