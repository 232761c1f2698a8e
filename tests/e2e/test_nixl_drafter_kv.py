"""The drafter KV the decode worker receives over NIXL in a real 1P1D stack equals what
vLLM's full drafter pass writes, while the prefill worker runs the KV-only drafter pass.

loadtest/kv_only_equality.py compares the two passes inside one engine without a KV
connector; this checks the bytes that reach the decode worker, through the prefill
worker's K=0 steps, chunked prefill and the NIXL transfer. The decode worker's test hook
(pdspec/worker/engine/testing_hooks.py) saves, at each request's first step and before its
own target or drafter runs, the drafter layer's blocks that the received tokens fill
completely (not the block of the last prompt token, which the decode worker recomputes).

1. The shared stack (KV-only pass on: its feature reads "on" and its pass counter grows)
   serves the prompts; its dumps are kept. Negative controls: different prompts' blocks
   differ, and with the prefill worker's drafter switched off (its drafter KV zeroed) the
   decode worker receives zeros, so the dumps are the transferred KV, not local state.
2. After the shared stack is gone (two cores: one stack at a time), a stack of our own with
   the same settings but `--no-prefill.kv_only_drafter` (feature "off", counter still)
   serves the same prompts; every block must equal the first stack's.

Tolerance: none. The in-process harness finds the KV-only pass bitwise equal to the full
pass in eager mode (tests/e2e/test_kv_only_equality.py), pdspec's workers run eager, both
stacks run the same chunks on one bound core each, and NIXL copies bytes.
"""

from __future__ import annotations

import shutil

import pytest

from pdspec.worker.launch import drafter_kv_dump_dir, skip_drafter_file
from tests import harness
from tests.prompts import completion_body

pytestmark = pytest.mark.e2e

REFERENCE_BASE_PORT = 19500
# Distinct from their first token; about 280 to 1,000 tokens (2 to 7 full blocks of 128 on the
# CPU build), the last two longer than the prefill worker's 512-token chunk.
PROMPTS = [
    f"item_{i}_0 = " + " ".join(f"item_{i}_{j}" for j in range(1, words)) for i, words in enumerate((50, 75, 116, 180))
]
ATOL = 0.0

_RUNS: dict = {}  # the shared stack and its dumps, from the first test to the second


def feature_state(url: str, feature: str) -> str:
    states = {
        dict(labels)["state"]
        for labels, value in harness.scrape_labeled(url, "pdspec_engine_feature").items()
        if dict(labels)["feature"] == feature and value == 1
    }
    assert len(states) == 1, states
    return states.pop()


def serve_and_dump(stack, client, prompts: list[str]) -> tuple[dict, dict]:
    """Sends the prompts through the proxy while the decode worker's dump is on; returns
    {prompt token ids: dump} and the prefill worker's K=0 steps and KV-only passes."""
    import torch

    dump_dir = drafter_kv_dump_dir(stack.run_dir, "decode")
    shutil.rmtree(dump_dir, ignore_errors=True)
    dump_dir.mkdir()
    before = harness.scrape(stack.prefill_url)
    try:
        for prompt in prompts:
            response = client.post(stack.proxy_url + "/v1/completions", json=completion_body(prompt, max_tokens=4))
            assert response.status_code == 200, response.text
        dumps = [torch.load(path) for path in sorted(dump_dir.glob("*.pt"))]
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)  # the dump is off again
    after = harness.scrape(stack.prefill_url)
    counts = {
        name: after.get(name, 0) - before.get(name, 0)
        for name in ("pdspec_k0_proposals_total", "pdspec_kv_only_passes_total")
    }
    assert len(dumps) == len(prompts), f"{len(dumps)} dumps for {len(prompts)} prompts"
    return {tuple(d["prompt_token_ids"]): d for d in dumps}, counts


def blocks(dump: dict):
    (tensor,) = dump["layers"].values()  # the EAGLE3 drafter has one layer
    return tensor


def test_kv_only_stack_transfers_the_drafter_kv(stack, client):
    import torch

    assert feature_state(stack.prefill_url, "kv_only_pass") == "on"
    dumps, counts = serve_and_dump(stack, client, PROMPTS)
    assert counts["pdspec_kv_only_passes_total"] >= len(PROMPTS)  # every prompt's K=0 steps
    assert counts["pdspec_kv_only_passes_total"] == counts["pdspec_k0_proposals_total"]
    for ids, dump in dumps.items():
        # The received tokens are all but the last prompt token; their full blocks were kept.
        assert dump["num_computed_tokens"] == len(ids) - 1
        assert blocks(dump).shape[0] == (len(ids) - 1) // dump["block_size"] > 0
        assert blocks(dump).abs().sum() > 0  # written, not the zeros of a fresh block
    _RUNS.update(stack=stack, kv_only=dumps)

    # Negative control 1: the comparison tells prompts apart.
    first, second = (blocks(d) for d in list(dumps.values())[:2])
    n = min(first.shape[0], second.shape[0])
    assert not torch.allclose(first[:n], second[:n], rtol=0, atol=ATOL)

    # Negative control 2: the dumps are what the prefill worker sent. With its drafter off
    # (its drafter KV zeroed) the decode worker receives zeros for the same prompt.
    switch = skip_drafter_file(stack.run_dir, "prefill")
    switch.touch()
    try:
        zeroed, _ = serve_and_dump(stack, client, PROMPTS[:1])
    finally:
        switch.unlink()
    ((ids, dump),) = zeroed.items()
    assert blocks(dump).shape == blocks(dumps[ids]).shape
    assert blocks(dump).abs().sum() == 0
    assert not torch.allclose(blocks(dump), blocks(dumps[ids]), rtol=0, atol=ATOL)


@pytest.mark.after_stack
def test_received_drafter_kv_equals_the_full_passs(tmp_path_factory, client):
    import torch

    kv_only = _RUNS.get("kv_only")
    if kv_only is None:
        pytest.fail("needs the dumps of test_kv_only_stack_transfers_the_drafter_kv (run the module)")
    _RUNS["stack"].stop()  # already stopped in a full run (stops_stack tests); never two stacks
    reference = harness.start_stack(
        tmp_path_factory.mktemp("full-pass-stack"),
        REFERENCE_BASE_PORT,
        [*harness.TEST_STACK_ARGS, "--no-prefill.kv_only_drafter"],
    )
    try:
        assert feature_state(reference.prefill_url, "kv_only_pass") == "off"
        full, counts = serve_and_dump(reference, client, PROMPTS)
    finally:
        reference.stop()
    assert counts["pdspec_k0_proposals_total"] >= len(PROMPTS)  # K=0 steps, on vLLM's full pass
    assert counts["pdspec_kv_only_passes_total"] == 0

    assert set(full) == set(kv_only)  # the same prompts, tokenized alike
    compared, max_abs = 0, 0.0
    for ids in full:
        a, b = blocks(kv_only[ids]), blocks(full[ids])
        assert a.shape == b.shape and a.dtype == b.dtype
        max_abs = max(max_abs, (a.float() - b.float()).abs().max().item())
        assert torch.allclose(a, b, rtol=0, atol=ATOL), (len(ids), max_abs)
        compared += a.shape[0]
    print(
        f"drafter KV over NIXL, KV-only vs full pass: {compared} blocks of {len(full)} prompts, max abs diff {max_abs}"
    )
    assert compared > 0
