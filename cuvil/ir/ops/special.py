"""Special functions, elementwise: the error-function inverses, digamma / polygamma / zeta, the
incomplete gamma functions, Bessel functions of order 0 and 1, Airy's Ai, and the classical orthogonal
polynomials. Their numpy references are scipy.special's (imported when a reference runs: scipy is a
development dependency, as the oracle, never the runtime's), and their special values are scipy's,
which are torch's (both Cephes). The polynomials follow torch.special: the degree is truncated to an
integer and a negative one gives 0."""
from __future__ import annotations

import numpy as np

from ...errors import CuvilError


def _scipy_special():
    try:
        import scipy.special
    except ImportError as e:
        raise CuvilError("the reference of a special function needs scipy (pip install scipy)") from e
    return scipy.special


def _ref(name, *fixed):
    """scipy.special.<name>(*fixed, x), in float64, cast back to x's dtype."""
    def ref(x):
        return getattr(_scipy_special(), name)(*fixed, x.astype(np.float64)).astype(x.dtype)
    return ref


def _spherical_j0(x):
    return _scipy_special().spherical_jn(0, x.astype(np.float64)).astype(x.dtype)


# op -> reference; C: kernels/special.h (codegen/c/lower_pointwise.py SPECIAL_C)
SPECIAL_UNARY = {
    "erfinv": _ref("erfinv"), "ndtri": _ref("ndtri"), "erfcx": _ref("erfcx"), "log_ndtr": _ref("log_ndtr"),
    "digamma": _ref("psi"),
    "i0": _ref("i0"), "i0e": _ref("i0e"), "i1": _ref("i1"), "i1e": _ref("i1e"),
    "k0": _ref("k0"), "k0e": _ref("k0e"), "k1": _ref("k1"), "k1e": _ref("k1e"),
    "j0": _ref("j0"), "j1": _ref("j1"), "y0": _ref("y0"), "y1": _ref("y1"),
    "spherical_j0": _spherical_j0, "airy_ai": lambda x: _scipy_special().airy(x.astype(np.float64))[0].astype(x.dtype),
}


def polygamma_ref(x, attrs):
    n = attrs["n"]
    f = _ref("psi") if n == 0 else _ref("polygamma", n)
    return f(x)


def _zeta(s, q):
    return _scipy_special().zeta(s.astype(np.float64), q.astype(np.float64)).astype(s.dtype)


def _gammainc(upper):
    def ref(a, x):
        sp = _scipy_special()
        return (sp.gammaincc if upper else sp.gammainc)(a.astype(np.float64), x.astype(np.float64)).astype(a.dtype)
    return ref


# (x, n) -> p_n(x): the first two polynomials of a kind and its recurrence p_{k+1} from (x, k, p_{k-1}, p_k)
_POLYNOMIALS = {
    "chebyshev_t": (lambda x: x, lambda x, k, p, q: 2 * x * q - p),
    "chebyshev_u": (lambda x: 2 * x, lambda x, k, p, q: 2 * x * q - p),
    "chebyshev_v": (lambda x: 2 * x - 1, lambda x, k, p, q: 2 * x * q - p),
    "chebyshev_w": (lambda x: 2 * x + 1, lambda x, k, p, q: 2 * x * q - p),
    "hermite_h": (lambda x: 2 * x, lambda x, k, p, q: 2 * x * q - 2 * k * p),
    "hermite_he": (lambda x: x, lambda x, k, p, q: x * q - k * p),
    "laguerre_l": (lambda x: 1 - x, lambda x, k, p, q: ((2 * k + 1 - x) * q - k * p) / (k + 1)),
    "legendre_p": (lambda x: x, lambda x, k, p, q: ((2 * k + 1) * x * q - k * p) / (k + 1)),
}
POLY_LOOP_MAX = 2 ** 20        # kernels/special.c: above it NaN (Chebyshev: closed forms), not a longer loop


def _polynomial(kind, shifted):
    first, step = _POLYNOMIALS[kind]

    def ref(x, n):
        x64, n64 = np.broadcast_arrays(x.astype(np.float64), n.astype(np.float64))
        if shifted:
            x64 = 2 * x64 - 1
        with np.errstate(invalid="ignore"):
            deg = np.trunc(n64)                   # as torch's cast to int64: NaN and 2^63 up are negative
            deg = np.where(np.isnan(deg) | (deg >= 9.2e18), -1, deg)
        if (deg > POLY_LOOP_MAX).any():
            raise CuvilError(f"the {kind} reference loops at most {POLY_LOOP_MAX} degrees")
        p, q = np.ones_like(x64), first(x64)
        out = np.where(deg == 0, p, q)
        with np.errstate(all="ignore"):
            for k in range(1, int(deg.max(initial=0))):
                p, q = q, step(x64, k, p, q)
                out = np.where(deg == k + 1, q, out)
        return np.where(deg < 0, 0.0, out).astype(x.dtype)
    return ref


SPECIAL_BINARY = {
    "zeta": _zeta, "igamma": _gammainc(False), "igammac": _gammainc(True),
    **{f"{k}_polynomial": _polynomial(k, False) for k in _POLYNOMIALS},
    **{f"shifted_{k}_polynomial": _polynomial(k, True) for k in ("chebyshev_t", "chebyshev_u", "chebyshev_v",
                                                                 "chebyshev_w")},
}
