"""Bad input gets a 4xx in the OpenAI error format, and the next good request works."""

import pytest

from tests.prompts import COMPLETION_PROMPTS, completion_body

pytestmark = pytest.mark.e2e

BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b"\xff\xfe\x00", 400),
    ("/v1/completions", b"[]", 400),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 3}', 400),
    ("/v1/completions", b'{"model": "pdspec-tiny", "prompt": "x", "max_tokens": "three"}', 400),
    ("/v1/completions", b'{"model": "pdspec-tiny", "prompt": 5}', 400),
    ("/v1/completions", b'{"model": "pdspec-tiny", "prompt": "x", "max_tokens": -4}', 400),
    ("/v1/completions", b'{"model": "pdspec-tiny", "prompt": "x", "stream": "yes"}', 400),
    ("/v1/completions", b'{"model": "no-such-model", "prompt": "x", "max_tokens": 2}', 404),
    ("/v1/chat/completions", b'{"model": "pdspec-tiny", "messages": "hello"}', 400),
    ("/v1/chat/completions", b'{"model": "pdspec-tiny"}', 400),
    ("/v1/chat/completions", b'{"model": "pdspec-tiny", "messages": [{"role": "user", "content": 7}]}', 400),
]


@pytest.mark.parametrize("path, raw, status", BAD_REQUESTS)
def test_bad_input_gets_openai_error_then_good_request_works(stack, client, path, raw, status):
    response = client.post(stack.proxy_url + path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    assert "code" in error and "param" in error

    good = client.post(stack.proxy_url + "/v1/completions", json=completion_body(COMPLETION_PROMPTS[0]))
    assert good.status_code == 200
    assert good.json()["choices"][0]["text"]
