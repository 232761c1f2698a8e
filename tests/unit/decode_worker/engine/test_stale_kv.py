"""The decode worker's stale-KV guard (decode_worker/engine/stale_kv.py): a request whose
prefill worker's KV lease may have run out before the scheduler got it is prefilled here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from decode_worker.engine import stale_kv
from pdspec.worker.engine.metrics import STALE_KV_RECOMPUTED

REMOTE = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "p"}


def request(arrival_time: float, params: dict | None = REMOTE) -> SimpleNamespace:
    return SimpleNamespace(request_id="r", arrival_time=arrival_time, kv_transfer_params=dict(params or {}) or None)


@pytest.mark.parametrize("age_s, stale", [(0.01, False), (59.9, False), (60.1, True), (600, True)])
def test_remote_kv_is_stale_past_the_limit(age_s, stale):
    assert stale_kv.remote_kv_is_stale(request(1000.0), now=1000.0 + age_s, stale_after_s=60) is stale


@pytest.mark.parametrize("params", [None, {"do_remote_decode": True}, {"do_remote_prefill": False}])
def test_only_requests_reading_remote_kv_are_judged(params):
    assert not stale_kv.remote_kv_is_stale(request(0.0, params), now=10_000.0, stale_after_s=60)


class Recorder:
    def __init__(self):
        self.added = []

    def add_request(self, request):
        self.added.append(request)


class Guarded(stale_kv.StaleKvMixin, Recorder):
    pass


def test_a_stale_request_loses_its_kv_params_and_is_counted(monkeypatch):
    monkeypatch.setattr(stale_kv.time, "time", lambda: 1100.0)
    scheduler = Guarded()
    scheduler._pdspec_stale_after_s = 60.0
    before = STALE_KV_RECOMPUTED._value.get()
    fresh, stale = request(1090.0), request(1000.0)
    scheduler.add_request(fresh)
    scheduler.add_request(stale)
    assert scheduler.added == [fresh, stale]  # both go on to vLLM's scheduler
    assert fresh.kv_transfer_params == REMOTE and stale.kv_transfer_params is None
    assert STALE_KV_RECOMPUTED._value.get() == before + 1


def test_the_guard_is_off_without_a_limit(monkeypatch):
    monkeypatch.delenv(stale_kv.STALE_KV_AFTER_ENV, raising=False)
    assert stale_kv.stale_after_from_env() is None
    scheduler = Guarded()  # _pdspec_stale_after_s None: a prefill worker
    old = request(0.0)
    scheduler.add_request(old)
    assert old.kv_transfer_params == REMOTE
    monkeypatch.setenv(stale_kv.STALE_KV_AFTER_ENV, "60")
    assert stale_kv.stale_after_from_env() == 60.0


@pytest.mark.parametrize(
    "role, limit, state",
    [("decode", "60", ("on", "")), ("decode", None, ("off", "PDSPEC_STALE_KV_AFTER_S is not set"))],
)
def test_the_decode_worker_reports_the_guards_state(monkeypatch, role, limit, state):
    from pdspec.worker.engine import features

    monkeypatch.setenv("PDSPEC_ROLE", role)
    if limit is None:
        monkeypatch.delenv(stale_kv.STALE_KV_AFTER_ENV, raising=False)
    else:
        monkeypatch.setenv(stale_kv.STALE_KV_AFTER_ENV, limit)
    assert stale_kv.start_guard() == (float(limit) if limit else None)
    assert features.reported()[features.STALE_KV_GUARD] == state
