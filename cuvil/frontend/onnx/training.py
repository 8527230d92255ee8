"""ai.onnx.preview.training optimizer handlers.

Adagrad, Momentum and Adam, one update step each (the step count T must be known at compile time)."""
from __future__ import annotations

import math

import numpy as np

from .helpers import dtype_of
from .registry import handler


# ---- ai.onnx.preview.training optimizers (one update step; the step count T must be known) --------
def _optimizer(kind):
    nstate = {"Adagrad": 1, "Momentum": 1, "Adam": 2}[kind]

    def h(c):
        n = (len(c.node.input) - 2) // (2 + nstate)
        t = float(np.asarray(c.known(1, "T")).ravel()[0])
        outs = [[] for _ in range(1 + nstate)]
        for i in range(n):
            x, g = c.inp(2 + i), c.inp(2 + n + i)
            st = [c.inp(2 + (2 + k) * n + i) for k in range(nstate)]
            dt = dtype_of(x)
            r = c.cast(c.inp(0), dt)

            def k(v):
                return c.scalar(v, dt)

            def op(name, *a):
                return c.op(name, list(a))
            greg = op("add", op("mul", k(c.attr("norm_coefficient", 0.0)), x), g)
            if kind == "Adagrad":
                r_ = op("div", r, k(1 + t * c.attr("decay_factor", 0.0)))
                hn = op("add", st[0], op("mul", greg, greg))
                hs = op("add", op("sqrt", hn), k(c.attr("epsilon", 1e-6)))
                res = [op("sub", x, op("div", op("mul", r_, greg), hs)), hn]
            elif kind == "Momentum":
                alpha, beta = c.attr("alpha"), c.attr("beta")
                mode = c.attr("mode", "standard")
                mode = mode.decode() if isinstance(mode, bytes) else mode
                vn = op("add", op("mul", k(alpha), st[0]), op("mul", k(beta if t > 0 else 1.0), greg))
                step = vn if mode == "standard" else op("add", greg, op("mul", k(alpha), vn))
                res = [op("sub", x, op("mul", r, step)), vn]
            else:
                alpha, beta = c.attr("alpha", 0.9), c.attr("beta", 0.999)
                vn = op("add", op("mul", k(alpha), st[0]), op("mul", k(1 - alpha), greg))
                hn = op("add", op("mul", k(beta), st[1]), op("mul", k(1 - beta), op("mul", greg, greg)))
                hs = op("add", op("sqrt", hn), k(c.attr("epsilon", 1e-6)))
                ra = op("mul", r, k(math.sqrt(1 - beta ** t) / (1 - alpha ** t))) if t > 0 else r
                xn = op("sub", x, op("mul", ra, op("div", vn, hs)))
                res = [op("mul", k(1 - c.attr("norm_coefficient_post", 0.0)), xn), vn, hn]
            for lst, v in zip(outs, res):
                lst.append(v)
        return [v for lst in outs for v in lst]
    return h


for _k in ("Adagrad", "Momentum", "Adam"):
    handler(f"ai.onnx.preview.training:{_k}")(_optimizer(_k))
