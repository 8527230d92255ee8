"""Low-precision storage dtypes (bfloat16, float8, float4, int4, int2) and the dtype legalisation pass."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.codegen.c import C_BACKEND
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.passes import legalize

from .util import compile_graph

ml_dtypes = pytest.importorskip("ml_dtypes", reason="numpy has no bfloat16 / float8 without it")

FLOATS = ["bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"]
INTS = ["int4", "uint4", "int2", "uint2"]


def _graph(op, in_types, attrs):
    g = Graph()
    g.inputs = [Value(TensorType(s, d)) for s, d in in_types]
    g.outputs = [g.add(op, g.inputs, dict(attrs))]
    return g


def _edge_values():
    r = np.random.default_rng(0)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-9, -1e-9, 0.3, 448.0, 449.0, 464.0, 465.0, 57344.0,
               61440.0, 1e6, -1e6, 6.0, 7.0, 0.25, 0.75, 2.5, -3.5]
    return np.concatenate([np.array(special, np.float32), r.standard_normal(200).astype(np.float32) * 8])


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("sat", [True, False])
def test_float_to_lowp_matches_reference(dt, sat):
    """C conversions (kernels/lowp.h) agree bit for bit with the numpy reference (ml_dtypes + ONNX rules)."""
    from cuvil.ir.ops.elementwise import _cast_ref
    x = _edge_values()
    cm = compile_graph(_graph("cast", [(x.shape, "float32")], {"to": dt, "saturate": sat}))
    got = cm.run(x)[0]
    want = _cast_ref([x], {"to": dt, "saturate": sat})
    assert got.dtype == np.dtype(dt)
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_array_equal(g[~np.isnan(g)], w[~np.isnan(w)])


@pytest.mark.parametrize("dt", FLOATS + INTS)
def test_lowp_round_trip(dt):
    """lowp -> float32 decodes every code; lowp -> int64 for the integer formats."""
    n = 16 if dt.startswith("float4") or dt.endswith(("4", "2")) else 256
    codes = np.arange(n, dtype=np.uint8)
    if dt in ("int4", "uint4"):
        codes = codes[:16]
    elif dt in ("int2", "uint2"):
        codes = codes[:4]
    x = codes.view(np.dtype(dt)) if dt != "bfloat16" else np.arange(0, 65536, 97, dtype=np.uint16).view(np.dtype(dt))
    to = "int64" if dt in INTS else "float32"
    cm = compile_graph(_graph("cast", [(x.shape, dt)], {"to": to}))
    got = cm.run(x)[0]
    want = x.astype(to)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", INTS)
def test_int_to_lowp_int_wraps(dt):
    from cuvil.ir.ops.elementwise import _cast_ref
    x = np.array([-10.7, -8.5, -2.2, -1.0, 0.0, 1.9, 3.0, 7.6, 9.0, 100.0], np.float32)
    cm = compile_graph(_graph("cast", [(x.shape, "float32")], {"to": dt}))
    np.testing.assert_array_equal(cm.run(x)[0].astype(np.int64), _cast_ref([x], {"to": dt}).astype(np.int64))


def test_legalize_wraps_unsupported_dtypes_in_float32():
    """softmax has no fp16 kernel: legalize computes it in float32 between casts; bf16 add likewise."""
    g = _graph("softmax", [((2, 5), "float16")], {"axis": 1})
    g = legalize.run(g, C_BACKEND)
    assert [n.op for n in g.nodes] == ["cast", "softmax", "cast"]
    assert g.nodes[1].inputs[0].dtype == "float32" and g.outputs[0].dtype == "float16"
    g = legalize.run(_graph("add", [((3,), "bfloat16"), ((3,), "bfloat16")], {}), C_BACKEND)
    assert [n.op for n in g.nodes] == ["cast", "cast", "add", "cast"]
    g = legalize.run(_graph("transpose", [((3, 2), "bfloat16")], {"perm": (1, 0)}), C_BACKEND)
    assert [n.op for n in g.nodes] == ["transpose"]          # data movement keeps the raw codes
    g = legalize.run(_graph("softmax", [((2, 5), "float32")], {"axis": 1}), C_BACKEND)
    assert [n.op for n in g.nodes] == ["softmax"]


def test_bf16_softmax_runs():
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(ml_dtypes.bfloat16)
    cm = compile_graph(_graph("softmax", [(x.shape, "bfloat16")], {"axis": 1}))
    got = cm.run(x)[0]
    assert got.dtype == x.dtype
    xf = x.astype(np.float32)
    e = np.exp(xf - xf.max(1, keepdims=True))
    np.testing.assert_allclose(got.astype(np.float32), (e / e.sum(1, keepdims=True)), rtol=1e-2, atol=1e-3)
