"""A real proxy in front of stand-in workers (two prefill, one decode), for the proxy's
unit tests of failures, clients leaving and metrics."""

import httpx

from pdspec.settings import ProxySettings
from tests.harness import merged
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server

BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}


class Cluster:
    """Two prefill stand-ins and one decode stand-in behind a real proxy."""

    def __init__(self, *layers: dict, **settings):
        """`settings`: ProxySettings' fields in their groups; `layers` merged under them
        (tests.harness.merged), so a shared group dict and one more setting of its group combine."""
        self.p1, self.p2, self.d = StandinBehaviour(), StandinBehaviour(), StandinBehaviour()
        self.settings = merged(*layers, settings)

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in (self.p1, self.p2, self.d)]
        urls = [s.url for s in self.servers]
        settings = ProxySettings(
            prefill_urls=urls[:2],
            decode_urls=urls[2:],
            **merged({"routing": {"prefill_policy": "round_robin"}, "retries": {"backoff_s": 0.01}}, self.settings),
        )
        self.proxy = proxy_server(settings).__enter__()
        self.app = self.proxy.server.config.app
        self.url = self.proxy.url
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*exc)
        for server in self.servers:
            server.__exit__(*exc)


def sample(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


class Fleet:
    """`prefill` prefill and `decode` decode stand-ins, each exporting `worker_info`, behind
    a real proxy with `settings`."""

    def __init__(self, prefill: int, decode: int, worker_info: dict | None = None, *layers: dict, **settings):
        self.prefills = [StandinBehaviour(worker_info=worker_info) for _ in range(prefill)]
        self.decodes = [StandinBehaviour(worker_info=worker_info) for _ in range(decode)]
        self.settings = merged(*layers, settings)

    def __enter__(self):
        self.servers = [ThreadServer(create_standin(b)).__enter__() for b in self.prefills + self.decodes]
        urls = [s.url for s in self.servers]
        n = len(self.prefills)
        self.proxy = proxy_server(
            ProxySettings(prefill_urls=urls[:n], decode_urls=urls[n:], **self.settings)
        ).__enter__()
        self.app = self.proxy.server.config.app
        self.url = self.proxy.url
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*exc)
        for server in self.servers:
            server.__exit__(*exc)


def outstanding(cluster: Cluster | Fleet) -> list[int]:
    """Every worker's in-flight count as the proxy keeps it (prefill pool first)."""
    return [w.outstanding for pool in cluster.app.state.pools for w in pool.workers]


def queued_prefill_s(fleet: Fleet, worker: int = 0) -> float | None:
    """The prefill time admission counts queued on a prefill worker (its metric, None before
    its first reading)."""
    return sample(
        httpx.get(fleet.url + "/metrics").text,
        f'pdspec_proxy_prefill_queued_seconds{{worker="{fleet.servers[worker].url}"}}',
    )
