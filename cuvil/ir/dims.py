"""Dimensions: a dim is a Python int or a sympy expression over named symbols.

Named symbols (`Sym("batch")`) carry their bounds in `Graph.symbols`; derived dims such as
`batch*seq` stay symbolic until run time, where the C code computes them from the inputs."""
from __future__ import annotations

import math

import sympy

Dim = "int | sympy.Expr"


def Sym(name: str) -> sympy.Symbol:  # noqa: N802 - reads like a type
    return sympy.Symbol(name, integer=True, positive=True)


def as_dim(d):
    """Normalise an int-like or sympy value to int when it is constant."""
    if isinstance(d, sympy.Basic):
        d = sympy.simplify(d) if not d.is_Symbol else d
        if d.is_Integer:
            return int(d)
        return d
    return int(d)


def is_static(d) -> bool:
    return isinstance(d, int)


def shape_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def dims_equal(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def numel(shape):
    n = 1
    for d in shape:
        n = n * d
    return as_dim(n) if not isinstance(n, int) else n


def numel_upper_bound(shape, bounds: dict, products=()) -> int:
    """The most elements a tensor of `shape` holds, given the symbols' bounds {name: (lo, hi)} and, for
    pairs of symbols, the most their product may be (`products`: [(a, b, most)], Graph.symbol_products:
    an LLM step's rows x tokens). Each term of the expanded element count is largest at one of the two
    corners of the region a <= hi_a, b <= hi_b, a * b <= most (on its hyperbola a term a^i b^j is monotone
    in a), so their sum bounds it; a count with a negative term keeps the plain bound."""
    plain = math.prod(upper_bound(d, bounds) for d in shape)
    if not products or all(isinstance(d, int) for d in shape):
        return plain
    expr = sympy.expand(sympy.Mul(*[sympy.sympify(d) for d in shape]))
    best = plain
    for a, b, most in products:
        if a not in bounds or b not in bounds or not {a, b} <= symbols_of(expr):
            continue
        ha, hb = bounds[a][1], bounds[b][1]
        corners = [(ha, min(hb, most // ha)), (min(ha, most // hb), hb)]
        total = 0
        for term in sympy.Add.make_args(expr):
            if term.as_coeff_Mul()[0] < 0:
                total = plain
                break
            total += max(evaluate(term, {**{k: hi for k, (lo, hi) in bounds.items()}, a: x, b: y}) for x, y in corners)
        best = min(best, total)
    return int(best)


def evaluate(d, env: dict) -> int:
    """Value of a dim for concrete symbol values {name: int}."""
    if isinstance(d, int):
        return d
    v = sympy.sympify(d).subs({sympy.Symbol(k, integer=True, positive=True): val for k, val in env.items()})
    if not v.is_Integer:
        raise ValueError(f"dim {d} is not determined by symbols {sorted(env)}")
    return int(v)


def upper_bound(d, bounds: dict) -> int:
    """Largest value of a dim given symbol bounds {name: (lo, hi)}; dims are monotone in their symbols."""
    if isinstance(d, int):
        return d
    return evaluate(d, {k: hi for k, (lo, hi) in bounds.items()})


def symbols_of(d) -> set[str]:
    return set() if isinstance(d, int) else {s.name for s in sympy.sympify(d).free_symbols}


def to_c(d) -> str:
    """C expression (int64 arithmetic) for a dim; symbols are C variables of the same name."""
    if isinstance(d, int):
        return str(d)
    return _c(sympy.sympify(d))


def _c(e) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return "S_" + e.name
    if e.is_Add:
        return "(" + " + ".join(_c(a) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(_c(a) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + " * ".join([_c(e.base)] * int(e.exp)) + ")"
    name = type(e).__name__
    if name == "FloorDiv":
        return f"cuvil_floordiv({_c(e.args[0])}, {_c(e.args[1])})"
    if name in ("Mod", "PythonMod"):
        return f"cuvil_mod({_c(e.args[0])}, {_c(e.args[1])})"
    if name in ("Max",):
        return f"cuvil_max({_c(e.args[0])}, {_c(e.args[1])})"
    if name in ("Min",):
        return f"cuvil_min({_c(e.args[0])}, {_c(e.args[1])})"
    if isinstance(e, sympy.floor):   # floor(h/2 - 1/2) (a strided conv's output) -> floordiv(h - 1, 2)
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den.is_Integer:
            return f"cuvil_floordiv({_c(sympy.expand(num))}, {_c(den)})"
    raise NotImplementedError(f"cannot express dim {e} in C")


def to_py(d) -> str:
    """Python-evaluable text of a dim for the manifest (ints, + * // % and symbol names)."""
    if isinstance(d, int):
        return str(d)
    return to_c(d).replace("S_", "").replace("cuvil_floordiv", "floordiv").replace("cuvil_mod", "mod") \
        .replace("cuvil_max", "max").replace("cuvil_min", "min")


def fmt(d) -> str:
    return str(d)


def prod(xs):
    return math.prod(xs)
