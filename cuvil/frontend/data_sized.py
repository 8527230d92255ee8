"""Results whose size depends on the input's values, shared by the frontends (torch's nonzero / x[mask] /
unique, ONNX's NonZero / Compress / Unique): each is computed padded to its bound with a count beside
it, and the bind_dim op cuts it to the count, naming that dim with a symbol set at run time.

add(op, inputs, attrs) and const(array) build the frontend's IR nodes."""
from __future__ import annotations

import numpy as np


def compact(add, const, hit):
    """hit [n] bool -> (the positions of its true entries in order, padded to n with 0; their count, 0-d
    int64): each hit's running count is its row, the misses go to a spare row n."""
    n = hit.shape[0]
    if n == 0:
        return const(np.zeros(0, np.int64)), const(np.int64(0))
    order = add("cumsum", [add("cast", [hit], {"to": "int64"})], {"axis": 0})
    count = add("reshape", [add("slice", [order], {"axis": 0, "start": n - 1, "step": 1, "length": 1})], {"shape": []})
    row = add("where", [hit, add("sub", [order, const(np.int64(1))]), const(np.int64(n))])
    pos = add("scatter_elements", [const(np.zeros(n + 1, np.int64)), row, const(np.arange(n, dtype=np.int64))],
              {"axis": 0, "reduction": "none"})
    return add("slice", [pos], {"axis": 0, "start": 0, "step": 1, "length": n}), count


def runs(add, const, vals):
    """vals [n], equal values adjacent -> (first: [n] bool, where a run starts; run: [n] int64, each
    entry's run index)."""
    n = vals.shape[0]
    prev = add("slice", [vals], {"axis": 0, "start": 0, "step": 1, "length": n - 1})
    rest = add("slice", [vals], {"axis": 0, "start": 1, "step": 1, "length": n - 1})
    first = add("concat", [const(np.ones(1, bool)), add("ne", [rest, prev])], {"axis": 0})
    run = add("sub", [add("cumsum", [add("cast", [first], {"to": "int64"})], {"axis": 0}), const(np.int64(1))])
    return first, run


def bind(add, graph, padded, count, axis, name):
    """padded cut to count along axis, that dim the symbol `name`, bounded by the padded size."""
    bound = padded.shape[axis]
    graph.symbols[name] = (0, max(bound, graph.symbols.get(name, (0, 0))[1]))
    return add("bind_dim", [padded, count], {"symbol": name, "axis": axis})


def fresh_symbol(graph, stem="data_dim") -> str:
    k = 0
    while f"{stem}{k}" in graph.symbols:
        k += 1
    return f"{stem}{k}"
