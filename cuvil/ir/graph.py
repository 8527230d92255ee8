"""The IR: a Graph of Nodes over Values, each Value typed by a TensorType."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError
from . import dims as D
from .ops import REGISTRY, infer_types
from .types import DTYPES, LOWP_DTYPES, TensorType  # noqa: F401  (re-exported: the IR's types, as ir.graph names them)

_ids = itertools.count()


class Value:
    """An SSA value. Constants carry their numpy `data`."""

    def __init__(self, type: TensorType, name: str | None = None, data: np.ndarray | None = None):
        self.type = type
        self.name = name or f"v{next(_ids)}"
        self.data = data
        self.producer: Node | None = None
        # how C stores it: "nchw" (row-major, as its logical shape) or a channel-blocked "nchw<B>c"
        # (ir/ops/movement.py LAYOUTS), set by passes/layout.py
        self.layout = "nchw"

    @property
    def is_const(self):
        return self.data is not None

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    def __repr__(self):
        return f"%{self.name}:{self.type}"


class Node:
    def __init__(self, op: str, inputs: list, attrs: dict, outputs: list[Value], loc: str | None = None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.outputs = list(outputs)
        self.loc = loc
        for o in self.outputs:
            o.producer = self

    def __repr__(self):
        outs = ", ".join(repr(o) for o in self.outputs)
        ins = ", ".join("None" if i is None else f"%{i.name}" for i in self.inputs)
        attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs.items() if v is not None)   # None: unset
        return f"{outs} = {self.op}({ins}{'; ' + attrs if attrs else ''})"


def _fmt_attr(v):
    if isinstance(v, Graph):      # a region: printed below its node (Graph.__str__)
        return f"<region of {len(v.nodes)} nodes>"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_attr(x) for x in v) + "]"
    return str(v)


@dataclass
class Graph:
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    symbols: dict = field(default_factory=dict)       # name -> (min, max)
    # [(a, b, most)]: symbols a and b whose product is at most `most` (an LLM step's rows x tokens: the
    # memory plan sizes its buffers by it, and a run with more is refused)
    symbol_products: list = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    # indices of inputs / outputs the caller sees as complex: their Values hold (real, imaginary)
    # pairs in a trailing axis of 2, the same bytes as numpy's complex64 / complex128
    complex_inputs: set = field(default_factory=set)
    complex_outputs: set = field(default_factory=set)
    # indices of 0-d outputs the source model returned as python numbers (x.item(), a size)
    scalar_outputs: set = field(default_factory=set)
    # name -> (first output, count): a sequence the source model returns, one output per element
    sequence_outputs: dict = field(default_factory=dict)

    # ---- construction -------------------------------------------------
    def const(self, array, name=None) -> Value:
        a = np.asarray(array)
        a = a if a.flags.c_contiguous else a.copy(order="C")   # (ascontiguousarray would make 0-d 1-d)
        return Value(TensorType(a.shape, str(a.dtype)), name=name, data=a)

    def add(self, op: str, inputs: list, attrs: dict | None = None, loc: str | None = None):
        """Append a node; output types come from the op registry. Returns the Value (or list)."""
        attrs = attrs or {}
        types = infer_types(op, [None if i is None else i.type for i in inputs], attrs, inputs)
        outs = [Value(t) for t in types]
        self.nodes.append(Node(op, inputs, attrs, outs, loc))
        return outs[0] if len(outs) == 1 else outs

    # ---- queries ------------------------------------------------------
    def data_dims(self) -> list[str]:
        """The dim symbols computed at run time (bind_dim: nonzero's count, unique's size), in order."""
        seen: dict = {}
        for n in self.nodes:
            if n.op == "bind_dim":
                seen.setdefault(n.attrs["symbol"], None)
        return list(seen)

    def constants(self) -> list[Value]:
        seen, out = set(), []
        for v in itertools.chain((i for n in self.nodes for i in n.inputs), self.outputs):
            if v is not None and v.is_const and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    def users(self) -> dict:
        u: dict = {}
        for n in self.nodes:
            for i in n.inputs:
                if i is not None:
                    u.setdefault(id(i), []).append(n)
        return u

    def __str__(self):
        sym = ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in self.symbols.items())
        lines = [f"graph({', '.join(repr(i) for i in self.inputs)})" + (f"  where {sym}" if sym else "")]
        for c in self.constants():
            preview = np.array2string(c.data.ravel()[:4], precision=4, separator=",") if c.data.size <= 4 \
                else f"<{c.data.size} elements>"
            lines.append(f"  %{c.name}:{c.type} = const {preview}")
        for n in self.nodes:
            lines.append(f"  {n}")
            for k, sub in regions(n):
                lines += [f"    {k}: " + ln if i == 0 else "    " + ln for i, ln in enumerate(str(sub).splitlines())]
        lines.append(f"  return {', '.join('%' + o.name for o in self.outputs)}")
        return "\n".join(lines)

    def verify(self):
        """Well-formedness: topological order, unique producers, types agree with the registry."""
        defined = {id(v) for v in self.inputs}
        names = set()
        for v in self.inputs:
            if v.name in names:
                raise GraphError(f"duplicate value name {v.name}")
            names.add(v.name)
        for n in self.nodes:
            if n.op not in REGISTRY:
                raise GraphError(f"unknown op {n.op!r}")
            for i in n.inputs:
                if i is not None and not i.is_const and id(i) not in defined:
                    raise GraphError(f"{n}: input %{i.name} used before it is defined")
            expect = infer_types(n.op, [None if i is None else i.type for i in n.inputs], n.attrs, n.inputs)
            for o, t in zip(n.outputs, expect):
                if o.type.dtype != t.dtype or len(o.type.shape) != len(t.shape) or not all(
                        D.dims_equal(a, b) for a, b in zip(o.type.shape, t.shape)):
                    raise GraphError(f"{n}: output type {o.type} but the registry infers {t}")
            for o in n.outputs:
                if id(o) in defined:
                    raise GraphError(f"value %{o.name} defined twice")
                defined.add(id(o))
            for _, sub in regions(n):
                sub.verify()
        for o in self.outputs:
            if not o.is_const and id(o) not in defined:
                raise GraphError(f"output %{o.name} is never defined")
        return self


def regions(node):
    """(attribute, Graph) of each subgraph a node holds (cond's branches, while_loop's cond and body,
    batch_map's body)."""
    return [(k, v) for k, v in node.attrs.items() if isinstance(v, Graph)]


def nodes_within(graph):
    """The graph's nodes, each followed by those of the regions it holds, depth first."""
    for n in graph.nodes:
        yield n
        for _, sub in regions(n):
            yield from nodes_within(sub)
