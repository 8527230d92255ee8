"""C lowering of pointwise ops: one C expression per op, placed in a broadcast loop nest."""
from __future__ import annotations

from ...ir import dims as D
from . import cexpr
from .ctypes_map import COMPUTE, CTYPE, LOWP, is_float
from .emit import lowering
from .gen_activations import GENERIC, SMATH, render_formula
from .loops import contiguous_strides, loop_nest, operand_strides, stored_shape

# {0}, {1}, {2}: operands; {T}: compute type. Float and integer variants where they differ.
UNARY_F = {
    "neg": "(-{0})", "abs": "fabs({0})", "exp": "exp({0})", "log": "log({0})", "log1p": "log1p({0})",
    "expm1": "expm1({0})", "sqrt": "sqrt({0})", "rsqrt": "(({T})1 / sqrt({0}))", "reciprocal": "(({T})1 / {0})",
    "sin": "sin({0})", "cos": "cos({0})", "tan": "tan({0})", "asin": "asin({0})", "acos": "acos({0})",
    "atan": "atan({0})", "sinh": "sinh({0})", "cosh": "cosh({0})", "tanh": "tanh({0})", "asinh": "asinh({0})",
    "acosh": "acosh({0})", "atanh": "atanh({0})", "erf": "erf({0})", "erfc": "erfc({0})", "lgamma": "lgamma({0})",
    "exp2": "exp2({0})", "trunc": "trunc({0})", "log2": "log2({0})", "log10": "log10({0})",
    **{name: render_formula(name, GENERIC, "{0}") for name in ("sigmoid", "gelu", "gelu_tanh", "silu")},
    "relu": "({0} < 0 ? ({T})0 : {0})",
    "relu6": "({0} < 0 ? ({T})0 : ({0} > 6 ? ({T})6 : {0}))",
    "hardswish": "({0} * (_T3_ < 0 ? ({T})0 : (_T3_ > 6 ? ({T})6 : _T3_)) / ({T})6)".replace("_T3_", "({0} + ({T})3)"),
    "softplus": "(log1p(exp(-fabs({0}))) + ({0} > 0 ? {0} : ({T})0))",
    "floor": "floor({0})", "ceil": "ceil({0})", "round": "nearbyint({0})",
    "sign": "({0} > 0 ? ({T})1 : ({0} < 0 ? ({T})-1 : {0}))",  # sign(nan) = nan, as numpy and ONNX
    "isnan": "({0} != {0})", "isinf": "(isinf({0}) != 0)",
    "leaky_relu": "({0} >= 0 ? {0} : {0} * ({T}){alpha})",
    "elu": "({0} > 0 ? {0} : ({T}){alpha} * expm1({0}))",
    # clamps as selects, which vectorize (fmin/fmax were libm calls, and drop a NaN operand, where numpy
    # and torch propagate it): NaN fails both tests and stays NaN. clip is min(max(x, min), max): min >
    # max gives max, as numpy
    "hardsigmoid": "(_HS_ < 0 ? ({T})0 : (_HS_ > 1 ? ({T})1 : _HS_))".replace(
        "_HS_", "(({T}){alpha} * {0} + ({T}){beta})"),
    "clip": "(({0} < ({T}){min} ? ({T}){min} : {0}) > ({T}){max} ? ({T}){max} : ({0} < ({T}){min} ? ({T}){min} : {0}))",
}
# special functions (kernels/special.c, in double)
SPECIAL_C = {
    "erfinv": "cuvil_erfinv({0})", "ndtri": "cuvil_ndtri({0})", "erfcx": "cuvil_erfcx({0})",
    "log_ndtr": "cuvil_log_ndtr({0})", "digamma": "cuvil_digamma({0})", "polygamma": "cuvil_polygamma({n}, {0})",
    **{f"{f}{nu}{e}": f"cuvil_bessel_{f}({nu}, {int(bool(e))}, {{0}})" for f in "ik" for nu in (0, 1) for e in ("", "e")},
    **{f"{f}{nu}": f"cuvil_bessel_{f}({nu}, {{0}})" for f in "jy" for nu in (0, 1)},
    "spherical_j0": "cuvil_spherical_j0({0})", "airy_ai": "cuvil_airy_ai({0})",
    "zeta": "cuvil_zeta({0}, {1})", "igamma": "cuvil_igamma({0}, {1})", "igammac": "cuvil_igammac({0}, {1})",
    **{f"{kind}_polynomial": f"cuvil_polynomial('{code}', {{0}}, {{1}})" for kind, code in (
        ("chebyshev_t", "t"), ("chebyshev_u", "u"), ("chebyshev_v", "v"), ("chebyshev_w", "w"), ("hermite_h", "h"),
        ("hermite_he", "e"), ("laguerre_l", "l"), ("legendre_p", "p"))},
    **{f"shifted_chebyshev_{k}_polynomial": f"cuvil_polynomial('{k.upper()}', {{0}}, {{1}})" for k in "tuvw"},
}
UNARY_F.update({k: v for k, v in SPECIAL_C.items() if "{1}" not in v})

# float32 versions that keep a loop vectorizable (kernels/smath.h), used in place of libm calls
FAST_F32 = {
    "exp": "cuvil_fexp({0})", "erf": "cuvil_ferf({0})", "tanh": "cuvil_ftanh({0})",
    "log": "cuvil_flog({0})", "log1p": "cuvil_flog1p({0})", "sin": "cuvil_fsin({0})", "cos": "cuvil_fcos({0})",
    "softplus": "(cuvil_flog1p(cuvil_fexp(-fabsf({0}))) + ({0} > 0 ? {0} : 0.f))",
    **{name: render_formula(name, SMATH, "{0}") for name in ("sigmoid", "silu", "gelu", "gelu_tanh")},
}
UNARY_I = {
    "neg": "(-{0})", "abs": "({0} < 0 ? -{0} : {0})", "relu": "({0} < 0 ? 0 : {0})",
    "sign": "(({T})(({0} > 0) - ({0} < 0)))", "not": "(!{0})",
    "clip": "(({0} > {max} || {min} > {max}) ? ({T}){max} : ({0} < {min} ? ({T}){min} : {0}))",  # min > max: max
}
BINARY_F = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "floordiv": "floor({0} / {1})", "pow": "pow({0}, {1})",
    "max": "(({0} != {0} || {0} > {1}) ? {0} : {1})", "min": "(({0} != {0} || {0} < {1}) ? {0} : {1})",
    "mod": "cuvil_pymod{fsuf}({0}, {1})", "fmod": "fmod({0}, {1})", "atan2": "atan2({0}, {1})",
    "copysign": "copysign({0}, {1})", "hypot": "hypot({0}, {1})", "nextafter": "nextafter({0}, {1})",
    "fmax": "fmax({0}, {1})", "fmin": "fmin({0}, {1})",
    **{k: v for k, v in SPECIAL_C.items() if "{1}" in v},
}
BINARY_I = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "div": "({1} == 0 ? 0 : ({1} == -1 ? -{0} : {0} / {1}))",
    "floordiv": "({1} == 0 ? 0 : cuvil_floordiv({0}, {1}))",
    "pow": "(({T})pow((double){0}, (double){1}))",
    "max": "({0} > {1} ? {0} : {1})", "min": "({0} < {1} ? {0} : {1})",
    "mod": "({1} == 0 ? 0 : cuvil_mod({0}, {1}))", "fmod": "({1} == 0 || {1} == -1 ? 0 : {0} % {1})",
}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
LOGICAL = {"and": "({0} && {1})", "or": "({0} || {1})", "xor": "(!{0} != !{1})"}


def _fmt_int(v, ctype):
    big = {"int64_t": 2**63 - 1, "int32_t": 2**31 - 1, "int16_t": 2**15 - 1, "int8_t": 127, "uint8_t": 255,
           "uint16_t": 2**16 - 1, "uint32_t": 2**32 - 1, "uint64_t": 2**64 - 1}[ctype]
    small = 0 if ctype.startswith("uint") else -big - 1
    v = max(min(v, big), small) if v not in (float("inf"), float("-inf")) else (big if v > 0 else small)
    return f"(({ctype}){int(v)}{'ULL' if ctype.startswith('uint') else 'LL'})" if v != -2**63 else "INT64_MIN"


def template(node):
    """The C expression template of a pointwise node."""
    op = node.op
    src = node.inputs[0].dtype
    if op == "where":
        return "({0} ? {1} : {2})"
    if op == "cast":
        return _cast_template(src, node.attrs["to"], node.attrs.get("saturate", True))
    if any(v.dtype in LOWP for v in node.inputs) and op != "where":
        return None      # low-precision dtypes are computed in float32 (passes/legalize.py)
    if op in COMPARE:
        return f"({{0}} {COMPARE[op]} {{1}})"
    if op in LOGICAL:
        return LOGICAL[op]
    table = (UNARY_F if node.op in UNARY_F or node.op in UNARY_I else None)
    if node.inputs.__len__() == 1:
        table = UNARY_F if is_float(src) else UNARY_I
        if src == "float32" and op in FAST_F32:
            return FAST_F32[op]
    else:
        table = BINARY_F if is_float(src) else BINARY_I
    if op not in table:
        return None
    t = table[op]
    T = COMPUTE[src]
    extra = {}
    for k, v in node.attrs.items():
        extra[k] = cexpr.float_literal(v) if is_float(src) else _fmt_int(v, CTYPE[src])
    return t.replace("{T}", T).replace("{fsuf}", "f" if T == "float" else "").format(
        "{0}", "{1}", "{2}", **extra) if extra else t.replace("{T}", T).replace("{fsuf}", "f" if T == "float" else "")


def _cast_template(src, to, sat):
    """Cast expression; low-precision dtypes go through the conversions of kernels/lowp.h."""
    x = "{0}"
    if src in LOWP:
        x = f"cv_{src}_to_i64({x})" if src.endswith(("int4", "int2")) else f"cv_{src}_to_f32({x})"
    if to == "bool":
        return f"({x} != 0)"
    if to in LOWP:
        if to.endswith(("int4", "int2")):
            return f"cv_i64_to_{to}((int64_t)({x}))"
        return f"cv_f32_to_{to}((float)({x}), {int(bool(sat))})"
    return f"(({COMPUTE[to]})({x}))"


def _supports(node):
    return None if template(node) is not None else f"no C lowering for dtype {node.inputs[0].dtype}"


def substitute(tmpl, args):
    out = tmpl
    for k, a in enumerate(args):
        out = out.replace("{%d}" % k, f"({a})")
    return out


POINTWISE_OPS = (list(UNARY_F) + ["not"] + list(BINARY_F) + list(COMPARE) + list(LOGICAL) + ["where", "cast"])


@lowering(*POINTWISE_OPS, supports=_supports)
def lower_pointwise(em, node):
    out = node.outputs[0]
    shape = stored_shape(out)
    tmpl = template(node)
    ins = [(em.ptr(v), operand_strides(v, out), "0") for v in node.inputs]
    return loop_nest(shape, (em.ptr(out), contiguous_strides(shape), "0"), ins,
                     lambda loads: substitute(tmpl, _widen(loads, node.inputs)), em.parallel)


def _widen(loads, values):
    """fp16 operands are computed in float (tgmath has no _Float16 overloads)."""
    return [f"(float){ld}" if v.dtype == "float16" else ld for ld, v in zip(loads, values)]


def _step_node(op, dtypes, attrs):
    from types import SimpleNamespace
    return SimpleNamespace(op=op, inputs=[SimpleNamespace(dtype=d) for d in dtypes], attrs=dict(attrs))


def _fused_steps(node):
    """(C template, result dtype) per step of a fused_pointwise body."""
    from ...ir.ops import REGISTRY
    from ...ir.ops.fused import pointwise_input_types
    ins = pointwise_input_types([v.type for v in node.inputs], node.attrs)
    types, out = [], []
    for op, args, attrs in node.attrs["body"]:
        ts = [ins[i] if kind == "in" else types[i] for kind, i in args]
        t = REGISTRY[op].infer(ts, dict(attrs), None)[0]
        types.append(t)
        out.append((template(_step_node(op, [x.dtype for x in ts], attrs)), t.dtype))
    return out


def _fused_supports(node):
    return None if all(t is not None for t, _ in _fused_steps(node)) else "a step has no C lowering for its dtype"


def _sliced(ptr, v, view):
    """(pointer, strides, base) of v read through a slice (axis, start, step, length) of it."""
    axis, start, step, _ = view
    strides = contiguous_strides(v.type.shape)
    base = D.to_c(D.as_dim(start * strides[axis]))
    strides[axis] = D.as_dim(strides[axis] * step)
    return ptr, strides, base


@lowering("fused_pointwise", supports=_fused_supports)
def lower_fused_pointwise(em, node):
    """One loop; each step is a local temporary, so values used twice are computed once."""
    out = node.outputs[0]
    shape = stored_shape(out)                    # passes/layout.py runs no node with views blocked
    steps = _fused_steps(node)
    body = node.attrs["body"]
    views = node.attrs.get("views") or [()] * len(node.inputs)
    ins = [_sliced(em.ptr(v), v, view) if view else (em.ptr(v), operand_strides(v, out), "0")
           for v, view in zip(node.inputs, views)]

    def expr(loads):
        parts = []
        for j, ((tmpl, dt), (_, args, _)) in enumerate(zip(steps, body)):
            ops = [_widen([loads[i]], [node.inputs[i]])[0] if kind == "in" else f"t{i}" for kind, i in args]
            parts.append(f"{COMPUTE[dt]} t{j} = {substitute(tmpl, ops)};")
        return "({ " + " ".join(parts) + f" t{len(steps) - 1}; }})"
    return loop_nest(shape, (em.ptr(out), contiguous_strides(shape), "0"), ins, expr, em.parallel)
