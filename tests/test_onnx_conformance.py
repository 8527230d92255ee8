"""The ONNX backend node tests under pytest.

What runs here: the node tests of the op types exporters emit for CNNs and transformers
(onnx_conformance.EXPORTER_OPS), without their `_expanded` twins, split into shards so pytest -n 2
spreads them over both cores (~a few minutes in all). The whole suite (every node test, expanded
variants included) runs with `python -m tests.onnx_conformance`, or here with CUVIL_ONNX_FULL=1.

Known failures are data, in tests/onnx_known_failures.json ({test, reason}); a test listed there
that passes fails its shard so the list gets trimmed.
"""
from __future__ import annotations

import os
import zlib

import pytest

pytest.importorskip("onnx", reason="the conformance cases are the onnx package's node tests")

from . import onnx_conformance as oc  # noqa: E402

SHARDS = 8
FULL = bool(os.environ.get("CUVIL_ONNX_FULL"))


def _selected():
    cases = oc.load_cases()
    ops = oc.op_of(cases)
    names = []
    for c in cases:
        if FULL or (ops[c.name] in oc.EXPORTER_OPS and "_expanded" not in c.name):
            names.append(c.name)
    return names


@pytest.fixture(scope="module")
def selected():
    return _selected()


def _shard(name):
    return zlib.crc32(name.encode()) % SHARDS


def test_known_failures_file_is_well_formed():
    entries = oc.json.loads(oc.KNOWN_FAILURES.read_text())
    assert isinstance(entries, list)
    seen = set()
    for e in entries:
        assert set(e) == {"test", "reason"} and e["reason"], e
        assert e["test"] not in seen, f"{e['test']} listed twice"
        seen.add(e["test"])


@pytest.mark.parametrize("shard", range(SHARDS))
def test_onnx_node_tests(shard, selected):
    names = [n for n in selected if _shard(n) == shard]
    results = oc.run(names=names, jobs=1)
    known = oc.load_known_failures()
    unexpected = sorted(f"{n}: {r.status}: {r.reason}" for n, r in results.items()
                        if r.status != "pass" and n not in known)
    fixed = sorted(n for n, r in results.items() if r.status == "pass" and n in known)
    msg = []
    if unexpected:
        msg.append(f"{len(unexpected)} node test(s) fail that are not known failures:\n  " + "\n  ".join(unexpected))
    if fixed:
        msg.append(f"{len(fixed)} known failure(s) now pass; remove them from {oc.KNOWN_FAILURES.name}:\n  "
                   + "\n  ".join(fixed))
    assert not msg, "\n".join(msg)
    assert len(results) == len(names)
