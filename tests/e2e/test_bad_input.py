"""Bad input gets the right 4xx in the OpenAI error format, never a 5xx, and the next
good request still works. Real workers behind the proxy; a second proxy in front of
the same workers requires an API key."""

import json

import httpx
import pytest

from tests import harness
from tests.api_cases import ACCEPTED_AS_VLLM_ACCEPTS, BAD_REQUESTS, C
from tests.prompts import COMPLETION_PROMPTS, completion_body


def assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert error["message"] and error["type"]
    assert "code" in error and "param" in error


def assert_good_request_works(client: httpx.Client, url: str, headers: dict | None = None) -> None:
    good = client.post(url + C, json=completion_body(COMPLETION_PROMPTS[0]), headers=headers)
    assert good.status_code == 200
    assert good.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    "path, body", ACCEPTED_AS_VLLM_ACCEPTS, ids=[f"{i}" for i in range(len(ACCEPTED_AS_VLLM_ACCEPTS))]
)
def test_what_vllm_accepts_the_proxy_serves(stack, client, path, body):
    headers = {"content-type": "application/json"}
    direct = client.post(stack.decode_url + path, content=body, headers=headers)
    through = client.post(stack.proxy_url + path, content=body, headers=headers)
    assert direct.status_code == 200, direct.text[:300]
    assert through.status_code == 200, through.text[:300]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_only_json_bodies_as_vllm_takes_them(stack, client, content_type):
    body = json.dumps(completion_body(COMPLETION_PROMPTS[0])).encode()
    headers = {} if content_type is None else {"content-type": content_type}
    for url in (stack.decode_url, stack.proxy_url):
        response = client.post(url + C, content=body, headers=headers)
        assert response.status_code == 400, (url, response.text[:300])
        assert "application/json" in response.text
    assert_good_request_works(client, stack.proxy_url)


def test_the_corpus_is_large_enough():
    assert len(BAD_REQUESTS) + len(AUTH_CASES) >= 50


@pytest.mark.parametrize("path, body, status", BAD_REQUESTS, ids=[f"{i}" for i in range(len(BAD_REQUESTS))])
def test_bad_input_gets_openai_error_then_good_request_works(stack, client, path, body, status):
    response = client.post(stack.proxy_url + path, content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, status)
    assert_good_request_works(client, stack.proxy_url)


AUTH_CASES = [(None, 401), ("Bearer wrong-key", 401), ("Basic c2VjcmV0", 401), ("Bearer", 401), ("secret-key", 401)]


@pytest.fixture(scope="module")
def keyed_proxy(stack):
    proxy = harness.start_proxy(
        18050,
        prefill_urls=[stack.prefill_url],
        decode_urls=[stack.decode_url],
        clients={"api_keys": ["secret-key"]},
        # the stack's prefill side channel (tests/harness.py)
        kv_transfer={"source_ports": [str(harness.STACK_BASE_PORT + 300)]},
    )
    harness.wait_healthy(proxy.url, proxy.process, path="/ready")
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("authorization, status", AUTH_CASES)
def test_missing_or_wrong_api_key_is_401(keyed_proxy, client, authorization, status):
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = client.post(keyed_proxy.url + C, json=completion_body("x"), headers=headers)
    assert_openai_error(response, status)
    assert_good_request_works(client, keyed_proxy.url, headers={"Authorization": "Bearer secret-key"})
