"""Ops that passes create (fusion groups) and composites that frontends emit whole:
matmul with its epilogue, attention, and a chain of pointwise ops run as one loop.
Each keeps a numpy reference, so fused graphs are checked against unfused ones."""
from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from .. import dims as D
from ..types import TensorType
from .registry import REGISTRY, OpDef, declare
from ._shape import broadcast

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "relu6", "hardswish")


def apply_act(y, act):
    if act == "none":
        return y
    return REGISTRY[act].ref([y], {})


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_range(op: str, attrs: dict, key: str = "int8_range"):
    """An integer kernel's input range attribute (conv's and the matmuls' int8_range, conv's int8_out_range):
    None, or [lo, hi], two floats within float32's range, lo <= hi (it reaches C as a packed constant)."""
    r = attrs.get(key)
    if r is not None and not (isinstance(r, (list, tuple)) and len(r) == 2       # types first: "a" <= 1 raises
                              and all(isinstance(v, float) and abs(v) <= _FLOAT32_MAX for v in r) and r[0] <= r[1]):
        raise ShapeError(f"{op}: {key} {r!r} is None or [lo, hi], two floats within float32's range, lo <= hi")


# ---- matmul + epilogue: act(alpha * a @ b + bias + residual) -----------------------------------
def _mm_fused_infer(types, attrs, inputs):
    (out,) = REGISTRY["matmul"].infer(types[:2], {"int8_range": attrs.get("int8_range")}, None)
    if attrs["act"] not in ACTIVATIONS:
        raise ShapeError(f"matmul_fused: act {attrs['act']!r} not one of {ACTIVATIONS}")
    bias = types[2] if len(types) > 2 else None
    res = types[3] if len(types) > 3 else None
    if bias is not None and (bias.rank != 1 or not D.dims_equal(bias.shape[0], out.shape[-1])):
        raise ShapeError(f"matmul_fused: bias {bias} must be [N] with N = {out.shape[-1]}")
    if res is not None and (res.rank != out.rank or not all(D.dims_equal(a, b) for a, b in zip(res.shape, out.shape))):
        raise ShapeError(f"matmul_fused: residual {res} must have the output's shape {out}")
    return [out]


def _mm_fused_ref(xs, a):
    y = REGISTRY["matmul"].ref(xs[:2], {}).astype(np.float64) * a["alpha"]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    if len(xs) > 3 and xs[3] is not None:
        y = y + xs[3]
    return apply_act(y.astype(xs[0].dtype), a["act"])


# int8_range (matmul's too): the range of a quantized model's activation grid that x lies on (a QDQ or
# PT2E model's); precision="int8" multiplies x on those very bytes (passes/quantize.py). The reference
# ignores it.
declare(OpDef("matmul_fused", {"act": "none", "alpha": 1.0, "int8_range": None}, _mm_fused_infer, _mm_fused_ref,
              kind="matmul"))


# ---- attention: softmax(q k^T * scale + mask) v, with grouped KV heads ------------------------
# Rank-4 operands are [batch, heads, seq, dim] ("bhsd"); a pass may set a layout attr to "bshd"
# when the tensor arrives (or leaves) as [batch, seq, heads, dim], saving the transpose copies.
LAYOUTS = ("bhsd", "bshd")


def _to_bhsd(t, layout):
    """TensorType or array in `layout` -> the bhsd view."""
    if layout == "bhsd":
        return t
    if isinstance(t, np.ndarray):
        return np.swapaxes(t, 1, 2)
    s = t.shape
    return TensorType((s[0], s[2], s[1], s[3]), t.dtype)


def _attention_infer(types, attrs, inputs):
    for k in ("layout_q", "layout_k", "layout_v", "layout_out"):
        if attrs[k] not in LAYOUTS:
            raise ShapeError(f"attention: {k}={attrs[k]!r} not one of {LAYOUTS}")
        if attrs[k] != "bhsd" and types[0].rank != 4:
            raise ShapeError(f"attention: {k}={attrs[k]!r} needs rank-4 operands")
    q, k, v = (_to_bhsd(t, attrs[n]) for t, n in zip(types[:3], ("layout_q", "layout_k", "layout_v")))
    for t in (q, k, v):
        if t.rank < 2 or not t.dtype.startswith(("float", "bfloat")):
            raise ShapeError(f"attention: q, k, v must be float tensors of rank >= 2, got {t}")
    if not (q.rank == k.rank == v.rank):
        raise ShapeError(f"attention: q {q}, k {k}, v {v} ranks differ")
    if not D.dims_equal(q.shape[-1], k.shape[-1]) or not D.dims_equal(k.shape[-2], v.shape[-2]):
        raise ShapeError(f"attention: q {q}, k {k}, v {v} do not fit")
    if q.rank >= 3:
        hq, hk = q.shape[-3], k.shape[-3]
        if isinstance(hq, int) and isinstance(hk, int) and hq % hk:
            raise ShapeError(f"attention: {hq} query heads are not a multiple of {hk} key/value heads")
    if len(types) > 3 and types[3] is not None:
        m = types[3]
        broadcast(m.shape, q.shape[:-1] + (k.shape[-2],))
    return [_to_bhsd(TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype), attrs["layout_out"])]


def _attention_ref(xs, a):
    q, k, v = (_to_bhsd(x, a[n]).astype(np.float64) for x, n in zip(xs[:3], ("layout_q", "layout_k", "layout_v")))
    mask = xs[3] if len(xs) > 3 else None
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * a["scale"]
    if a["causal"]:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    p = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)   # a fully masked row attends to nothing
    return np.ascontiguousarray(_to_bhsd(p @ v, a["layout_out"])).astype(xs[0].dtype)


declare(OpDef("attention", {"scale": 1.0, "causal": False, "layout_q": "bhsd", "layout_k": "bhsd",
                            "layout_v": "bhsd", "layout_out": "bhsd"}, _attention_infer, _attention_ref, kind="attention"))


# ---- a pointwise chain as one loop -------------------------------------------------------
# body: tuple of steps (op, args, attrs); an arg is ("in", i) for the node's i-th input or
# ("t", j) for step j's result. The last step is the output.
def _steps_types(types, body):
    res = []
    for op, args, attrs in body:
        ts = [types[i] if kind == "in" else res[i] for kind, i in args]
        res.append(REGISTRY[op].infer(ts, dict(attrs), None)[0])
    return res


# views: per input, () or a slice's (axis, start, step, length): the loop reads that input through
# the slice's strides instead of a copy of it (passes/fuse.py, read_slices_in_place)
def _viewed(xs, attrs, fn):
    views = attrs.get("views") or ()
    return [fn(x, dict(zip(("axis", "start", "step", "length"), views[i]))) if i < len(views) and views[i] else x
            for i, x in enumerate(xs)]


def pointwise_input_types(types, attrs):
    """The types a fused_pointwise loop reads its inputs as (each view applied)."""
    return _viewed(types, attrs, lambda t, a: REGISTRY["slice"].infer([t], a, None)[0])


def _fused_infer(types, attrs, inputs):
    types = pointwise_input_types(types, attrs)
    body = attrs["body"]
    if not body:
        raise ShapeError("fused_pointwise: empty body")
    for op, _, _ in body:
        if REGISTRY[op].kind not in ("unary", "binary", "where", "cast"):
            raise ShapeError(f"fused_pointwise: {op} is not pointwise")
    return [_steps_types(types, body)[-1]]


def _fused_ref(xs, attrs):
    xs = _viewed(xs, attrs, lambda x, a: REGISTRY["slice"].ref([x], a))
    res = []
    for op, args, a in attrs["body"]:
        res.append(REGISTRY[op].ref([xs[i] if kind == "in" else res[i] for kind, i in args], dict(a)))
    return res[-1]


declare(OpDef("fused_pointwise", {"body": (), "views": ()}, _fused_infer, _fused_ref, kind="fused"))

__all__ = ["ACTIVATIONS", "apply_act", "math"]
