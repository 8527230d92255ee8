"""Every op of the registry: the compiled C kernel against the op's numpy reference.

Each case builds one graph holding many instances of an op (edge shapes: size-1 and size-0
dims, odd sizes, broadcasting, 0-d scalars, non-contiguous inputs, dynamic dims, several
dtypes), so one gcc run covers them all; a failure names every output that disagrees.
fp32 tolerance is rtol=atol=1e-4; float64 outputs are held to 1e-9, which catches a float64
path that silently computes in float32. Integer and bool outputs must match exactly.
`test_every_op_has_a_case` fails for an op registered without a case here."""
from __future__ import annotations

import copy
import functools
import warnings

import numpy as np
import pytest

from cuvil.errors import CuvilError, ShapeError, UnsupportedOpError
from cuvil.ir import dims, interpreter
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.ir.ops import REGISTRY
from cuvil.ir.ops.elementwise import BINARY, COMPARE, FLOAT_BINARY, LOGICAL, UNARY
from cuvil.ir.ops.fused import ACTIVATIONS
from cuvil.target import vector_floats

from .util import check_graph, compile_graph

F64_TOL = (1e-9, 1e-9)
# passes/legalize.py computes float64 nodes of ops whose C kernels are float32-only (conv, pooling,
# softmax, norms, attention, rope) in float32 between casts: those outputs get the fp32 tolerance
LEGALIZED_F64 = (1e-4, 1e-4)
B = dims.Sym("b")
SYMS = {"b": (1, 9)}          # dynamic dim of the dynamic cases; each such case runs at b = 1 and b = 6
B_RUNS = (1, 6)
MM_ACTS = ACTIVATIONS   # fused epilogue activations (ir/ops/fused.py; C in codegen/c/gen_activations.py)


# ---- building and checking one graph -------------------------------------------------------
class Case:
    """A graph under test: inputs with their values (one set per run) and labelled outputs."""

    def __init__(self, seed=0, runs=1, symbols=None):
        self.g = Graph()
        self.g.symbols = dict(symbols or {})
        self.runs = [[] for _ in range(runs)]
        self.labels = []
        self.tols = []
        self.rng = np.random.default_rng(seed)

    def input(self, value, shape=None):
        """value: an array, or a list of arrays (one per run) when shape has a dynamic dim."""
        values = value if isinstance(value, list) else [value] * len(self.runs)
        assert len(values) == len(self.runs)
        v = Value(TensorType(tuple(shape) if shape is not None else values[0].shape, str(values[0].dtype)),
                  f"x{len(self.g.inputs)}")
        self.g.inputs.append(v)
        for r, a in zip(self.runs, values):
            r.append(a)
        return v

    def const(self, array):
        return self.g.const(array)

    def add(self, op, ins, attrs=None):
        return self.g.add(op, ins, dict(attrs or {}))

    def out(self, v, label, tol=None):
        """tol: (rtol, atol) for this output instead of the dtype's default; give the reason at the call."""
        self.g.outputs.append(v)
        self.labels.append(label)
        self.tols.append(tol)
        return v

    def check(self, rtol=1e-4, atol=1e-4, inplace=(), **opts):
        """inplace: indices of inputs the op updates in place (the KV cache), exempt from the no-write check."""
        assert self.g.outputs, "a case without outputs tests nothing"
        self.g.verify()
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)       # mean of an empty slice is nan, and says so
            expected = [interpreter.run(copy.deepcopy(self.g), *feeds) for feeds in self.runs]
        cm = compile_graph(self.g, **opts)
        errors = []
        for r, (feeds, exp) in enumerate(zip(self.runs, expected)):
            before = [np.array(a, copy=True) for a in feeds]
            got = cm.run(*feeds)
            for k, (a, b0) in enumerate(zip(feeds, before)):
                if k not in inplace and not np.array_equal(a, b0, equal_nan=a.dtype.kind == "f"):
                    errors.append(f"[run {r}] input {k} was modified by the compiled code")
            assert len(got) == len(exp)
            for label, tol, e, o in zip(self.labels, self.tols, exp, got):
                try:
                    assert o.shape == e.shape, f"shape {o.shape}, expected {e.shape}"
                    assert o.dtype == e.dtype, f"dtype {o.dtype}, expected {e.dtype}"
                    if e.dtype.kind == "f":
                        rt, at = tol or (F64_TOL if e.dtype == np.float64 else (rtol, atol))
                        np.testing.assert_allclose(o, e, rtol=rt, atol=at, equal_nan=True)
                    else:
                        np.testing.assert_array_equal(o, e)
                except AssertionError as ex:
                    errors.append(f"[run {r}] {label}: {str(ex).strip()[:1500]}")
        if errors:
            pytest.fail(f"{len(errors)} of {len(self.labels) * len(self.runs)} outputs disagree:\n" + "\n".join(errors))
        return cm


def rand(rng, shape, dtype, lo=-4.0, hi=4.0):
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind in "iu":
        return np.asarray(rng.integers(int(lo), int(hi) + 1, size=shape)).astype(dtype)
    return np.asarray(rng.uniform(lo, hi, size=shape)).astype(dtype)


def strided(a):
    """The same values as a, laid out with a stride of 2 elements along the last dim."""
    if a.ndim == 0:
        return a
    buf = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 1,), a.dtype)
    view = buf[..., 1::2]
    view[...] = a
    assert not view.flags.c_contiguous or a.size <= 1
    return view


def fortran(a):
    """The same values as a in column-major (transposed) layout."""
    f = np.asfortranarray(a)
    assert not f.flags.c_contiguous or a.ndim < 2 or a.size <= max(a.shape)
    return f


def dyn(rng, shape, dtype, lo=-4.0, hi=4.0):
    """Values for a shape with the dynamic dim B, one array per run."""
    return [rand(rng, tuple(dims.evaluate(d, {"b": n}) for d in shape), dtype, lo, hi) for n in B_RUNS]


# ---- the table: op -> {variant: function} ---------------------------------------------------
CASES: dict = {}


def case(*ops, name="basic"):
    def deco(fn):
        for op in ops:
            assert name not in CASES.get(op, {}), (op, name)
            CASES.setdefault(op, {})[name] = functools.partial(fn, op)
        return fn
    return deco


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5], np.float64)

# input ranges inside each op's domain (and away from poles, where fp32 rounding of the input dominates)
DOMAIN = {
    "airy_ai": (-30, 12), "log": (0.05, 6), "sqrt": (0.0, 6), "rsqrt": (0.05, 6), "log1p": (-0.9, 6), "reciprocal": (0.2, 4),
    "asin": (-0.95, 0.95), "acos": (-0.95, 0.95), "atanh": (-0.95, 0.95), "acosh": (1.05, 6),
    "tan": (-1.4, 1.4), "exp": (-8, 8), "expm1": (-8, 8), "sinh": (-6, 6), "cosh": (-6, 6),
}
SIGNED = {"reciprocal"}            # domain applied to |x|, random sign
HALVES = {"floor", "ceil", "round", "trunc", "sign", "relu", "leaky_relu", "elu", "hardsigmoid", "clip", "abs"}
INT_UNARY = [n for n, (_, acc, _) in UNARY.items() if acc == "any"]
NUMERIC_UNARY = [n for n, (_, acc, _) in UNARY.items() if acc != "bool"]   # all but "not": floats, and ints for "any"
UNARY_ATTRS = {"leaky_relu": {"alpha": 0.1}, "elu": {"alpha": 0.7}, "hardsigmoid": {"alpha": 0.25, "beta": 0.4},
               "clip": {"min": -1.5, "max": 2.25}}


def _unary_values(op, rng, shape, dtype):
    lo, hi = DOMAIN.get(op, (-4.0, 4.0))
    x = rand(rng, shape, dtype, lo, hi)
    if op in SIGNED:
        x = (x * np.where(rand(rng, shape, "bool"), 1, -1)).astype(dtype)
    if op in HALVES and x.size:   # exact halves: round-half-even, ties at 0 and at the clip bounds
        flat = x.reshape(-1)
        flat[::3] = (rng.integers(-8, 9, size=flat[::3].shape) / 2).astype(dtype)
    return x


@case(*NUMERIC_UNARY)
def unary_float(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    attrs = UNARY_ATTRS.get(op, {})
    x = c.input(_unary_values(op, r, (7, 13), "float32"))
    c.out(c.add(op, [x], attrs), "f32[7,13]")
    for shape in [(0, 5), (), (1, 1, 33)]:
        c.out(c.add(op, [c.input(_unary_values(op, r, shape, "float32"))], attrs), f"f32{list(shape)}")
    c.out(c.add(op, [c.input(fortran(_unary_values(op, r, (13, 7), "float32")))], attrs), "f32 transposed input")
    c.out(c.add(op, [c.input(strided(_unary_values(op, r, (3, 5), "float32")))], attrs), "f32 strided input")
    xd = c.input([_unary_values(op, r, (n, 3), "float32") for n in B_RUNS], (B, 3))
    c.out(c.add(op, [xd], attrs), "f32[b,3]")
    c.out(c.add(op, [c.input(_unary_values(op, r, (33,), "float64"))], attrs), "f64[33]")
    c.out(c.add(op, [c.input(SPECIAL.astype("float32"))], attrs), "f32 nan/inf/0")
    c.out(c.add(op, [c.input(SPECIAL.copy())], attrs), "f64 nan/inf/0")
    if op in INT_UNARY:
        _unary_int(op, c)
    c.check()


def _unary_int(op, c):
    attrs = {"clip": {"min": -3.0, "max": 5.0}}.get(op, {})
    for dt in ("int64", "int32"):
        for shape in [(7, 13), (), (0, 3)]:
            c.out(c.add(op, [c.input(rand(c.rng, shape, dt, -50, 50))], attrs), f"{dt}{list(shape)}")
    c.out(c.add(op, [c.input(strided(rand(c.rng, (4, 5), "int64", -9, 9)))], attrs), "int64 strided")


@case("clip", name="bounds")
def clip_bounds(op):
    """Default (infinite) bounds, one-sided bounds, fractional bounds on ints, and min > max (all = max)."""
    c = Case()
    xf = c.input(np.array([np.nan, -np.inf, np.inf, -3, -1, 0, 1, 2.5, 7], np.float32))
    xi = c.input(np.array([-2**40, -7, -2, -1, 0, 1, 2, 3, 2**40], np.int64))
    xi32 = c.input(np.array([-2**31, -7, -1, 0, 1, 2, 3, 2**31 - 1], np.int32))
    for bounds in [{}, {"min": 0.0}, {"max": 1.0}, {"min": -1.5, "max": 2.5}, {"min": 3.0, "max": 1.0}]:
        c.out(c.add("clip", [xf], bounds), f"f32 {bounds}")
        c.out(c.add("clip", [xi], bounds), f"int64 {bounds}")
        c.out(c.add("clip", [xi32], bounds), f"int32 {bounds}")
    c.check()


@case("not")
def logical_not(op):
    c = Case(runs=2, symbols=SYMS)
    for shape in [(7, 13), (), (0, 4), (1, 1, 33)]:
        c.out(c.add(op, [c.input(rand(c.rng, shape, "bool"))]), f"bool{list(shape)}")
    c.out(c.add(op, [c.input(fortran(rand(c.rng, (5, 3), "bool")))]), "transposed")
    c.out(c.add(op, [c.input(dyn(c.rng, (B, 3), "bool"), (B, 3))]), "bool[b,3]")
    c.check()


# ---- binary ---------------------------------------------------------------------------------
INT_BINARY = [n for n in BINARY if n not in FLOAT_BINARY]
BOOL_BINARY = ["max", "min"]


def _binary_values(op, rng, sa, sb, dtype):
    """Operand values inside the op's domain: divisors away from 0 for floats, small ints,
    positive bases for float pow; integer divisors include 0 and negatives (C truncation rules)."""
    if dtype == "bool":
        return rand(rng, sa, dtype), rand(rng, sb, dtype)
    if np.dtype(dtype).kind in "iu":
        if op == "pow":
            return rand(rng, sa, dtype, -4, 4), rand(rng, sb, dtype, 0, 6)
        if op in ("div", "floordiv", "mod", "fmod"):
            return rand(rng, sa, dtype, -20, 20), rand(rng, sb, dtype, -6, 6)
        return rand(rng, sa, dtype, -50, 50), rand(rng, sb, dtype, -50, 50)
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    if op == "pow":
        a = rand(rng, sa, dtype, 0.1, 3)
    if op in ("div", "floordiv", "mod", "fmod"):
        b = (np.sign(b) * (np.abs(b) + 0.25)).astype(dtype)
        a = np.where(rand(rng, sa, "bool"), np.round(a), a).astype(dtype)   # exact multiples too
    return a, b


def _binary_cases(op, c, dtypes):
    r = c.rng
    pairs = [((7, 13), (7, 13)), ((3, 1, 5), (4, 5)), ((), (6,)), ((6,), ()), ((0, 5), (1, 5)), ((), ())]
    for dt in dtypes:
        for sa, sb in pairs if dt == "float32" else pairs[1:3]:
            a, b = _binary_values(op, r, sa, sb, dt)
            c.out(c.add(op, [c.input(a), c.input(b)]), f"{dt}{list(sa)} . {dt}{list(sb)}")
    a, b = _binary_values(op, r, (13, 7), (7, 13), dtypes[0])
    c.out(c.add(op, [c.input(np.ascontiguousarray(a).T), c.input(strided(b))]), f"{dtypes[0]} non-contiguous inputs")
    av = [_binary_values(op, r, (n, 5), (5,), dtypes[0]) for n in B_RUNS]
    c.out(c.add(op, [c.input([a for a, _ in av], (B, 5)), c.input(av[0][1])]), f"{dtypes[0]}[b,5] . [5]")
    av = [_binary_values(op, r, (n, 1), (1, n), dtypes[0]) for n in B_RUNS]
    c.out(c.add(op, [c.input([a for a, _ in av], (B, 1)), c.input([b for _, b in av], (1, B))]),
          f"{dtypes[0]}[b,1] . [1,b]")


@case(*BINARY)
def binary(op):
    """Domain values over the broadcast shapes, then every pair of nan, +-inf, +-0 and ordinary values."""
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    _binary_cases(op, c, ["float32", "float64"] + (["int64", "int32"] if op in INT_BINARY else [])
                  + (["bool"] if op in BOOL_BINARY else []))
    a, b = np.meshgrid(SPECIAL, np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0, -3.0]), indexing="ij")
    for dt in ("float32", "float64"):
        c.out(c.add(op, [c.input(a.astype(dt)), c.input(b.astype(dt))]), f"{dt} nan/inf/0 pairs")
    c.check()


@case(*COMPARE)
def compare(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    for dt in ("float32", "float64", "int64", "int32", "bool", "uint8"):
        lo, hi = (-3, 3) if dt != "uint8" else (0, 5)       # small ranges: plenty of ties
        a, b = rand(r, (3, 1, 5), dt, lo, hi), rand(r, (4, 5), dt, lo, hi)
        if dt.startswith("float"):
            a, b = np.round(a).astype(dt), np.round(b).astype(dt)
        c.out(c.add(op, [c.input(a), c.input(b)]), f"{dt}[3,1,5] . [4,5]")
    c.out(c.add(op, [c.input(np.float32(1.5)), c.input(rand(r, (0, 3), "float32"))]), "0-d . [0,3]")
    c.out(c.add(op, [c.input(fortran(np.round(rand(r, (5, 3), "float32")))), c.input(np.float32(0))]),
          "transposed . 0-d")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "int64", -2, 2), (B, 3)), c.input(rand(r, (3,), "int64", -2, 2))]),
          "int64[b,3] . [3]")
    sa, sb = np.meshgrid(SPECIAL, SPECIAL, indexing="ij")
    c.out(c.add(op, [c.input(sa.astype("float32")), c.input(sb.astype("float32"))]), "f32 nan/inf/0")
    c.check()


@case(*LOGICAL)
def logical(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    for sa, sb in [((7, 13), (7, 13)), ((3, 1, 5), (4, 5)), ((), (6,)), ((0, 2), (1, 2))]:
        c.out(c.add(op, [c.input(rand(r, sa, "bool")), c.input(rand(r, sb, "bool"))]), f"{list(sa)} . {list(sb)}")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 3), "bool"))), c.input(strided(rand(r, (5, 3), "bool")))]),
          "non-contiguous")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "bool"), (B, 3)), c.input(rand(r, (1, 3), "bool"))]), "[b,3] . [1,3]")
    c.check()


@case("where")
def where(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in ("float32", "float64", "int64", "int32", "bool"):
        c.out(c.add(op, [c.input(rand(r, (3, 1, 5), "bool")), c.input(rand(r, (4, 5), dt)),
                         c.input(rand(r, (), dt))]), f"{dt}: cond[3,1,5], a[4,5], b[]")
    c.out(c.add(op, [c.input(rand(r, (), "bool")), c.input(rand(r, (7,), "float32")),
                     c.input(rand(r, (1,), "float32"))]), "cond[]")
    c.out(c.add(op, [c.input(rand(r, (0, 1), "bool")), c.input(rand(r, (1, 4), "float32")),
                     c.input(rand(r, (4,), "float32"))]), "cond[0,1]")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "bool"))), c.input(strided(rand(r, (6, 5), "float32"))),
                     c.input(fortran(rand(r, (6, 5), "float32")))]), "non-contiguous")
    c.out(c.add(op, [c.input(dyn(r, (B, 1), "bool"), (B, 1)), c.input(dyn(r, (B, 4), "int64"), (B, 4)),
                     c.input(rand(r, (4,), "int64"))]), "cond[b,1], a[b,4], b[4]")
    c.out(c.add(op, [c.input(np.array([True, False, True])), c.input(SPECIAL[:3].astype("float32")),
                     c.input(SPECIAL[3:6].astype("float32"))]), "nan/inf pass through")
    c.check()


CAST_DTYPES = ("float32", "float64", "int64", "int32", "bool", "uint8", "int8")


@case("cast")
def cast(op):
    """Every pair of dtypes; floats to ints truncate toward zero (values stay in the target's range)."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    vals = {"float32": np.array([-100.75, -2.5, -1.7, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.7, 99.9, 127.0], "float32"),
            "int64": np.array([-128, -2, -1, 0, 1, 2, 3, 127, 100, 7, -100, 64], "int64"),
            "bool": np.array([True, False] * 6)}
    vals["float64"] = vals["float32"].astype("float64") + 1e-9
    vals["int32"] = vals["int64"].astype("int32")
    vals["int8"] = vals["int64"].astype("int8")
    vals["uint8"] = np.abs(vals["int64"]).astype("uint8")
    for src in CAST_DTYPES:
        x = c.input(vals[src].reshape(3, 4))
        for dst in CAST_DTYPES:
            if src.startswith("float") and dst == "uint8":
                x2 = c.input(np.abs(vals[src]).reshape(3, 4))     # negative floats to uint8 are undefined in C
                c.out(c.add(op, [x2], {"to": dst}), f"{src} -> {dst}")
            else:
                c.out(c.add(op, [x], {"to": dst}), f"{src} -> {dst}")
    big = c.input(np.array([2**33 + 5, -2**33 - 7, 2**31, 2**40 + 1, -1], np.int64))
    for dst in ("int32", "float32", "float64", "bool"):
        c.out(c.add(op, [big], {"to": dst}), f"int64 large -> {dst}")
    sp = c.input(SPECIAL.astype("float32"))
    for dst in ("float64", "bool"):
        c.out(c.add(op, [sp], {"to": dst}), f"f32 nan/inf -> {dst}")
    c.out(c.add(op, [c.input(SPECIAL.copy())], {"to": "float32"}), "f64 nan/inf -> float32")
    c.out(c.add(op, [c.input(np.float64(-3.9))], {"to": "int32"}), "0-d f64 -> int32")
    c.out(c.add(op, [c.input(rand(r, (0, 3), "float32"))], {"to": "int64"}), "[0,3]")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 3), "float32", -50, 50)))], {"to": "int64"}), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "int64", -9, 9), (B, 3))], {"to": "float32"}), "int64[b,3]")
    c.check()


# ---- reductions ------------------------------------------------------------------------------
REDUCE_RANGE = {"reduce_prod": (0.6, 1.5)}


@case("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
def reduce(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    lo, hi = REDUCE_RANGE.get(op, (-4.0, 4.0))
    x = c.input(rand(r, (5, 7, 13), "float32", lo, hi))
    for axes, keep in [(None, False), ((1,), False), ((0, 2), False), ((-1,), True), ((0, 1, 2), True),
                       ((0,), False), ((0, 1), True), ((), False)]:
        c.out(c.add(op, [x], {"axes": axes, "keepdims": keep}), f"f32[5,7,13] axes={axes} keepdims={keep}")
    e = c.input(rand(r, (0, 5), "float32"))
    for axes in [(0,), (1,), None]:
        c.out(c.add(op, [e], {"axes": axes}), f"f32[0,5] axes={axes}")
    c.out(c.add(op, [c.input(rand(r, (), "float32", lo, hi))], {"axes": None}), "0-d")
    c.out(c.add(op, [c.input(rand(r, (1, 1, 33), "float32", lo, hi))], {"axes": (0, 1)}), "[1,1,33] axes=(0,1)")
    c.out(c.add(op, [c.input(rand(r, (3, 1, 1, 4), "float32", lo, hi))], {"axes": (1, 3)}), "[3,1,1,4] axes=(1,3)")
    c.out(c.add(op, [c.input(rand(r, (4, 1000), "float32", lo, hi) if op != "reduce_prod" else
                             rand(r, (4, 1000), "float32", 0.999, 1.001))], {"axes": (1,)}), "[4,1000] axes=1")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32", lo, hi)))], {"axes": (1,)}), "transposed")
    c.out(c.add(op, [c.input(strided(rand(r, (6, 5), "float32", lo, hi)))], {"axes": (0,)}), "strided")
    xd = c.input(dyn(r, (B, 7), "float32", lo, hi), (B, 7))
    for axes in [(0,), (1,), None]:
        c.out(c.add(op, [xd], {"axes": axes}), f"f32[b,7] axes={axes}")
    xd3 = c.input(dyn(r, (3, B, 4), "float32", lo, hi), (3, B, 4))
    c.out(c.add(op, [xd3], {"axes": (1,), "keepdims": True}), "f32[3,b,4] axes=1")
    c.out(c.add(op, [xd3], {"axes": (0, 2)}), "f32[3,b,4] axes=(0,2)")
    c.out(c.add(op, [c.input(rand(r, (4, 6, 5), "float64", lo, hi))], {"axes": (0, 2)}), "f64 axes=(0,2)")
    c.out(c.add(op, [c.input(rand(r, (4, 6, 5), "float64", lo, hi))], {"axes": (1,)}), "f64 axes=1")
    if op != "reduce_mean":
        ilo, ihi = (-3, 3) if op == "reduce_prod" else (-100, 100)
        for dt in ("int64", "int32", "uint8"):
            xi = c.input(rand(r, (4, 6, 5), dt, max(ilo, 0) if dt == "uint8" else ilo, ihi))
            c.out(c.add(op, [xi], {"axes": (0, 2)}), f"{dt} axes=(0,2)")
            c.out(c.add(op, [xi], {"axes": (2,)}), f"{dt} axes=2")
            c.out(c.add(op, [c.input(rand(r, (0, 3), dt))], {"axes": (0,)}), f"{dt}[0,3] axes=0")
    if op in ("reduce_max", "reduce_min"):
        for x in ([np.nan, 1, 2], [1, np.nan, -np.inf], [np.inf, 3, 1], [-np.inf, -np.inf, -np.inf]):
            c.out(c.add(op, [c.input(np.array(x, np.float32))], {"axes": (0,)}), f"f32 {x}")
        xb = c.input(rand(r, (6, 5), "bool"))
        c.out(c.add(op, [xb], {"axes": (1,)}), "bool axes=1")
        c.out(c.add(op, [c.input(np.zeros((0, 3), bool))], {"axes": (0,)}), "bool[0,3] axes=0")
    c.check()


@case("argmax", "argmin")
def argreduce(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (5, 7, 13), "float32"))
    for axis in (0, 1, 2, -1):
        c.out(c.add(op, [x], {"axis": axis}), f"f32 axis={axis}")
    c.out(c.add(op, [x], {"axis": 1, "keepdims": True}), "f32 axis=1 keepdims")
    for dt in ("int64", "int32", "float64", "bool", "uint8"):     # few distinct values: ties everywhere
        xi = c.input(rand(r, (6, 9), dt, 0, 3))
        for last in (False, True):
            c.out(c.add(op, [xi], {"axis": 1, "select_last_index": last}), f"{dt} ties axis=1 last={last}")
        c.out(c.add(op, [xi], {"axis": 0, "select_last_index": True, "keepdims": True}), f"{dt} ties axis=0 last")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], {"axis": 1}), "[0,5] axis=1")
    c.out(c.add(op, [c.input(rand(r, (1, 5), "float32"))], {"axis": 0}), "[1,5] axis=0")
    c.out(c.add(op, [c.input(rand(r, (4, 1000), "float32"))], {"axis": 1}), "[4,1000] axis=1")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32")))], {"axis": 1}), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 7), "float32"), (B, 7))], {"axis": 0}), "[b,7] axis=0")
    c.out(c.add(op, [c.input(dyn(r, (3, B), "float32"), (3, B))], {"axis": 1}), "[3,b] axis=1")
    nan = c.input(np.array([[1, np.nan, 3, np.nan], [np.inf, 2, -np.inf, 0], [-np.inf] * 4], np.float32))
    for last in (False, True):
        c.out(c.add(op, [nan], {"axis": 1, "select_last_index": last}), f"nan/inf last={last}")
    c.check()


@case("cumsum")
def cumsum(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (5, 7, 13), "float32"))
    for axis, excl, rev in [(0, False, False), (0, True, True), (1, False, False), (1, True, False),
                            (1, False, True), (1, True, True), (2, False, False), (2, True, True)]:
        c.out(c.add(op, [x], {"axis": axis, "exclusive": excl, "reverse": rev}),
              f"f32 axis={axis} exclusive={excl} reverse={rev}")
    for dt in ("float64", "int64", "int32"):
        xi = c.input(rand(r, (4, 9), dt, -100, 100))
        for excl, rev in [(False, False), (True, True)]:
            c.out(c.add(op, [xi], {"axis": 1, "exclusive": excl, "reverse": rev}), f"{dt} excl={excl} rev={rev}")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], {"axis": 1}), "[0,5] axis=1")
    c.out(c.add(op, [c.input(rand(r, (3, 0), "int64"))], {"axis": 1, "exclusive": True}), "[3,0] axis=1")
    c.out(c.add(op, [c.input(rand(r, (1,), "float32"))], {"axis": 0}), "[1]")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32")))], {"axis": 0}), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "float32"), (B, 3))], {"axis": 0, "reverse": True}), "[b,3] axis=0")
    c.out(c.add(op, [c.input(dyn(r, (3, B), "int64"), (3, B))], {"axis": -1, "exclusive": True}), "[3,b] axis=-1")
    c.check()


# ---- movement -------------------------------------------------------------------------------
MOVE_DTYPES = ("float32", "float64", "int64", "int32", "bool")


@case("reshape")
def reshape(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in MOVE_DTYPES:
        c.out(c.add(op, [c.input(rand(r, (4, 6), dt))], {"shape": (2, 12)}), f"{dt} [4,6] -> [2,12]")
    x = c.input(rand(r, (4, 6), "float32"))
    c.out(c.add("neg", [c.add(op, [x], {"shape": (24,)})]), "view of an input, then used")
    y = c.add("neg", [x])
    v = c.add(op, [y], {"shape": (3, 8)})
    c.out(c.add("abs", [v]), "view of an intermediate, then used")
    c.out(v, "view of an intermediate, returned")
    c.out(c.add(op, [c.add(op, [c.input(rand(r, (3, 1, 5), "int64"))], {"shape": (15,)})], {"shape": (5, 3)}),
          "reshape chain")
    c.out(c.add(op, [x], {"shape": (4, 6)}), "same shape (identity)")
    c.out(c.add(op, [c.input(np.float32(2.5))], {"shape": (1, 1)}), "0-d -> [1,1]")
    c.out(c.add(op, [c.input(np.array([7], np.int32))], {"shape": ()}), "[1] -> 0-d")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], {"shape": (5, 0)}), "[0,5] -> [5,0]")
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 6), "float32")))], {"shape": (3, 8)}), "transposed input")
    c.out(c.add(op, [c.input(strided(rand(r, (4, 6), "int64")))], {"shape": (24,)}), "strided input")
    xd = c.input(dyn(r, (B, 6), "float32"), (B, 6))
    c.out(c.add(op, [xd], {"shape": (B * 2, 3)}), "[b,6] -> [2b,3]")
    c.out(c.add("abs", [c.add(op, [xd], {"shape": (B * 6,)})]), "[b,6] -> [6b] -> abs")
    c.out(c.add(op, [xd], {"shape": (3, B, 2)}), "[b,6] -> [3,b,2]")
    c.check()


@case("transpose")
def transpose(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (2, 3, 4), "float32"))
    for perm in [(2, 0, 1), (1, 0, 2), (0, 2, 1), (2, 1, 0), (0, 1, 2)]:
        c.out(c.add(op, [x], {"perm": perm}), f"[2,3,4] perm={perm}")
    for dt in MOVE_DTYPES:
        c.out(c.add(op, [c.input(rand(r, (7, 13), dt))], {"perm": (1, 0)}), f"{dt}[7,13]")
    c.out(c.add(op, [c.input(rand(r, (1, 5, 1), "float32"))], {"perm": (2, 1, 0)}), "[1,5,1]")
    c.out(c.add(op, [c.input(rand(r, (0, 3), "float32"))], {"perm": (1, 0)}), "[0,3]")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4, 5), "float32"))], {"perm": (0, 2, 3, 1)}), "[2,3,4,5] nchw->nhwc")
    c.out(c.add(op, [c.input(rand(r, (40, 33, 30), "float32"))], {"perm": (2, 0, 1)}), "[40,33,30] (threaded)")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 6), "float32")))], {"perm": (1, 0)}), "transposed input")
    c.out(c.add(op, [c.input(dyn(r, (B, 3, 5), "float32"), (B, 3, 5))], {"perm": (2, 0, 1)}), "[b,3,5]")
    c.check()


@case("expand")
def expand(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in MOVE_DTYPES:
        c.out(c.add(op, [c.input(rand(r, (3, 1), dt))], {"shape": (2, 3, 4)}), f"{dt}[3,1] -> [2,3,4]")
    c.out(c.add(op, [c.input(np.float32(1.25))], {"shape": (5,)}), "0-d -> [5]")
    c.out(c.add(op, [c.input(np.array([3.0], np.float32))], {"shape": (0,)}), "[1] -> [0]")
    c.out(c.add(op, [c.input(rand(r, (4, 1, 1), "float32"))], {"shape": (4, 3, 2)}), "[4,1,1] -> [4,3,2]")
    c.out(c.add(op, [c.input(rand(r, (1, 5), "float32"))], {"shape": (5, 5)}), "[1,5] -> [5,5]")
    c.out(c.add(op, [c.input(strided(rand(r, (4, 1), "float32")))], {"shape": (4, 6)}), "strided input")
    c.out(c.add(op, [c.input(rand(r, (1, 5), "int64"))], {"shape": (B, 5)}), "[1,5] -> [b,5]")
    c.out(c.add(op, [c.input(dyn(r, (B, 1), "float32"), (B, 1))], {"shape": (2, B, 3)}), "[b,1] -> [2,b,3]")
    c.check()


@case("slice")
def slice_(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (7, 13), "float32"))
    for attrs in [dict(axis=1, start=2, length=5), dict(axis=1, start=1, step=3, length=4),
                  dict(axis=1, start=12, step=-1, length=13), dict(axis=0, start=6, step=-2, length=4),
                  dict(axis=1, start=3, length=0), dict(axis=-2, start=0, length=7), dict(axis=0, start=6, length=1)]:
        c.out(c.add(op, [x], attrs), f"[7,13] {attrs}")
    for dt in MOVE_DTYPES:
        c.out(c.add(op, [c.input(rand(r, (4, 5, 6), dt))], dict(axis=1, start=1, step=2, length=2)), f"{dt}[4,5,6]")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], dict(axis=1, start=1, length=3)), "[0,5]")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32")))], dict(axis=0, start=1, length=4)), "transposed")
    xd = c.input(dyn(r, (B, 13), "float32"), (B, 13))
    c.out(c.add(op, [xd], dict(axis=1, start=2, step=3, length=4)), "[b,13] axis=1")
    c.out(c.add(op, [xd], dict(axis=0, start=0, length=B)), "[b,13] axis=0 whole")
    xd2 = c.input(dyn(r, (3, B + 1), "int64"), (3, B + 1))
    c.out(c.add(op, [xd2], dict(axis=1, start=1, length=B)), "[3,b+1] axis=1 from 1")
    c.check()


@case("concat")
def concat(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in MOVE_DTYPES:
        c.out(c.add(op, [c.input(rand(r, (2, 3), dt)), c.input(rand(r, (0, 3), dt)), c.input(rand(r, (4, 3), dt))],
                    {"axis": 0}), f"{dt} axis=0 with an empty input")
    c.out(c.add(op, [c.input(rand(r, (2, 3), "float32")), c.input(rand(r, (2, 1), "float32")),
                     c.input(rand(r, (2, 5), "float32"))], {"axis": -1}), "axis=-1")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32")), c.input(rand(r, (2, 5, 4), "float32"))], {"axis": 1}),
          "rank 3 axis=1")
    c.out(c.add(op, [c.input(rand(r, (3, 7), "int64"))], {"axis": 1}), "one input")
    x = c.input(rand(r, (2, 2), "float32"))
    c.out(c.add(op, [x, x, x], {"axis": 1}), "the same input three times")
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 3), "float32"))), c.input(strided(rand(r, (4, 2), "float32")))],
                {"axis": 1}), "non-contiguous inputs")
    xd = c.input(dyn(r, (B, 3), "float32"), (B, 3))
    c.out(c.add(op, [xd, c.input(rand(r, (2, 3), "float32")), xd], {"axis": 0}), "[b,3] ++ [2,3] ++ [b,3]")
    c.out(c.add(op, [xd, c.input(dyn(r, (B, 2), "float32"), (B, 2))], {"axis": 1}), "[b,3] ++ [b,2] axis=1")
    c.check()


@case("pad")
def pad(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (4, 5), "float32"))
    for mode in ("constant", "reflect", "edge"):
        for pads in [((1, 2), (0, 3)), ((2, 1), (1, 3)), ((0, 0), (4, 4)), ((3, 3), (0, 0))]:
            c.out(c.add(op, [x], {"pads": pads, "mode": mode, "value": 1.5}), f"{mode} {pads}")
        c.out(c.add(op, [x], {"pads": ((-1, 2), (1, -2)), "mode": mode}), f"{mode} with negative pads (crop)")
        c.out(c.add(op, [x], {"pads": ((-1, -2), (0, -4)), "mode": mode}), f"{mode} crop only")
    for dt in ("int64", "int32", "bool", "float64"):
        c.out(c.add(op, [c.input(rand(r, (3, 4), dt))], {"pads": ((1, 0), (2, 1)), "value": 1.0}), f"{dt} constant")
        c.out(c.add(op, [c.input(rand(r, (3, 4), dt))], {"pads": ((1, 2), (2, 1)), "mode": "edge"}), f"{dt} edge")
    c.out(c.add(op, [c.input(rand(r, (0, 3), "float32"))], {"pads": ((1, 1), (0, 1)), "value": -2.0}), "[0,3]")
    c.out(c.add(op, [c.input(rand(r, (1, 3), "float32"))], {"pads": ((0, 0), (2, 2)), "mode": "reflect"}),
          "reflect [1,3]")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32"))], {"pads": ((0, 1), (1, 1), (2, 0)), "mode": "reflect"}),
          "rank 3 reflect")
    c.out(c.add(op, [c.input(np.float32(3))], {"pads": ()}), "0-d")
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 3), "float32")))], {"pads": ((1, 1), (1, 1))}), "transposed")
    xd = c.input(dyn(r, (B, 5), "float32"), (B, 5))
    c.out(c.add(op, [xd], {"pads": ((0, 0), (2, 2)), "mode": "reflect"}), "[b,5] reflect on static dim")
    c.out(c.add(op, [xd], {"pads": ((1, 2), (0, 1)), "mode": "edge"}), "[b,5] edge on b")
    c.out(c.add(op, [xd], {"pads": ((2, 1), (0, 0)), "value": 9.0}), "[b,5] constant on b")
    c.check()


@case("gather")
def gather(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (5, 7), "float32"))
    c.out(c.add(op, [x, c.input(np.array([4, 0, -1, 2, -5], np.int64))], {"axis": 0}), "axis=0 negative indices")
    c.out(c.add(op, [x, c.input(np.array([[6, 0, 1, -7], [3, 3, 3, 2]], np.int32))], {"axis": 1}),
          "axis=1 int32 2-d indices")
    c.out(c.add(op, [x, c.input(np.int64(3))], {"axis": -1}), "0-d index")
    c.out(c.add(op, [x, c.input(np.zeros((0,), np.int64))], {"axis": 0}), "no indices")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32")), c.input(np.array([[2], [0]], np.int64))], {"axis": 1}),
          "rank 3 axis=1")
    for dt in ("float64", "int64", "int32", "bool"):
        c.out(c.add(op, [c.input(rand(r, (6, 3), dt)), c.input(np.array([5, 1, 1], np.int64))], {"axis": 0}), dt)
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 6), "float32"))), c.input(np.array([1, 3], np.int64))],
                {"axis": 1}), "transposed data")
    c.out(c.add(op, [c.input(dyn(r, (B, 7), "float32"), (B, 7)), c.input(np.array([6, 0, 2], np.int64))],
                {"axis": 1}), "data[b,7] axis=1")
    c.out(c.add(op, [c.input(rand(r, (9, 4), "float32")),
                     c.input([np.array([8], np.int64), np.array([0, -1, 3, 5, 2, 2], np.int64)], (B,))], {"axis": 0}),
          "indices[b]")
    # along the last axis: a row of outputs a task (lower_movement.lower_gather), any element type
    c.out(c.add(op, [c.input(rand(r, (3, 2, 9), "int64")), c.input(np.array([8, -1, 0, 4, -9, 4, 4], np.int64))],
                {"axis": 2}), "last axis int64, negative indices")
    c.out(c.add(op, [c.input(rand(r, (5, 6), "bool")),
                     c.input([np.array([5], np.int64), np.array([0, -1, 3, 5, 2, -6], np.int64)], (B,))], {"axis": 1}),
          "last axis bool, indices[b]")
    c.check()


@case("gather_elements")
def gather_elements(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (4, 5), "float32"))
    c.out(c.add(op, [x, c.input(r.integers(-5, 5, (4, 3)))], {"axis": 1}), "axis=1 smaller index")
    c.out(c.add(op, [x, c.input(r.integers(-4, 4, (2, 5)).astype(np.int32))], {"axis": 0}), "axis=0 int32")
    c.out(c.add(op, [x, c.input(np.zeros((0, 5), np.int64))], {"axis": 0}), "empty index")
    c.out(c.add(op, [c.input(rand(r, (3, 4, 5), "float32")), c.input(r.integers(0, 4, (3, 6, 2)))], {"axis": 1}),
          "rank 3 axis=1 index longer than data")
    for dt in ("float64", "int64", "int32", "bool"):
        c.out(c.add(op, [c.input(rand(r, (3, 4), dt)), c.input(r.integers(0, 4, (3, 4)))], {"axis": -1}), dt)
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 6), "float32"))), c.input(fortran(r.integers(0, 6, (4, 6))))],
                {"axis": 1}), "transposed data and index")
    c.out(c.add(op, [c.input(dyn(r, (B, 4), "float32"), (B, 4)),
                     c.input([r.integers(0, 4, (n, 3)) for n in B_RUNS], (B, 3))], {"axis": 1}), "[b,4] axis=1")
    c.check()


@case("iota")
def iota(op):
    """Source ops fold to constants at fusion_level >= 1, so compile at fusion_level 0 to run the C."""
    c = Case(runs=2, symbols=SYMS)
    for attrs in [dict(length=7, start=3, step=2), dict(length=9, start=0.5, step=0.25, dtype="float32"),
                  dict(length=5, start=4, step=-3, dtype="int32"), dict(length=0), dict(length=1, dtype="float64"),
                  dict(length=6, start=-1.5, step=0.1, dtype="float64")]:
        c.out(c.add(op, [], attrs), f"{attrs}")
    c.input(dyn(c.rng, (B,), "float32"), (B,))
    c.out(c.add(op, [], dict(length=B, start=2)), "length b")
    c.out(c.add(op, [], dict(length=2 * B + 1, step=-1, dtype="float32")), "length 2b+1")
    c.check(fusion_level=0)


@case("full")
def full(op):
    c = Case(runs=2, symbols=SYMS)
    for attrs in [dict(shape=(3, 4), value=2.5), dict(shape=(5,), value=7, dtype="int64"),
                  dict(shape=(2, 2), value=1, dtype="bool"), dict(shape=(2,), value=0, dtype="bool"),
                  dict(shape=(3,), value=float("inf")), dict(shape=(2,), value=float("-inf"), dtype="float64"),
                  dict(shape=(0, 3), value=1.0), dict(shape=(), value=-3.5), dict(shape=(4,), value=-2, dtype="int32"),
                  dict(shape=(1, 1), value=0.1, dtype="float64")]:
        c.out(c.add(op, [], attrs), f"{attrs}")
    c.input(dyn(c.rng, (B,), "float32"), (B,))
    c.out(c.add(op, [], dict(shape=(B, 3), value=4.0)), "[b,3]")
    c.check(fusion_level=0)


# ---- matmul: every remainder path of the 6 x 16 register tile and the 384 K block ------------
MS, NS, KS = range(1, 8), (1, 15, 17, 33), (1, 3, 400)


def _matmul_tiles(const_b):
    c = Case(seed=int(const_b))
    r = c.rng
    for k in KS:
        for n in NS:
            b = rand(r, (k, n), "float32", -1, 1)
            bv = c.const(b) if const_b else c.input(b)
            for m in MS:
                c.out(c.add("matmul", [c.input(rand(r, (m, k), "float32", -1, 1)), bv]), f"M={m} N={n} K={k}")
    # tall and wide: several M blocks of 120, threads, K blocks of 384 with a remainder
    for m, n, k in [(125, 33, 400), (250, 70, 769), (13, 130, 385)]:
        b = rand(r, (k, n), "float32", -1, 1)
        c.out(c.add("matmul", [c.input(rand(r, (m, k), "float32", -1, 1)), c.const(b) if const_b else c.input(b)]),
              f"M={m} N={n} K={k}")
    c.check()


CASES.setdefault("matmul", {}).update(tiles_runtime_b=functools.partial(_matmul_tiles, False),
                                     tiles_const_b=functools.partial(_matmul_tiles, True))


@case("matmul", name="shapes")
def matmul_shapes(op):
    """Vectors, broadcast batch dims, K = 0, constant weights with batched activations, dynamic dims."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng

    def mm(a, b, label):
        c.out(c.add(op, [a, b]), label)
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731
    mm(c.input(f(5)), c.input(f(5, 7)), "[5] @ [5,7]")
    mm(c.input(f(3, 5)), c.input(f(5)), "[3,5] @ [5]")
    mm(c.input(f(5)), c.input(f(5)), "[5] @ [5]")
    mm(c.input(f(2, 1, 3, 4)), c.input(f(5, 4, 6)), "[2,1,3,4] @ [5,4,6]")
    mm(c.input(f(3, 4)), c.input(f(2, 4, 6)), "[3,4] @ [2,4,6]")
    mm(c.input(f(2, 3, 4)), c.input(f(4, 6)), "[2,3,4] @ [4,6]")
    mm(c.input(f(3, 0)), c.input(f(0, 5)), "K=0")
    mm(c.input(f(0, 4)), c.input(f(4, 5)), "M=0")
    mm(c.input(f(3, 4)), c.input(f(4, 0)), "N=0")
    mm(c.input(f(2, 3, 4)), c.const(f(4, 6)), "[2,3,4] @ const[4,6]")
    mm(c.input(f(3, 4)), c.const(f(4)), "[3,4] @ const[4]")
    mm(c.input(f(4)), c.const(f(4, 6)), "[4] @ const[4,6]")
    mm(c.input(f(3, 4)), c.const(f(2, 4, 6)), "[3,4] @ const[2,4,6]")
    mm(c.input(f(2, 3, 4)), c.const(f(2, 4, 6)), "[2,3,4] @ const[2,4,6]")
    mm(c.input(f(1, 3, 4)), c.const(f(4, 5)), "[1,3,4] @ const[4,5]")
    mm(c.input(f(3, 0)), c.const(f(0, 5)), "K=0 const")
    # one row: the GEMV streams up to 4 panels of 16 columns at once; 7 and 13 panels leave 3 and 1
    mm(c.input(f(1, 70)), c.const(f(70, 101)), "[1,70] @ const[70,101]")
    mm(c.input(f(1, 40)), c.const(f(40, 200)), "[1,40] @ const[40,200]")
    mm(c.input(f(1, 300)), c.const(f(300, 250)), "[1,300] @ const[300,250] (threaded)")
    # more than 24 panels a thread: chunks of 6 claimed as threads come free, shrinking toward the end
    mm(c.input(f(1, 64)), c.const(f(64, 1700)), "[1,64] @ const[64,1700] (guided chunks)")
    mm(c.input(fortran(f(7, 5))), c.input(strided(f(5, 9))), "non-contiguous operands")
    mm(c.input(fortran(f(4, 5))), c.const(f(5, 3)), "transposed activations, const weights")
    mm(c.input([f(n, 5) for n in B_RUNS], (B, 5)), c.input(f(5, 17)), "[b,5] @ [5,17]")
    mm(c.input([f(n, 3, 5) for n in B_RUNS], (B, 3, 5)), c.const(f(5, 17)), "[b,3,5] @ const[5,17]")
    mm(c.input(f(3, 6)), c.input([f(6, n) for n in B_RUNS], (6, B)), "[3,6] @ [6,b]")
    mm(c.input([f(4, n) for n in B_RUNS], (4, B)), c.input([f(n, 7) for n in B_RUNS], (B, 7)), "K=b")
    mm(c.input([f(n, 2, 3) for n in B_RUNS], (B, 2, 3)), c.input(f(1, 3, 4)), "[b,2,3] @ [1,3,4]")
    c.check()


@case("matmul", name="dtypes")
def matmul_dtypes(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in ("float64", "int64", "int32"):
        for sa, sb in [((7, 13), (13, 5)), ((2, 3, 4), (4, 6)), ((4,), (4, 3)), ((3, 0), (0, 2))]:
            c.out(c.add(op, [c.input(rand(r, sa, dt, -9, 9)), c.input(rand(r, sb, dt, -9, 9))]),
                  f"{dt}{list(sa)} @ {list(sb)}")
        c.out(c.add(op, [c.input(rand(r, (3, 4), dt, -9, 9)), c.const(rand(r, (4, 6), dt, -9, 9))]),
              f"{dt} const weights")
        c.out(c.add(op, [c.input(fortran(rand(r, (3, 4), dt, -9, 9))), c.input(rand(r, (2, 4, 2), dt, -9, 9))]),
              f"{dt} transposed @ batched")
        c.out(c.add(op, [c.input(dyn(r, (B, 4), dt, -9, 9), (B, 4)), c.input(rand(r, (4, 3), dt, -9, 9))]),
              f"{dt}[b,4] @ [4,3]")
    c.out(c.add(op, [c.input(rand(r, (6, 300), "float64")), c.input(rand(r, (300, 17), "float64"))]), "f64 K=300")
    c.check()


# ---- convolution and pooling -------------------------------------------------------------------
def _conv(c, x, w, bias=None, label="", **attrs):
    ins = [x, w] + ([bias] if bias is not None else [])
    c.out(c.add("conv", ins, attrs), label)


@case("conv", name="tiles")
def conv_tiles(op):
    """GEMM shapes of the conv (M = out channels per group, N = output pixels, K = C*KH*KW) over the
    micro-kernel remainders; 1x1 stride-1 convs take the direct (no im2col) path."""
    c = Case()
    r = c.rng
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731
    spatial = {1: (1, 1), 15: (3, 5), 17: (1, 17), 33: (3, 11), 32: (4, 8), 48: (3, 16)}
    for o in MS:
        # K = 405: the prepacked filters span two K blocks of the micro-kernel. N = 32, 48: whole panels,
        # so a 1x1 conv with no more filters than channels reads its input in place (cuvil_sgemm_strided_b),
        # over two K blocks at 400 channels
        for (cin, kh, kw), n in [((1, 1, 1), 1), ((3, 1, 1), 15), ((300, 1, 1), 17), ((12, 3, 3), 33), ((2, 5, 5), 17),
                                 ((45, 3, 3), 15), ((400, 1, 1), 32), ((20, 1, 1), 48)]:
            oh, ow = spatial[n]
            x = c.input(f(1, cin, oh + kh - 1, ow + kw - 1))
            _conv(c, x, c.const(f(o, cin, kh, kw)), c.const(f(o)) if o % 2 else None,
                  label=f"O={o} K={cin * kh * kw} N={n}")
    c.check()


@case("conv", name="attrs")
def conv_attrs(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731
    x = c.input(f(2, 3, 9, 11))
    w = c.const(f(5, 3, 3, 3))
    _conv(c, x, w, c.const(f(5)), "3x3 pad 1", pads=((1, 1), (1, 1)))
    _conv(c, x, w, None, "3x3 stride 2 asymmetric pads", strides=(2, 2), pads=((0, 1), (2, 1)))
    _conv(c, x, w, None, "3x3 dilation (2,1) stride (1,3)", dilations=(2, 1), strides=(1, 3))
    _conv(c, x, c.const(f(190, 3, 3, 3)), c.const(f(190)), "190 filters: several M blocks, im2col whole",
          strides=(2, 1), pads=((1, 1), (0, 2)))
    _conv(c, x, c.const(f(4, 3, 1, 1)), c.const(f(4)), "1x1 stride 2", strides=(2, 2))
    # 38 columns: whole panels of 16 inside the image take the vector im2col rows (stride 2: even lanes),
    # the rest the general path; two groups, so the read-ahead bound is the group's
    _conv(c, c.input(f(1, 4, 11, 79)), c.const(f(6, 2, 7, 7)), c.const(f(6)), "7x7 stride 2 groups 2, 37 wide",
          strides=(2, 2), pads=((3, 3), (2, 3)), groups=2)
    _conv(c, c.input(f(1, 3, 5, 40)), c.const(f(5, 3, 3, 3)), None, "3x3 stride 1, 38 wide", pads=((1, 1), (0, 0)))
    # 20-wide outputs: panels cross output rows, so their im2col rows are runs of 20, 12, 8, ... pixels,
    # each a vector or a vector stored in part; the last input rows' runs, whose vectors would read
    # past the channel's plane, go element by element. 40 channels: pixels as the GEMM's rows
    for cin in (3, 40):
        x20 = c.input(f(1, cin, 9, 40))
        _conv(c, x20, c.const(f(5, cin, 3, 3)), c.const(f(5)), f"3x3 stride 2, 20 wide, {cin} channels",
              strides=(2, 2), pads=((1, 1), (1, 0)))
        _conv(c, x20, c.const(f(5, cin, 3, 1)), None, f"3x1 stride (1, 2), 20 wide, {cin} channels",
              strides=(1, 2), pads=((1, 0), (0, 0)))
    _conv(c, x, c.const(f(4, 3, 1, 1)), None, "1x1 pad 1", pads=((1, 1), (1, 1)))
    _conv(c, x, c.const(f(2, 3, 9, 11)), None, "kernel = input")
    _conv(c, x, c.const(f(2, 3, 5, 5)), None, "kernel larger than input with pads", pads=((3, 3), (0, 0)))
    _conv(c, x, c.const(f(3, 3, 9, 9)), None, "9x9 with pads: 81 taps, gathers redone per row", pads=((4, 4), (3, 5)))
    # 3x3 stride 1 with >= 16 channels each way: Winograd F(2x2, 3x3); odd sizes leave partial tiles
    x16 = c.input(f(2, 16, 7, 9))
    w16 = c.const(f(17, 16, 3, 3))
    _conv(c, x16, w16, c.const(f(17)), "winograd pad 1", pads=((1, 1), (1, 1)))
    _conv(c, x16, w16, None, "winograd no pads")
    _conv(c, x16, w16, None, "winograd asymmetric pads", pads=((0, 2), (2, 1)))
    _conv(c, c.input(f(1, 40, 3, 35)), c.const(f(16, 40, 3, 3)), c.const(f(16)), "winograd 35 wide, tiles over panels",
          pads=((1, 1), (1, 1)))
    # from 24x24 outputs F(4x4, 3x3): 4x4 tiles over panels and tile rows, partial tiles at both edges,
    # asymmetric pads, input columns at the image border, 40 channels = two channel blocks
    _conv(c, c.input(f(1, 40, 26, 31)), c.const(f(17, 40, 3, 3)), c.const(f(17)), "winograd F(4x4) 26x29",
          pads=((1, 1), (0, 0)))
    _conv(c, c.input(f(2, 16, 25, 27)), c.const(f(16, 16, 3, 3)), None, "winograd F(4x4) asymmetric pads",
          pads=((0, 2), (2, 1)))
    # channel counts that end in a partial run of the rows the input transforms hold (4 channels)
    _conv(c, c.input(f(1, 18, 24, 24)), c.const(f(16, 18, 3, 3)), None, "winograd F(4x4) 18 channels",
          pads=((1, 1), (1, 1)))
    _conv(c, c.input(f(1, 19, 6, 9)), c.const(f(16, 19, 3, 3)), None, "winograd F(2x2) 19 channels",
          pads=((1, 1), (1, 1)))
    x4 = c.input(f(2, 4, 7, 6))
    _conv(c, x4, c.const(f(6, 2, 3, 3)), c.const(f(6)), "groups=2", groups=2, pads=((1, 1), (1, 1)))
    _conv(c, x4, c.const(f(8, 1, 3, 3)), c.const(f(8)), "depthwise x2", groups=4, strides=(2, 2),
          pads=((1, 1), (1, 1)))
    _conv(c, x4, c.const(f(4, 1, 3, 2)), None, "depthwise dilated", groups=4, dilations=(2, 2), pads=((2, 0), (1, 1)))
    _conv(c, c.input(f(1, 6, 5, 5)), c.const(f(4, 3, 3, 3)), None, "groups=2 of 3 in-channels", groups=2)
    _conv(c, c.input(f(1, 4, 6, 6)), c.const(f(2, 2, 3, 3)), None, "groups=2, 1 out channel each", groups=2)
    _conv(c, x, c.input(f(5, 3, 3, 3)), c.input(f(5)), "weights and bias as inputs")
    _conv(c, c.input(f(0, 3, 5, 5)), c.const(f(2, 3, 3, 3)), None, "batch 0")
    _conv(c, c.input(fortran(f(1, 3, 6, 7))), c.const(f(2, 3, 3, 3)), None, "transposed input")
    x1 = c.input(f(2, 3, 17))
    _conv(c, x1, c.const(f(4, 3, 5)), c.const(f(4)), "1-d stride 2 pads (2,1) dilation 2",
          strides=(2,), pads=((2, 1),), dilations=(2,))
    _conv(c, x1, c.const(f(3, 1, 3)), None, "1-d depthwise", groups=3, pads=((1, 1),))
    _conv(c, c.input([f(n, 3, 8, 8) for n in B_RUNS], (B, 3, 8, 8)), c.const(f(4, 3, 3, 3)), c.const(f(4)),
          "batch b", pads=((1, 1), (1, 1)))
    _conv(c, c.input([f(1, 3, 5, n) for n in B_RUNS], (1, 3, 5, B)), c.const(f(2, 3, 3, 1)), None,
          "width b (stride 1)", pads=((1, 1), (0, 0)))
    _conv(c, c.input([f(1, 2, n + 4, 5) for n in B_RUNS], (1, 2, B + 4, 5)), c.const(f(3, 2, 3, 3)), None,
          "height b+4, stride (2,3)", strides=(2, 3), pads=((1, 0), (1, 1)))
    # the fused epilogue passes create: act(conv + bias + residual)
    for act in MM_ACTS:
        c.out(c.add("conv", [x, w, c.const(f(5)), c.input(f(2, 5, 9, 11))], {"pads": ((1, 1), (1, 1)), "act": act}),
              f"bias, residual, act={act}")
    c.out(c.add("conv", [x4, c.const(f(8, 1, 3, 3)), None, c.input(f(2, 8, 7, 6))],
                {"groups": 4, "pads": ((1, 1), (1, 1)), "act": "relu"}), "depthwise, residual, relu")
    c.out(c.add("conv", [x4, c.const(f(3, 4, 1, 1))], {"act": "gelu"}), "1x1 gelu, no bias")
    x3 = c.input(f(2, 4, 5, 6, 7))
    _conv(c, x3, c.const(f(3, 4, 3, 3, 3)), c.const(f(3)), "3-d pads 1", pads=((1, 1), (1, 1), (1, 1)))
    _conv(c, x3, c.const(f(6, 2, 2, 3, 1)), None, "3-d groups=2 stride (2,1,3) dilation (1,2,1)", groups=2,
          strides=(2, 1, 3), dilations=(1, 2, 1), pads=((0, 1), (2, 0), (0, 0)))
    _conv(c, x3, c.const(f(4, 1, 3, 3, 3)), None, "3-d depthwise", groups=4, pads=((1, 1), (1, 1), (1, 1)))
    c.out(c.add("conv", [c.input(f(1, 3, 6, 5).astype("float64")), c.const(f(4, 3, 3, 3).astype("float64")),
                         c.const(f(4).astype("float64"))], {"pads": ((1, 1), (0, 1))}), "float64", LEGALIZED_F64)
    c.check()


BLOCKED = f"nchw{vector_floats()}c"     # the native target's blocked layout


@case("relayout")
def blocked_layout(op):
    """The channel-blocked kernels (kernels/blocked.h, winograd_blocked.c) between explicit relayouts, as
    passes/layout.py places them, in blocks of this host's vector width: pixel counts that leave edge tiles (35, 25, 63), 48 channels (a panel
    and a half on AVX-512), K over several blocks, both Winograd tile sizes with partial tiles, depthwise
    convs (strides, dilations, pads, 7x7), batch 2 and a dynamic batch."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731

    def blocked(v):
        return c.add("relayout", [v], {"to": BLOCKED})

    def conv(label, x, o, k, residual=False, act="none", **attrs):
        ins = [blocked(x), c.const(f(o, x.shape[1] // attrs.get("groups", 1), *k)), c.const(f(o))]
        if residual:
            y_shape = interpreter_shape(x, o, k, attrs)
            ins.append(blocked(c.input(f(*y_shape))))
        y = c.add("conv", ins, dict(attrs, act=act, layout=BLOCKED))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), label)

    def interpreter_shape(x, o, k, attrs):
        probe = Graph().add("conv", [Value(x.type), Value(TensorType((o, x.shape[1] // attrs.get("groups", 1), *k), "float32"))], dict(attrs))
        return probe.type.shape

    conv("1x1, 35 pixels, 48 out, residual, relu", c.input(f(2, 32, 5, 7)), 48, (1, 1), residual=True, act="relu")
    conv("1x1, K over two blocks of 16, 100 pixels, silu", c.input(f(1, 288, 10, 10)), 16, (1, 1), act="silu")
    conv("1x1 stride 2", c.input(f(1, 16, 9, 9)), 32, (1, 1), strides=(2, 2))
    # odd numbers of blocks (24 and 40 channels on AVX2): panels of two blocks with one left over
    vf = vector_floats()
    conv("3x3 stride 2 pad 1, 3 blocks in, 5 out", c.input(f(1, 3 * vf, 9, 11)), 5 * vf, (3, 3), strides=(2, 2),
         pads=((1, 1), (1, 1)), act="relu6")
    conv("1x1, 5 blocks in, 3 out, residual", c.input(f(1, 5 * vf, 7, 5)), 3 * vf, (1, 1), residual=True)
    # grouped (RegNet, ResNeXt): one GEMM per group; groups of 2 and 3 blocks, a panel and a half
    conv("3x3 groups 2, 2 blocks a group in, 3 out, residual", c.input(f(2, 4 * vf, 9, 7)), 6 * vf, (3, 3),
         groups=2, pads=((1, 1), (1, 1)), residual=True, act="relu")
    conv("3x3 stride 2 groups 3", c.input(f(1, 3 * vf, 11, 10)), 3 * vf, (3, 3), groups=3, strides=(2, 2),
         pads=((1, 1), (1, 1)))
    conv("1x1 groups 4 (read in place)", c.input(f(1, 8 * vf, 5, 6)), 4 * vf, (1, 1), groups=4, act="silu")
    # the 6-pixel x 64-channel tiles (AVX-512): 35 pixels are 5 of them and a 5-pixel edge, 160 channels
    # two K blocks of 128 and 32, 96 out one pair of panels and a single one
    conv("1x1, 64 out, 160 in, residual, relu", c.input(f(1, 160, 5, 7)), 64, (1, 1), residual=True, act="relu")
    conv("1x1, 96 out, 2 images", c.input(f(2, 32, 6, 6)), 96, (1, 1))
    conv("3x3 stride 2 pad 1, 64 out", c.input(f(1, 32, 13, 11)), 64, (3, 3), strides=(2, 2), pads=((1, 1), (1, 1)),
         residual=True)
    conv("3x3 stride 2 pad 1", c.input(f(2, 16, 11, 10)), 16, (3, 3), strides=(2, 2), pads=((1, 1), (1, 1)))
    conv("5x3 dilation (2, 1), asymmetric pads", c.input(f(1, 16, 12, 8)), 32, (5, 3), dilations=(2, 1),
         pads=((2, 0), (1, 2)))
    conv("3x3 dilation (1, 2), strides (2, 1), 32 channels, unpadded, 2 images", c.input(f(2, 32, 9, 12)), 16, (3, 3),
         dilations=(1, 2), strides=(2, 1), residual=True)
    conv("3x3 stride 2 pad 1, 14x14: M blocks of 72, 72, 52", c.input(f(1, 16, 27, 27)), 32, (3, 3), strides=(2, 2),
         pads=((1, 1), (1, 1)), act="relu")
    conv("winograd F(2x2), residual, relu", c.input(f(2, 32, 7, 9)), 48, (3, 3), residual=True, act="relu",
         pads=((1, 1), (1, 1)))
    conv("winograd F(4x4), partial tiles", c.input(f(1, 16, 13, 14)), 32, (3, 3), pads=((1, 1), (1, 1)))
    conv("winograd F(4x4), asymmetric pads", c.input(f(1, 16, 14, 13)), 16, (3, 3), pads=((0, 2), (2, 1)))
    # NCHW input into blocked output (a stem): 7x7 stride 2, and 3 channels dilated with a residual
    for label, shape, o, k, attrs, residual in (
            ("nchw in: 7x7 stride 2 pad 3", (2, 3, 23, 20), 32, (7, 7), dict(strides=(2, 2), pads=((3, 3), (3, 3))), False),
            ("nchw in: 5 channels, 3x3 dilation 2, residual", (1, 5, 9, 10), 48, (3, 3), dict(dilations=(2, 2),
                                                                                             pads=((2, 1), (2, 2))), True)):
        x = c.input(f(*shape))
        ins = [x, c.const(f(o, shape[1], *k)), c.const(f(o))]
        if residual:
            ins.append(blocked(c.input(f(*interpreter_shape(x, o, k, attrs)))))
        y = c.add("conv", ins, dict(attrs, act="relu", layout=BLOCKED, in_layout="nchw"))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), label)
    xd = c.input(f(2, 32, 9, 11))
    for k, attrs in (((3, 3), dict(pads=((1, 1), (1, 1)))), ((3, 3), dict(strides=(2, 2), pads=((1, 1), (0, 1)))),
                     ((5, 3), dict(dilations=(2, 1), pads=((4, 4), (1, 1)))), ((7, 7), dict(pads=((3, 3), (3, 3))))):
        y = c.add("conv", [blocked(xd), c.const(f(32, 1, *k)), c.const(f(32))],
                  dict(attrs, groups=32, act="relu", layout=BLOCKED))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), f"depthwise {k} {attrs}")
    # rows wide enough for the tiles of 4 pixels (kernels/blocked.c: dw_tile) and ragged ends after them
    xw = c.input(f(1, 2 * vf, 9, 30))
    for k, st, pad in ((3, 1, 1), (3, 2, 1), (5, 1, 2), (5, 2, 2), (7, 1, 3), (3, 1, 0), (5, 2, 1)):
        y = c.add("conv", [blocked(xw), c.const(f(2 * vf, 1, k, k)), c.const(f(2 * vf))],
                  dict(pads=((pad, pad), (pad, pad + 1)), strides=(st, st), groups=2 * vf, act="silu", layout=BLOCKED))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), f"depthwise {k}x{k} stride {st} pad {pad}, tiled")
    x3 = c.input(f(1, 3 * vf, 10, 9))
    y = c.add("conv", [blocked(x3), c.const(f(3 * vf, 1, 5, 5)), c.const(f(3 * vf))],
              dict(pads=((2, 2), (2, 2)), strides=(2, 2), groups=3 * vf, act="relu6", layout=BLOCKED))
    c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), "depthwise 5x5 stride 2, 3 blocks")
    y = c.add("conv", [blocked(xd), c.const(f(32, 1, 3, 3)), c.const(f(32)), blocked(xd)],
              dict(pads=((1, 1), (1, 1)), groups=32, layout=BLOCKED))
    c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), "depthwise with residual")
    xp = blocked(c.input(f(2, 16, 9, 10)))
    for attrs in (dict(kernel=(3, 3), strides=(2, 2), pads=((1, 1), (1, 1))),
                  dict(kernel=(3, 3), strides=(2, 2), ceil_mode=True), dict(kernel=(2, 3), dilations=(2, 1))):
        y = c.add("max_pool", [xp], dict(attrs, layout=BLOCKED))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), f"max_pool {attrs}")
    xb = blocked(c.input(dyn(r, (B, 16, 6, 7), "float32"), (B, 16, 6, 7)))     # dynamic batch: b = 1, 6
    for k, attrs in (((1, 1), {}), ((3, 3), dict(pads=((1, 1), (1, 1)))), ((3, 3), dict(groups=16, strides=(2, 2)))):
        y = c.add("conv", [xb, c.const(f(16, 16 // attrs.get("groups", 1), *k)), c.const(f(16))],
                  dict(attrs, layout=BLOCKED))
        c.out(c.add("relayout", [y], {"to": "nchw", "from": BLOCKED}), f"batch b: conv {k} {attrs}")
    c.out(c.add("relayout", [c.add("max_pool", [xb], dict(kernel=(2, 2), layout=BLOCKED))], {"to": "nchw", "from": BLOCKED}),
          "batch b: max_pool")
    for shape in ((2, 32, 5, 7), (1, 16, 3, 3), (1, 48, 16, 17)):
        c.out(c.add("relayout", [blocked(c.input(f(*shape)))], {"to": "nchw", "from": BLOCKED}), f"round trip {shape}")
    c.check()


@case("max_pool", "avg_pool")
def pool(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (2, 3, 9, 10), "float32"))
    cfgs = [dict(kernel=(2, 2)), dict(kernel=(3, 3), strides=(2, 2), pads=((1, 1), (1, 1))),
            dict(kernel=(3, 3), strides=(2, 2), pads=((1, 1), (1, 1)), ceil_mode=True),
            dict(kernel=(3, 2), strides=(2, 3), ceil_mode=True), dict(kernel=(2, 3), strides=(1, 2), dilations=(2, 1)),
            dict(kernel=(3, 3), strides=(1, 1), pads=((0, 2), (1, 0))), dict(kernel=(9, 10)),
            dict(kernel=(1, 1), strides=(2, 3))]
    for attrs in cfgs:
        c.out(c.add(op, [x], attrs), f"{attrs}")
        if op == "avg_pool" and "pads" in attrs:
            c.out(c.add(op, [x], dict(attrs, count_include_pad=True)), f"{attrs} count_include_pad")
    x1 = c.input(rand(r, (2, 3, 11), "float32"))
    c.out(c.add(op, [x1], dict(kernel=(3,), strides=(2,), ceil_mode=True)), "1-d ceil_mode")
    c.out(c.add(op, [x1], dict(kernel=(4,), pads=((2, 1),), strides=(3,))), "1-d pads")
    # rows wider than the kernel's 2048-column row buffer: split in strips; a window wider than it
    xw = c.input(rand(r, (1, 2, 3, 4500), "float32"))
    c.out(c.add(op, [xw], dict(kernel=(2, 3), strides=(1, 2), pads=((0, 0), (1, 1)))), "4500 columns")
    c.out(c.add(op, [xw], dict(kernel=(1, 2100), strides=(1, 700))), "window of 2100 columns")
    if op == "avg_pool":
        c.out(c.add(op, [x1], dict(kernel=(4,), pads=((2, 1),), strides=(3,), ceil_mode=True, count_include_pad=True)),
              "1-d pads ceil_mode count_include_pad")
    c.out(c.add(op, [c.input(fortran(rand(r, (1, 2, 6, 5), "float32")))], dict(kernel=(2, 2))), "transposed input")
    c.out(c.add(op, [c.input(rand(r, (0, 2, 4, 4), "float32"))], dict(kernel=(2, 2))), "batch 0")
    c.out(c.add(op, [c.input(dyn(r, (B, 2, 5, 5), "float32"), (B, 2, 5, 5))], dict(kernel=(3, 3), strides=(2, 2))),
          "batch b")
    special = np.array([[np.nan, 1, 2, 3], [4, -np.inf, 6, np.inf], [1, 2, 3, 4], [-np.inf, -np.inf, 0, 0]], np.float32)
    c.out(c.add(op, [c.input(special.reshape(1, 1, 4, 4))], dict(kernel=(2, 2))), "nan/inf")
    # the same inside rows wide enough for the vector path of max (stride 1 and 2, dilated)
    wide = rand(r, (1, 2, 3, 41), "float32")
    wide[0, 0, 1, [5, 17, 30]] = np.nan
    wide[0, 1, 0, [8, 9, 22]] = [np.inf, -np.inf, np.nan]
    xn = c.input(wide)
    c.out(c.add(op, [xn], dict(kernel=(3, 3), strides=(2, 2), pads=((1, 1), (1, 1)))), "nan/inf 41 wide stride 2")
    c.out(c.add(op, [xn], dict(kernel=(2, 3), dilations=(1, 2))), "nan/inf 41 wide dilated")
    if op == "avg_pool":      # the vector path's divisors: PoolFormer's 3x3 stride 1, a ceil_mode overhang
        xa = c.input(rand(r, (1, 2, 4, 41), "float32"))
        for cip in (False, True):
            c.out(c.add(op, [xa], dict(kernel=(3, 3), pads=((1, 1), (1, 1)), count_include_pad=cip)),
                  f"41 wide 3x3 stride 1 count_include_pad={cip}")
            c.out(c.add(op, [xa], dict(kernel=(3, 3), strides=(2, 2), pads=((1, 1), (1, 1)), ceil_mode=True,
                                       count_include_pad=cip)), f"41 wide stride 2 ceil_mode count_include_pad={cip}")
    x3 = c.input(rand(r, (2, 3, 5, 6, 7), "float32"))
    c.out(c.add(op, [x3], dict(kernel=(2, 2, 2))), "3-d 2x2x2")
    c.out(c.add(op, [x3], dict(kernel=(3, 2, 3), strides=(2, 1, 2), pads=((1, 1), (0, 1), (1, 0)), ceil_mode=True)),
          "3-d pads ceil_mode")
    if op == "avg_pool":
        c.out(c.add(op, [x3], dict(kernel=(3, 3, 3), strides=(2, 2, 2), pads=((1, 1), (1, 1), (1, 1)),
                                   count_include_pad=True)), "3-d count_include_pad")
    else:
        c.out(c.add(op, [x3], dict(kernel=(2, 2, 2), dilations=(2, 1, 2))), "3-d dilated")
    c.out(c.add(op, [c.input(rand(r, (1, 2, 5, 6), "float64"))], dict(kernel=(2, 3), pads=((1, 0), (0, 1)))),
          "float64", LEGALIZED_F64)
    c.check()


# ---- composites --------------------------------------------------------------------------------
@case("softmax", "log_softmax")
def softmax(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (5, 7, 13), "float32"))
    for axis in (0, 1, 2, -1):
        c.out(c.add(op, [x], {"axis": axis}), f"axis={axis}")
    c.out(c.add(op, [c.input(rand(r, (3, 1), "float32"))], {"axis": 1}), "axis of size 1")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], {"axis": 1}), "[0,5]")
    c.out(c.add(op, [c.input(rand(r, (4, 1000), "float32", -30, 30))], {"axis": 1}), "[4,1000] wide range")
    c.out(c.add(op, [c.input(rand(r, (3, 7), "float32", 900, 1000))], {"axis": 1}), "large values")
    masked = rand(r, (4, 6), "float32")
    masked[0, :3] = -np.inf
    masked[1, :] = -np.inf
    masked[2, 5] = np.inf
    masked[3, 2] = np.nan
    c.out(c.add(op, [c.input(masked)], {"axis": 1}), "-inf masks, a fully masked row, +inf, nan")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32")))], {"axis": 1}), "transposed")
    c.out(c.add(op, [c.input(strided(rand(r, (6, 5), "float32")))], {"axis": 0}), "strided")
    xd = c.input(dyn(r, (B, 7), "float32"), (B, 7))
    c.out(c.add(op, [xd], {"axis": 1}), "[b,7] axis=1")
    c.out(c.add(op, [xd], {"axis": 0}), "[b,7] axis=0")
    c.out(c.add(op, [c.input(rand(r, (3, 7), "float64", -20, 20))], {"axis": 1}), "float64", LEGALIZED_F64)
    c.check()


@case("layer_norm", "rms_norm")
def norm(op):
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    f = lambda *s, lo=-2, hi=2: rand(r, s, "float32", lo, hi)  # noqa: E731
    two = op == "layer_norm"

    def params(*s):
        return [c.const(f(*s)), c.const(f(*s))][:2 if two else 1]
    x = c.input(f(4, 33))
    c.out(c.add(op, [x, *params(33)]), "[4,33] with params")
    c.out(c.add(op, [x]), "[4,33] no params")
    c.out(c.add(op, [x, c.const(f(33))]), "[4,33] scale only")
    c.out(c.add(op, [x, *params(33)], {"eps": 1e-2}), "eps 1e-2")
    c.out(c.add(op, [x, *[c.input(f(33)) for _ in range(2 if two else 1)]]), "params as inputs")
    x4 = c.input(f(2, 3, 5, 7))
    c.out(c.add(op, [x4, *params(5, 7)], {"axis": 2}), "[2,3,5,7] axis=2")
    c.out(c.add(op, [x4], {"axis": 1}), "[2,3,5,7] axis=1")
    c.out(c.add(op, [c.input(f(3, 1)), *params(1)]), "n=1")
    # rows past the last 4 vectors: summed a vector at a time (kernels/norm.c), then a scalar tail
    c.out(c.add(op, [c.input(f(5, 96, lo=-3, hi=5)), *params(96)]), "n=96")
    c.out(c.add(op, [c.input(f(3, 103)), *params(103)]), "n=103")
    c.out(c.add(op, [c.input(f(0, 8)), *params(8)]), "[0,8]")
    c.out(c.add(op, [c.input(f(3, 4099, lo=99, hi=101)), *params(4099)]), "n=4099, mean 100, std 0.6")
    c.out(c.add(op, [c.input(f(3, 64, lo=1e3, hi=1e3 + 1)), *params(64)]), "n=64, mean 1000, std 0.3")
    # float lanes: the shift by x[0] and the mean's low half both matter here (either dropped: ~1e-2 off)
    c.out(c.add(op, [c.input(f(2, 20000, lo=3000, hi=3000.1)), *params(20000)]), "n=20000, mean 3000, std 0.03")
    c.out(c.add(op, [c.input(np.full((2, 16), 3.0, np.float32)), *params(16)]), "constant rows (var 0)")
    c.out(c.add(op, [c.input(fortran(f(6, 5))), *params(5)]), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 16), "float32"), (B, 16)), *params(16)]), "[b,16]")
    c.out(c.add(op, [c.input(dyn(r, (2, B), "float32"), (2, B))]), "[2,b] no params")
    c.out(c.add(op, [c.input(f(3, 9).astype("float64")), *[c.const(f(9).astype("float64")) for _ in range(1 + two)]]),
          "float64", LEGALIZED_F64)
    c.check()


@case("group_norm")
def group_norm(op):
    """NCHW (each image's groups are rows of the layer norm's kernel); the channel-blocked kernel is checked
    through whole nets in test_layout.py."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (2, 6, 5, 7), "float32", -2, 2))
    for groups in (1, 3, 6):
        c.out(c.add(op, [x], {"groups": groups}), f"{groups} groups")
    c.out(c.add(op, [x], {"groups": 2, "eps": 0.5}), "eps 0.5")
    c.out(c.add(op, [c.input(rand(r, (1, 4, 3, 3), "float32", 999, 1001))], {"groups": 2}), "mean 1000")
    c.out(c.add(op, [c.input(np.full((1, 4, 2, 2), 3.0, np.float32))], {"groups": 4}), "constant (var 0)")
    c.out(c.add(op, [c.input(dyn(r, (B, 4, 3, 5), "float32"), (B, 4, 3, 5))], {"groups": 2}), "batch b")
    c.check()


@case("batch_norm")
def batch_norm(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng

    def params(ch, const=True):
        ps = [rand(r, (ch,), "float32", 0.5, 2), rand(r, (ch,), "float32"), rand(r, (ch,), "float32"),
              rand(r, (ch,), "float32", 0.1, 3)]
        return [c.const(p) if const else c.input(p) for p in ps]
    for shape in [(2, 3, 5, 7), (4, 3), (2, 5, 9), (1, 1, 1, 1), (0, 3, 2, 2)]:
        c.out(c.add(op, [c.input(rand(r, shape, "float32")), *params(shape[1])]), f"{list(shape)}")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32")), *params(3, const=False)], {"eps": 1e-3}),
          "params as inputs, eps 1e-3")
    zero_var = params(3)[:3] + [c.const(np.zeros(3, np.float32))]
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32")), *zero_var]), "var 0")
    c.out(c.add(op, [c.input(fortran(rand(r, (2, 3, 4), "float32"))), *params(3)]), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3, 4), "float32"), (B, 3, 4)), *params(3)]), "[b,3,4]")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float64")), *[c.const(p.data.astype("float64")) for p in params(3)]]),
          "float64", LEGALIZED_F64)
    c.check()


# ---- integer bit ops, cumprod, scatter, top-k (the ONNX frontend's extra ops) ------------------
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right")
INT_DTYPES = ("int64", "int32", "uint8", "int8")


@case(*BITWISE)
def bitwise(op):
    """Shift counts run past the width and below 0 (0, or the sign for an arithmetic right shift)."""
    c = Case(seed=len(op), runs=2, symbols=SYMS)
    r = c.rng
    for dt in INT_DTYPES:
        bits = np.dtype(dt).itemsize * 8
        info = np.iinfo(dt)
        for sa, sb in [((3, 1, 5), (4, 5)), ((), (6,)), ((0, 2), (1, 2))]:
            a = rand(r, sa, dt, max(info.min, -2**40), min(info.max, 2**40))
            b = rand(r, sb, dt, 0 if dt == "uint8" else -2, bits + 2) if op.startswith("shift") else \
                rand(r, sb, dt, max(info.min, -2**40), min(info.max, 2**40))
            c.out(c.add(op, [c.input(a), c.input(b)]), f"{dt}{list(sa)} . {list(sb)}")
    a = rand(r, (13, 7), "int64", -1000, 1000)
    c.out(c.add(op, [c.input(np.ascontiguousarray(a).T), c.input(rand(r, (7, 13), "int64", 0, 9))]), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "int32", -100, 100), (B, 3)), c.input(rand(r, (3,), "int32", 0, 5))]),
          "int32[b,3] . [3]")
    c.check()


@case("bitwise_not")
def bitwise_not(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for dt in INT_DTYPES:
        info = np.iinfo(dt)
        for shape in [(7, 13), (), (0, 3)]:
            c.out(c.add(op, [c.input(rand(r, shape, dt, max(info.min, -2**40), min(info.max, 2**40)))]),
                  f"{dt}{list(shape)}")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 3), "int64", -9, 9)))]), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "int64", -9, 9), (B, 3))]), "[b,3]")
    c.check()


@case("cumprod")
def cumprod(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    x = c.input(rand(r, (5, 7, 13), "float32", 0.7, 1.3))
    for axis, excl, rev in [(0, False, False), (0, True, True), (1, False, False), (1, True, False),
                            (1, False, True), (1, True, True), (2, False, False), (2, True, True)]:
        c.out(c.add(op, [x], {"axis": axis, "exclusive": excl, "reverse": rev}),
              f"f32 axis={axis} exclusive={excl} reverse={rev}")
    for dt in ("float64", "int64", "int32"):
        xi = c.input(rand(r, (4, 9), dt, -3, 3))
        for excl, rev in [(False, False), (True, True), (True, False)]:
            c.out(c.add(op, [xi], {"axis": 1, "exclusive": excl, "reverse": rev}), f"{dt} excl={excl} rev={rev}")
    c.out(c.add(op, [c.input(rand(r, (0, 5), "float32"))], {"axis": 1}), "[0,5] axis=1")
    c.out(c.add(op, [c.input(rand(r, (3, 0), "int64"))], {"axis": 1, "exclusive": True}), "[3,0] axis=1")
    c.out(c.add(op, [c.input(fortran(rand(r, (6, 5), "float32")))], {"axis": 0}), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "float32", 0.5, 1.5), (B, 3))], {"axis": 0, "reverse": True}),
          "[b,3] axis=0")
    c.check()


SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


@case("scatter_elements")
def scatter_elements(op):
    """Repeated indices: 'none' keeps the last update in index order; the reductions combine them all."""
    c = Case()
    r = c.rng
    for dt in ("float32", "float64", "int64", "int32"):
        x = c.input(rand(r, (4, 5), dt, -9, 9))
        upd = c.input(rand(r, (3, 5), dt, -9, 9))
        idx = c.input(np.array([[0, 1, 2, 3, -1], [1, 1, 3, 3, 0], [0, 2, -4, 3, 1]], np.int64))
        for red in SCATTER_REDUCTIONS:
            c.out(c.add(op, [x, idx, upd], {"axis": 0, "reduction": red}), f"{dt} axis=0 {red}")
    x = c.input(rand(r, (3, 6), "float32"))
    idx = c.input(np.array([[5, 0], [2, 2], [-1, 0]], np.int32))
    upd = c.input(rand(r, (3, 2), "float32"))
    for red in SCATTER_REDUCTIONS:
        c.out(c.add(op, [x, idx, upd], {"axis": 1, "reduction": red}), f"axis=1 smaller index {red}")
    c.out(c.add(op, [c.input(rand(r, (2, 3, 4), "float32")), c.input(r.integers(0, 3, (2, 2, 4))),
                     c.input(rand(r, (2, 2, 4), "float32"))], {"axis": 1}), "rank 3")
    c.out(c.add(op, [c.input(rand(r, (3, 4), "float32")), c.input(np.zeros((0, 4), np.int64)),
                     c.input(rand(r, (0, 4), "float32"))], {"axis": 0}), "no updates")
    c.out(c.add(op, [c.input(fortran(rand(r, (4, 3), "float32"))), c.input(fortran(r.integers(0, 4, (2, 3)))),
                     c.input(strided(rand(r, (2, 3), "float32")))], {"axis": 0, "reduction": "add"}), "non-contiguous")
    c.check()


@case("scatter_nd")
def scatter_nd(op):
    c = Case()
    r = c.rng
    for dt in ("float32", "int64"):
        x = c.input(rand(r, (4, 5, 3), dt, -9, 9))
        cases = [(np.array([[0, 1], [3, 4], [-1, 0], [0, 1]]), (4, 3)),      # depth 2: rows of 3
                 (np.array([[2], [0], [2]]), (3, 5, 3)),                    # depth 1: whole slabs
                 (np.array([[1, 2, 0], [1, 2, 0], [3, -1, 2]]), (3,))]      # depth 3: elements
        for idx, us in cases:
            iv, uv = c.input(idx.astype(np.int64)), c.input(rand(r, us, dt, -9, 9))
            for red in SCATTER_REDUCTIONS:
                c.out(c.add(op, [x, iv, uv], {"reduction": red}), f"{dt} depth {idx.shape[-1]} {red}")
    c.out(c.add(op, [c.input(rand(r, (4, 2), "float32")), c.input(np.array([[[1], [3]], [[0], [2]]], np.int32)),
                     c.input(rand(r, (2, 2, 2), "float32"))]), "2-d batch of int32 indices")
    c.out(c.add(op, [c.input(rand(r, (4, 2), "float32")), c.input(np.zeros((0, 1), np.int64)),
                     c.input(rand(r, (0, 2), "float32"))]), "no updates")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 3), "float32"))), c.input(np.array([[4], [0]], np.int64)),
                     c.input(fortran(rand(r, (2, 3), "float32")))]), "non-contiguous")
    c.check()


@case("topk")
def topk(op):
    """Ties keep the lower index first; both outputs (values and int64 indices) are checked."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng

    def tk(x, label, **attrs):
        v, i = c.add(op, [x], attrs)
        c.out(v, label + " values")
        c.out(i, label + " indices")
    x = c.input(rand(r, (5, 13), "float32"))
    for k in (1, 3, 13, 0):
        tk(x, f"[5,13] k={k}", k=k)
        tk(x, f"[5,13] k={k} smallest", k=k, largest=False)
    tk(x, "axis 0", k=2, axis=0)
    tk(c.input(rand(r, (2, 7, 3), "float32")), "rank 3 axis 1", k=4, axis=1)
    for dt in ("int64", "int32", "float64"):
        xi = c.input(rand(r, (4, 9), dt, 0, 3))                 # many ties
        tk(xi, f"{dt} ties", k=5)
        tk(xi, f"{dt} ties smallest", k=5, largest=False)
    special = c.input(np.array([[1, np.inf, -np.inf, 3, 3, -0.0, 0.0], [np.nan, 1, np.nan, 2, -np.inf, 0, 5]],
                               np.float32))
    for k in (2, 7):
        tk(special, f"nan, inf, signed zeros k={k}", k=k)
        tk(special, f"nan, inf, signed zeros k={k} smallest", k=k, largest=False)
    tk(c.input(rand(r, (0, 5), "float32")), "[0,5]", k=2)
    tk(c.input(fortran(rand(r, (6, 5), "float32"))), "transposed", k=2)
    # k above TOPK_SCAN_MAX and full sorts: the merge sort (lengths not a power of two, ties, NaN)
    long = rand(r, (3, 1001, 2), "float32", -2, 2).round(1)      # ~40 distinct values: many ties
    long[1, ::97, 0] = np.nan
    xl = c.input(long)
    for k in (17, 1001):
        tk(xl, f"[3,1001,2] axis 1 k={k}", k=k, axis=1)
        tk(xl, f"[3,1001,2] axis 1 k={k} smallest", k=k, axis=1, largest=False)
    tk(c.input(rand(r, (2, 300), "int64", -20, 20)), "int64 ties, sorted whole", k=300)
    tk(c.input(dyn(r, (B, 6), "float32"), (B, 6)), "[b,6]", k=3)
    c.check()


# ---- fused ops (created by passes, or emitted whole by frontends) -----------------------------
@case("fused_pointwise")
def fused_pointwise(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    a, b = c.input(rand(r, (3, 1, 5), "float32")), c.input(rand(r, (4, 5), "float32"))
    s = c.input(np.float32(0.5))
    body = (("mul", (("in", 0), ("in", 1)), {}), ("add", (("t", 0), ("in", 2)), {}), ("relu", (("t", 1),), {}),
            ("mul", (("t", 2), ("t", 0)), {}))
    c.out(c.add(op, [a, b, s], {"body": body}), "mul add relu, a temporary used twice")
    body = (("gt", (("in", 0), ("in", 1)), {}), ("where", (("t", 0), ("in", 0), ("in", 1)), {}),
            ("cast", (("t", 0),), {"to": "int64"}), ("cast", (("t", 1),), {"to": "float64"}))
    c.out(c.add(op, [a, b], {"body": body}), "compare, where, casts: float64 result")
    body = (("clip", (("in", 0),), {"min": -1.0, "max": 1.0}), ("exp", (("t", 0),), {}))
    c.out(c.add(op, [c.input(SPECIAL.astype("float32"))], {"body": body}), "attrs, nan/inf")
    xi = c.input(rand(r, (2, 3), "int64", -9, 9))
    body = (("abs", (("in", 0),), {}), ("mod", (("t", 0), ("in", 1)), {}), ("eq", (("t", 1), ("in", 1)), {}))
    c.out(c.add(op, [xi, c.input(np.int64(4))], {"body": body}), "int64 steps, bool result")
    body = (("sigmoid", (("in", 0),), {}), ("mul", (("t", 0), ("in", 0)), {}))
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 4), "float32")))], {"body": body}), "transposed input (silu)")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "float32"), (B, 3))], {"body": body}), "[b,3]")
    c.out(c.add(op, [c.input(rand(r, (0, 3), "float32"))], {"body": body}), "[0,3]")
    c.check()



@case("matmul_fused")
def matmul_fused(op):
    """act(alpha * a @ b + bias + residual) over the tile remainders. Only a constant B without batch
    dims is fused (see UNSUPPORTED): passes create the op for weights."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731
    for i, act in enumerate(MM_ACTS):
        m, n, k = MS[i % len(MS)] + 8 * (i // len(MS)), NS[i % 4], KS[i % 3]
        a = c.input(f(m, k))
        bias, res = c.const(f(n)), c.input(f(m, n))
        c.out(c.add(op, [a, c.const(f(k, n)), bias, res], {"act": act, "alpha": 0.5}),
              f"{act} const b, bias, residual M={m} N={n} K={k}")
        c.out(c.add(op, [a, c.const(f(k, n)), bias], {"act": act}), f"{act} bias M={m} N={n} K={k}")
        c.out(c.add(op, [a, c.const(f(k, n))], {"act": act, "alpha": -2.0}), f"{act} no bias")
    c.out(c.add(op, [c.input(f(2, 3, 300)), c.const(f(300, 33)), c.input(f(33)), c.input(f(2, 3, 33))],
                {"act": "relu"}), "batched, bias and residual as inputs, K=300")
    c.out(c.add(op, [c.input(f(75, 40)), c.const(f(40, 70)), c.const(f(70))], {"act": "gelu"}), "threaded")
    # full tiles read A's rows in place (rows 400 / 800 floats apart), edge tiles pack theirs; rows
    # 1024 apart share an L1 set and are packed
    for m, n, k in [(21, 77, 400), (64, 96, 800), (16, 40, 1024)]:
        c.out(c.add(op, [c.input(f(m, k)), c.const(f(k, n)), c.const(f(n)), c.input(f(m, n))],
                    {"act": "gelu", "alpha": 0.5}), f"M={m} N={n} K={k}, gelu, residual")
    c.out(c.add(op, [c.input(fortran(f(4, 5))), c.const(f(5, 3)), c.const(f(3)), c.input(strided(f(4, 3)))]),
          "non-contiguous")
    c.out(c.add(op, [c.input([f(n, 8) for n in B_RUNS], (B, 8)), c.const(f(8, 17)), c.const(f(17)),
                     c.input([f(n, 17) for n in B_RUNS], (B, 17))], {"act": "silu"}), "[b,8]")
    c.out(c.add(op, [c.input(f(3, 0)), c.const(f(0, 5)), c.const(f(5))], {"act": "relu"}), "K=0: act(bias)")
    c.check()


@case("attention")
def attention(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    f = lambda *s: rand(r, s, "float32", -1, 1)  # noqa: E731
    q, k, v = c.input(f(2, 3, 5, 8)), c.input(f(2, 3, 7, 8)), c.input(f(2, 3, 7, 6))
    c.out(c.add(op, [q, k, v], {"scale": 8 ** -0.5}), "[2,3,5,8] x 7 keys")
    c.out(c.add(op, [q, k, v], {"scale": 0.3, "causal": True}), "causal, L < S")
    qq = c.input(f(2, 3, 7, 8))
    c.out(c.add(op, [qq, k, v], {"causal": True}), "causal, L = S")
    mask_b = rand(r, (2, 1, 5, 7), "bool")
    mask_b[0, 0, 1] = False                                            # a fully masked row
    c.out(c.add(op, [q, k, v, c.input(mask_b)]), "bool mask [2,1,5,7] with a fully masked row")
    c.out(c.add(op, [q, k, v, c.input(f(5, 7))], {"scale": 0.5}), "float mask [5,7]")
    c.out(c.add(op, [q, k, v, c.input(np.where(rand(r, (1, 1, 1, 7), "bool"), 0, -np.inf).astype(np.float32))]),
          "float -inf padding mask [1,1,1,7]")
    # padding masks, every row alike: the kernel drops the masked keys (both attention paths)
    keep = rand(r, (2, 1, 1, 40), "bool")
    keep[..., 3] = True
    qp, kp, vp = c.input(f(2, 2, 9, 32)), c.input(f(2, 2, 40, 32)), c.input(f(2, 2, 40, 32))
    c.out(c.add(op, [qp, kp, vp, c.input(np.broadcast_to(keep, (2, 1, 9, 40)).copy())], {"scale": 0.2}),
          "bool padding mask [2,1,9,40], rows alike")
    c.out(c.add(op, [qp, kp, vp, c.input(np.where(keep, 0, np.finfo(np.float32).min).astype(np.float32))]),
          "float finfo.min padding mask [2,1,1,40]")
    c.out(c.add(op, [q, k, v, c.input(np.broadcast_to(mask_b[:, :, 2:3], (2, 3, 5, 7)).copy())]),
          "bool padding mask per head [2,3,5,7], head dim 8")
    uneven = np.broadcast_to(keep, (2, 1, 9, 40)).copy()
    uneven[1, 0, 4, 3] = False
    c.out(c.add(op, [qp, kp, vp, c.input(uneven)]), "bool mask, one row unlike the rest")
    c.out(c.add(op, [qp, kp, vp, c.input(np.zeros((1, 1, 1, 40), bool))]), "bool mask, every key masked")
    # every score far below 0 and 21 keys (not whole vectors): a row max that took the zeros of the
    # padded key lanes would underflow every exp to 0
    qn, kn, vn = c.input(np.abs(f(1, 2, 9, 32))), c.input(-np.abs(f(1, 2, 21, 32))), c.input(f(1, 2, 21, 32))
    c.out(c.add(op, [qn, kn, vn], {"scale": 30.0}), "scores far below 0, 21 keys")
    c.out(c.add(op, [qn, kn, vn], {"scale": 30.0, "causal": True}), "scores far below 0, 21 keys, causal")
    q4, k2, v2 = c.input(f(1, 4, 3, 16)), c.input(f(1, 2, 9, 16)), c.input(f(1, 2, 9, 16))
    c.out(c.add(op, [q4, k2, v2], {"scale": 0.25}), "grouped kv heads 4/2")
    c.out(c.add(op, [c.input(f(4, 3, 8)), c.input(f(4, 6, 8)), c.input(f(4, 6, 5))]), "rank 3")
    c.out(c.add(op, [c.input(f(3, 8)), c.input(f(6, 8)), c.input(f(6, 5))], {"causal": True}), "rank 2")
    qs, ks, vs = c.input(f(2, 5, 3, 8)), c.input(f(2, 7, 3, 8)), c.input(f(2, 7, 3, 6))
    c.out(c.add(op, [qs, ks, vs], {"layout_q": "bshd", "layout_k": "bshd", "layout_v": "bshd", "layout_out": "bshd"}),
          "bshd in and out")
    c.out(c.add(op, [qs, k, v], {"layout_q": "bshd"}), "bshd q, bhsd out")
    c.out(c.add(op, [c.input(fortran(f(1, 2, 4, 8))), c.input(strided(f(1, 2, 6, 8))), c.input(f(1, 2, 6, 8))]),
          "non-contiguous")
    c.out(c.add(op, [c.input([f(1, 2, n, 8) for n in B_RUNS], (1, 2, B, 8)),
                     c.input([f(1, 2, n, 8) for n in B_RUNS], (1, 2, B, 8)),
                     c.input([f(1, 2, n, 8) for n in B_RUNS], (1, 2, B, 8))], {"causal": True}), "seq b, causal")
    c.out(c.add(op, [c.input(f(1, 2, 9, 64)), c.input(f(1, 2, 300, 64)), c.input(f(1, 2, 300, 64))], {"scale": 0.125}),
          "300 keys, head dim 64")
    q64 = c.input(rand(r, (1, 2, 3, 4), "float64"))
    c.out(c.add(op, [q64, q64, q64], {"causal": True}), "float64", LEGALIZED_F64)
    c.check()


@case("bitcast")
def bitcast(op):
    """The same bytes as another dtype of the same size (NaN payloads and -0.0 included)."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    f = np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 1e-40, 3.4e38], np.float32)
    for src, dst, x in [("float32", "int32", f), ("float32", "uint32", f), ("float64", "int64", f.astype("float64")),
                        ("int32", "float32", rand(r, (3, 5), "int32", -2**31, 2**31 - 1)),
                        ("int64", "float64", rand(r, (4,), "int64", -2**40, 2**40)),
                        ("uint8", "int8", rand(r, (2, 7), "uint8", 0, 255)),
                        ("int8", "uint8", rand(r, (6,), "int8", -128, 127)),
                        ("int16", "float16", rand(r, (5,), "int16", 0, 30000))]:
        c.out(c.add(op, [c.input(x)], {"to": dst}), f"{src} -> {dst}")
    c.out(c.add(op, [c.input(np.float32(-1.0))], {"to": "int32"}), "0-d")
    c.out(c.add(op, [c.input(rand(r, (0, 3), "float32"))], {"to": "int32"}), "[0,3]")
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 3), "float32")))], {"to": "int32"}), "transposed")
    c.out(c.add(op, [c.input(dyn(r, (B, 3), "int64", -9, 9), (B, 3))], {"to": "float64"}), "[b,3]")
    c.check()


# ---- the language-model ops -------------------------------------------------------------------
def _quantize(rng, K, N, bits, group):
    """(weight, scales) in matmul_q's storage: int8 [K, N], packed int4 uint8 [K, N/2], or bf16 uint16."""
    if bits == 16:
        return (rand(rng, (K, N), "float32", -1, 1).view(np.uint32) >> 16).astype(np.uint16), None
    scales = rand(rng, (-(-K // group), N), "float32", 0.001, 0.02)
    if bits == 8:
        return rand(rng, (K, N), "int8", -127, 127), scales
    nib = rng.integers(0, 16, (K, N)).astype(np.uint8)
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8), scales


@case("matmul_q")
def matmul_q(op):
    """int8 / int4 (group scales, K not a multiple of the group) / bf16 weights over the tile remainders."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for bits, group in [(8, 1 << 30), (8, 64), (4, 32), (16, 1 << 30)]:
        for i, (m, k) in enumerate([(1, 1), (2, 3), (5, 300), (7, 65), (6, 256), (1, 70), (1, 300)]):
            n = (1, 15, 17, 33, 16, 101, 250)[i] * (2 if bits == 4 else 1)
            w, s = _quantize(r, k, n, bits, group)
            ins = [c.input(rand(r, (m, k), "float32", -1, 1)), c.const(w)] + ([c.const(s)] if s is not None else [])
            c.out(c.add(op, ins, {"bits": bits, "group": group}), f"bits={bits} group={group} M={m} N={n} K={k}")
        if bits == 16:     # one row, odd K: the GEMV's two-step rounds and then its single last step
            w, _ = _quantize(r, 71, 200, bits, group)
            c.out(c.add(op, [c.input(rand(r, (1, 71), "float32", -1, 1)), c.const(w)], {"bits": 16, "group": group}),
                  "bits=16 M=1 N=200 K=71")
        w, s = _quantize(r, 40, 18, bits, group)
        sc = [c.const(s)] if s is not None else [None]
        c.out(c.add(op, [c.input([rand(r, (n, 3, 40), "float32", -1, 1) for n in B_RUNS], (B, 3, 40)), c.const(w),
                         *sc, c.input([rand(r, (n, 3, 18), "float32") for n in B_RUNS], (B, 3, 18))],
                    {"bits": bits, "group": group}), f"bits={bits} [b,3,40] with residual")
    w, s = _quantize(r, 8, 4, 8, 4)
    c.out(c.add(op, [c.input(fortran(rand(r, (5, 8), "float32"))), c.const(w), c.const(s)], {"bits": 8, "group": 4}),
          "transposed input")
    c.check()


@case("matmul_q", name="fp16 weights and epilogues")
def matmul_q_epilogue(op):
    """IEEE-half weights (the precision="fp16" format: F16C / AVX-512 widening, or the portable bit
    operations) including subnormals, and the fused epilogue (bias, residual, activation) on every
    kernel: the float GEMM, the one-row GEMV and the integer-dot tiles."""
    from cuvil.ir.ops.llm import act_block
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for m, k, n in [(1, 71, 200), (5, 300, 33), (7, 65, 17)]:
        w = rand(r, (k, n), "float32", -1, 1).astype(np.float16)
        w[0, :4] = np.array([6e-8, -6e-8, 3e-5, 65504], np.float16)     # subnormals and the largest half
        c.out(c.add(op, [c.input(rand(r, (m, k), "float32", -1, 1)), c.const(w)], {"bits": 16}),
              f"fp16 M={m} N={n} K={k}")
    for bits, group, k, ab in [(16, 1 << 30, 64, 0), (8, 1 << 30, 64, 0), (8, 1 << 30, 64, 64), (4, 32, 64, 32)]:
        for m, act in [(1, "gelu"), (6, "relu"), (9, "tanh")]:
            n = 20
            w, s = _quantize(r, k, n, bits, group)
            if bits == 16 and act == "relu":
                w = rand(r, (k, n), "float32", -1, 1).astype(np.float16)
            assert not ab or ab == act_block(bits, k, group)
            res = c.input(rand(r, (m, n), "float32")) if m > 1 else None
            ins = [c.input(rand(r, (m, k), "float32", -1, 1)), c.const(w), c.const(s) if s is not None else None,
                   res, c.const(rand(r, (n,), "float32"))]
            c.out(c.add(op, ins, {"bits": bits, "group": group, "act_block": ab, "act": act}),
                  f"bits={bits} act_block={ab} M={m} bias{' + residual' if res is not None else ''} + {act}")
    for m, kx in [(1, 100), (5, 97), (9, 65)]:     # int8 weights padded with zero rows to whole blocks
        kp = -(-kx // 32) * 32
        w, s = _quantize(r, kp, 24, 8, 1 << 30)
        w[kx:] = 0
        ab = next(b for b in (128, 64, 32) if kp % b == 0)
        c.out(c.add(op, [c.input(rand(r, (m, kx), "float32", -1, 1)), c.const(w), c.const(s)],
                    {"bits": 8, "group": kp, "act_block": ab}), f"int8 K={kx} padded to {kp} M={m}")
    c.check()


@case("matmul_q", name="bf16 activations")
def matmul_q_bf16_act(op):
    """bf16_act: on a CPU with bf16 products (AVX512-BF16) the activations are rounded to bf16 too
    (kernels/bf16dot.c, tile rows 1-6, panels cut short, odd K, every epilogue); elsewhere the float
    path. The reference keeps float32 activations: each output is within bf16's rounding of x (2^-9
    relative per product, |x| <= 1, |w| <= 1, K <= 300) of it, which a layout slip would not be."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for m, k, n, act in [(1, 71, 200, "none"), (5, 300, 33, "relu"), (7, 65, 130, "gelu"), (13, 64, 64, "silu")]:
        w, _ = _quantize(r, k, n, 16, 1 << 30)
        res = c.input(rand(r, (m, n), "float32")) if m > 1 else None
        ins = [c.input(rand(r, (m, k), "float32", -1, 1)), c.const(w), None, res, c.const(rand(r, (n,), "float32"))]
        c.out(c.add(op, ins, {"bits": 16, "bf16_act": 1, "act": act}), f"bf16 act M={m} N={n} K={k} {act}",
              tol=(0, 2 ** -9 * k ** 0.5 * 4))
    x = c.input([rand(r, (b, 3, 40), "float32", -1, 1) for b in B_RUNS], (B, 3, 40))
    c.out(c.add(op, [x, c.const(_quantize(r, 40, 18, 16, 1 << 30)[0])], {"bits": 16, "bf16_act": 1}),
          "bf16 act [b,3,40]", tol=(0, 2 ** -9 * 40 ** 0.5 * 4))
    c.check()


@case("expert_matmul")
def expert_matmul(op):
    """Every (token, slot) pair times its expert's weights, in each weight format: one row per token
    (the gate/up projections) and one per slot (down), a dynamic token count, experts chosen by no
    token, by every token, and twice by one token."""
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    E, K, k = 4, 40, 2
    for bits, group in [(32, 1 << 30), (16, 1 << 30), (8, 1 << 30), (4, 32)]:
        n = 18
        if bits == 32:
            w, s = rand(r, (E, K, n), "float32"), None
        else:
            parts = [_quantize(r, K, n, bits, group) for _ in range(E)]
            w, s = np.stack([p[0] for p in parts]), None if bits == 16 else np.stack([p[1] for p in parts])
        wc = [c.const(w)] + ([c.const(s)] if s is not None else [])
        for rows in (1, k):
            ids = [np.stack([r.permutation([0, 2, 3])[:k] for _ in range(m * 3)]).reshape(m, 3, k) for m in B_RUNS]
            ids[1][0, 0] = [1, 1]          # a pair of slots on one expert
            x = c.input([rand(r, (m, 3, rows, K), "float32", -1, 1) for m in B_RUNS], (B, 3, rows, K))
            c.out(c.add(op, [x, c.input(ids, (B, 3, k)), *wc], {"bits": bits, "group": group}),
                  f"bits={bits} rows per token={rows}")
    c.check()


@case("matmul_q", name="int8 activations")
def matmul_q_int_dot(op):
    """The integer-dot kernel (act_block > 0): int8 activations in blocks, int4 groups of 32/64/128 and
    per-column int8, over the row/column tile remainders, a zero row (scale 0) and a residual."""
    from cuvil.ir.ops.llm import act_block
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for bits, group, k in [(4, 32, 64), (4, 64, 192), (4, 128, 256), (4, 32, 448), (8, 1 << 30, 96),
                           (8, 1 << 30, 256)]:    # K 448: two K blocks of the fp32 GEMM
        ab = act_block(bits, k, group)
        assert ab, (bits, group, k)
        # 20 rows: int4 takes the dequantize-into-fp32-GEMM path (float activations). One row of 330
        # columns, from K 256 on: 11 tiles of 32 columns split over the threads as 6 + 5, the last tile
        # half empty. int4 at 2-8 rows: the 512-bit VNNI tiles of 4 and 8 rows (2, 3 and 6 with rows repeated)
        for m, n in [(1, 2), (1, 10), (1, 330), (2, 12), (3, 6), (4, 34), (6, 40), (8, 66), (9, 8), (20, 38)]:
            w, s = _quantize(r, k, n, bits, group)
            x = rand(r, (m, k), "float32", -1, 1)
            x[m // 2] = 0.0
            c.out(c.add(op, [c.input(x), c.const(w), c.const(s)], {"bits": bits, "group": group, "act_block": ab}),
                  f"bits={bits} group={group} M={m} N={n} K={k}")
        w, s = _quantize(r, k, 18, bits, group)
        c.out(c.add(op, [c.input([rand(r, (n, 3, k), "float32", -2, 2) for n in B_RUNS], (B, 3, k)), c.const(w),
                         c.const(s), c.input([rand(r, (n, 3, 18), "float32") for n in B_RUNS], (B, 3, 18))],
                    {"bits": bits, "group": group, "act_block": ab}), f"bits={bits} [b,3,{k}] with residual")
    c.check()


@case("rope")
def rope(op):
    c = Case(runs=2, symbols=SYMS)
    r = c.rng
    for b, t, h, d in [(1, 1, 1, 2), (2, 3, 4, 16), (1, 5, 2, 64), (2, 1, 3, 6)]:
        inv = (10000.0 ** (-np.arange(d // 2) * 2.0 / d)).astype(np.float32)
        x = c.input(rand(r, (b, t, h, d), "float32"))
        pos = c.input(r.integers(0, 4096, (b, t)))
        c.out(c.add(op, [x, pos, c.const(inv)]), f"[{b},{t},{h},{d}]")
        c.out(c.add(op, [x, pos, c.input(inv)], {"scale": 1.25}), f"[{b},{t},{h},{d}] scale 1.25")
    inv = (10000.0 ** (-np.arange(4) / 4.0)).astype(np.float32)
    c.out(c.add(op, [c.input(fortran(rand(r, (1, 2, 3, 8), "float32"))), c.input(np.array([[0, 7]])), c.const(inv)]),
          "transposed input")
    c.out(c.add(op, [c.input(dyn(r, (1, B, 2, 8), "float32"), (1, B, 2, 8)),
                     c.input([r.integers(0, 100, (1, n)) for n in B_RUNS], (1, B)), c.const(inv)]), "[1,b,2,8]")
    c.out(c.add(op, [c.input(rand(r, (1, 2, 3, 8), "float64")), c.input(np.array([[3, 9]])),
                     c.const(inv.astype("float64"))]), "float64", LEGALIZED_F64)
    c.check()


def _cache(r, L, Bmax, Hk, S, Dd):
    return rand(r, (L, Bmax, Hk, S, Dd), "float32")


def _region(types, build):
    """A subgraph over inputs of these types; build(graph, *inputs) returns its outputs."""
    g = Graph()
    g.symbols = dict(SYMS)
    g.inputs = [Value(TensorType(tuple(shape), dtype)) for shape, dtype in types]
    outs = build(g, *g.inputs)
    g.outputs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return g


@case("cond")
def cond_case(op):
    """Both branches taken (one run each), a dynamic dim, a weight and a GEMM inside a branch, a
    nested cond, an operand returned unchanged, and a branch that returns a constant."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    types = [((B, 5), "float32"), ((), "float32")]
    inner = _region(types, lambda g, x, s: g.add("cond", [g.add("gt", [s, g.const(np.float32(0))]), x, s], {
        "then_graph": _region(types, lambda h, x, s: h.add("mul", [x, s])),
        "else_graph": _region(types, lambda h, x, s: h.add("sub", [x, s]))}))
    then_g = _region(types, lambda g, x, s: [g.add("relu", [g.add("matmul", [x, g.const(w)])]), x])
    else_g = _region(types, lambda g, x, s: [g.add("tanh", [g.add("matmul", [g.add("add", [x, s]), g.const(w)])]),
                                              g.add("neg", [x])])
    for flags in ([True, False], [False, True]):
        c = Case(runs=2, symbols=SYMS)
        x = c.input(dyn(c.rng, (B, 5), "float32"), (B, 5))
        s = c.input([np.float32(1.5), np.float32(-0.5)])
        p = c.input([np.array(f) for f in flags])
        y, z = c.add(op, [p, x, s], {"then_graph": then_g, "else_graph": else_g})
        c.out(y, "gemm + activation in a branch")
        c.out(z, "operand or its negation")
        zero = _region(types, lambda g, x, s: g.add("mul", [x, g.const(np.float32(0))]))
        c.out(c.add(op, [p, x, s], {"then_graph": inner, "else_graph": zero}), "nested cond")
        c.check()


@case("while_loop")
def while_case(op):
    """A counter and a state updated through a GEMM until a norm passes a bound read from an input
    (a loop invariant), zero trips when it already does, and a loop inside a loop."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((4, 4)) * 0.5 + np.eye(4)).astype(np.float32)
    t = [((), "int64"), ((B, 4), "float32"), ((), "float32")]
    cond = _region(t, lambda g, i, x, lim: g.add("lt", [g.add("reduce_sum", [g.add("abs", [x])], {"axes": None}), lim]))
    body = _region(t, lambda g, i, x, lim: [g.add("add", [i, g.const(np.int64(1))]),
                                            g.add("add", [g.add("matmul", [x, g.const(w)]), g.const(np.float32(0.25))])])
    # the inner loop doubles x three times per outer step
    t2 = [((), "int64"), ((B, 4), "float32")]
    doubling = {"cond_graph": _region(t2, lambda h, j, y: h.add("lt", [j, h.const(np.int64(3))])),
                "body_graph": _region(t2, lambda h, j, y: [h.add("add", [j, h.const(np.int64(1))]),
                                                           h.add("mul", [y, h.const(np.float32(2))])]),
                "carried": 2}
    outer_body = _region(t2, lambda g, k, x: [g.add("add", [k, g.const(np.int64(1))]),
                                              g.add("while_loop", [g.const(np.int64(0)), x], dict(doubling))[1]])
    outer_cond = _region(t2, lambda g, k, x: g.add("lt", [k, g.const(np.int64(2))]))
    c = Case(runs=2, symbols=SYMS)
    x = c.input(dyn(c.rng, (B, 4), "float32", -1, 1), (B, 4))
    lim = c.input([np.float32(200.0), np.float32(0.0)])
    i, y = c.add(op, [c.const(np.int64(0)), x, lim], {"cond_graph": cond, "body_graph": body, "carried": 2})
    c.out(i, "trip count (0 when the bound is already passed)")
    c.out(y, "state")
    c.out(c.add(op, [c.const(np.int64(0)), x], {"cond_graph": outer_cond, "body_graph": outer_body, "carried": 2})[1],
          "a loop inside a loop")
    c.check()


@case("batch_map")
def batch_map_case(op):
    """A body of a conv, a pool, a reduction and a GEMM run image by image: a static batch of 3 (which
    2 threads cannot halve: one image at a time) and the dynamic dim b (1 and 6 images), two inputs and
    two outputs, one of them an input returned unchanged."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((4, 2, 3, 3)) * 0.5).astype(np.float32)
    m = rng.standard_normal((4, 3)).astype(np.float32)
    types = [((1, 2, 6, 6), "float32"), ((1, 4), "float32")]

    def body(g, x, v):
        y = g.add("relu", [g.add("conv", [x, g.const(w)], {"pads": [(1, 1), (1, 1)]})])
        y = g.add("max_pool", [y], {"kernel": [2, 2], "strides": [2, 2]})
        pooled = g.add("reduce_mean", [y], {"axes": [2, 3], "keepdims": False})
        return [g.add("matmul", [g.add("add", [pooled, v]), g.const(m)]), x]
    region = {"body_graph": _region(types, body)}
    for batch in (3, B):
        c = Case(runs=2 if batch == B else 1, symbols=SYMS)
        if batch == B:
            x, v = c.input(dyn(c.rng, (B, 2, 6, 6), "float32"), (B, 2, 6, 6)), c.input(dyn(c.rng, (B, 4), "float32"), (B, 4))
        else:
            x, v = c.input(rand(c.rng, (3, 2, 6, 6), "float32")), c.input(rand(c.rng, (3, 4), "float32"))
        y, same = c.add(op, [x, v], dict(region))
        c.out(y, f"conv, pool, mean and GEMM per image (batch {batch})")
        c.out(same, "an input returned")
        c.check()


@case("kv_update")
def kv_update(op):
    """The cache is updated in place: the op's output is its first input's buffer."""
    c = Case()
    r = c.rng
    cache = c.input(_cache(r, 2, 3, 2, 10, 4))
    c.out(c.add(op, [cache, c.input(rand(r, (2, 3, 2, 4), "float32")), c.input(np.array([0, 7]))], {"layer": 1}),
          "layer 1, batch 2 of 3, prefill 3 at 0 and 7")
    c.check(inplace=(0,))
    c = Case()
    cache = c.input(_cache(r, 1, 2, 1, 5, 8))
    k1 = c.add(op, [cache, c.input(rand(r, (2, 1, 1, 8), "float32")), c.input(np.array([4, 0]))])
    c.out(c.add("neg", [k1]), "decode at 4 and 0, then used")
    c.check(inplace=(0,))
    c = Case()
    cache = c.input(_cache(r, 2, 4, 2, 6, 4))
    c.out(c.add(op, [cache, c.input(rand(r, (2, 2, 2, 4), "float32")), c.input(np.array([1, 3])),
                     c.input(np.array([3, 1]))], {"layer": 0}), "rows in slots 3 and 1 of 4")
    c.check(inplace=(0,))


@case("kv_update", name="fp16 cache")
def kv_update_fp16(op):
    """An fp16 KV cache: rows rounded to nearest even as they are stored (numpy's rounding), in place."""
    c = Case()
    cache = c.input(_cache(c.rng, 2, 3, 2, 10, 12).astype(np.float16))
    new = rand(c.rng, (2, 3, 2, 12), "float32") * np.float32(3e4)       # some past the half range: inf
    c.out(c.add(op, [cache, c.input(new), c.input(np.array([0, 7])), c.input(np.array([2, 0]))], {"layer": 1}),
          "layer 1, slots 2 and 0")
    c.check(inplace=(0,), rtol=0, atol=0)


@case("kv_update", name="bad slots")
def kv_update_bad_slots(op):
    """A slot outside the cache, or two rows writing one position of one slot, is a run-time error (nothing
    written); two rows of one slot at positions apart write both (a prompt's tokens as rows of a step)."""
    c = Case()
    cache = c.input(_cache(c.rng, 1, 3, 1, 5, 4))
    new, start = c.input(rand(c.rng, (2, 1, 1, 4), "float32")), c.input(np.array([0, 1]))
    c.out(c.add(op, [cache, new, start, c.input(np.array([2, 0]))]), "slots 2 and 0")
    cm = c.check(inplace=(0,))
    cache0, rows = c.runs[0][0], c.runs[0][1]
    for bad_slots, bad_start in (([3, 0], [0, 1]), ([-1, 0], [0, 1]), ([1, 1], [2, 2])):
        with pytest.raises(ShapeError, match="slots"):
            cm.run(cache0.copy(), rows, np.array(bad_start), np.array(bad_slots))
    (got,) = cm.run(cache0.copy(), rows, np.array([3, 2]), np.array([1, 1]))
    want = cache0.copy()
    want[0, 1, 0, 3], want[0, 1, 0, 2] = rows[0, 0, 0], rows[1, 0, 0]
    np.testing.assert_array_equal(got, want)


@case("kv_update", name="overflow")
def kv_update_overflow(op):
    c = Case()
    cache = c.input(_cache(c.rng, 1, 2, 1, 5, 4))
    new, start = c.input(rand(c.rng, (1, 2, 1, 4), "float32")), c.input(np.array([3]))
    c.out(c.add(op, [cache, new, start]), "at 3 of 5")
    cm = c.check(inplace=(0,))
    with pytest.raises(ShapeError, match="KV cache"):
        cm.run(c.runs[0][0], c.runs[0][1], np.array([4]))


@case("grouped_matmul")
def grouped_matmul(op):
    """Rows sorted by group, one GEMM per group: constant (packed ahead) and run-time weights, empty
    groups, rows past the last offset (zeros), and malformed offsets (decreasing, past the rows,
    negative) clamped, never read outside x."""
    c = Case()
    r = c.rng
    x = c.input(rand(r, (13, 40), "float32"))
    w = rand(r, (4, 40, 37), "float32")
    for offs in ([3, 3, 9, 13], [0, 5, 5, 11], [13, 13, 13, 13], [6, 2, 40, 50], [-3, 4, 1, 13]):
        for dtype in ("int32", "int64"):
            o = c.input(np.array(offs, dtype))
            c.out(c.add(op, [x, c.const(w), o]), f"const w, offs={offs} {dtype}")
        c.out(c.add(op, [x, c.input(w), c.input(np.array(offs, "int64"))]), f"run-time w, offs={offs}")
    c.check()


@case("cached_attention")
def cached_attention(op):
    """Decode (T = 1) and prefill (T > 1) over the cache rows [0, start + t], grouped kv heads."""
    c = Case()
    r = c.rng
    kc, vc = c.input(_cache(r, 2, 3, 2, 12, 8)), c.input(_cache(r, 2, 3, 2, 12, 8))
    for b, t, h, start in [(2, 1, 4, [5, 0]), (1, 4, 2, [3]), (3, 2, 2, [10, 0, 4]), (1, 12, 4, [0])]:
        q = c.input(rand(r, (b, t, h, 8), "float32"))
        for layer in (0, 1):
            c.out(c.add(op, [q, kc, vc, c.input(np.array(start))], {"layer": layer, "scale": 8 ** -0.5}),
                  f"B={b} T={t} H={h} start={start} layer={layer}")
    # prefill of 30 rows x 2 query heads per kv head: the 48-row blocks span two heads
    kv2 = c.input(_cache(r, 1, 1, 2, 40, 16))
    c.out(c.add(op, [c.input(rand(r, (1, 30, 4, 16), "float32")), kv2, kv2, c.input(np.array([6]))], {"scale": 0.25}),
          "T=30, blocks across heads")
    kv = c.input(_cache(r, 1, 1, 1, 300, 64))
    c.out(c.add(op, [c.input(rand(r, (1, 1, 2, 64), "float32")), kv, kv, c.input(np.array([299]))], {"scale": 0.125}),
          "300 cached rows, head dim 64")
    # Gemma 2's capped scores and a sliding window: rows tiled together (2 query heads per kv head) and
    # one by one (1 per kv head), decode and prefill, windows shorter and longer than the history
    for h, t, start, window, cap in [(2, 1, 20, 5, 0.0), (1, 1, 20, 5, 0.7), (2, 9, 3, 4, 1.5), (1, 9, 3, 40, 0.0),
                                     (4, 12, 0, 1, 2.0)]:
        c.out(c.add(op, [c.input(rand(r, (1, t, 2 * h, 16), "float32")), kv2, kv2, c.input(np.array([start]))],
                    {"scale": 0.5, "window": window, "softcap": cap}),
              f"H={2 * h} T={t} start={start} window={window} softcap={cap}")
    # rows reading other cache slots (continuous batching), grouped and one-row paths
    kv4 = c.input(_cache(r, 1, 4, 2, 12, 8))
    for h, t in [(2, 1), (1, 3)]:
        c.out(c.add(op, [c.input(rand(r, (2, t, 2 * h, 8), "float32")), kv4, kv4, c.input(np.array([7, 2])),
                         c.input(np.array([3, 0]))], {"scale": 0.5}), f"H={2 * h} T={t} slots 3 and 0")
    # an fp16 cache: its rows widened (vectors of 8 and the scalar tail: head dim 12), decode and prefill
    kv16 = c.input(_cache(r, 2, 3, 2, 20, 12).astype(np.float16))
    for b, t, h, start, slots in [(2, 1, 4, [7, 19], [2, 0]), (1, 6, 2, [3], [1]), (1, 1, 2, [0], [0])]:
        c.out(c.add(op, [c.input(rand(r, (b, t, h, 12), "float32")), kv16, kv16, c.input(np.array(start)),
                         c.input(np.array(slots))], {"layer": 1, "scale": 0.3}), f"fp16 cache B={b} T={t} H={h}")
    # head dims in whole vectors (16, 32): the tiles read the halves as they lie (K^T built from them,
    # V widened in registers); one query row per KV head (H=2 decode) keeps the widened copy
    for e in (16, 32):
        kvh = c.input(_cache(r, 2, 3, 2, 40, e).astype(np.float16))
        for b, t, h, start, slots in [(2, 1, 4, [7, 39], [2, 0]), (1, 6, 2, [3], [1]), (1, 1, 2, [30], [0]),
                                      (2, 9, 8, [0, 20], [1, 2])]:
            c.out(c.add(op, [c.input(rand(r, (b, t, h, e), "float32")), kvh, kvh, c.input(np.array(start)),
                             c.input(np.array(slots))], {"layer": 1, "scale": e ** -0.5}),
                  f"fp16 cache E={e} B={b} T={t} H={h}")
    kv64 = c.input(_cache(r, 1, 1, 1, 6, 4).astype("float64"))
    c.out(c.add(op, [c.input(rand(r, (1, 2, 2, 4), "float64")), kv64, kv64, c.input(np.array([3]))]), "float64",
          LEGALIZED_F64)
    c.check()


# ---- what the declarations reject, what the C backend reports, run-time index checks ---------
def _g(op, types, attrs=None):
    g = Graph()
    g.inputs = [Value(TensorType(s, dt), f"x{i}") for i, (s, dt) in enumerate(types)]
    g.outputs = [g.add(op, g.inputs, dict(attrs or {}))]
    return g


REJECTED = [  # (op, [(shape, dtype)], attrs): dtypes or shapes the op's declaration must refuse
    ("neg", [((3,), "bool")], {}), ("sign", [((3,), "bool")], {}), ("abs", [((3,), "bool")], {}),
    ("exp", [((3,), "int64")], {}), ("not", [((3,), "float32")], {}),
    ("add", [((3,), "bool"), ((3,), "bool")], {}), ("sub", [((3,), "bool"), ((3,), "bool")], {}),
    ("atan2", [((3,), "int64"), ((3,), "int64")], {}), ("add", [((3,), "int64"), ((3,), "int32")], {}),
    ("and", [((3,), "int64"), ((3,), "int64")], {}), ("add", [((3,), "float32"), ((4,), "float32")], {}),
    ("reduce_sum", [((3,), "bool")], {}), ("reduce_prod", [((3,), "bool")], {}),
    ("reduce_mean", [((3,), "int64")], {}), ("cumsum", [((3,), "bool")], {}),
    ("conv", [((1, 4, 5, 5), "float32"), ((2, 1, 3, 3), "float32")], {"groups": 4}),
    ("conv", [((1, 3, 2, 2), "float32"), ((2, 3, 3, 3), "float32")], {}),
    ("gather_elements", [((3, 4), "float32"), ((4, 2), "int64")], {"axis": 1}),
    ("scatter_elements", [((2, 3), "float32"), ((3, 4), "int64"), ((3, 4), "float32")], {"axis": 0}),
    ("rope", [((1, 2, 3, 5), "float32"), ((1, 2), "int64"), ((2,), "float32")], {}),
    ("rope", [((1, 2, 3, 4), "float32"), ((1, 2), "int64"), ((3,), "float32")], {}),
    ("rope", [((1, 2, 3, 4), "float32"), ((2, 1), "int64"), ((2,), "float32")], {}),
    ("matmul_q", [((3, 4), "float32"), ((4, 5), "int8")], {"bits": 8}),
    ("gather", [((3, 4), "float32"), ((2,), "float32")], {}),
    ("matmul", [((3, 4), "float32"), ((5, 6), "float32")], {}),
    ("reshape", [((3, 4), "float32")], {"shape": (5, 2)}), ("transpose", [((3, 4), "float32")], {"perm": (0, 0)}),
    ("softmax", [((3, 4), "int64")], {}), ("bitwise_not", [((3,), "bool")], {}),
    ("bitwise_and", [((3,), "bool"), ((3,), "bool")], {}), ("shift_left", [((3,), "float32"), ((3,), "float32")], {}),
    ("max_pool", [((1, 1, 2, 2), "float32")], {"kernel": (3, 3)}),
]


@pytest.mark.parametrize("op, types, attrs", REJECTED, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(REJECTED)])
def test_declaration_rejects(op, types, attrs):
    with pytest.raises(ShapeError):
        _g(op, types, attrs)


UNSUPPORTED = [  # declared, but the C backend lowers only some dtypes or ranks: a clear UnsupportedOpError
    ("conv", [((B, 2, 4, 4, 4), "float32"), ((3, 2, 3, 3, 3), "float32")], {}),
    ("avg_pool", [((B, 2, 4, 4, 4), "float32")], {"kernel": (2, 2, 2)}),
    ("conv", [((1, 2, 4, 4, 4, 4), "float32"), ((3, 2, 3, 3, 3, 3), "float32")], {}),
    ("layer_norm", [((3, 4, 5), "float32"), ((5,), "float32")], {"axis": 1}),
    ("matmul", [((3, 4), "bool"), ((4, 5), "bool")], {}), ("matmul", [((3, 4), "int8"), ((4, 5), "int8")], {}),
    ("matmul_fused", [((3, 4), "float32"), ((4, 5), "float32")], {"act": "relu"}),
    ("matmul_fused", [((3, 4), "float64"), ((4, 5), "float64")], {}),
    ("matmul_q", [((3, 4), "float32"), ((4, 5), "int8"), ((1, 5), "float32")], {}),
]


@pytest.mark.parametrize("op, types, attrs", UNSUPPORTED,
                         ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(UNSUPPORTED)])
def test_unsupported_is_reported(op, types, attrs):
    with pytest.raises(UnsupportedOpError, match=op):
        compile_graph(_g(op, types, attrs))


def test_index_out_of_range_is_an_error_not_a_crash():
    c = Case()
    x = c.input(rand(c.rng, (4, 5), "float32"))
    i = c.input(np.array([0, 3], np.int64))
    j = c.input(np.array([[1], [4], [0], [2]], np.int64))
    c.out(c.add("gather", [x, i], {"axis": 0}), "gather")
    c.out(c.add("gather_elements", [x, j], {"axis": 1}), "gather_elements")
    cm = c.check()
    xv = c.runs[0][0]
    for bad_i, bad_j in [([0, 4], [[1], [4], [0], [2]]), ([-5, 0], [[1], [4], [0], [2]]),
                         ([0, 1], [[1], [5], [0], [2]]), ([0, 1], [[1], [-6], [0], [2]])]:
        with pytest.raises(ShapeError, match="out of range"):
            cm.run(xv, np.array(bad_i, np.int64), np.array(bad_j, np.int64))
    np.testing.assert_array_equal(cm.run(xv, np.array([-4, -1]), np.array([[-5], [4], [0], [2]]))[0], xv[[0, 3]])


def test_topk_longer_than_a_symbolic_dim_is_an_error_not_garbage():
    """k against a dim known only at run time (lower_reduce.lower_topk): a row shorter than k is refused with
    the sizes, not filled from uninitialised slots; rows at least k long match the reference."""
    g = Graph()
    n = dims.Sym("n")
    g.symbols["n"] = (1, 9)
    x = Value(TensorType((2, n), "float32"), "x")
    g.inputs = [x]
    g.outputs = list(g.add("topk", [x], {"k": 3, "axis": 1}))
    xv = np.random.default_rng(0).standard_normal((2, 7)).astype(np.float32)
    cm = check_graph(g, [xv])
    with pytest.raises(ShapeError, match="k=3 for a dim of size 2"):
        cm.run(xv[:, :2])


def test_attention_window_and_cap_from_a_config_are_bounded_before_c():
    """window and softcap come from a checkpoint's config and are rendered into C as literals: any value
    is either refused by the declaration or an int64 / a finite float that C reads back as written."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    q, kv, start = TensorType((1, 1, 2, 4), "float32"), TensorType((1, 1, 1, 8, 4), "float32"), \
        TensorType((1,), "int64")

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=3)),
           st.one_of(st.floats(), st.integers(), st.booleans(), st.none()))
    def check(window, cap):
        attrs = {"layer": 0, "scale": 1.0, "window": window, "softcap": cap}
        try:
            REGISTRY["cached_attention"].infer([q, kv, kv, start], attrs, [None] * 4)
        except ShapeError:
            return
        assert isinstance(window, int) and 0 <= window < 1 << 62
        assert np.isfinite(np.float32(float(cap))) and float(cap) >= 0
    check()


def test_fmax_fmin_drop_nan_where_max_min_keep_it():
    c = Case()
    a = c.input(np.array([1.0, np.nan, 3.0, np.nan, -0.0], np.float32))
    b = c.input(np.array([np.nan, 2.0, 1.0, np.nan, 0.0], np.float32))
    for op in ("fmax", "fmin", "max", "min", "copysign", "hypot", "nextafter"):
        c.out(c.add(op, [a, b]), f"{op} with NaNs")
    c.check()


def test_expert_index_out_of_range_is_an_error_not_a_crash():
    c = Case()
    x = c.input(rand(c.rng, (3, 1, 8), "float32"))
    ids = c.input(np.array([[0, 1], [2, 3], [1, 1]], np.int64))
    c.out(c.add("expert_matmul", [x, ids, c.const(rand(c.rng, (4, 8, 6), "float32"))], {"bits": 32}), "experts")
    cm = c.check()
    for bad in (4, -1, 1 << 40):
        with pytest.raises(CuvilError, match=f"expert index {bad} outside"):
            cm.run(c.runs[0][0], np.array([[0, 1], [2, bad], [1, 1]], np.int64))


# ---- linear algebra (ir/ops/linalg.py) ---------------------------------------------------------
def _well_conditioned(rng, shape):
    """Random matrices plus n on the diagonal: solves stay accurate at float32."""
    a = rand(rng, shape, "float32", -1, 1)
    n = shape[-1]
    a[..., np.arange(n), np.arange(n)] += n
    return a


@case("lu_factor")
def lu_factor(op):
    """Square, wide and tall matrices, a batch, rows that need swapping, a singular matrix (info) and an
    empty batch; LU, pivots and info checked."""
    c = Case()
    r = c.rng
    mats = {"batch 3x5x5": rand(r, (3, 5, 5), "float32"), "wide 3x6": rand(r, (3, 6), "float32"),
            "tall 6x3": rand(r, (6, 3), "float32"),
            "zero column": np.array([[0, 1, 2], [0, 3, 4], [0, 5, 7]], np.float32),
            "subnormal pivot": np.array([[1e-39, 1], [0, 1]], np.float32),
            "empty batch": rand(r, (0, 4, 4), "float32"), "1x1": np.array([[-2.5]], np.float32)}
    for label, a in mats.items():
        lu, piv, info = c.add(op, [c.input(a)])
        c.out(lu, label + " LU")
        c.out(piv, label + " pivots")
        c.out(info, label + " info")
    c.check(rtol=1e-5, atol=1e-5)


@case("lu_permutation")
def lu_permutation(op):
    """Pivots from a factorization, the identity, and out-of-range pivots (clamped, never out of bounds)."""
    c = Case()
    for label, piv, rows in [("swaps", np.array([[3, 3, 3], [1, 3, 3]], np.int32), 4),
                             ("identity", np.array([1, 2, 3], np.int32), 3),
                             ("corrupt", np.array([0, -7, 99], np.int32), 3)]:
        c.out(c.add(op, [c.input(piv)], {"rows": rows}), label)
    c.check()


@case("ldl_factor")
def ldl_factor(op):
    """Bunch-Kaufman against LAPACK's ssytrf: no swaps (diagonally dominant), 2 x 2 blocks (a small
    diagonal), a zero column (info), garbage above the diagonal (only the lower triangle is read)."""
    c = Case()
    m = rand(c.rng, (3, 6, 6), "float32", -1, 1)
    a = (m + np.swapaxes(m, -1, -2)).astype(np.float32)
    a[0] += 8 * np.eye(6, dtype=np.float32)
    a[1] -= np.diag(np.diagonal(a[1])) * np.float32(0.99)
    a[2, :, 2] = a[2, 2, :] = 0
    a[..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] = 99
    ld, piv, info = c.add(op, [c.input(a)])
    c.out(ld, "LD")
    c.out(piv, "pivots")
    c.out(info, "info")
    c.check(rtol=1e-4, atol=1e-4)


@case("ldl_solve")
def ldl_solve(op):
    """Solves from LAPACK's own factors (1 x 1 and 2 x 2 pivots), several right-hand sides, a batch."""
    import scipy.linalg.lapack as lapack
    c = Case()
    m = rand(c.rng, (2, 5, 5), "float32", -1, 1)
    a = (m + np.swapaxes(m, -1, -2)).astype(np.float32)
    a[1] -= np.diag(np.diagonal(a[1])) * np.float32(0.99)
    facs = [lapack.ssytrf(x, lower=1) for x in a]
    ld = np.stack([np.tril(f[0]) for f in facs]).astype(np.float32)
    piv = np.stack([f[1] for f in facs]).astype(np.int32)
    c.out(c.add(op, [c.input(ld), c.input(piv), c.input(rand(c.rng, (2, 5, 3), "float32"))]), "X")
    c.check(rtol=1e-3, atol=1e-3)


@case("bind_dim")
def bind_dim(op):
    """The front of a padded buffer cut at a count given at run time (two runs, two counts), along the
    first and a middle axis; an op after it runs over the computed size."""
    c = Case(runs=2, symbols={"k": (0, 6), "m": (0, 4)})
    x = c.input(rand(c.rng, (6, 4, 2), "float32"))
    k = c.input([np.array(3, np.int64), np.array(6, np.int64)], ())
    m = c.input([np.array(0, np.int64), np.array(2, np.int64)], ())
    rows = c.add(op, [x, k], dict(symbol="k", axis=0))
    c.out(rows, "rows")
    c.out(c.add("reduce_sum", [rows], dict(axes=[0], keepdims=False)), "sum over the rows")
    c.out(c.add(op, [x, m], dict(symbol="m", axis=1)), "middle axis")
    c.check()


@case("nms_select")
def nms_select(op):
    """Greedy suppression in score order against the reference: corner boxes (either corner first)
    and center boxes, equal scores, a score threshold, a per-class limit given at run time."""
    for center in (0, 1):
        c = Case(seed=center)
        B, C, N = 2, 3, 24
        xy = rand(c.rng, (B, N, 2), "float32", 0, 6)
        wh = rand(c.rng, (B, N, 2), "float32", 0.5, 3)
        boxes = np.concatenate([xy, wh] if center else [xy, xy + wh], -1).astype(np.float32)
        scores = np.round(rand(c.rng, (B, C, N), "float32", 0, 1), 1).astype(np.float32)
        order = np.argsort(-scores, axis=-1, kind="stable").astype(np.int64)
        scalar = lambda x, t: np.array(x, t)  # noqa: E731
        sel, count = c.add(op, [c.input(boxes), c.input(scores), c.input(order), c.input(scalar(4, np.int64)),
                                c.input(scalar(0.4, np.float32)), c.input(scalar(0.3, np.float32))],
                           dict(center_point_box=center, use_score_threshold=1))
        c.out(sel, "rows (padded)")
        c.out(count, "count")
        c.check()


@case("roi_align")
def roi_align(op):
    """Bilinear pooling of regions against the reference: average and max, an adaptive grid and a fixed
    one, half-pixel or not, rois inside, across the edge and reversed."""
    c = Case()
    x = c.input(rand(c.rng, (2, 3, 7, 9), "float32"))
    rois = c.input(np.array([[1, 1, 5, 4], [-2, -1, 3, 6], [7, 5, 2, 1]], np.float32))
    idx = c.input(np.array([1, 0, 1], np.int64))
    for mode, ratio, half in (("avg", 0, 1), ("max", 2, 0), ("avg", 1, 0)):
        c.out(c.add(op, [x, rois, idx], dict(mode=mode, output_height=3, output_width=2, sampling_ratio=ratio,
                                             spatial_scale=0.75, half_pixel=half)), f"{mode} ratio {ratio} half {half}")
    c.check(rtol=1e-5, atol=1e-5)


@case("cholesky")
def cholesky(op):
    """A batch of positive-definite matrices (upper triangle garbage: only the lower is read), and one
    that is not (info names its first failing minor)."""
    c = Case()
    b = rand(c.rng, (2, 5, 5), "float32", -1, 1)
    spd = (b @ np.swapaxes(b, -1, -2) + 5 * np.eye(5, dtype=np.float32)).astype(np.float32)
    spd[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] = 99
    low, info = c.add(op, [c.input(spd)])
    c.out(low, "L")
    c.out(info, "info")
    _, info_bad = c.add(op, [c.input(np.array([[4, 0, 0], [0, 1, 0], [0, 0, -1]], np.float32))])
    c.out(info_bad, "not positive definite: info")
    c.check(rtol=1e-5, atol=1e-5)


@case("triangular_solve")
def triangular_solve(op):
    """Lower and upper, unit diagonal or not, several right-hand sides, a batch; the other triangle
    holds garbage that must not be read."""
    c = Case()
    r = c.rng
    a = _well_conditioned(r, (2, 6, 6))
    b = rand(r, (2, 6, 3), "float32")
    for upper in (False, True):
        for unit in (False, True):
            c.out(c.add(op, [c.input(a), c.input(b)], {"upper": upper, "unit": unit}), f"upper={upper} unit={unit}")
    c.check(rtol=1e-4, atol=1e-4)


@case("householder_qr")
def householder_qr(op):
    """Square, tall, wide and batched matrices, and a column already zero below the diagonal (tau 0)."""
    c = Case()
    r = c.rng
    triangular = np.triu(rand(r, (4, 4), "float32"))
    for label, a in {"5x5": rand(r, (5, 5), "float32"), "tall 6x3": rand(r, (6, 3), "float32"),
                     "wide 3x5": rand(r, (3, 5), "float32"), "batch 2x4x3": rand(r, (2, 4, 3), "float32"),
                     "upper triangular": triangular}.items():
        qr, tau = c.add(op, [c.input(a)])
        c.out(qr, label + " qr")
        c.out(tau, label + " tau")
    c.check(rtol=1e-4, atol=1e-5)


@case("householder_product")
def householder_product(op):
    """Q from geqrf's reflectors: k < n <= m and k = n, batched."""
    c = Case()
    for shape, k in (((6, 4), 3), ((2, 5, 5), 5)):
        qr, tau = REGISTRY["householder_qr"].ref([rand(c.rng, shape, "float32")], {})
        c.out(c.add(op, [c.input(qr), c.input(np.ascontiguousarray(tau[..., :k]))]), f"{shape} k={k}")
    c.check(rtol=1e-4, atol=1e-5)


@case("eigh")
def eigh(op):
    """Symmetric matrices (the upper triangle garbage: only the lower is read), a batch, a diagonal one
    and 1 x 1; eigenvalues ascending and eigenvectors with their largest entry positive."""
    c = Case()
    b = rand(c.rng, (2, 5, 5), "float32", -1, 1)
    sym = (b + np.swapaxes(b, -1, -2)).astype(np.float32)
    garbage = np.tril(sym) + np.triu(np.full((5, 5), 7, np.float32), 1)
    for label, a in {"batch 2x5x5": sym, "upper garbage": garbage,
                     "diagonal": np.diag(np.array([3, -1, 2], np.float32)), "1x1": np.array([[-2.0]], np.float32)}.items():
        w, v = c.add(op, [c.input(a)])
        c.out(w, label + " eigenvalues")
        c.out(v, label + " eigenvectors")
    c.check(rtol=1e-4, atol=1e-4)


@case("svd")
def svd(op):
    """Tall, wide, square and batched full-rank matrices: u, s descending, vt (the tall side's vectors
    with their largest entry positive)."""
    c = Case()
    for shape in ((6, 4), (3, 5), (4, 4), (2, 5, 3)):
        u, s, vt = c.add(op, [c.input(rand(c.rng, shape, "float32", -1, 1))])
        c.out(u, f"{shape} u")
        c.out(s, f"{shape} s")
        c.out(vt, f"{shape} vt")
    c.check(rtol=1e-4, atol=1e-4)


@case("igamma", "igammac", name="large")
def igamma_large(op):
    """a and x up to 1e10 (where the series needs ~sqrt(a) terms and x^a e^-x / Gamma(a) cancels)."""
    c = Case()
    a = np.array([20.0, 1e4, 1e6, 1e8, 1e10, 1e10], np.float64)
    x = np.array([21.0, 1e4 - 50, 1e6 + 900, 1e8, 1e10, 1e10 + 2e5], np.float64)
    c.out(c.add(op, [c.input(a), c.input(x)]), "large a, x near a")
    c.check(rtol=1e-7, atol=1e-9)


def test_linalg_references_match_lapack():
    """The numpy references of lu_factor, cholesky, triangular_solve and householder_qr / _product
    against scipy's LAPACK calls (getrf, potrf, trtrs, geqrf): an oracle the C kernels are not derived
    from."""
    scipy_linalg = pytest.importorskip("scipy.linalg", reason="scipy (from scikit-learn) is the LAPACK oracle")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 7)).astype(np.float32)
    lu, piv, info = REGISTRY["lu_factor"].ref([a], {})
    want_lu, want_piv = scipy_linalg.lu_factor(a)
    np.testing.assert_allclose(lu, want_lu, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(piv, want_piv + 1)          # LAPACK's 1-based pivots (scipy shows them 0-based)
    assert info == 0
    perm = REGISTRY["lu_permutation"].ref([piv], {"rows": 7})[0]
    low, up = np.tril(lu, -1) + np.eye(7), np.triu(lu)
    np.testing.assert_allclose((low @ up), a[perm], rtol=1e-4, atol=1e-4)
    spd = a @ a.T + 7 * np.eye(7, dtype=np.float32)
    np.testing.assert_allclose(REGISTRY["cholesky"].ref([spd], {})[0], np.linalg.cholesky(spd), rtol=1e-5, atol=1e-5)
    qr, tau = REGISTRY["householder_qr"].ref([a], {})
    want_qr, want_tau = scipy_linalg.qr(a.astype(np.float64), mode="raw")[0]
    np.testing.assert_allclose(qr, want_qr, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tau, want_tau, rtol=1e-4, atol=1e-5)
    q = REGISTRY["householder_product"].ref([qr, tau], {})[0]
    np.testing.assert_allclose(q @ np.triu(qr), a, rtol=1e-4, atol=1e-4)
    b = rng.standard_normal((7, 2)).astype(np.float32)
    for upper in (False, True):
        x = REGISTRY["triangular_solve"].ref([spd, b], {"upper": upper, "unit": False})[0]
        np.testing.assert_allclose(x, scipy_linalg.solve_triangular(spd, b, lower=not upper), rtol=1e-4, atol=1e-6)


# ---- the tests --------------------------------------------------------------------------------
PARAMS = [pytest.param(op, variant, id=f"{op}-{variant}") for op in sorted(CASES) for variant in CASES[op]]


@pytest.mark.parametrize("op, variant", PARAMS)
def test_op(op, variant):
    CASES[op][variant]()


def test_every_op_has_a_case():
    missing = sorted(set(REGISTRY) - set(CASES))
    assert not missing, f"ops without a case in tests/test_ops.py: {missing}"
    unknown = sorted(set(CASES) - set(REGISTRY))
    assert not unknown, f"cases for ops that are not registered: {unknown}"


def test_activations_header_is_current():
    """kernels/activations.h is what gen_activations.py renders from the table (rerun it after an edit)."""
    from cuvil.codegen.c import gen_activations
    assert gen_activations.HEADER.read_text() == gen_activations.render()


def test_tuning_header_is_current():
    """kernels/tuning.h is what gen_tuning.py renders from the per-CPU table in tuning.py (rerun it after an edit)."""
    from cuvil.codegen.c import gen_tuning
    assert gen_tuning.HEADER.read_text() == gen_tuning.render()
