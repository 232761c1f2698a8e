"""The proxy's acceptance rules against a real vLLM worker, over generated bodies.

Each generated body goes to the proxy and straight to the decode worker (which serves it
locally). Both must land in the same status class (2xx or 4xx), a proxy refusal in
OpenAI's error shape; afterwards no KV is left on the prefill worker. The deliberate
differences are left out of the bodies: `kv_transfer_params` (the proxy's to set; sent to
a decode worker by a client it can kill vLLM's engine: an assertion in NixlConnector's
`update_state_after_alloc`) and `n` beyond `max_choices`. The same rules are checked over
many more bodies against vLLM's request classes in tests/unit/proxy/apis/test_validation_differential.py.
"""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import harness
from tests.request_bodies import CHAT_FIELDS, COMPLETION_FIELDS, beyond_max_choices, bodies

# Bodies the worker runs stay short: a small max_tokens unless the body sets its own.
SHORT = st.fixed_dictionaries({"model": st.just("pdspec-tiny"), "max_tokens": st.sampled_from([2, 3])})


def real(fields: dict, required: str, path: str):
    return st.tuples(st.just(path), st.builds(lambda short, body: {**short, **body}, SHORT, bodies(fields, required)))


CASES = st.one_of(
    real(COMPLETION_FIELDS, "prompt", "/v1/completions"), real(CHAT_FIELDS, "messages", "/v1/chat/completions")
)


def status_class(status: int) -> int:
    return status // 100


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(CASES)
def test_the_proxy_answers_as_the_worker_does(stack, case):
    path, body = case
    if beyond_max_choices(body):
        return
    with httpx.Client(timeout=120) as client:
        direct = client.post(stack.decode_url + path, json=body)
        through = client.post(stack.proxy_url + path, json=body)
    if status_class(direct.status_code) == 5:  # vLLM's own failure: nothing to agree with
        assert through.status_code >= 400
        return
    assert status_class(through.status_code) == status_class(direct.status_code), (
        body,
        direct.status_code,
        direct.text[:200],
        through.status_code,
        through.text[:200],
    )
    if through.status_code >= 400:
        error = through.json()["error"]
        assert error["message"] and error["type"] and "param" in error and "code" in error


def test_no_kv_is_left_behind(stack):
    """Runs after the generated bodies (file order): the prefill worker holds nothing."""
    assert harness.wait_idle(stack.prefill_url, timeout_s=20) == (0, 0)
    assert harness.wait_idle(stack.decode_url, timeout_s=20) == (0, 0)
