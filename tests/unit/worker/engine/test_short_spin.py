"""short_spin: on CPU builds vLLM's shared-memory queue readers spin milliseconds, not a
second, before they sleep; writers are untouched. On vLLM's own SpinCondition."""

import pytest

from pdspec.worker.engine import features, short_spin
from pdspec.worker.engine.short_spin import MARKER
from pdspec.worker.engine.wrap_once import is_wrapped


@pytest.fixture
def spin_condition(monkeypatch):
    shm = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    monkeypatch.setattr(shm.SpinCondition, "__init__", shm.SpinCondition.__init__)  # restored after the test
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
    assert is_wrapped(spin_condition.__init__, MARKER)
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
