"""The drafter's KV reaches the decode worker: P/D acceptance equals a colocated
server's, and a negative control (the prefill worker writes no drafter KV) makes it
drop. Needs the trained drafter: a random one is never accepted, so nothing could drop."""

import httpx
import pytest

from pdspec.worker.launch import skip_drafter_file
from tests import harness
from tests.prompts import ACCEPTANCE_PROMPTS, acceptance_body, acceptance_length, complete

pytestmark = pytest.mark.e2e

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

    # Negative control: fresh prompts (no prefix-cache hit on either worker), and the
    # prefill worker skips the drafter, so the drafter KV that D pulls was never written.
    switch = skip_drafter_file(stack.run_dir, "prefill")
    switch.touch()
    try:
        fresh = [f"# negative control\n{p}" for p in ACCEPTANCE_PROMPTS]
        without_kv, _ = pd_acceptance(stack, client, fresh)
    finally:
        switch.unlink()
    assert without_kv < (1 - 2 * BAND) * colocated, (without_kv, colocated)

    # And with the switch off again, fresh prompts are back in the band.
    again, _ = pd_acceptance(stack, client, [f"# positive control\n{p}" for p in ACCEPTANCE_PROMPTS])
    assert abs(again - colocated) <= 2 * BAND * colocated, (again, colocated)
