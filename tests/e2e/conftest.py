"""Fixtures of the end-to-end tests only."""

from __future__ import annotations

import pytest

from tests import harness


@pytest.fixture(scope="session", autouse=True)
def shared_engine_cache(tmp_path_factory):
    """One engine cache for every worker the session starts (`engine_cache_dir`), set in the
    environment the stacks inherit: on two cores each worker after the first starts about
    15 s sooner, its model classes' inspection read from the cache instead of redone in a
    subprocess. Only the end-to-end session: the unit tests read the defaults."""
    folder = tmp_path_factory.mktemp("engine-cache")
    with pytest.MonkeyPatch.context() as patch:
        for name in harness.ENGINE_CACHE_ENV:
            patch.setenv(name, str(folder))
        yield folder
