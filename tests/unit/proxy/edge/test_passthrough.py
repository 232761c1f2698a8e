"""/tokenize, /detokenize and /v1/models pass to one healthy decode worker, behind the
API key; unknown paths and methods, vLLM's scale-out endpoints among them, answer in
OpenAI's error format."""

import httpx
import pytest

from pdspec.settings import ProxySettings
from proxy.app import SCALE_OUT_PATHS
from tests.standin import StandinBehaviour, ThreadServer, create_standin, proxy_server


@pytest.fixture
def fleet():
    prefill, decode = StandinBehaviour(), StandinBehaviour()
    with ThreadServer(create_standin(prefill)) as p, ThreadServer(create_standin(decode)) as d:
        settings = ProxySettings(
            prefill_urls=[p.url],
            decode_urls=[d.url],
            clients={"api_keys": ["k"]},
            worker_client={"api_key": "w"},
            health={"interval_s": 0.05},
        )
        with proxy_server(settings) as proxy:
            yield proxy.url, prefill, decode


KEY = {"Authorization": "Bearer k"}


def test_tokenize_and_detokenize_reach_a_decode_worker_with_the_worker_key(fleet):
    url, prefill, decode = fleet
    tokens = httpx.post(url + "/tokenize", json={"model": "m", "prompt": "hi"}, headers=KEY)
    assert tokens.status_code == 200 and tokens.json()["tokens"] == list(b"hi")
    assert decode.tokenized == [{"model": "m", "prompt": "hi"}] and prefill.tokenized == []
    text = httpx.post(url + "/detokenize", json={"model": "m", "tokens": list(b"hi")}, headers=KEY)
    assert text.json() == {"prompt": "hi"}
    assert httpx.get(url + "/v1/models", headers=KEY).status_code == 200


def test_the_worker_status_goes_back_as_is(fleet):
    url, _, decode = fleet
    decode.tokenize_status = 400
    assert httpx.post(url + "/tokenize", json={"model": "m", "prompt": "x"}, headers=KEY).status_code == 400


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_the_client_key_is_checked(fleet, path):
    url, _, decode = fleet
    refused = httpx.post(url + path, json={"prompt": "x"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert decode.tokenized == []


def test_no_healthy_decode_worker_is_a_503():
    with ThreadServer(create_standin(StandinBehaviour())) as p:
        settings = ProxySettings(prefill_urls=[p.url], decode_urls=["http://127.0.0.1:9"], health={"interval_s": 0.05})
        with proxy_server(settings) as proxy:
            response = httpx.post(proxy.url + "/tokenize", json={"prompt": "x"})
    assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"


def test_unknown_paths_and_methods_answer_in_openai_format(fleet):
    url, _, _ = fleet
    missing = httpx.post(url + "/v1/embeddings", json={}, headers=KEY)
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "No route /v1/embeddings.",
        "type": "not_found_error",
        "param": None,
        "code": "not_found",
    }
    wrong = httpx.get(url + "/tokenize", headers=KEY)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    assert httpx.delete(url + "/health").status_code == 405


@pytest.mark.parametrize("path", SCALE_OUT_PATHS)
def test_the_workers_scale_out_endpoints_are_not_served(fleet, path):
    """Render, derender and /inference/v1/generate are the workers' own (the proxy reads
    render for routing): a client gets the proxy's 404 whatever the method, and nothing
    reaches a worker (`/v1/responses/render` is not taken for a stored response's id)."""
    url, prefill, decode = fleet
    for method in ("POST", "GET", "DELETE"):
        response = httpx.request(method, url + path, json={"model": "m", "input": "hi"}, headers=KEY)
        assert response.status_code == 404, (method, response.text)
        assert response.json()["error"] == {
            "message": f"No route {path}.",
            "type": "not_found_error",
            "param": None,
            "code": "not_found",
        }
    assert prefill.rendered == decode.rendered == [] and prefill.received == decode.received == []


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_only_json_bodies_reach_a_worker(fleet, path, content_type):
    """As vLLM: 400 for any type but application/json (a browser's cross-site simple POST
    among them); the proxy once forwarded the client's type after its own and the worker
    answered 200."""
    url, _, decode = fleet
    headers = {**KEY, **({"content-type": content_type} if content_type else {})}
    refused = httpx.post(url + path, content=b'{"model": "m", "prompt": "hi"}', headers=headers)
    assert refused.status_code == 400 and "application/json" in refused.json()["error"]["message"]
    assert decode.tokenized == []


def test_vllms_small_routes_answer_as_vllm_does(fleet):
    """/version (a decode worker's), /ping (an empty 200 for GET and POST) and /load (the
    requests in flight) once answered 404."""
    url, _, _ = fleet
    assert httpx.get(url + "/version", headers=KEY).json() == {"version": "standin-0"}
    for method in ("GET", "POST"):
        ping = httpx.request(method, url + "/ping")
        assert ping.status_code == 200 and ping.content == b""
    assert httpx.get(url + "/load").json() == {"server_load": 0}


@pytest.mark.parametrize("path", ["/v1/completions/", "/v1/chat/completions/", "/v1/responses/", "/v1/messages/"])
def test_a_trailing_slash_is_redirected_with_307(fleet, path):
    url, _, _ = fleet
    response = httpx.post(url + path + "?x=1", json={"model": "m"}, headers=KEY, follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == url + path[:-1] + "?x=1"
