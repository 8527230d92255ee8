"""Recurrent-layer op handlers.

RNN, GRU and LSTM unrolled over a static sequence length, forward, reverse or bidirectional, with the
activations (and their alpha / beta) the node names."""
from __future__ import annotations

import numpy as np

from .helpers import Unsupported, dtype_of, shape_of
from .registry import handler


# ---- recurrent layers: RNN, GRU, LSTM unrolled over a static sequence length ----------------------
_RNN_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_RNN_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _rnn_act(c, name, x, alpha, beta):
    name = name.lower()
    if name in ("tanh", "sigmoid", "relu"):
        return c.op(name, [x])
    dt = dtype_of(x)
    if name == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        y = c.op("add", [c.op("mul", [x, c.scalar(a, dt)]), c.scalar(b, dt)])
        return c.op("clip", [y], min=0.0, max=1.0)
    if name == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return c.op("where", [c.op("lt", [x, c.scalar(0, dt)]), c.op("mul", [x, c.scalar(a, dt)]), x])
    if name == "affine":
        return c.op("add", [c.op("mul", [x, c.scalar(alpha, dt)]), c.scalar(beta, dt)])
    if name == "scaledtanh":
        return c.op("mul", [c.op("tanh", [c.op("mul", [x, c.scalar(beta, dt)])]), c.scalar(alpha, dt)])
    raise Unsupported(f"activation {name}")


def _recurrent(kind):
    def h(c):
        x, w, r, b = c.inp(0), c.inp(1), c.inp(2), c.inp(3)
        seq_lens, h0 = c.inp(4), c.inp(5)
        c0 = c.inp(6) if kind == "LSTM" else None
        p = c.inp(7) if kind == "LSTM" else None
        G = _RNN_GATES[kind]
        layout = c.attr("layout", 0)
        direction = c.attr("direction", "forward")
        if isinstance(direction, bytes):
            direction = direction.decode()
        ndir = 2 if direction == "bidirectional" else 1
        H = c.attr("hidden_size") or shape_of(r)[-1]
        clip = c.attr("clip")
        if kind == "LSTM" and c.attr("input_forget", 0):
            raise Unsupported("input_forget=1")
        acts = [a.decode() if isinstance(a, bytes) else a for a in (c.attr("activations") or _RNN_ACTS[kind] * ndir)]
        alphas, betas = c.attr("activation_alpha") or [], c.attr("activation_beta") or []
        if layout:
            x = c.op("transpose", [x], perm=(1, 0, 2))
        S, B, I = shape_of(x)
        if not isinstance(S, int):
            raise Unsupported("symbolic sequence length")
        if seq_lens is not None:
            sl = c.known(4, "sequence_lens")
            if not np.all(np.asarray(sl) == S):
                raise Unsupported("sequence_lens shorter than the sequence")
        dt = dtype_of(x)

        def sl_(v, axis, start, length):
            return c.op("slice", [v], axis=axis, start=start, length=length)

        def add(a, b_):
            return c.op("add", [a, b_])

        def mul(a, b_):
            return c.op("mul", [a, b_])

        ys, hs, cs = [], [], []
        for d in range(ndir):
            reverse = direction == "reverse" or d == 1
            na = len(_RNN_ACTS[kind])
            act = [(acts[d * na + k], alphas[d * na + k] if d * na + k < len(alphas) else None,
                    betas[d * na + k] if d * na + k < len(betas) else None) for k in range(na)]

            def f(k, v):
                if clip is not None:
                    v = c.op("clip", [v], min=-float(clip), max=float(clip))
                return _rnn_act(c, act[k][0], v, act[k][1], act[k][2])
            wd = c.op("transpose", [c.reshape(sl_(w, 0, d, 1), (G * H, I))], perm=(1, 0))
            rd = c.reshape(sl_(r, 0, d, 1), (G * H, H))
            xw = c.op("matmul", [x, wd])                                       # S, B, G*H
            if b is not None:
                bd = c.reshape(sl_(b, 0, d, 1), (2 * G * H,))
                wb, rb = sl_(bd, 0, 0, G * H), sl_(bd, 0, G * H, G * H)
                xw = add(xw, wb) if kind == "GRU" else add(xw, add(wb, rb))
            else:
                rb = None
            rt = c.op("transpose", [rd], perm=(1, 0))
            hp = c.reshape(sl_(h0, 0, d, 1), (B, H)) if h0 is not None else c.op("full", [], shape=(B, H), value=0.0, dtype=dt)
            cp = None
            if kind == "LSTM":
                cp = c.reshape(sl_(c0, 0, d, 1), (B, H)) if c0 is not None else c.op("full", [], shape=(B, H), value=0.0, dtype=dt)
                pd = c.reshape(sl_(p, 0, d, 1), (3 * H,)) if p is not None else None
            outs = [None] * S
            for t in (range(S - 1, -1, -1) if reverse else range(S)):
                xt = c.reshape(sl_(xw, 0, t, 1), (B, G * H))
                if kind == "RNN":
                    hp = f(0, add(xt, c.op("matmul", [hp, rt])))
                elif kind == "LSTM":
                    g = add(xt, c.op("matmul", [hp, rt]))
                    gi, go, gf, gc = (sl_(g, 1, k * H, H) for k in range(4))
                    if pd is not None:
                        gi = add(gi, mul(sl_(pd, 0, 0, H), cp))
                        gf = add(gf, mul(sl_(pd, 0, 2 * H, H), cp))
                    it, ft, ct = f(0, gi), f(0, gf), f(1, gc)
                    cp = add(mul(ft, cp), mul(it, ct))
                    if pd is not None:
                        go = add(go, mul(sl_(pd, 0, H, H), cp))
                    hp = mul(f(0, go), f(2, cp))
                else:   # GRU: z, r, h
                    hr = c.op("matmul", [c.reshape(hp, (B, H)), sl_(rt, 1, 0, 2 * H)])
                    if rb is not None:
                        hr = add(hr, sl_(rb, 0, 0, 2 * H))
                    zr = add(sl_(xt, 1, 0, 2 * H), hr)
                    z, rr = f(0, sl_(zr, 1, 0, H)), f(0, sl_(zr, 1, H, H))
                    rh = sl_(rt, 1, 2 * H, H)
                    if c.attr("linear_before_reset", 0):
                        hh = c.op("matmul", [hp, rh])
                        if rb is not None:
                            hh = add(hh, sl_(rb, 0, 2 * H, H))
                        hh = mul(rr, hh)
                    else:
                        hh = c.op("matmul", [mul(rr, hp), rh])
                        if rb is not None:
                            hh = add(hh, sl_(rb, 0, 2 * H, H))
                    ht = f(1, add(sl_(xt, 1, 2 * H, H), hh))
                    one = c.scalar(1, dt)
                    hp = add(mul(c.op("sub", [one, z]), ht), mul(z, hp))
                outs[t] = c.reshape(hp, (1, 1, B, H))
            ys.append(outs[0] if S == 1 else c.op("concat", outs, axis=0))
            hs.append(c.reshape(hp, (1, B, H)))
            if kind == "LSTM":
                cs.append(c.reshape(cp, (1, B, H)))
        y = ys[0] if ndir == 1 else c.op("concat", ys, axis=1)               # S, D, B, H
        yh = hs[0] if ndir == 1 else c.op("concat", hs, axis=0)
        res = [y, yh]
        if kind == "LSTM":
            res.append(cs[0] if ndir == 1 else c.op("concat", cs, axis=0))
        if layout:
            res = [c.op("transpose", [res[0]], perm=(2, 0, 1, 3))] + [c.op("transpose", [v], perm=(1, 0, 2)) for v in res[1:]]
        return res
    return h


for _k in _RNN_GATES:
    handler(_k)(_recurrent(_k))
