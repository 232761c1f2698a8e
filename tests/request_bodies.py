"""Generated request bodies for the differential tests of the proxy's acceptance rules
(tests/unit/proxy/apis/test_validation_differential.py, test_responses_differential.py and
test_messages_differential.py against vLLM's request classes,
tests/e2e/test_validation_differential.py against a real worker)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pdspec.settings import ProxySettings
from proxy.flow.fanout import choice_count

MAX_CHOICES = ProxySettings().clients.max_choices

# The unit tests' runs, derandomized so CI runs the same bodies every time;
# PDSPEC_DIFF_RANDOM=1 (and more PDSPEC_DIFF_EXAMPLES) explores new ones.
UNIT_SETTINGS = settings(
    max_examples=int(os.environ.get("PDSPEC_DIFF_EXAMPLES", "1500")),
    derandomize=not os.environ.get("PDSPEC_DIFF_RANDOM"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Values that probe pydantic's lax mode (numbers as strings, floats with and without a
# fraction, bools as numbers and words), ranges, nulls and wrong types.
INTS = st.sampled_from([None, 0, 1, 2, 3, -1, -2, 4.0, 2.5, "3", "x", True, False, 2**63 - 1, 2**63, -(2**63), [], {}])
FLOATS = st.sampled_from([None, 0, 0.0, 0.5, 1, 1.0, 2.5, -1, "0.7", "hot", True, [], 1e-6])
BOOLS = st.sampled_from([None, True, False, 0, 1, 2, "true", "false", "yes", "no", "maybe", [], 0.0])
STREAM_OPTIONS = st.sampled_from(
    [None, {}, {"include_usage": True}, {"include_usage": "yes"}, {"continuous_usage_stats": True}, "all", 5]
)
PROMPTS = st.sampled_from(
    [None, "", "The capital of France is", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [1, -2], [1, "a"], 5, {"a": 1}, []]
)
MESSAGES = st.sampled_from(
    [
        [{"role": "user", "content": "hi"}],
        [{"role": "function", "name": "f", "content": "1"}, {"role": "user", "content": "hi"}],
        [{"role": "wizard", "content": "x"}],
        [{"role": 7, "content": "x"}],
        [{"content": "x"}],
        ["hi"],
        [],
        "hello",
    ]
)
COMMON = {
    "model": st.sampled_from(["m", "", None, 7]),
    "stream": BOOLS,
    "stream_options": STREAM_OPTIONS,
    "max_tokens": INTS,
    "n": INTS,
    "temperature": FLOATS,
    "top_p": FLOATS,
    "seed": INTS,
    "min_tokens": INTS,
    "prompt_logprobs": INTS,
    "use_beam_search": BOOLS,
}
COMPLETION_FIELDS = {**COMMON, "prompt": PROMPTS, "logprobs": INTS, "echo": BOOLS}
CHAT_FIELDS = {
    **COMMON,
    "messages": MESSAGES,
    "logprobs": BOOLS,
    "top_logprobs": INTS,
    "max_completion_tokens": INTS,
    "echo": BOOLS,
}

# The Responses API: `n`, `max_tokens` and `stream_options` are not its fields (vLLM ignores
# them); `previous_response_id` and `background` are refused by the proxy (stateful), and by
# vLLM too while nothing is stored (no VLLM_ENABLE_RESPONSES_API_STORE).
RESPONSES_FIELDS = {
    "model": st.sampled_from(["m", "", None, 7]),
    "input": st.sampled_from([None, "", "Say hi.", [{"role": "user", "content": "hi"}], [], 5, {"a": 1}]),
    "stream": BOOLS,
    "store": BOOLS,
    "background": BOOLS,
    "previous_response_id": st.sampled_from([None, "resp_1", 5]),
    "max_output_tokens": INTS,
    "seed": INTS,
    "temperature": FLOATS,
    "top_p": FLOATS,
    "top_logprobs": INTS,
    "include": st.sampled_from([None, [], ["message.output_text.logprobs"], ["bogus"], "x"]),
    "request_id": st.sampled_from([None, "resp_mine", 5]),
    "n": INTS,
    "max_tokens": INTS,
    "stream_options": STREAM_OPTIONS,
}

MESSAGES_FIELDS = {  # Anthropic's Messages
    "model": st.sampled_from(["m", "", None, 7]),
    "messages": st.sampled_from([[{"role": "user", "content": "hi"}], [{"role": "wizard", "content": "x"}], [], "x"]),
    "max_tokens": INTS,
    "stream": BOOLS,
    "temperature": FLOATS,
    "top_k": INTS,
    "thinking": st.sampled_from(
        [
            None,
            {"type": "enabled", "budget_tokens": 2048},
            {"type": "enabled", "budget_tokens": 100},
            {"type": "disabled"},
            {"type": "bogus"},
            "x",
        ]
    ),
    "n": INTS,
}


def bodies(fields: dict, required: str):
    """A body with `required` always present and any subset of the other fields."""
    optional = {name: strategy for name, strategy in fields.items() if name != required}
    return st.fixed_dictionaries({required: fields[required]}, optional=optional)


def beyond_max_choices(body: dict) -> bool:
    """The one deliberate limit vLLM does not have: each choice is a prefill and a decode."""
    try:
        return choice_count(body) > MAX_CHOICES
    except TypeError:
        return False
