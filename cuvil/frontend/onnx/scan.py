"""Scan (opset 9 and later, and opset 8's batched form).

A scan over a length known at compile time, at most MAX_UNROLL steps, is inlined step by step. A
longer one, or one over a symbolic dim (a length known only at run time), becomes the IR's
while_loop: the states carried, step t's slices of the scan inputs gathered at t (or at length-1-t
when reversed), and each scan output written at its row of a buffer as long as the scan (carried
too), moved to its output axis after the loop. Scan-8 runs that per batch entry; its sequence_lens
may only restate the full length (per-entry lengths are refused)."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D

from .helpers import Unsupported, is_sym, norm_axis, rank_of, shape_of
from .model import MAX_UNROLL
from .registry import handler
from .regions import stack, take_slice, while_region, write_row, zero_rows
from .subgraphs import inline_subgraph


@handler("Scan")
def _scan(c):
    body, m = c.attr("body"), c.attr("num_scan_inputs")
    ins = [c.inp(i) for i in range(len(c.node.input))]
    if c.opset < 9:
        return _scan8(c, body, m, ins)
    n = len(ins) - m
    n_out = len(body.output) - n
    states, xs = ins[:n], ins[n:]
    in_axes = [norm_axis(a, rank_of(x)) for a, x in zip(c.attr("scan_input_axes") or [0] * m, xs)]
    return _scan_steps(c, body, states, xs, in_axes, c.attr("scan_input_directions") or [0] * m,
                       c.attr("scan_output_axes") or [0] * n_out, c.attr("scan_output_directions") or [0] * n_out)


def _scan8(c, body, m, ins):
    """Scan-8: inputs (sequence_lens, states [B, ...], scans [B, T, ...]); each batch entry is scanned
    along its axis 0, the results stacked back along the batch."""
    lens, rest = ins[0], ins[1:]
    n = len(rest) - m
    n_out = len(body.output) - n
    B, T = shape_of(rest[0])[0], shape_of(rest[n])[1]
    if not isinstance(B, int):
        raise Unsupported("Scan-8 over a symbolic batch size")
    if B * (T if isinstance(T, int) else 1) > MAX_UNROLL:
        raise Unsupported(f"Scan-8 over {B} batch entries of {T} steps (more than {MAX_UNROLL} in all)")
    if lens is not None and not (isinstance(lens, np.ndarray) and not is_sym(lens) and (np.asarray(lens) == T).all()):
        raise Unsupported("Scan-8 with per-entry sequence lengths (sequence_lens other than the full length)")
    dirs = c.attr("directions") or [0] * m
    per = [_scan_steps(c, body, [take_slice(c, s, 0, b) for s in rest[:n]], [take_slice(c, x, 0, b) for x in rest[n:]],
                       [0] * m, dirs, [0] * n_out, [0] * n_out) for b in range(B)]
    return [stack(c, [p[k] for p in per], 0) for k in range(n + n_out)]


def _scan_steps(c, body, states, xs, in_axes, in_dirs, out_axes, out_dirs):
    """The final states, then each scan output stacked along its axis."""
    T = shape_of(xs[0])[in_axes[0]]
    if not all(D.dims_equal(shape_of(x)[a], T) for x, a in zip(xs, in_axes)):
        raise Unsupported(f"scan inputs of different lengths: {[shape_of(x)[a] for x, a in zip(xs, in_axes)]}")
    n = len(states)
    if isinstance(T, int) and T <= MAX_UNROLL:
        return _unrolled(c, body, states, xs, T, in_axes, in_dirs, out_axes, out_dirs)
    out = _region(c, body, states, xs, T, in_axes, in_dirs, out_dirs)
    for k, axis in enumerate(out_axes):
        y = out[n + k]
        axis = norm_axis(axis, y.type.rank)
        if axis:
            perm = list(range(1, y.type.rank))
            perm.insert(axis, 0)
            out[n + k] = c.op("transpose", [y], perm=perm)
    return out


def _unrolled(c, body, states, xs, T, in_axes, in_dirs, out_axes, out_dirs):
    n, names, ys = len(states), [i.name for i in body.input], []
    for t in range(T):
        env = dict(zip(names[:n], states))
        for k, x in enumerate(xs):
            env[names[n + k]] = take_slice(c, x, in_axes[k], T - 1 - t if in_dirs[k] else t)
        outs = inline_subgraph(c, body, env)
        if any(o is None for o in outs):
            raise Unsupported("a Scan body output that is not a tensor (a sequence or optional)")
        states = outs[:n]
        ys.append(outs[n:])
    res = list(states)
    for k in range(len(out_axes)):
        seq = [y[k] for y in ys]
        res.append(stack(c, seq[::-1] if out_dirs[k] else seq, out_axes[k]))
    return res


def _region(c, body, states, xs, T, in_axes, in_dirs, out_dirs):
    """The scan as a while_loop over t < T; its scan outputs stacked along axis 0."""
    n, names, outer = len(states), [i.name for i in body.input], c.g
    length = c.op("full", [], shape=[], value=T, dtype="int64") if not isinstance(T, int) else c.val(np.array(T, np.int64))
    start = [c.val(np.array(0, np.int64)), c.val(np.array(True))] + [c.val(s) for s in states]

    def step(own, carry):
        t = own[0]
        back = c.op("sub", [c.op("sub", [length, np.array(1, np.int64)]), t])
        env = dict(zip(names[:n], own[2:]))
        for k, x in enumerate(xs):
            env[names[n + k]] = take_slice(c, x, in_axes[k], back if in_dirs[k] else t)
        outs = inline_subgraph(c, body, env)
        if any(o is None for o in outs):
            raise Unsupported("a Scan body output that is not a tensor (a sequence or optional)")
        rows = []
        for k, y in enumerate(outs[n:]):
            buf = carry(zero_rows(outer, T, y))
            rows.append(write_row(c, buf, back if out_dirs[k] else t, y))
        return [np.array(True)] + outs[:n] + rows

    return while_region(c, start, length, step)[2:]
