"""Next-token choice from logits: greedy, temperature, top-k, top-p, repetition penalty (numpy)."""
from __future__ import annotations

import numpy as np


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
    """One token id from a [V] logits row."""
    logits = apply_repetition_penalty(np.asarray(logits, np.float64), seen, repetition_penalty)
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    if top_k and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
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
