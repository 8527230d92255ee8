"""Complex tensors in the torch frontend, kept inside the graph as float pairs.

The IR stays real: a complex tensor of shape s is a float Value of shape s + (2,) (real, imaginary),
wrapped in `Complex` so that only the handlers here ever see it (torch.py routes every node that
reads or makes one to this table; an op without a row is reported unsupported "on complex
tensors"). Products are four real products, FFTs one GEMM per axis (dft.py). A complex model input
or output is the same bytes as its pairs (numpy's complex64 is two float32s), so the runtime hands
the caller's arrays to the library as they are."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..ir.graph import Value
from . import dft
from .aten import Unsupported, _norm_bound, aten
from .aten import handles as aten_handles
from .torch_dtypes import dtype_of

PAIR_DTYPES = {torch.complex64: "float32", torch.complex128: "float64"}
COMPLEX_DTYPES = {v: k for k, v in PAIR_DTYPES.items()}
HANDLERS: dict = {}


class Complex:
    """A complex tensor: `pair` is its float Value with a trailing axis of (real, imaginary)."""
    __slots__ = ("pair",)

    def __init__(self, pair: Value):
        self.pair = pair

    @property
    def rank(self) -> int:
        return self.pair.type.rank - 1

    @property
    def shape(self) -> tuple:
        return tuple(self.pair.shape[:-1])


def handles(*targets):
    return aten_handles(*targets, table=HANDLERS)


def is_complex_meta(val) -> bool:
    if isinstance(val, (list, tuple)):
        return any(is_complex_meta(v) for v in val)
    return isinstance(val, torch.Tensor) and val.dtype.is_complex


def involves_complex(node, args) -> bool:
    """Whether a node reads or makes a complex tensor: it then goes to this module's table."""
    def has(a):
        return isinstance(a, Complex) or (isinstance(a, (list, tuple)) and any(has(v) for v in a))
    return is_complex_meta(node.meta.get("val")) or has(args)


def pair_dtype(dtype) -> str:
    """The float dtype of a complex torch dtype's parts; Unsupported for complex32."""
    if dtype not in PAIR_DTYPES:
        raise Unsupported(f"dtype {dtype}")
    return PAIR_DTYPES[dtype]


def _meta(ctx):
    return ctx.node.meta["val"]


def _out_pair(ctx) -> str:
    return pair_dtype(_meta(ctx).dtype)


def _meta_shape(ctx) -> list:
    return [ctx.dim(d) for d in _meta(ctx).shape]


# ---- building blocks -------------------------------------------------------------------------
def parts(ctx, z: Complex):
    """(real, imaginary) of z, each of z's shape plus a trailing 1 (ready to broadcast and rejoin)."""
    last = z.rank
    return tuple(ctx.add("slice", [z.pair], {"axis": last, "start": k, "step": 1, "length": 1}) for k in (0, 1))


def join(ctx, re, im) -> Complex:
    return Complex(ctx.add("concat", [re, im], {"axis": re.type.rank - 1}))


def _drop_last(ctx, x):
    return ctx.add("reshape", [x], {"shape": list(x.shape[:-1])})


def _trailing_one(ctx, x: Value):
    return ctx.add("reshape", [x], {"shape": list(x.shape) + [1]})


def lift(ctx, x, dt: str) -> Complex:
    """x (Complex, real tensor or python number) as a Complex of part dtype dt."""
    if isinstance(x, Complex):
        return x if x.pair.dtype == dt else Complex(ctx.add("cast", [x.pair], {"to": dt}))
    if isinstance(x, Value):                 # imaginary zeros (0 * re would be NaN at an infinite re)
        re = _trailing_one(ctx, ctx.tensor(x, dt))
        return join(ctx, re, ctx.add("full", [], {"shape": list(re.shape), "value": 0.0, "dtype": dt}))
    if isinstance(x, (bool, int, float, complex)):
        return Complex(ctx.g.const(np.array([complex(x).real, complex(x).imag], dtype=dt)))
    raise Unsupported(f"{type(x).__name__} as a complex operand")


def _real_operand(ctx, x, dt):
    """A real tensor or number as something that broadcasts against a pair (a trailing axis of 1)."""
    return _trailing_one(ctx, ctx.tensor(x, dt)) if isinstance(x, Value) else ctx.tensor(float(x), dt)


def _is_real(x) -> bool:
    return isinstance(x, Value) or (isinstance(x, (bool, int, float)))


def _mul(ctx, a: Complex, b: Complex) -> Complex:
    ar, ai = parts(ctx, a)
    br, bi = parts(ctx, b)
    re = ctx.add("sub", [ctx.add("mul", [ar, br]), ctx.add("mul", [ai, bi])])
    return join(ctx, re, ctx.add("add", [ctx.add("mul", [ar, bi]), ctx.add("mul", [ai, br])]))


def _conj(ctx, z: Complex) -> Complex:
    return Complex(ctx.add("mul", [z.pair, ctx.g.const(np.array([1.0, -1.0], dtype=z.pair.dtype))]))


# ---- pointwise -------------------------------------------------------------------------------
@handles(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add(ctx, a, b, alpha=1):
    dt = _out_pair(ctx)
    a, b = lift(ctx, a, dt), lift(ctx, b, dt)
    if alpha != 1:
        b = _mul(ctx, b, lift(ctx, alpha, dt))
    op = "sub" if ctx.node.target in (aten.sub.Tensor, aten.sub.Scalar) else "add"
    return Complex(ctx.add(op, [a.pair, b.pair]))


@handles(aten.mul.Tensor, aten.mul.Scalar)
def _mul_h(ctx, a, b):
    dt = _out_pair(ctx)
    if _is_real(a) or _is_real(b):                # a real factor scales both parts
        z, r = (b, a) if _is_real(a) else (a, b)
        return Complex(ctx.add("mul", [lift(ctx, z, dt).pair, _real_operand(ctx, r, dt)]))
    return _mul(ctx, lift(ctx, a, dt), lift(ctx, b, dt))


@handles(aten.div.Tensor, aten.div.Scalar)
def _div(ctx, a, b):
    dt = _out_pair(ctx)
    if _is_real(b):
        return Complex(ctx.add("div", [lift(ctx, a, dt).pair, _real_operand(ctx, b, dt)]))
    return _smith_div(ctx, lift(ctx, a, dt), lift(ctx, b, dt))


def _smith_div(ctx, a, b):
    """(p + iq) / (c + id) by Smith's algorithm: scaled by the larger of |c|, |d|, so |b|^2 never
    overflows or underflows (it would past about 1e19 or below 1e-19 in float32)."""
    p, q = parts(ctx, a)
    c, d = parts(ctx, b)
    wide = ctx.add("ge", [ctx.add("abs", [c]), ctx.add("abs", [d])])
    big, small = ctx.add("where", [wide, c, d]), ctx.add("where", [wide, d, c])
    r = ctx.add("div", [small, big])                           # |r| <= 1
    den = ctx.add("add", [big, ctx.add("mul", [small, r])])
    # wide: ((p + q r) + i (q - p r)) / den; else ((p r + q) + i (q r - p)) / den
    pr, qr = ctx.add("mul", [p, r]), ctx.add("mul", [q, r])
    re = ctx.add("where", [wide, ctx.add("add", [p, qr]), ctx.add("add", [pr, q])])
    im = ctx.add("where", [wide, ctx.add("sub", [q, pr]), ctx.add("sub", [qr, p])])
    return join(ctx, ctx.add("div", [re, den]), ctx.add("div", [im, den]))


@handles(aten.neg.default)
def _neg(ctx, z):
    return Complex(ctx.add("neg", [z.pair]))


@handles(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default, aten.conj.default)
def _conj_h(ctx, z):
    return _conj(ctx, z) if isinstance(z, Complex) else z


@handles(aten.resolve_conj.default, aten.resolve_neg.default, aten.clone.default, aten.alias.default,
         aten.detach.default, aten.contiguous.default, aten.lift_fresh_copy.default)
def _identity(ctx, z, **kw):
    return z


@handles(aten._assert_tensor_metadata.default)
def _assert(ctx, *a, **kw):
    return None


@handles(aten.abs.default)
def _abs(ctx, z):
    re, im = parts(ctx, z)
    return _drop_last(ctx, ctx.add("hypot", [re, im]))


@handles(aten.angle.default)
def _angle(ctx, z):
    re, im = parts(ctx, z)
    return _drop_last(ctx, ctx.add("atan2", [im, re]))


@handles(aten.real.default, aten.imag.default)
def _real_imag(ctx, z):
    return _drop_last(ctx, parts(ctx, z)[ctx.node.target is aten.imag.default])


@handles(aten.exp.default)
def _exp(ctx, z):
    re, im = parts(ctx, z)
    mag = ctx.add("exp", [re])
    return join(ctx, ctx.add("mul", [mag, ctx.add("cos", [im])]), ctx.add("mul", [mag, ctx.add("sin", [im])]))


@handles(aten.view_as_real.default)
def _view_as_real(ctx, z):
    return z.pair


@handles(aten.view_as_complex.default)
def _view_as_complex(ctx, x):
    if x.type.rank == 0 or x.shape[-1] != 2:
        raise Unsupported("view_as_complex of a tensor whose last dim is not 2")
    return Complex(x)


@handles(aten.complex.default)
def _complex(ctx, re, im):
    dt, shape = _out_pair(ctx), _meta_shape(ctx)
    re, im = (ctx.add("expand", [ctx.tensor(v, dt)], {"shape": shape}) for v in (re, im))
    return join(ctx, _trailing_one(ctx, re), _trailing_one(ctx, im))


@handles(aten.polar.default)
def _polar(ctx, mag, ang):
    dt, shape = _out_pair(ctx), _meta_shape(ctx)
    mag, ang = (_trailing_one(ctx, ctx.add("expand", [ctx.tensor(v, dt)], {"shape": shape})) for v in (mag, ang))
    return join(ctx, ctx.add("mul", [mag, ctx.add("cos", [ang])]), ctx.add("mul", [mag, ctx.add("sin", [ang])]))


@handles(aten._to_copy.default)
def _to_copy(ctx, x, dtype=None, **kw):
    out = _meta(ctx).dtype
    if out.is_complex:
        return lift(ctx, x, pair_dtype(out))
    re = _drop_last(ctx, parts(ctx, x)[0])        # to a real dtype: torch drops the imaginary part
    return ctx.add("cast", [re], {"to": dtype_of(out)})


@handles(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def _sum(ctx, z, dim=None, keepdim=False, dtype=None):
    z = lift(ctx, z, _out_pair(ctx))
    r = z.rank
    axes = list(range(r)) if dim is None or dim == [] or r == 0 else \
        [d % r for d in ([dim] if isinstance(dim, int) else dim)]
    op = "reduce_mean" if ctx.node.target in (aten.mean.dim, aten.mean.default) else "reduce_sum"
    return Complex(ctx.add(op, [z.pair], {"axes": axes, "keepdims": keepdim}))


# ---- shapes and movement: the pair axis rides along at the end -----------------------------------
@handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints)
def _reshape(ctx, z, *a):
    return Complex(ctx.add("reshape", [z.pair], {"shape": _meta_shape(ctx) + [2]}))


@handles(aten.expand.default)
def _expand(ctx, z, *a, **kw):
    return Complex(ctx.add("expand", [z.pair], {"shape": _meta_shape(ctx) + [2]}))


@handles(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, z, perm):
    r = z.rank
    return Complex(ctx.add("transpose", [z.pair], {"perm": [p % max(r, 1) for p in perm] + [r]}))


@handles(aten.transpose.int)
def _transpose(ctx, z, a, b):
    r = z.rank
    perm = list(range(r + 1))
    perm[a % r], perm[b % r] = perm[b % r], perm[a % r]
    return Complex(ctx.add("transpose", [z.pair], {"perm": perm}))


@handles(aten.slice.Tensor)
def _slice(ctx, z, dim=0, start=None, end=None, step=1):
    dim %= z.rank
    n = z.shape[dim]
    start = _norm_bound(start, n) if start is not None else 0
    length = _meta_shape(ctx)[dim]
    if isinstance(start, int) and isinstance(n, int) and start >= n:
        start = 0
    return Complex(ctx.add("slice", [z.pair], {"axis": dim, "start": start, "step": step, "length": length}))


@handles(aten.select.int)
def _select(ctx, z, dim, index):
    dim %= z.rank
    if index < 0:
        index = z.shape[dim] + index
    s = ctx.add("slice", [z.pair], {"axis": dim, "start": index, "step": 1, "length": 1})
    return Complex(ctx.add("reshape", [s], {"shape": _meta_shape(ctx) + [2]}))


@handles(aten.index_select.default)
def _index_select(ctx, z, dim, idx):
    return z if z.rank == 0 else Complex(ctx.add("gather", [z.pair, idx], {"axis": dim % z.rank}))


@handles(aten.flip.default)
def _flip(ctx, z, dims):
    pair = z.pair
    for d in dims:
        n = _length(z, d % z.rank)
        pair = ctx.add("slice", [pair], {"axis": d % z.rank, "start": n - 1, "step": -1, "length": n})
    return Complex(pair)


@handles(aten.cat.default)
def _cat(ctx, zs, dim=0):
    dt = _out_pair(ctx)
    zs = [lift(ctx, z, dt) for z in zs]
    return zs[0] if len(zs) == 1 else Complex(ctx.add("concat", [z.pair for z in zs], {"axis": dim % zs[0].rank}))


@handles(aten.constant_pad_nd.default)
def _pad(ctx, z, pad, value=0):
    pairs = [(0, 0)] * (z.rank + 1)
    for i in range(len(pad) // 2):
        pairs[z.rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if value == 0:
        return Complex(ctx.add("pad", [z.pair], {"pads": pairs, "value": 0.0}))
    value = complex(value)
    re, im = parts(ctx, z)
    return join(ctx, ctx.add("pad", [re], {"pads": pairs, "value": value.real}),
                ctx.add("pad", [im], {"pads": pairs, "value": value.imag}))


# ---- FFTs: torch's three primitives, over any set of dims -------------------------------------
def _scale(normalization: int, n: int) -> float:
    """torch's fft_norm_mode: 0 none, 1 by 1 / sqrt(n), 2 by 1 / n (n the signal size)."""
    return (1.0, 1.0 / math.sqrt(n), 1.0 / n)[normalization]


def _apply(ctx, x, axis, rank, w, pair_in, pair_out):
    return dft.transform(ctx.add, ctx.g.const, x, axis, rank, w, pair_in, pair_out)


def _fft(fn):
    """A transform too long for its dense matrix is unsupported, with the reason."""
    def h(ctx, *a, **kw):
        try:
            return fn(ctx, *a, **kw)
        except dft.TooLarge as e:
            raise Unsupported(str(e)) from None
    return h


def _c2c(ctx, z: Complex, dims, normalization, sign) -> Complex:
    pair = z.pair
    for d in dims:
        n = _length(z, d)
        pair = _apply(ctx, pair, d, z.rank, dft.forward_matrix(n, n, n, sign, _scale(normalization, n), False),
                      True, True)
    return Complex(pair)


def _rank_shape(x):
    return (x.rank, x.shape) if isinstance(x, Complex) else (x.type.rank, tuple(x.shape))


def _dims(x, dim) -> list:
    return [d % _rank_shape(x)[0] for d in dim]


def _length(x, axis) -> int:
    n = _rank_shape(x)[1][axis]
    if not isinstance(n, int):
        raise Unsupported("an FFT along a symbolic dim")
    return n


@handles(aten._fft_r2c.default)
@_fft
def _fft_r2c(ctx, x, dim, normalization, onesided):
    """Real -> complex, forward: the last of dims one-sided when asked, then the others."""
    dims = _dims(x, dim)
    r = x.type.rank
    n = _length(x, dims[-1])
    bins = n // 2 + 1 if onesided else n
    x = ctx.tensor(x, _out_pair(ctx))
    w = dft.forward_matrix(n, n, bins, -1.0, _scale(normalization, n), True)
    z = Complex(_apply(ctx, x, dims[-1], r, w, False, True))
    return _c2c(ctx, z, dims[:-1], normalization, -1.0)


@handles(aten._fft_c2c.default)
@_fft
def _fft_c2c(ctx, z, dim, normalization, forward):
    return _c2c(ctx, lift(ctx, z, _out_pair(ctx)), _dims(z, dim), normalization, -1.0 if forward else 1.0)


@handles(aten._fft_c2r.default)
@_fft
def _fft_c2r(ctx, z, dim, normalization, last_dim_size):
    """Complex -> real, inverse: the other dims first, then the Hermitian last one of last_dim_size."""
    dims = _dims(z, dim)
    z = _c2c(ctx, lift(ctx, z, dtype_of(_meta(ctx).dtype)), dims[:-1], normalization, 1.0)
    bins = _length(z, dims[-1])
    length = int(ctx.dim(last_dim_size))
    return _apply(ctx, z.pair, dims[-1], z.rank, dft.hermitian_matrix(bins, length, _scale(normalization, length)),
                  True, False)
