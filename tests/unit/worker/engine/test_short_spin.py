"""short_spin: on CPU builds vLLM's shared-memory queue readers spin milliseconds, not a
second, before they sleep, and sleep at most RECHECK_MS between looks at their ring;
writers are untouched. On vLLM's own SpinCondition."""

import pytest

from pdspec.worker.engine import features, short_spin
from pdspec.worker.engine.short_spin import MARKER
from pdspec.worker.engine.wrap_once import is_wrapped


@pytest.fixture
def spin_condition(monkeypatch):
    shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    monkeypatch.setattr(shm.SpinCondition, "__init__", shm.SpinCondition.__init__)  # restored after the test
    monkeypatch.setattr(shm.SpinCondition, "wait", shm.SpinCondition.wait)
    return shm.SpinCondition


def readers_window(spin_condition, tmp_path) -> tuple[float, float]:
    import zmq

    context = zmq.Context()
    address = f"ipc://{tmp_path}/notify"
    writer = spin_condition(is_reader=False, context=context, notify_address=address)
    reader = spin_condition(is_reader=True, context=context, notify_address=address)
    try:
        return reader.busy_loop_s, writer.busy_loop_s
    finally:
        for socket in (
            reader.local_notify_socket,
            reader.write_cancel_socket,
            reader.read_cancel_socket,
            writer.local_notify_socket,
        ):
            socket.close(linger=0)
        context.term()


def test_a_reader_spins_the_window_on_a_cpu_build(monkeypatch, spin_condition, tmp_path):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test; a GPU build keeps vLLM's spin (next test)")
    assert readers_window(spin_condition, tmp_path) == (1, 0)  # vLLM's own
    monkeypatch.setenv(short_spin.WINDOW_ENV, "5")
    short_spin.install_short_spin()
    short_spin.install_short_spin()  # idempotent
    assert is_wrapped(spin_condition.__init__, MARKER) and is_wrapped(spin_condition.wait, MARKER)
    assert readers_window(spin_condition, tmp_path) == (0.005, 0)
    assert features.reported()[features.SHORT_SPIN] == ("on", "")


def test_off_by_setting_or_on_a_gpu_build(monkeypatch, spin_condition):
    monkeypatch.setenv(short_spin.WINDOW_ENV, "0")
    short_spin.install_short_spin()
    assert features.reported()[features.SHORT_SPIN][0] == "off" and not is_wrapped(spin_condition.__init__, MARKER)
    from vllm.platforms import current_platform

    monkeypatch.setenv(short_spin.WINDOW_ENV, "5")
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    short_spin.install_short_spin()
    assert features.reported()[features.SHORT_SPIN] == ("off", "not a CPU build (vLLM's one-second spin kept)")
    assert not is_wrapped(spin_condition.__init__, MARKER)


def test_off_in_an_engine_core_that_runs_its_model(monkeypatch, spin_condition):
    """Started by in_core_worker's bound start: no worker process, no queue to read."""
    from pdspec.worker.engine.control import MODEL_IN_CORE_ENV
    from pdspec.worker.engine.in_core_worker import NO_QUEUE

    monkeypatch.setenv(short_spin.WINDOW_ENV, "5")
    monkeypatch.setenv(MODEL_IN_CORE_ENV, "1")
    short_spin.install_short_spin()
    assert features.reported()[features.SHORT_SPIN] == ("off", NO_QUEUE)
    assert not is_wrapped(spin_condition.__init__, MARKER)


def test_a_sleeping_reader_looks_again_within_the_recheck_bound():
    """vLLM's reader sleeps up to 5 s (no timeout given: its recheck interval) for a
    notification that now and then does not come; bounded, a lost one costs RECHECK_MS."""
    asked = []
    wait = short_spin._bounded_sleep(lambda self, timeout_ms=None: asked.append(timeout_ms), short_spin.RECHECK_MS)
    for given in (None, 5000, short_spin.RECHECK_MS + 1, 3):
        wait(object(), given)
    assert asked == [short_spin.RECHECK_MS, short_spin.RECHECK_MS, short_spin.RECHECK_MS, 3]


def test_an_idle_reader_on_vllms_condition_wakes_without_a_notification(monkeypatch, spin_condition, tmp_path):
    """A real reader past its window, nothing written, asked to wait vLLM's recheck
    interval (5 s, what its reads pass): it looks again after about RECHECK_MS."""
    import threading

    import zmq
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test")
    monkeypatch.setenv(short_spin.WINDOW_ENV, "5")
    short_spin.install_short_spin()
    context = zmq.Context()
    address = f"ipc://{tmp_path}/notify"
    writer = spin_condition(is_reader=False, context=context, notify_address=address)
    reader = spin_condition(is_reader=True, context=context, notify_address=address)
    reader.last_read = 0.0  # long idle: the next wait sleeps on the socket
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (reader.wait(timeout_ms=5000), returned.set()), daemon=True)
    thread.start()
    try:
        assert returned.wait(2.0)  # vLLM's own sleep is 5 s
    finally:
        thread.join(6)
        for socket in (reader.local_notify_socket, reader.write_cancel_socket, reader.read_cancel_socket):
            socket.close(linger=0)
        writer.local_notify_socket.close(linger=0)
        context.term()


def test_off_where_vllms_spin_loop_extension_spins_each_read(monkeypatch, spin_condition):
    """With VLLM_USE_SPINLOOP_EXT each read spins 100 ms before it waits: bounded waits would
    keep an idle reader spinning, so the feature stays off and says why."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's test")
    monkeypatch.setenv(short_spin.WINDOW_ENV, "5")
    monkeypatch.setattr(shm_broadcast, "SPINLOOP_EXT_ENABLED", True, raising=False)
    short_spin.install_short_spin()
    state, reason = features.reported()[features.SHORT_SPIN]
    assert state == "off" and not is_wrapped(spin_condition.wait, MARKER)
    assert "spin-loop extension" in reason
