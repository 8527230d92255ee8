"""PyTorch frontend: torch.export (non-strict) -> cuvil IR, straight from export's graph when
every op in it is known (aten_export.py), else after core ATen decompositions.

Each ATen op maps onto IR ops in aten.py; SymInt arithmetic becomes symbolic dims; every op
the IR cannot express is collected with the user's source line and reported all at once."""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

import numpy as np
import sympy
import torch
from torch.utils import _pytree

from ..errors import CuvilError, QuantizationError, UnsupportedOpError
from ..ir import dims as D
from ..ir.graph import Graph, TensorType, Value
# these register their handlers into aten.HANDLERS
from . import (aten, aten_complex, aten_dynamic, aten_experts, aten_export, aten_grid, aten_hash,  # noqa: F401
               aten_linalg, aten_losses, aten_quant, aten_resample, aten_writes, torch_control)
from .torch_dtypes import TORCH_DTYPES, dtype_of, to_numpy


def source_location(node) -> str | None:
    """The user's source line of an exported node, from its stack trace."""
    st = node.meta.get("stack_trace")
    if not st:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', st)
    if not frames:
        return None
    user = [f for f in frames if "/torch/" not in f[0]] or frames
    path, line, fn, code = user[-1]
    return f"{path}:{line} in {fn}: {code.strip()}"


@dataclass
class Ctx:
    g: Graph
    rename: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    node: object = None
    unsupported: list = field(default_factory=list)
    direct: bool = False            # converting export's graph as it is (no core ATen decompositions)
    # id(value) -> [lo, hi]: the grid a per-tensor dequantize or fake quantization put its output on
    # (aten_quant.py); a conv reading it takes it as int8_range (precision="int8": the model's own bytes)
    grids: dict = field(default_factory=dict)

    @property
    def loc(self):
        return source_location(self.node) if self.node is not None else None

    def dim(self, x):
        """A python int, SymInt or fx node of one -> IR dim."""
        if isinstance(x, torch.fx.Node):
            x = self.env[x.name]
            if isinstance(x, Value):
                raise CuvilError("a tensor was used where a size was expected")
            return x
        if isinstance(x, torch.SymInt):
            return self.sym(x.node.expr)
        if isinstance(x, (int, np.integer)):
            return int(x)
        if isinstance(x, sympy.Basic):
            return self.sym(x)
        return x

    def sym(self, expr):
        subs = {s: D.Sym(self.rename.get(s.name, s.name)) for s in expr.free_symbols}
        return D.as_dim(expr.xreplace(subs))

    def value(self, x):
        if isinstance(x, torch.fx.Node):
            return self.env[x.name]
        if isinstance(x, (list, tuple)):
            return type(x)(self.value(v) for v in x)
        if isinstance(x, (torch.SymInt, sympy.Basic)):
            return self.dim(x)
        return x

    def add(self, op, inputs, attrs=None):
        return self.g.add(op, inputs, attrs or {}, loc=self.loc)

    def scalar(self, v, dtype):
        return self.g.const(np.array(v, dtype=dtype))

    def tensor(self, x, dtype):
        """x as a tensor Value of dtype: python scalars become constants, tensors are cast."""
        if isinstance(x, Value):
            return x if x.dtype == dtype else self.add("cast", [x], {"to": dtype})
        if isinstance(x, (bool, int, float)):
            return self.scalar(x, dtype)
        if hasattr(x, "free_symbols"):   # a symbolic size used as data: computed at run time
            return self.add("full", [], {"shape": [], "value": x, "dtype": dtype})
        raise CuvilError(f"cannot use {x!r} as a tensor")


def _meta_type(node):
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return v
    return None


def _input_symbols(ep) -> set:
    """The names of the symbols in the program's user inputs: their shapes' and the symbolic ints'."""
    user = {sp.arg.name for sp in ep.graph_signature.input_specs
            if sp.kind == torch.export.graph_signature.InputKind.USER_INPUT}
    names = set()
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        for d in [val] if isinstance(val, torch.SymInt) else getattr(val, "shape", ()):
            if isinstance(d, torch.SymInt):
                names |= {str(f) for f in d.node.expr.free_symbols}
    return names


def _bounds(ep, rename):
    """{symbol: (lo, hi)} of the program's dims, the unbacked ones without a bound, and every unbacked one
    (a data-dependent op's handler binds its own symbol; any other used at the end is refused)."""
    syms, unbounded, unbacked = {}, set(), set()
    inputs = _input_symbols(ep)
    for s, vr in ep.range_constraints.items():
        lo, hi = vr.lower, vr.upper
        name = rename.get(str(s), str(s))
        if str(s).startswith(("u", "zuf")):        # unbacked: computed from the input's values
            unbacked.add(name)
        try:
            hi = int(hi)
        except (TypeError, ValueError, OverflowError, AttributeError):
            hi = None
        if hi is None or hi > 2**40:
            if str(s).startswith(("u", "zuf")):    # unbacked: a size or a number computed from the input's values
                unbounded.add(name)
                continue
            if str(s) not in inputs:       # a size only in an op's meta (an output cuvil computes itself)
                continue
            raise CuvilError(f"dynamic dim {name} has no upper bound: give it one, e.g. Dim('{name}', max=512)")
        syms[name] = (max(int(lo), 0), hi)
    return syms, unbounded, unbacked


def to_torch_dynamic_shapes(spec):
    """Accept torch.export's own spec, or {input: {axis: (name, min, max)}} tuples."""
    if spec is None:
        return None

    def conv(x):
        if isinstance(x, tuple) and len(x) == 3 and isinstance(x[0], str):
            return torch.export.Dim(x[0], min=x[1], max=x[2])
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x
    return conv(spec)


def decomposition_table():
    """Core ATen, except ops cuvil lowers better whole: attention stays one op (its torch
    decomposition also trips a view bug on GPT-2 in torch 2.13)."""
    table = torch.export.default_decompositions()
    for op in (torch.ops.aten.scaled_dot_product_attention.default,):
        table.pop(op, None)
    return table


def _refuse_converted_quantized(model):
    """Eager-mode quantized modules (torch.ao.quantization.convert) keep their weights in packed
    objects torch.export cannot trace: say what compiles instead."""
    for name, m in model.named_modules():
        packed = hasattr(m, "_packed_params") or any(isinstance(v, torch.ScriptObject) for v in vars(m).values())
        if packed and type(m).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            raise QuantizationError(
                f"{name or 'the model'} is an eager-mode quantized {type(m).__name__} "
                "(torch.ao.quantization.convert): its packed int8 weights cannot be exported. Compile the float "
                "model with precision='int8', or the QAT model before convert() (observers off: "
                "model.apply(torch.ao.quantization.disable_observer)) with precision='int8', which keeps its "
                "learned int8 weights")


def export(model, args, kwargs=None, dynamic_shapes=None):
    if isinstance(model, torch.jit.ScriptModule):
        return _export_torchscript(model, args, kwargs, dynamic_shapes)
    if not isinstance(model, torch.fx.GraphModule):     # an exported program's module() refuses eval()
        model = model.eval()
    _refuse_converted_quantized(model)
    try:
        with torch.no_grad():
            return torch.export.export(model, tuple(args), kwargs=kwargs or None,
                                       dynamic_shapes=to_torch_dynamic_shapes(dynamic_shapes), strict=False)
    except CuvilError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.export raises many types
        raise CuvilError(f"torch.export could not trace the model: {type(e).__name__}: {str(e)[:2000]}") from e


def _export_torchscript(model, args, kwargs, dynamic_shapes):
    """A TorchScript module (torch.jit.load / torch.jit.script) through torch's own TorchScript-to-
    ExportedProgram converter, then exported again from the converted graph at the example shapes
    (the converter leaves the batch dim unbounded) or the dynamic_shapes given."""
    from torch._export.converter import TS2EPConverter
    try:
        with torch.no_grad():
            converted = TS2EPConverter(model.eval(), tuple(args), kwargs or None).convert().module()
    except Exception as e:  # noqa: BLE001 - the converter raises many types
        raise CuvilError(f"torch's TorchScript converter could not convert the module: {type(e).__name__}: "
                         f"{str(e)[:2000]} (compile the Python module, or torch.export it, instead)") from e
    return export(converted, args, kwargs, dynamic_shapes)


def _user_dim_names(ep, dynamic_shapes):
    """Map export's symbols (s0, s1, ...) to the Dim names the user gave."""
    rename = {}
    if not dynamic_shapes:
        return rename
    sig = ep.graph_signature
    user_inputs = [s.arg.name for s in sig.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    flat_specs = []

    def walk(x):
        if isinstance(x, dict) and all(isinstance(k, int) for k in x):
            flat_specs.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)) and x and not all(isinstance(v, (int, type(None))) for v in x) \
                and not any(hasattr(v, "__name__") and hasattr(v, "max") for v in x):
            for v in x:
                walk(v)
        else:
            flat_specs.append(x)
    walk(dynamic_shapes)
    nodes = {n.name: n for n in ep.graph.nodes}
    for name, spec in zip(user_inputs, flat_specs):
        val = nodes[name].meta.get("val")
        if not isinstance(spec, dict) or not isinstance(val, torch.Tensor):
            continue
        for axis, dim in spec.items():
            dname = dim[0] if isinstance(dim, tuple) else getattr(dim, "__name__", None)
            d = val.shape[axis]
            if dname and isinstance(d, torch.SymInt) and d.node.expr.is_Symbol and dname.isidentifier():
                rename[str(d.node.expr)] = dname
    return rename


class _NeedsDecomposition(Exception):
    """The export graph holds an op (or a mutation) the direct conversion does not take."""


def from_exported(ep, dynamic_shapes=None) -> tuple[Graph, object, bool]:
    """ExportedProgram (as torch.export returns it) -> (Graph, output treespec, decomposed): converted
    directly when it can be, else after core ATen decompositions."""
    try:
        return (*_convert(ep, dynamic_shapes, direct=True), False)
    except _NeedsDecomposition:
        pass
    try:
        with torch.no_grad():
            ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # noqa: BLE001 - torch raises many types
        raise CuvilError(f"torch.export could not decompose the model: {type(e).__name__}: {str(e)[:2000]}") from e
    return (*_convert(ep, dynamic_shapes, direct=False), True)


def _mutation(node, target):
    """The functional op for an in-place node whose effect is a plain rebinding of its first
    argument (an intermediate no view aliases); raises _NeedsDecomposition otherwise."""
    functional = aten_export.inplace_counterpart(target)
    src = node.args[0] if node.args else None
    if (functional is None or not isinstance(src, torch.fx.Node) or src.op != "call_function"
            or aten_export.is_view(src.target)
            or any(u is not node and aten_export.is_view(u.target) for u in src.users if u.op == "call_function")):
        raise _NeedsDecomposition(str(target))
    return functional


def _convert(ep, dynamic_shapes, direct) -> tuple[Graph, object]:
    if direct and any(s.kind != torch.export.graph_signature.OutputKind.USER_OUTPUT
                      for s in ep.graph_signature.output_specs):
        raise _NeedsDecomposition("the program mutates a buffer or an input")
    rename = _user_dim_names(ep, dynamic_shapes)
    symbols, unbounded, unbacked = _bounds(ep, rename)
    g = Graph(symbols=symbols)
    ctx = Ctx(g, rename, direct=direct)
    sig = ep.graph_signature
    kinds = {s.arg.name: s for s in sig.input_specs}
    consts = dict(ep.state_dict)
    consts.update(getattr(ep, "constants", {}) or {})
    for node in ep.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            spec = kinds[node.name]
            if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
                t = node.meta["val"]
                if not isinstance(t, torch.Tensor):
                    ctx.env[node.name] = ctx.dim(t)
                    continue
                v = _input_value(ctx, t, node.name)
                if isinstance(v, aten_complex.Complex):
                    g.complex_inputs.add(len(g.inputs))
                g.inputs.append(getattr(v, "pair", v))
                g.input_names.append(node.name)
                ctx.env[node.name] = v
            elif spec.kind == torch.export.graph_signature.InputKind.TOKEN:
                ctx.env[node.name] = aten_linalg.EFFECT_TOKEN     # orders side effects: no value
            else:
                if spec.target not in consts:
                    raise UnsupportedOpError([(f"an exported input of kind {spec.kind.name} with no value ({node.name})",
                                               None)])
                t = consts[spec.target]
                arr = to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
                name = re.sub(r"[^A-Za-z0-9_]", "_", spec.target)
                if arr.dtype.kind == "c":       # a complex buffer (a rotary table): its (real, imaginary) pairs
                    ctx.env[node.name] = aten_complex.Complex(g.const(np.stack([arr.real, arr.imag], -1), name=name))
                else:
                    ctx.env[node.name] = g.const(arr, name=name)
        elif node.op == "call_function":
            _call_function(ctx, node, direct)
        elif node.op == "get_attr":       # a higher-order op's subgraph (torch.cond's branches)
            ctx.env[node.name] = _attr(ep.graph_module, node.target)
        elif node.op == "output":
            outs = _user_outputs(ctx, _pytree.tree_leaves(node.args[0]), ep.graph_signature.output_specs, consts)
            for o in outs:
                v = ctx.value(o)
                if isinstance(v, aten_complex.Complex):
                    g.complex_outputs.add(len(g.outputs))
                    v = v.pair
                elif _is_number(o) and v is not None:      # x.item(), a size: returned as a python number
                    g.scalar_outputs.add(len(g.outputs))
                    v = v if isinstance(v, Value) else ctx.tensor(v, _number_dtype(o))
                if isinstance(v, Value):
                    g.outputs.append(v)
                elif v is not None:
                    raise CuvilError(f"model output {o} is not a tensor; cuvil returns tensors only")
            g.output_names = [getattr(o, "name", f"output{i}") for i, o in enumerate(outs)]
    ctx.unsupported += [(f"a size that depends on the input's values ({name}): cuvil computes such sizes for "
                         "nonzero, boolean masks and unique only", None)
                        for name in sorted(((unbounded | unbacked) & _used_symbols(g)) - set(g.data_dims()))]
    if ctx.unsupported:
        if direct:
            raise _NeedsDecomposition(ctx.unsupported[0][0])
        raise UnsupportedOpError(ctx.unsupported)
    return g, ep.call_spec.out_spec


def _number_dtype(o) -> str:
    val = o.meta.get("val") if isinstance(o, torch.fx.Node) else o
    return ("bool" if isinstance(val, (bool, torch.SymBool)) else
            "float64" if isinstance(val, (float, torch.SymFloat)) else "int64")


def _is_number(o) -> bool:
    val = o.meta.get("val") if isinstance(o, torch.fx.Node) else o
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _used_symbols(g) -> set:
    """The names of the symbols the graph's tensors are shaped by or its nodes' attributes read."""
    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from walk(y)
        elif isinstance(x, dict):
            yield from walk(list(x.values()))
        elif isinstance(x, Graph):               # a cond / while_loop region
            yield from _used_symbols(x)
        else:
            yield from (str(f) for f in getattr(x, "free_symbols", ()))
    values = list(g.inputs) + [o for n in g.nodes for o in n.outputs]
    return set(walk([list(v.type.shape) for v in values])) | set(walk([n.attrs for n in g.nodes]))


def _user_outputs(ctx, outs, specs, consts):
    """The program's own outputs. A write into an input or buffer is refused (an artifact returns its
    outputs, it never writes into its inputs), unless it writes back the value the buffer holds (a
    QAT fake-quant with its observer off hands its buffers through unchanged)."""
    user, writes = [], []
    for o, spec in zip(outs, specs):
        if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT:
            user.append(o)
            continue
        if spec.kind == torch.export.graph_signature.OutputKind.TOKEN:
            continue
        v, old = ctx.value(o), consts.get(spec.target)
        same = isinstance(v, Value) and v.is_const and isinstance(old, torch.Tensor) and \
            np.array_equal(v.data, to_numpy(old))
        if not same:
            writes.append(str(spec.target))
    if writes and not ctx.unsupported:        # an unsupported op (a QAT observer left on) says why first
        raise UnsupportedOpError([(f"writes into the model's inputs or buffers ({', '.join(writes)}): compile the "
                                   "module in eval mode, without in-place updates of its inputs or buffers", None)])
    return user


def _call_function(ctx, node, direct):
    """One call_function node of an exported graph: its handler's IR, bound in ctx.env (an op
    without a handler is recorded in ctx.unsupported and stood in for, so every one is found)."""
    val = node.meta.get("val")
    returned_item = node.target is torch.ops.aten._local_scalar_dense.default and all(u.op == "output" for u in node.users)
    if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool) and node.target is not operator.getitem \
            and not returned_item:           # (an int x.item() the model only returns: its value, as data)
        ctx.env[node.name] = ctx.dim(val)
        return
    if aten_dynamic.is_size_check(node):
        ctx.env[node.name] = True
        return
    if node.target is operator.getitem:
        src = ctx.env[node.args[0].name]
        item = src[node.args[1]] if isinstance(src, (list, tuple)) else None
        if item is None and isinstance(src, (list, tuple)):
            ctx.unsupported.append((f"{node.args[0].target} output {node.args[1]}", ctx.loc))
        ctx.env[node.name] = item
        return
    target = node.target
    args = [ctx.value(a) for a in node.args]
    on_complex = aten_complex.involves_complex(node, args)
    table = aten_complex.HANDLERS.get if on_complex else aten.handler_for
    if direct and table(target) is None:
        target = _mutation(node, target)
    handler = table(target)
    if handler is None:
        real_only = on_complex and aten.handler_for(target) is not None       # handled, but not for complex
        ctx.unsupported.append((f"{node.target} on complex tensors" if real_only else str(node.target), ctx.loc))
        ctx.env[node.name] = _placeholder_for(ctx, node)
        return
    try:
        out = handler(ctx, *args, **{k: ctx.value(v) for k, v in node.kwargs.items()})
    except aten.Unsupported as e:
        ctx.unsupported.append((f"{node.target} ({e})", ctx.loc))
        out = _placeholder_for(ctx, node)
    except Exception as e:  # noqa: BLE001 - a handler meeting export's graph: use the decomposed one
        if direct:
            raise _NeedsDecomposition(f"{node.target}: {e}") from e
        if isinstance(e, CuvilError):
            raise
        if not ctx.unsupported:
            raise CuvilError(f"cuvil failed converting {node.target} at {ctx.loc}: "
                             f"{type(e).__name__}: {e} (a cuvil bug: please report it)") from e
        out = _placeholder_for(ctx, node)       # fed by an op already reported unsupported
    if direct and ctx.unsupported:
        raise _NeedsDecomposition(ctx.unsupported[0][0])
    ctx.env[node.name] = out
    if target is not node.target:                 # in place: later readers see the result
        ctx.env[node.args[0].name] = out
    try:
        _check_against_meta(node, out)
    except CuvilError as e:
        if direct:
            raise _NeedsDecomposition(str(e)) from None
        raise


def _attr(module, target):
    for part in target.split("."):
        module = getattr(module, part)
    return module


def convert_region(parent, gm, operands, as_input):
    """A higher-order op's subgraph (a GraphModule) -> an IR Graph. operands: what its placeholders
    are bound to; as_input[i]: whether operand i becomes an input of the region (a tensor computed at
    run time), else it is used in place (a constant, a size). Returns (graph, the operands taken)."""
    sub = Graph(symbols=parent.g.symbols)
    ctx = Ctx(sub, parent.rename, direct=parent.direct)
    taken = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise CuvilError(f"a subgraph takes {len(placeholders)} inputs, given {len(operands)}")
    for node, v, take in zip(placeholders, operands, as_input):
        if take:
            x = Value(v.type)
            sub.inputs.append(x)
            taken.append(v)
            v = x
        ctx.env[node.name] = v
    for node in gm.graph.nodes:
        ctx.node = node
        if node.op == "call_function":
            _call_function(ctx, node, ctx.direct)
        elif node.op == "get_attr":
            ctx.env[node.name] = _attr(gm, node.target)
        elif node.op == "output":
            sub.outputs = [ctx.value(o) for o in _pytree.tree_leaves(node.args[0])]
    parent.unsupported += ctx.unsupported
    if not ctx.unsupported and not all(isinstance(o, Value) for o in sub.outputs):
        raise CuvilError("a torch.cond / while_loop branch returns something other than tensors")
    return sub, taken


def _input_value(ctx, t, name=None):
    """A Value of tensor t's shape and dtype; a complex t is a Complex over its (real, imaginary) pairs."""
    shape = tuple(ctx.dim(d) for d in t.shape)
    if t.dtype.is_complex:
        return aten_complex.Complex(Value(TensorType(shape + (2,), aten_complex.pair_dtype(t.dtype)), name=name))
    return Value(TensorType(shape, dtype_of(t.dtype)), name=name)


def _placeholder_for(ctx, node):
    """A stand-in value of the right type so the walk continues and finds every unsupported op."""
    def one(v):
        try:
            return _input_value(ctx, v) if isinstance(v, torch.Tensor) else None
        except (CuvilError, aten.Unsupported):
            return None
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return tuple(one(v) for v in val)
    return one(val)


def _check_against_meta(node, out):
    t = _meta_type(node)
    if isinstance(out, aten_complex.Complex):
        shape, dtype, table = out.shape, out.pair.dtype, aten_complex.PAIR_DTYPES
    elif isinstance(out, Value):
        shape, dtype, table = out.type.shape, out.dtype, TORCH_DTYPES
    else:
        return
    if t is None:
        return
    want = table.get(t.dtype)
    if len(shape) != t.dim() or any(isinstance(a, int) and isinstance(b, int) and a != b
                                    for a, b in zip(shape, [int(d) if isinstance(d, int) else d for d in t.shape])):
        raise CuvilError(f"internal: {node.target} lowered to shape {tuple(shape)}, torch says {tuple(t.shape)} "
                         f"(at {source_location(node)})")
    if dtype != want:
        kind = "complex parts of " if isinstance(out, aten_complex.Complex) else ""
        raise CuvilError(f"internal: {node.target} lowered to {kind}dtype {dtype}, torch says {t.dtype}")


def flatten_inputs(args, kwargs=None):
    flat, spec = _pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    return flat, spec


torch_control.register(convert_region)
