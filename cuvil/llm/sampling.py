"""Next-token choice from logits: greedy, temperature, top-k, top-p, repetition penalty (numpy)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ShapeError

_MAX = np.finfo(np.float64).max


def check_arg(name, value, kind, want, ok=lambda v: True):
    """TypeError unless `value` is a `kind` (numbers.Real or numbers.Integral; never a bool), ValueError
    unless it is finite and ok(value): the message names the argument, what it must be, and what it is."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")
    try:
        finite = kind is numbers.Integral or math.isfinite(value)
    except OverflowError:                   # an int too large for a float: no use as a float parameter
        finite = False
    if not (finite and ok(value)):
        raise ValueError(f"{name} must be {want}, got {value!r}")


def check_sampling(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=None):
    """Raise TypeError/ValueError naming the first bad sampling parameter. Called once per request
    (generate, choose), not per token: bad values otherwise fail deep in numpy or, worse, quietly
    (a negative temperature was greedy, top_p=0 still sampled, -1 penalties flipped logits' signs)."""
    check_arg("temperature", temperature, numbers.Real, "a finite number >= 0 (0: greedy)", lambda v: v >= 0)
    check_arg("top_k", top_k, numbers.Integral, "an int >= 0 (0: no top-k)", lambda v: v >= 0)
    check_arg("top_p", top_p, numbers.Real, "a number in (0, 1]", lambda v: 0 < v <= 1)
    check_arg("repetition_penalty", repetition_penalty, numbers.Real, "a finite number > 0 (1: none)", lambda v: v > 0)
    if seed is not None and not isinstance(seed, np.random.Generator):
        check_arg("seed", seed, numbers.Integral, "None, an int >= 0 or a numpy Generator", lambda v: v >= 0)


def apply_repetition_penalty(logits: np.ndarray, seen, penalty: float) -> np.ndarray:
    """The CTRL / transformers rule: positive logits of seen tokens divided, negative multiplied."""
    if penalty == 1.0 or not len(seen):
        return logits
    out = logits.copy()
    idx = np.unique(np.asarray(seen, dtype=np.int64))
    v = out[idx]
    out[idx] = np.where(v > 0, v / penalty, v * penalty)
    return out


def choose(logits: np.ndarray, *, temperature=0.0, top_k=0, top_p=1.0, rng=None, seen=(), repetition_penalty=1.0):
    """One token id from a [V] logits row; the parameters are checked (check_sampling)."""
    check_sampling(temperature, top_k, top_p, repetition_penalty)
    logits = np.asarray(logits, np.float64)
    if logits.ndim != 1 or logits.size == 0:
        raise ShapeError(f"logits must be one non-empty row [V], got shape {list(logits.shape)}")
    ids = np.asarray(seen)
    if ids.ndim != 1 or ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= logits.size):
        raise ValueError(f"seen must be a list of token ids in [0, {logits.size}), got {seen!r}")
    return pick(logits, temperature, top_k, top_p, rng, ids, repetition_penalty)


def pick(logits, temperature, top_k, top_p, rng, seen, repetition_penalty) -> int:
    """choose() without the checks, for generate's per-token loop (it checks once per request)."""
    logits = apply_repetition_penalty(np.asarray(logits, np.float64), seen, repetition_penalty)
    if temperature == 0:
        return int(np.argmax(logits))
    logits = np.minimum(logits, _MAX)       # +inf (a positive logit / a tiny penalty): the largest float instead
    top = logits.max()
    if not np.isfinite(top):                # every logit -inf, or NaNs: nothing to weigh, argmax as greedy does
        return int(np.argmax(logits))
    z = (logits - top) / temperature        # shifted first: a tiny temperature gives -inf, never inf - inf
    if top_k and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, top_p)) + 1]
        mask = np.zeros_like(p, bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    rng = rng or np.random.default_rng()
    return int(rng.choice(p.size, p=p))


def log_softmax(x: np.ndarray, axis=-1) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
