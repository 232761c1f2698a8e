"""proxy/auth.py: client API keys, sent as `Authorization: Bearer <key>`; with none
configured there is no auth. Then how proxy/app.py wires it: which paths ask for a key,
what a refused client gets (401 in the OpenAI error format), and that a refused request
reaches no worker."""

from __future__ import annotations

import httpx
import openai
import pytest

from pdspec.settings import ProxySettings
from proxy.auth import ApiKeys
from proxy.errors import ProxyError
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server

KEYS = ["k1", "k2"]
BODY = {"model": "m", "prompt": "hello", "max_tokens": 5}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
MISSING = "Missing API key: send 'Authorization: Bearer <key>'."
INVALID = "Invalid API key."


# The module


@pytest.mark.parametrize("keys", [[], [""], ["", ""]])
@pytest.mark.parametrize("header", [None, "", "Bearer anything", "Basic abc"])
def test_no_keys_configured_means_no_auth(keys, header):
    api_keys = ApiKeys(keys)
    assert not api_keys.enabled
    api_keys.check(header)  # nothing raised


@pytest.mark.parametrize("header", ["Bearer k1", "Bearer k2", "Bearer  k1 ", "bearer k1", "BEARER k2"])
def test_a_configured_key_is_accepted(header):
    api_keys = ApiKeys(KEYS)
    assert api_keys.enabled
    api_keys.check(header)  # nothing raised


@pytest.mark.parametrize("header", [None, "", "k1", "Bearer", "Bearerk1", "Basic azE6", "Token k1"])
def test_no_bearer_key_is_refused_as_missing(header):
    with pytest.raises(ProxyError) as refused:
        ApiKeys(KEYS).check(header)
    assert (refused.value.status, refused.value.code, refused.value.message) == (401, "invalid_api_key", MISSING)


@pytest.mark.parametrize("header", ["Bearer wrong", "Bearer ", "Bearer K1", "Bearer k", "Bearer k1k2", "Bearer k1,k2"])
def test_a_wrong_key_is_refused_as_invalid(header):
    with pytest.raises(ProxyError) as refused:
        ApiKeys(KEYS).check(header)
    assert (refused.value.status, refused.value.code, refused.value.message) == (401, "invalid_api_key", INVALID)


def test_an_empty_configured_key_is_no_key():
    api_keys = ApiKeys(["", "k1"])
    api_keys.check("Bearer k1")
    with pytest.raises(ProxyError):
        api_keys.check("Bearer ")


# In the app


@pytest.fixture(scope="module")
def behaviour():
    return StandinBehaviour()


@pytest.fixture(scope="module")
def proxy_url(behaviour):
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(
            prefill_urls=[worker.url],
            decode_urls=[worker.url],
            clients={"api_keys": KEYS, "max_body_bytes": 1000},
            worker_client={"api_key": "worker-secret"},
        )
        with proxy_server(settings) as proxy:
            yield proxy.url


def auth(key: str | None) -> dict:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("path, body", [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize("key", ["k1", "k2"])
def test_generation_with_a_right_key_is_served(proxy_url, behaviour, path, body, key):
    before = len(behaviour.headers)
    response = httpx.post(proxy_url + path, json=body, headers=auth(key))
    assert response.status_code == 200, response.text
    # Both legs went out, with the proxy's own credential, never the client's key.
    assert [h["authorization"] for h in behaviour.headers[before:]] == ["Bearer worker-secret"] * 2


@pytest.mark.parametrize("path, body", [("/v1/completions", BODY), ("/v1/chat/completions", CHAT)])
@pytest.mark.parametrize(
    "headers, message", [({}, MISSING), (auth("wrong"), INVALID), ({"Authorization": "k1"}, MISSING)]
)
def test_generation_without_a_right_key_is_an_openai_401(proxy_url, behaviour, path, body, headers, message):
    before = len(behaviour.received)
    response = httpx.post(proxy_url + path, json=body, headers={**headers, "X-Request-Id": "refused-1"})
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == "refused-1"
    assert response.json() == {
        "error": {"message": message, "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    }
    assert len(behaviour.received) == before  # no leg was sent


def test_the_key_is_checked_before_the_body_is_read(proxy_url, behaviour):
    """A client without a key learns nothing about the body checks: an oversized or
    broken body is still a 401."""
    oversized = httpx.post(proxy_url + "/v1/completions", json={**BODY, "prompt": "x" * 2000})
    broken = httpx.post(proxy_url + "/v1/completions", content=b"{", headers={"content-type": "text/plain"})
    assert (oversized.status_code, broken.status_code) == (401, 401)
    assert (
        httpx.post(
            proxy_url + "/v1/completions", content=b"{", headers={**auth("k1"), "content-type": "application/json"}
        ).status_code
        == 400
    )


def test_the_openai_client_sees_an_authentication_error(proxy_url):
    client = openai.OpenAI(base_url=proxy_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.completions.create(model="m", prompt="hello", max_tokens=5)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    served = openai.OpenAI(base_url=proxy_url + "/v1", api_key="k2", max_retries=0)
    assert served.completions.create(model="m", prompt="hello", max_tokens=5).choices


def test_models_asks_for_a_key(proxy_url):
    refused = httpx.get(proxy_url + "/v1/models", headers=auth("wrong"))
    missing = httpx.get(proxy_url + "/v1/models")
    served = httpx.get(proxy_url + "/v1/models", headers=auth("k1"))
    assert (refused.status_code, missing.status_code, served.status_code) == (401, 401, 200)
    assert refused.json()["error"] == {
        "message": INVALID,
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert missing.json()["error"]["message"] == MISSING
    assert served.json()["data"][0]["id"] == "standin"


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_health_readiness_and_metrics_need_no_key(proxy_url, path):
    """Probes and Prometheus send no key."""
    assert httpx.get(proxy_url + path).status_code == 200
    assert httpx.get(proxy_url + path, headers=auth("wrong")).status_code == 200


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_api_docs_are_off_with_keys_even_for_a_right_key(proxy_url, path):
    assert httpx.get(proxy_url + path, headers=auth("k1")).status_code == 404


def test_a_proxy_without_keys_serves_everyone():
    behaviour = StandinBehaviour()
    with ThreadServer(create_standin(behaviour)) as worker:
        settings = ProxySettings(prefill_urls=[worker.url], decode_urls=[worker.url])
        with proxy_server(settings) as proxy:
            plain = httpx.post(proxy.url + "/v1/completions", json=BODY)
            with_any = httpx.post(proxy.url + "/v1/completions", json=BODY, headers=auth("whatever"))
            models = httpx.get(proxy.url + "/v1/models")
    assert (plain.status_code, with_any.status_code, models.status_code) == (200, 200, 200)
    assert all("authorization" not in h for h in behaviour.headers)  # no worker key set: none sent
