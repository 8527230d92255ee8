"""JAX frontend: a function and its example inputs -> jax.make_jaxpr -> cuvil IR.

The function is traced once, at the example inputs' shapes and dtypes, into a closed jaxpr. Arrays it
closes over (weights: `functools.partial(apply_fn, params)`, or a lambda over params) are the jaxpr's
consts and become the graph's constants. Each primitive maps onto IR ops through a handler in
jax_registry.HANDLERS (jax_pointwise, jax_movement, jax_reduce, jax_nn); call-like primitives (jit,
closed_call, custom_jvp_call, custom_vjp_call, checkpoint) are inlined here, their derivative rules
dropped (inference needs none). Every primitive the IR cannot express is collected with the user's
source line and reported at once, in one UnsupportedOpError."""
from __future__ import annotations

import jax
import numpy as np
from jax._src import source_info_util
from jax.extend.core import Literal

from ..errors import CuvilError, UnsupportedOpError
from ..ir import dims as D
from ..ir.graph import DTYPES, Graph, TensorType, Value
from ..ir.interpreter import run_node
from . import jax_control, jax_movement, jax_nn, jax_pointwise, jax_reduce
from .jax_registry import HANDLERS, Unsupported

FAMILIES = (jax_pointwise, jax_movement, jax_reduce, jax_nn, jax_control)     # importing them filled HANDLERS

# call-like primitives -> the parameter holding the jaxpr they run (inlined)
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr"}
# a node over constants with at most this many output elements is evaluated here, so handlers see the
# values of scalars and indices computed from literals (a pad value, a clamp bound, a slice start)
FOLD_ELEMENTS = 4096


class _Missing:
    """Stands for the outputs of an equation that could not be converted: the walk goes on, skipping
    what depends on them, so every unsupported primitive is found in one pass."""


MISSING = _Missing()


def ir_dtype(aval) -> str | None:
    """The IR dtype of a jax abstract value, None when the IR has none (complex, float0)."""
    name = np.dtype(aval.dtype).name
    return name if name in DTYPES else None


class Ctx:
    """What a handler builds with: the graph, the equation being converted, and the unsupported list."""

    def __init__(self, g: Graph):
        self.g = g
        self.unsupported: list = []
        self.eqn = None
        self._loc = None
        self.caller_loc = None      # the inlined call's line: jax's own jitted helpers (jnp.fft) have none
        self._consts: dict = {}     # id(array) -> (array, Value): a weight several calls close over is one constant

    def at(self, eqn):
        self.eqn, self._loc = eqn, None

    @property
    def loc(self):
        """The user's source line of the current equation (computed once per equation), else its caller's."""
        if self._loc is None and self.eqn is not None:
            self._loc = source_info_util.summarize(self.eqn.source_info) or self.caller_loc
        return self._loc

    def out(self, i=0) -> TensorType:
        aval = self.eqn.outvars[i].aval
        return TensorType(tuple(aval.shape), ir_dtype(aval))

    def add(self, op, inputs, attrs=None):
        out = self.g.add(op, inputs, attrs or {}, loc=self.loc)
        node = self.g.nodes[-1]
        if inputs and all(i is not None and i.is_const for i in inputs) and all(
                D.shape_static(o.shape) and D.prod(o.shape) <= FOLD_ELEMENTS for o in node.outputs):
            try:
                results = run_node(node, [i.data for i in inputs], {})
            except Exception:  # noqa: BLE001 - as in passes/fold.py: a node that fails to fold fails at run time
                return out
            self.g.nodes.pop()
            vals = [self.g.const(r) for r in results]
            return vals[0] if len(vals) == 1 else vals
        return out

    def inline(self, jaxpr, args) -> list:
        """A (closed) jaxpr's outputs applied to args, its equations added to this graph."""
        return inline(self, jaxpr, args)

    def region(self, jaxpr, inputs, bind) -> Graph:
        """A (closed) jaxpr converted into a graph of its own (a cond branch, a while loop's condition or
        body): the graph's inputs are fresh values of `inputs`' types; bind(graph inputs) gives the
        jaxpr's arguments from them."""
        g, consts, outer = Graph(), self._consts, self.g
        g.inputs = [Value(v.type) for v in inputs]
        self.g, self._consts = g, {}            # constants are made in the region's own graph
        try:
            g.outputs = inline(self, jaxpr, bind(g.inputs))
        finally:
            self.g, self._consts = outer, consts
        if any(o is MISSING for o in g.outputs):
            raise Unsupported("its body holds what is reported above")
        return g

    def const(self, array) -> Value:
        hit = self._consts.get(id(array))
        if hit is None:
            hit = self._consts[id(array)] = (array, self.g.const(np.asarray(array)))
        return hit[1]

    def scalar(self, v, dtype) -> Value:
        return self.g.const(np.array(v, dtype=dtype))

    @staticmethod
    def known(v):
        """A constant's numpy value; None for a value computed at run time."""
        return v.data if v.is_const else None

    def cast(self, x, dtype):
        if x.dtype == dtype:
            return x
        if dtype == "bool":          # jax's bool(x) is x != 0, not a C narrowing of x
            return self.add("ne", [x, self.scalar(0, x.dtype)])
        return self.add("cast", [x], {"to": dtype})

    def reshape(self, x, shape):
        shape = tuple(shape)
        return x if tuple(x.shape) == shape else self.add("reshape", [x], {"shape": list(shape)})

    def transpose(self, x, perm):
        perm = list(perm)
        return x if perm == sorted(perm) else self.add("transpose", [x], {"perm": perm})

    def expand(self, x, shape):
        shape = tuple(shape)
        return x if tuple(x.shape) == shape else self.add("expand", [x], {"shape": list(shape)})


def trace(fn, args):
    """fn's closed jaxpr at args."""
    try:
        return jax.make_jaxpr(fn)(*args)
    except Exception as e:  # noqa: BLE001 - tracing user code raises anything
        raise CuvilError(f"jax could not trace the function: {type(e).__name__}: {str(e)[:2000]}") from e


def to_graph(fn, args) -> Graph:
    """A JAX function and its example inputs (arrays, or pytrees of them) -> an IR Graph whose inputs
    are the inputs' flattened leaves and whose outputs are the outputs' leaves."""
    closed = trace(fn, tuple(args))
    g = Graph()
    for i, var in enumerate(closed.jaxpr.invars):
        dt = ir_dtype(var.aval)
        if dt is None:
            raise CuvilError(f"input {i} has dtype {var.aval.dtype}; cuvil compiles {', '.join(DTYPES)}")
        g.inputs.append(Value(TensorType(tuple(var.aval.shape), dt), name=f"arg{i}"))
    g.input_names = [v.name for v in g.inputs]
    ctx = Ctx(g)
    outs = inline(ctx, closed, g.inputs)
    if ctx.unsupported:
        raise UnsupportedOpError(ctx.unsupported)
    g.outputs = outs
    g.output_names = [f"output{i}" for i in range(len(outs))]
    return g


def inline(ctx, jaxpr, args) -> list:
    """A (closed) jaxpr's equations applied to args, converted into ctx.g: its outputs."""
    consts = [ctx.const(c) for c in getattr(jaxpr, "consts", ())]
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    outer, outer_loc = ctx.eqn, ctx.caller_loc
    ctx.caller_loc = ctx.loc            # the call's line stands for inner equations that have none
    for eqn in jaxpr.eqns:
        ctx.at(eqn)
        env.update(zip(eqn.outvars, _equation(ctx, eqn, [_read(ctx, env, a) for a in eqn.invars])))
    ctx.at(outer)
    ctx.caller_loc = outer_loc
    return [_read(ctx, env, a) for a in jaxpr.outvars]


def _read(ctx, env, atom):
    if isinstance(atom, Literal):
        return ctx.scalar(atom.val, ir_dtype(atom.aval))
    return env[atom]


def _equation(ctx, eqn, ins) -> list:
    """One equation's outputs; MISSING for each when it cannot be converted, recorded in ctx.unsupported
    (except a known primitive fed by a MISSING value: the cause was recorded where it arose)."""
    name = eqn.primitive.name
    missing = [MISSING] * len(eqn.outvars)
    if name in CALLS:
        return inline(ctx, eqn.params[CALLS[name]], ins)
    handler = HANDLERS.get(name)
    if handler is None:
        ctx.unsupported.append((name, ctx.loc))
        return missing
    if any(i is MISSING for i in ins):
        return missing
    odd = [str(v.aval.dtype) for v in eqn.outvars if ir_dtype(v.aval) is None]
    if odd:
        ctx.unsupported.append((f"{name} (dtype {odd[0]})", ctx.loc))
        return missing
    try:
        out = handler(ctx, *ins, **eqn.params)
    except Unsupported as e:
        ctx.unsupported.append((f"{name} ({e})", ctx.loc))
        return missing
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    _check(ctx, name, outs)
    return outs


def _check(ctx, name, outs):
    """A handler's outputs against jax's types (a mismatch is a cuvil bug, caught here, not in C)."""
    want = [ctx.out(i) for i in range(len(ctx.eqn.outvars))]
    got = [o.type if isinstance(o, Value) else o for o in outs]
    if len(got) != len(want) or any(g != w for g, w in zip(got, want)):
        raise CuvilError(f"internal: {name} lowered to {[str(t) for t in got]}, jax says {[str(t) for t in want]} "
                         f"(at {ctx.loc}; a cuvil bug: please report it)")


def flat_inputs(args) -> list:
    """The example inputs as the compiled function takes them: the leaves, as numpy arrays of the dtypes
    jax computes in (int64 becomes int32 unless jax_enable_x64 is set)."""
    return [np.asarray(jax.numpy.asarray(a)) for a in jax.tree_util.tree_leaves(tuple(args))]


def reference_outputs(fn, args):
    """jax.jit(fn)'s outputs on args (the leaves, as numpy arrays) and the flat inputs (flat_inputs)."""
    ref = jax.jit(fn)(*args)
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(ref)], flat_inputs(args)
