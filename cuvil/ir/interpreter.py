"""Numpy reference executor: runs a Graph op by op with each op's reference implementation."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from . import dims as D
from .ops import REGIONS, REGISTRY

MAX_LOOP_STEPS = 1 << 24       # a while_loop the reference runs longer than this is a ShapeError, not a hang


def bind_symbols(graph, arrays) -> dict:
    """Symbol values {name: int} read off the input arrays; checks static dims and bounds."""
    env: dict = {}
    for v, a in zip(graph.inputs, arrays):
        if a.ndim != v.type.rank:
            raise ShapeError(f"input {v.name}: expected rank {v.type.rank} {v.type}, got shape {a.shape}")
        for i, (d, n) in enumerate(zip(v.type.shape, a.shape)):
            if isinstance(d, int):
                if d != n:
                    raise ShapeError(f"input {v.name}: expected shape {v.type}, got {a.shape} (dim {i})")
            elif getattr(d, "is_Symbol", False):
                if env.setdefault(d.name, n) != n:
                    raise ShapeError(f"input {v.name}: dim {i} is {d} = {env[d.name]} elsewhere, got {n}")
    for name, (lo, hi) in graph.symbols.items():
        if name in env and not lo <= env[name] <= hi:
            raise ShapeError(f"dynamic dim {name} = {env[name]} is outside its bounds [{lo}, {hi}]")
    return env


def concrete_attrs(attrs: dict, env: dict) -> dict:
    def ev(x):
        if isinstance(x, (list, tuple)):
            return type(x)(ev(y) for y in x)
        if hasattr(x, "free_symbols"):
            return D.evaluate(x, env)
        return x
    return {k: ev(v) for k, v in attrs.items()}


def _run_region(node, arrays):
    """cond, while_loop and batch_map: their subgraphs, run by this interpreter."""
    a = node.attrs
    if node.op == "batch_map":
        images = [run(a["body_graph"], *(x[i:i + 1] for x in arrays)) for i in range(arrays[0].shape[0])]
        return [np.concatenate(outs) for outs in zip(*images)]
    if node.op == "cond":
        return run(a["then_graph"] if bool(arrays[0].reshape(-1)[0]) else a["else_graph"], *arrays[1:])
    n, carried, extra = a["carried"], list(arrays[:a["carried"]]), list(arrays[a["carried"]:])
    for _ in range(MAX_LOOP_STEPS):
        if not bool(run(a["cond_graph"], *carried, *extra)[0].reshape(-1)[0]):
            return carried
        carried = run(a["body_graph"], *carried, *extra)[:n]
    raise ShapeError(f"while_loop ran {MAX_LOOP_STEPS} steps without its condition turning false")


def run_node(node, arrays, env):
    if node.op in REGIONS:
        outs = _run_region(node, arrays)
        return [np.asarray(o, dtype=v.dtype) for o, v in zip(outs, node.outputs)]
    if node.op == "bind_dim":             # a data-dependent dim: later nodes' attrs read its value
        count, bound = int(arrays[1]), arrays[0].shape[node.attrs["axis"]]
        if not 0 <= count <= bound:
            raise ShapeError(f"data-dependent dim {node.attrs['symbol']} = {count} is outside [0, {bound}]")
        env[node.attrs["symbol"]] = count
    out = REGISTRY[node.op].ref(arrays, concrete_attrs(node.attrs, env))
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o, dtype=v.dtype) for o, v in zip(outs, node.outputs)]


def run(graph, *arrays, observe=None) -> list[np.ndarray]:
    """The graph's outputs on `arrays`; observe(node, input_arrays), where given, sees each node's
    inputs before it runs (calibration, passes/quantize.py)."""
    arrays = [np.asarray(a) for a in arrays]
    if len(arrays) != len(graph.inputs):
        raise ShapeError(f"expected {len(graph.inputs)} inputs, got {len(arrays)}")
    for v, a in zip(graph.inputs, arrays):
        if str(a.dtype) != v.dtype:
            raise ShapeError(f"input {v.name}: expected dtype {v.dtype}, got {a.dtype}")
    env = bind_symbols(graph, arrays)
    vals = {id(v): a for v, a in zip(graph.inputs, arrays)}

    def get(v):
        if v is None:
            return None
        return v.data if v.is_const else vals[id(v)]
    for n in graph.nodes:
        ins = [get(i) for i in n.inputs]
        if observe is not None:
            observe(n, ins)
        for o, r in zip(n.outputs, run_node(n, ins, env)):
            vals[id(o)] = r
    return [get(o) for o in graph.outputs]
