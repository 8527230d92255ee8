"""Dtype legalisation for the backend: a node whose lowering lacks its floating dtype (fp16, fp64,
bfloat16, float8 ...) is computed in float32 between casts; low-precision storage dtypes are only
ever moved or cast in C, so every other op on them is computed in float32 (or int64 for int4/int2).

The cast back to the original dtype rounds once, as ONNX Runtime does for fp16 kernels it
upcasts; fp64 nodes lose precision to float32 (within the rtol=1e-3 of the ONNX suites)."""
from __future__ import annotations

from ..ir.graph import LOWP_DTYPES, Node, Value
from ..ir.ops import infer_types

# ops that only move or select elements: raw storage codes pass through them untouched
MOVES = {"reshape", "transpose", "expand", "slice", "concat", "gather", "gather_elements", "where", "cast"}
WIDE = ("float16", "float64") + LOWP_DTYPES
LOWP_INT = ("int4", "uint4", "int2", "uint2")


def _compute_dtype(dt):
    return "int64" if dt in LOWP_INT else "float32"


def _needs(node, backend):
    dts = {v.dtype for v in node.inputs if v is not None} | {o.dtype for o in node.outputs}
    if not dts & set(WIDE) or node.op == "cast":
        return False
    if dts & set(LOWP_DTYPES) and node.op not in MOVES:
        return True
    return node.op in backend.ops and backend.supports(node) is not None


def run(graph, backend):
    """backend: what the code generator lowers (passes/backend.py)."""
    nodes = []
    narrowed = []                 # float64 ops computed in float32: lossy, so the user is told
    for n in graph.nodes:
        if not _needs(n, backend):
            nodes.append(n)
            continue
        ins = []
        for v in n.inputs:
            if v is not None and v.dtype in WIDE:
                c = Value(infer_types("cast", [v.type], {"to": _compute_dtype(v.dtype)})[0])
                nodes.append(Node("cast", [v], {"to": _compute_dtype(v.dtype), "saturate": True}, [c], n.loc))
                v = c
            ins.append(v)
        attrs = dict(n.attrs)
        for k, a in attrs.items():
            if isinstance(a, str) and a in WIDE:
                attrs[k] = _compute_dtype(a)
        try:
            types = infer_types(n.op, [None if i is None else i.type for i in ins], attrs, ins)
        except Exception:  # noqa: BLE001 - the op does not accept the wider dtype: leave the node alone
            nodes.append(n)
            continue
        outs = []
        for o, t in zip(n.outputs, types):
            if t.dtype == o.dtype:
                outs.append(o)
                continue
            tmp = Value(t)
            outs.append(tmp)
        nodes.append(Node(n.op, ins, attrs, outs, n.loc))
        if any(v is not None and v.dtype == "float64" for v in list(n.inputs) + list(n.outputs)):
            narrowed.append(n.op)
        for o, tmp in zip(n.outputs, outs):
            if tmp is not o:
                nodes.append(Node("cast", [tmp], {"to": o.dtype, "saturate": True}, [o], n.loc))
    graph.nodes = nodes
    if narrowed:
        import warnings

        from ..errors import PrecisionWarning
        warnings.warn(f"cuvil: {len(narrowed)} float64 op(s) have no float64 kernel and run in float32: "
                      f"{', '.join(sorted(set(narrowed)))}", PrecisionWarning, stacklevel=2)
    return graph
