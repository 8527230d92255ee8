"""Node lists the converter walks besides the main graph, and the order it walks them in.

ONNX function bodies (schema functions and the defaults of their attributes), subgraphs of If / Loop /
Scan run in place by inline_subgraph with their outer-scope references renamed, and the topological
order of a node list (a cycle is an error)."""
from __future__ import annotations

from ...errors import GraphError
from .helpers import require_onnx
from .model import tensor_to_numpy


def rename_outer_refs(g, fn, local=None):
    """Rewrite, in place, the names subgraph g reads from enclosing scopes."""
    local = set(local or ()) | {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(o for o in n.output if o)
    for n in g.node:
        ins = [(i if (not i or i in local) else fn(i)) for i in n.input]
        del n.input[:]
        n.input.extend(ins)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else list(a.graphs)):
                rename_outer_refs(sub, fn, local)
    outs = [o for o in g.output]
    for o in outs:
        if o.name not in local:
            o.name = fn(o.name)


def inline_subgraph(c, g, bindings):
    """Run the nodes of subgraph g in place (outer names stay visible); returns its outputs."""
    onnx = require_onnx()
    c.uid += 1
    pre = f"__g{c.uid}_"
    rename = {}
    for formal, val in bindings.items():
        rename[formal] = pre + formal
        c.env[pre + formal] = val
    for t in g.initializer:
        rename[t.name] = pre + t.name
        c.env[pre + t.name] = tensor_to_numpy(t, f"initializer {t.name!r}")
    for n in g.node:
        for o in n.output:
            if o:
                rename[o] = pre + o
    nodes = []
    for n in g.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        del n2.input[:]
        del n2.output[:]
        n2.input.extend([rename.get(i, i) if i else "" for i in n.input])
        n2.output.extend([rename[o] if o else "" for o in n.output])
        for a in n2.attribute:
            for sub in ([a.g] if a.HasField("g") else list(a.graphs)):
                rename_outer_refs(sub, lambda i: rename.get(i, i))
        nodes.append(n2)
    outer = c.node
    c.run_nodes(toposort(nodes, set(c.env)), c.opsets)
    c.node = outer
    return [c.env.get(rename.get(o.name, o.name)) for o in g.output]


_SCHEMA_CACHE = {}


def schema_default(op_type, opset, name):
    """The default value (an AttributeProto) of an attribute of a standard op, or None."""
    onnx = require_onnx()
    try:
        a = onnx.defs.get_schema(op_type, opset, "").attributes.get(name)
    except Exception:  # noqa: BLE001
        return None
    if a is None or not a.default_value.name and a.default_value.type == 0:
        return None
    return a.default_value


def schema_function(op_type, opset, node=None, types=None, domain=""):
    onnx = require_onnx()
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - SchemaError: unknown op or version
        return None
    if schema.has_function:
        key = (domain, op_type, schema.since_version)
        if key not in _SCHEMA_CACHE:
            f = None
            try:
                f = onnx.FunctionProto()
                f.ParseFromString(schema.get_function_with_opset_version(opset)
                                  if hasattr(schema, "get_function_with_opset_version") else b"")
                if not f.node:
                    f = schema.function_body
            except Exception:  # noqa: BLE001
                f = schema.function_body
            _SCHEMA_CACHE[key] = f
        return _SCHEMA_CACHE[key]
    if schema.has_context_dependent_function:
        if node is None:
            return True
        try:
            body = schema.get_context_dependent_function(node.SerializeToString(),
                                                         [t.SerializeToString() for t in types])
        except Exception:  # noqa: BLE001
            return None
        f = onnx.FunctionProto()
        f.ParseFromString(body)
        return f if f.node else None
    return None


def toposort(nodes, available):
    """Nodes in an order where every input is defined first; cycles are an error."""
    produced = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced.setdefault(o, idx)
    order, state = [], [0] * len(nodes)
    import sys
    for start in range(len(nodes)):
        if state[start]:
            continue
        stack = [(start, 0)]
        state[start] = 1
        while stack:
            idx, k = stack.pop()
            ins = [i for i in nodes[idx].input if i]
            ins += _subgraph_reads(nodes[idx])
            while k < len(ins):
                dep = produced.get(ins[k])
                k += 1
                if dep is None or ins[k - 1] in available:
                    continue
                if state[dep] == 1:
                    raise GraphError(f"the graph has a cycle through node {nodes[dep].name!r} ({nodes[dep].op_type})")
                if state[dep] == 0:
                    stack.append((idx, k))
                    stack.append((dep, 0))
                    state[dep] = 1
                    break
            else:
                state[idx] = 2
                order.append(nodes[idx])
    del sys
    return order


def _subgraph_reads(node):
    out = []
    for a in node.attribute:
        gs = [a.g] if a.HasField("g") else list(a.graphs)
        for g in gs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                out += [i for i in n.input if i and i not in local]
    return out
