"""The drafter's KV reaches the decode worker: P/D acceptance equals a colocated
server's, and a negative control (the prefill worker writes no drafter KV) makes it
drop. Needs the trained drafter: a random one is never accepted, so nothing could drop."""

import httpx

from pdspec.worker.launch import skip_drafter_file
from tests import harness
from tests.prompts import ACCEPTANCE_PROMPTS, acceptance_body, acceptance_length, complete

BAND = 0.05


def pd_acceptance(stack, client: httpx.Client, prompts: list[str]) -> tuple[float, list[str]]:
    before = harness.scrape(stack.decode_url)
    texts = [complete(client, stack.proxy_url, "/v1/completions", acceptance_body(p)) for p in prompts]
    return acceptance_length(before, harness.scrape(stack.decode_url)), texts


def test_trained_drafter_is_accepted(reference_outputs):
    # EAGLE3 at K=3 on a colocated server, held-out prompts.
    assert reference_outputs["acceptance_length"] >= 2.0


def test_pd_acceptance_matches_colocated_and_drops_without_drafter_kv(stack, client, reference_outputs):
    colocated = reference_outputs["acceptance_length"]
    pd, texts = pd_acceptance(stack, client, ACCEPTANCE_PROMPTS)
    assert texts == reference_outputs["acceptance_texts"]  # same greedy output
    assert abs(pd - colocated) <= BAND * colocated, (pd, colocated)

    # Negative control: the same prompts again (the test stack runs without prefix
    # caching, so they are prefilled and transferred anew), while the prefill worker
    # skips the drafter: the drafter KV that D pulls was never written.
    switch = skip_drafter_file(stack.run_dir, "prefill")
    switch.touch()
    try:
        without_kv, texts_without_kv = pd_acceptance(stack, client, ACCEPTANCE_PROMPTS)
    finally:
        switch.unlink()
    assert texts_without_kv == texts  # the target's output does not depend on the drafter
    # Greedy and deterministic: P/D and colocated agree to within rounding, so a drop
    # below the band is the drafter missing its prompt KV, not noise.
    assert without_kv < (1 - BAND) * colocated, (without_kv, colocated)
    print(f"acceptance length: colocated {colocated:.3f}, P/D {pd:.3f}, P/D without drafter KV {without_kv:.3f}")

    # And with the switch off again, the same prompts are back in the band.
    again, _ = pd_acceptance(stack, client, ACCEPTANCE_PROMPTS)
    assert abs(again - colocated) <= BAND * colocated, (again, colocated)
