"""Dead code elimination and common subexpression elimination."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph


def dce(graph):
    live = {id(o) for o in graph.outputs}
    kept = []
    for n in reversed(graph.nodes):
        if n.op == "bind_dim" or any(id(o) in live for o in n.outputs):     # bind_dim sets a symbol too
            kept.append(n)
            live.update(id(i) for i in n.inputs if i is not None)
    graph.nodes = kept[::-1]
    return graph


def _attr_key(v):
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, dict):   # e.g. the per-step attrs in a fused_pointwise body
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    if isinstance(v, Graph):      # a region: equal only to itself
        return ("region", id(v))
    return str(v) if hasattr(v, "free_symbols") else v


def _const_key(v):
    d = v.data
    return ("const", d.dtype.str, d.shape, d.tobytes()) if d.size <= 64 else ("big", id(v))


def replace_uses(graph, mapping):
    """Rewire every use of a value to its replacement {id(old): new}."""
    if not mapping:
        return graph
    for n in graph.nodes:
        n.inputs = [mapping.get(id(i), i) if i is not None else None for i in n.inputs]
    graph.outputs = [mapping.get(id(o), o) for o in graph.outputs]
    return graph


def cse(graph):
    seen, mapping, kept = {}, {}, []
    consts = {}
    for n in graph.nodes:
        ins = []
        for i in n.inputs:
            i = mapping.get(id(i), i) if i is not None else None
            if i is not None and i.is_const:
                i = consts.setdefault(_const_key(i), i)
            ins.append(i)
        n.inputs = ins
        key = (n.op, tuple(id(i) for i in ins), tuple(sorted((k, _attr_key(v)) for k, v in n.attrs.items())))
        if key in seen:
            for a, b in zip(n.outputs, seen[key].outputs):
                mapping[id(a)] = b
            continue
        seen[key] = n
        kept.append(n)
    graph.nodes = kept
    graph.outputs = [mapping.get(id(o), o) for o in graph.outputs]
    return graph


def run(graph):
    return dce(cse(dce(graph)))


__all__ = ["dce", "cse", "run", "replace_uses", "np"]
