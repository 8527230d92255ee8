"""Fusion groups (DESIGN "Passes"): GEMM and conv with their epilogues (bias, residual add,
activation, scale), attention reading and writing [batch, seq, heads, dim] directly, and
chains of pointwise ops run as one loop.

fusion_level 1: epilogues. 2 and 3: also attention layouts and pointwise chains."""
from __future__ import annotations

from ..ir import dims as D
from ..ir.graph import Node, Value
from ..ir.ops import REGISTRY
from ..ir.ops.fused import ACTIVATIONS
from .cleanup import dce

POINTWISE_KINDS = ("unary", "binary", "where", "cast")


class _Uses:
    def __init__(self, graph):
        self.users = graph.users()
        self.outs = {id(o) for o in graph.outputs}

    def only_user(self, v):
        """The single node using v, if v has exactly one use and is not a graph output."""
        u = self.users.get(id(v), [])
        return u[0] if len(u) == 1 and id(v) not in self.outs and u[0].inputs.count(v) == 1 else None


def _same_shape(a, b):
    return a.type.rank == b.type.rank and all(D.dims_equal(x, y) for x, y in zip(a.shape, b.shape))


def _bias_vector(graph, c, n):
    """A constant broadcast along all but the last dim, as a 1-D [n] constant (or None)."""
    if not c.is_const or c.data.ndim == 0 or c.data.shape[-1] != n or c.data.size != n:
        return None
    return graph.const(c.data.reshape(n))


def _other(add, v):
    a, b = add.inputs
    return b if a is v else a


def _residual_then_activation(uses, u, y, chain):
    """Extend an epilogue chain ending in y (u: y's only user) with `+ residual`, then an activation.
    Returns (residual or None, activation name, the chain's new last value)."""
    res, act = None, "none"
    if u is not None and u.op == "add" and _same_shape(u.outputs[0], y) and _same_shape(_other(u, y), y) \
            and not _other(u, y).is_const:
        res = _other(u, y)
        chain.append(u)
        y = u.outputs[0]
        u = uses.only_user(y)
    if u is not None and u.op in ACTIVATIONS:
        act = u.op
        chain.append(u)
        y = u.outputs[0]
    return res, act, y


def _ends_epilogue(v, depth=3):
    """v is a GEMM's output, or an add/activation chain on one (what an epilogue can absorb)."""
    p = v.producer
    if p is None or depth == 0:
        return False
    if p.op == "matmul":
        return True
    if p.op == "add" or p.op in ACTIVATIONS:
        return any(i is not None and not i.is_const and _ends_epilogue(i, depth - 1) for i in p.inputs)
    return False


def sink_reshapes(graph):
    """reshape(x) -> activation / + residual / + bias becomes activation / add on x, then the reshape:
    a linear layer's epilogue then sits right after its GEMM (torch's addmm + view puts a view between).
    The moved op stays where it was in the order, so its other operand is defined by then."""
    for _ in range(16):
        uses = _Uses(graph)
        rewrites = {}
        for n in graph.nodes:
            if n.op != "reshape":
                continue
            x, y = n.inputs[0], n.outputs[0]
            u = uses.only_user(y)
            if u is None or x.dtype != "float32" or id(u) in rewrites or not _ends_epilogue(x):
                continue
            pre = []
            if u.op in ACTIVATIONS and len(u.inputs) == 1:
                ins = [x]
            elif u.op == "add":
                z = _other(u, y)
                if _same_shape(z, y) and not z.is_const:
                    zr = Node("reshape", [z], {"shape": tuple(x.shape)}, [Value(x.type)], n.loc)
                    pre, ins = [zr], [x, zr.outputs[0]]
                elif z.is_const and z.data.ndim == 1 and x.type.rank >= 1 and D.dims_equal(x.shape[-1], y.shape[-1]) \
                        and z.data.shape[0] == y.shape[-1]:
                    ins = [x, z]
                else:
                    continue
            else:
                continue
            moved = Node(u.op, ins, dict(u.attrs), [Value(x.type)], u.loc)
            rewrites[id(u)] = pre + [moved, Node("reshape", [moved.outputs[0]], dict(n.attrs), [u.outputs[0]], n.loc)]
        if not rewrites:
            break
        graph.nodes = [m for n in graph.nodes for m in rewrites.get(id(n), [n])]
        graph = dce(graph)
    return graph


def _fusable_matmul(n, backend):
    """The backend lowers a matmul_fused of this matmul's operands (in C: a float32 weight, packed at
    compile time). The probe's output is named, so that it takes no number from the values' counter."""
    out = Value(n.outputs[0].type, name="probe")
    return backend.lowers(Node("matmul_fused", n.inputs[:2], {"act": "none", "alpha": 1.0}, [out], n.loc))


def fuse_matmul_epilogues(graph, backend):
    uses = _Uses(graph)
    replace = {}                      # id(last node of a chain) -> fused node
    drop = set()
    for n in graph.nodes:
        if n.op != "matmul" or id(n) in drop or not _fusable_matmul(n, backend):
            continue
        y, chain = n.outputs[0], [n]
        N = y.shape[-1]
        alpha, bias = 1.0, None
        u = uses.only_user(y)
        if u is not None and u.op == "mul" and _other(u, y).is_const and _other(u, y).data.size == 1:
            alpha = float(_other(u, y).data.reshape(()))
            chain.append(u)
            y = u.outputs[0]
            u = uses.only_user(y)
        if u is not None and u.op == "add" and isinstance(N, int) and _same_shape(u.outputs[0], y):
            b = _bias_vector(graph, _other(u, y), N)
            if b is not None:
                bias = b
                chain.append(u)
                y = u.outputs[0]
                u = uses.only_user(y)
        res, act, y = _residual_then_activation(uses, u, y, chain)
        if len(chain) == 1 or any(id(c) in drop or id(c) in replace for c in chain):
            continue
        ins = list(n.inputs[:2]) + [bias, res]
        while ins and ins[-1] is None:
            ins.pop()
        fused = Node("matmul_fused", ins, {"act": act, "alpha": alpha, "int8_range": n.attrs.get("int8_range")}, [y],
                     chain[-1].loc or n.loc)
        REGISTRY["matmul_fused"].infer([None if i is None else i.type for i in ins], fused.attrs, ins)
        replace[id(chain[-1])] = fused
        drop.update(id(c) for c in chain[:-1])
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return graph


def fuse_conv_epilogues(graph):
    uses = _Uses(graph)
    replace, drop = {}, set()
    for n in graph.nodes:
        if n.op != "conv" or n.attrs["act"] != "none" or len(n.inputs) > 3 or id(n) in drop:
            continue
        y, chain = n.outputs[0], [n]
        res, act, y = _residual_then_activation(uses, uses.only_user(y), y, chain)
        if len(chain) == 1 or any(id(c) in drop or id(c) in replace for c in chain):
            continue
        ins = list(n.inputs)
        if res is not None:
            ins = ins + [None] * (3 - len(ins)) + [res]
        replace[id(chain[-1])] = Node("conv", ins, dict(n.attrs, act=act), [y], chain[-1].loc or n.loc)
        drop.update(id(c) for c in chain[:-1])
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return graph


SWAP_12 = (0, 2, 1, 3)


def absorb_attention_layouts(graph):
    """attention(transpose(x, 0213)) reads x as [b, s, h, d]; transpose(attention(...), 0213) is
    written directly: the two copies per attention operand disappear."""
    uses = _Uses(graph)
    mapping, drop = {}, set()
    for n in graph.nodes:
        if n.op != "attention" or n.inputs[0].type.rank != 4:
            continue
        for i, key in enumerate(("layout_q", "layout_k", "layout_v")):
            v = n.inputs[i]
            p = v.producer
            if p is not None and p.op == "transpose" and tuple(p.attrs["perm"]) == SWAP_12 and n.attrs[key] == "bhsd" \
                    and uses.only_user(v) is n:
                n.inputs[i] = p.inputs[0]
                n.attrs[key] = "bshd"
                drop.add(id(p))
        u = uses.only_user(n.outputs[0])
        if u is not None and u.op == "transpose" and tuple(u.attrs["perm"]) == SWAP_12:
            n.attrs["layout_out"] = "bshd"
            new = Value(u.outputs[0].type)
            n.outputs = [new]
            new.producer = n
            mapping[id(u.outputs[0])] = new
            drop.add(id(u))
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    if mapping:
        for n in graph.nodes:
            n.inputs = [mapping.get(id(i), i) if i is not None else None for i in n.inputs]
        graph.outputs = [mapping.get(id(o), o) for o in graph.outputs]
    return graph


def fuse_pointwise_chains(graph):
    uses = _Uses(graph)
    group_of = {}
    nodes = graph.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    groups = []
    for root in reversed(nodes):
        if id(root) in group_of or REGISTRY[root.op].kind not in POINTWISE_KINDS:
            continue
        members = {id(root): root}
        frontier = [root]
        while frontier:
            m = frontier.pop()
            for v in m.inputs:
                p = v.producer if v is not None and not v.is_const else None
                if p is None or id(p) in members or id(p) in group_of or REGISTRY[p.op].kind not in POINTWISE_KINDS:
                    continue
                if not _same_shape(p.outputs[0], root.outputs[0]):
                    continue
                users = uses.users.get(id(p.outputs[0]), [])
                if id(p.outputs[0]) in uses.outs or not all(id(x) in members for x in users):
                    continue
                members[id(p)] = p
                frontier.append(p)
        if len(members) < 2:
            continue
        for k in members:
            group_of[k] = root
        groups.append((root, sorted(members.values(), key=lambda x: pos[id(x)])))
    replace, drop = {}, set()
    for root, members in groups:
        inside = {id(m.outputs[0]): j for j, m in enumerate(members)}
        ins, in_idx, body = [], {}, []
        for m in members:
            args = []
            for v in m.inputs:
                if id(v) in inside:
                    args.append(("t", inside[id(v)]))
                else:
                    key = id(v)
                    if key not in in_idx:
                        in_idx[key] = len(ins)
                        ins.append(v)
                    args.append(("in", in_idx[key]))
            body.append((m.op, tuple(args), tuple(sorted(m.attrs.items()))))
        fused = Node("fused_pointwise", ins, {"body": tuple(body)}, [root.outputs[0]], root.loc)
        replace[id(root)] = fused
        drop.update(id(m) for m in members if m is not root)
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return graph


def read_slices_in_place(graph):
    """A slice read only by a pointwise loop over its own shape is read there through its strides, not
    copied first: the halves of a fused gate/up projection into SiLU(gate) * up (TinyLlama prefill of
    128 tokens: the copies were 1.4% of the time)."""
    uses = _Uses(graph)
    for n in graph.nodes:
        if n.op != "fused_pointwise":
            continue
        ins, views = list(n.inputs), list(n.attrs.get("views") or [()] * len(n.inputs))
        for i, v in enumerate(ins):
            p = v.producer if not v.is_const else None
            if p is None or p.op != "slice" or uses.only_user(v) is not n or not _same_shape(v, n.outputs[0]):
                continue
            a = p.attrs
            ins[i], views[i] = p.inputs[0], (a["axis"], a["start"], a["step"], a["length"])
        if any(views):
            n.inputs, n.attrs = ins, {**n.attrs, "views": tuple(views)}
    return graph


def run(graph, level, backend):
    """backend: what the code generator lowers (passes/backend.py): a matmul is fused only where it
    lowers the matmul_fused node."""
    if level >= 1:
        graph = fuse_conv_epilogues(fuse_matmul_epilogues(sink_reshapes(graph), backend))
    if level >= 2:
        graph = read_slices_in_place(fuse_pointwise_chains(absorb_attention_layouts(graph)))
    return dce(graph)
