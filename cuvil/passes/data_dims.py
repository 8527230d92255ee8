"""Checks on the dims a run computes from the data (bind_dim's symbols) before a graph is planned:
buffers are planned, and outputs allocated, at each symbol's upper bound, so every size must grow with
it (n - k with k computed would be planned at its smallest); and a symbol is set in the top-level code
only (a bind_dim inside a cond / loop region is refused)."""
from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import dims as D
from ..ir.graph import Graph


def _regions(graph):
    for n in graph.nodes:
        for v in n.attrs.values():
            if isinstance(v, Graph):
                yield v
                yield from _regions(v)


def check(graph) -> None:
    computed = set(graph.data_dims())
    problems = []
    if any(n.op == "bind_dim" for r in _regions(graph) for n in r.nodes):
        problems.append(("a size computed from the data inside a torch.cond / while_loop / If / Loop body", None))
    if computed:
        values = list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]
        for v in values:
            for d in v.type.shape:
                for s in D.symbols_of(d) & computed:
                    hi = {k: b[1] for k, b in graph.symbols.items()}
                    if D.evaluate(d, dict(hi, **{s: 0})) > D.evaluate(d, hi):
                        problems.append((f"a size ({d}) that shrinks as the data-dependent size {s} grows: "
                                         "buffers are planned at its upper bound", None))
    if problems:
        raise UnsupportedOpError(list(dict.fromkeys(problems)))
