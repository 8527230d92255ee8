"""Shared test fixtures: a per-session compile cache so tests never touch the user's cache."""
import atexit
import os
import shutil
import tempfile

import pytest

# made once, by the process that starts the run (xdist workers inherit it), and removed when that
# process exits: every run used to leave its compiled artifacts in /tmp
if "CUVIL_CACHE_DIR" not in os.environ:
    os.environ["CUVIL_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuvil-test-cache-")
    atexit.register(shutil.rmtree, os.environ["CUVIL_CACHE_DIR"], ignore_errors=True)

# Graph.verify() after every pass (passes/pipeline.py), here and in the subprocesses tests start
os.environ.setdefault("CUVIL_VERIFY_PASSES", "1")


@pytest.fixture(scope="session")
def cache_dir():
    return os.environ["CUVIL_CACHE_DIR"]
