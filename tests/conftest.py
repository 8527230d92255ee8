"""Shared test fixtures: a per-session compile cache so tests never touch the user's cache."""
import os
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="cuvil-test-cache-")
os.environ.setdefault("CUVIL_CACHE_DIR", _CACHE)


@pytest.fixture(scope="session")
def cache_dir():
    return os.environ["CUVIL_CACHE_DIR"]
