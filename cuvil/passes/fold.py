"""Constant folding through the reference interpreter: a node whose inputs are all constants
(and whose output has static shape) becomes a constant."""
from __future__ import annotations

from ..ir import dims as D
from ..ir.interpreter import run_node
from .cleanup import replace_uses

MAX_FOLD_BYTES = 1 << 28   # never materialise more than 256 MiB for one folded value...


def _fold_bytes_allowed(n, size):
    """...unless it is no larger than the constants it is computed from (a transpose of a big weight:
    VGG's 25088 x 4096 classifier, 411 MB, was transposed at every call, 0.9 s)."""
    return size <= MAX_FOLD_BYTES or size <= sum(i.type.itemsize * D.prod(i.type.shape) for i in n.inputs
                                                  if i is not None)


def run(graph):
    mapping = {}
    kept = []
    for n in graph.nodes:
        n.inputs = [mapping.get(id(i), i) if i is not None else None for i in n.inputs]
        foldable = n.inputs and all(i is None or i.is_const for i in n.inputs) or n.op in ("iota", "full")
        static = all(D.shape_static(o.type.shape) for o in n.outputs) and not any(
            hasattr(v, "free_symbols") for v in _flat(n.attrs.values()))
        size = sum(D.prod(o.type.shape) * o.type.itemsize for o in n.outputs) if static else 0
        if foldable and static and _fold_bytes_allowed(n, size):
            try:
                results = run_node(n, [None if i is None else i.data for i in n.inputs], {})
            except Exception:  # noqa: BLE001 - a node that fails to fold stays and fails at run time
                kept.append(n)
                continue
            for o, r in zip(n.outputs, results):
                o.data = r
                o.producer = None
                mapping[id(o)] = o
            continue
        kept.append(n)
    graph.nodes = kept
    return replace_uses(graph, {})


def _flat(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x
