"""Fixtures shared by all tests. The end-to-end ones start real vLLM workers: one
colocated reference server first, then one `pdspec up` stack, never both at once
(two cores)."""

from __future__ import annotations

import httpx
import pytest

from tests import dockerhost, harness
from tests.fleet import Fleet, start_fleet
from tests.prompts import (
    ACCEPTANCE_PROMPTS,
    CHAT_MESSAGES,
    COMPLETION_PROMPTS,
    acceptance_body,
    acceptance_length,
    chat_body,
    complete,
    completion_body,
    seeded_outputs,
)

REFERENCE_PORT = harness.REFERENCE_PORT
STACK_BASE_PORT = harness.STACK_BASE_PORT


def pytest_itemcollected(item):
    # Every test under tests/e2e starts real vLLM workers: marked by where it lives, so
    # `-m "not e2e"` (the quick loop) cannot miss one.
    if "e2e" in item.path.relative_to(item.config.rootpath).parts:
        item.add_marker(pytest.mark.e2e)


FLEET_MODULES = ("test_render_routing", "test_kv_routing", "test_faults")
COMPOSE_MODULE = "test_compose"


def pytest_collection_modifyitems(config, items):
    # A test that stops the shared stack runs after every test that uses it; tests that
    # start workers of their own run after that, when the stack is gone.
    # The modules sharing the 2P1D fleet (tests/fleet.py) run together, in this order (the
    # last kills its workers, then stops it), before any other module starts workers.
    def order(item) -> tuple[int, int]:
        if item.path.stem in FLEET_MODULES:
            return 2, FLEET_MODULES.index(item.path.stem)
        if item.get_closest_marker("after_stack"):
            return 3, 0
        return (1 if item.get_closest_marker("stops_stack") else 0), 0

    items.sort(key=order)


def pytest_collection_finish(session):
    # The compose test's image, built while the tests before it run (tests/dockerhost.py);
    # here, once `-m` and `-k` have deselected what will not run.
    if any(item.path.stem == COMPOSE_MODULE for item in session.items):
        session.config.stash[IMAGE_BUILD] = dockerhost.ImageBuild(harness.REPO)


IMAGE_BUILD = pytest.StashKey[dockerhost.ImageBuild]()


@pytest.fixture(scope="session")
def image_build(request) -> dockerhost.ImageBuild:
    """The background build of the CPU image, started at collection (only when the compose
    test is collected)."""
    build = request.config.stash.get(IMAGE_BUILD, None)
    if build is None:  # collected some other way: build now
        build = request.config.stash[IMAGE_BUILD] = dockerhost.ImageBuild(harness.REPO)
    yield build
    build.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "stops_stack: stops the shared stack; runs after the tests using it")
    config.addinivalue_line("markers", "after_stack: starts its own workers; runs once the shared stack is gone")


@pytest.fixture(scope="session")
def reference_outputs(tmp_path_factory) -> dict:
    """Greedy (and seeded, temperature 1) outputs of one colocated vLLM server (same model
    and drafter, no P/D)."""
    server = harness.start_colocated(tmp_path_factory.mktemp("colocated"), REFERENCE_PORT)
    try:
        with httpx.Client(timeout=120) as client:
            outputs = {
                "completions": [
                    complete(client, server.url, "/v1/completions", completion_body(p)) for p in COMPLETION_PROMPTS
                ],
                "chat": [complete(client, server.url, "/v1/chat/completions", chat_body(m)) for m in CHAT_MESSAGES],
                "seeded": seeded_outputs(client, server.url),
            }
            before = harness.scrape(server.url)
            outputs["acceptance_texts"] = [
                complete(client, server.url, "/v1/completions", acceptance_body(p)) for p in ACCEPTANCE_PROMPTS
            ]
            outputs["acceptance_length"] = acceptance_length(before, harness.scrape(server.url))
            return outputs
    finally:
        server.stop()


@pytest.fixture(scope="session")
def stack(reference_outputs, tmp_path_factory):
    # Depends on reference_outputs only for ordering: the reference server is gone
    # before the stack starts. harness.TEST_STACK_ARGS: chunked prefill, no prefix caching
    # (the drafter-KV negative control re-sends the same prompts), the test hooks on.
    running = harness.start_stack(tmp_path_factory.mktemp("stack"), STACK_BASE_PORT, harness.TEST_STACK_ARGS)
    yield running
    running.stop()


@pytest.fixture
def client():
    with httpx.Client(timeout=120) as http:
        yield http


@pytest.fixture(scope="session")
def fleet_2p1d(tmp_path_factory) -> Fleet:
    """Two prefill workers and one decode worker, shared by FLEET_MODULES (tests/fleet.py).
    The stack is gone by then: those modules are `after_stack`."""
    fleet = start_fleet(tmp_path_factory.mktemp("fleet-2p1d"))
    yield fleet
    fleet.stop()
