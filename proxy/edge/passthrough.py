"""Endpoints the proxy passes whole to one healthy decode worker: `/v1/models`, vLLM's
`/version` (the workers' vLLM version), `/tokenize` and `/detokenize` (token counting for
clients and gateways). Every decode
worker serves the same model with the same tokenizer (the pairing check), so any one
answers for all. The client's API key is checked as for generation; the worker gets the
proxy's own worker key.

Failure policy: no healthy decode worker is a 503; a worker that cannot be reached or
times out is a 502 (not retried elsewhere: these calls are cheap to repeat); the worker's
own status and body (a 400 for a bad body included) go back as they are. A POST body must
be `application/json`, as vLLM requires (400 otherwise, before any worker is asked): a
browser's cross-site "simple" POST (text/plain, a form) never reaches a worker.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from proxy.apis.validation import check_content_type
from proxy.auth import ApiKeys
from proxy.errors import ProxyError
from proxy.fleet.pool import NoHealthyWorker, WorkerPool
from proxy.upstream.client import UpstreamClient, UpstreamError

PASSED = (("GET", "/v1/models"), ("GET", "/version"), ("POST", "/tokenize"), ("POST", "/detokenize"))
MAX_BODY_BYTES = 4 * 1024 * 1024


def add_passthrough_routes(
    app: FastAPI,
    client: UpstreamClient,
    pool: WorkerPool,
    api_keys: ApiKeys,
    worker_headers: dict[str, str],
    timeout_s: float,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    async def passthrough(request: Request) -> Response:
        api_keys.check(request.headers.get("authorization"))
        if request.method == "POST":
            check_content_type(request.headers.get("content-type"))
        body = await _bounded_body(request, max_body_bytes) if request.method == "POST" else None
        try:
            worker = pool.pick()
        except NoHealthyWorker as exc:
            raise ProxyError(503, str(exc)) from None
        try:  # a body goes upstream as application/json (the client's own type was checked above)
            resp = await client.request(worker.url, request.method, request.url.path, body, worker_headers, timeout_s)
            data = await resp.read()
        except UpstreamError as exc:
            raise ProxyError(502, f"decode worker {worker.url} failed: {exc.reason}") from None
        return Response(data, status_code=resp.status, media_type=resp.headers.get("content-type", "application/json"))

    for method, path in PASSED:
        app.add_api_route(path, passthrough, methods=[method], include_in_schema=True)


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes (then 413)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"Request body over {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)
