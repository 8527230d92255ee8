"""Where run time goes: per-node timers of a profiling build, summed by op, and a Chrome trace
(chrome://tracing or Perfetto) of one run."""
from __future__ import annotations

import fnmatch
import json
from collections import defaultdict


def profile(compiled, *inputs, runs=10):
    """Run a model compiled with profile=True; returns [(op, total ms per run, share, count)] by op
    (most expensive first) and the per-node list [(label, ms per run)]."""
    module = getattr(compiled, "module", compiled)
    module.profile_counters()                     # reset
    for _ in range(runs):
        module.run(*inputs)
    nodes = [(label, ns / runs / 1e6) for label, ns in module.profile_counters()]
    by_op = defaultdict(lambda: [0.0, 0])
    for label, ms in nodes:
        op = label.split(":", 1)[1]
        by_op[op][0] += ms
        by_op[op][1] += 1
    total = sum(ms for _, ms in nodes) or 1.0
    table = sorted(((op, ms, ms / total, n) for op, (ms, n) in by_op.items()), key=lambda r: -r[1])
    return table, nodes


def format_table(table):
    lines = [f"{'op':<18} {'ms/run':>9} {'share':>7} {'nodes':>6}"]
    lines += [f"{op:<18} {ms:9.3f} {100 * share:6.1f}% {n:6d}" for op, ms, share, n in table]
    lines.append(f"{'total':<18} {sum(r[1] for r in table):9.3f}")
    return "\n".join(lines)


def chrome_trace(nodes, path):
    """Nodes laid end to end as one run (Chrome trace event format, microseconds)."""
    events, t = [], 0.0
    for label, ms in nodes:
        idx, op = label.split(":", 1)
        events.append({"name": op, "cat": "node", "ph": "X", "ts": t * 1000, "dur": ms * 1000, "pid": 0, "tid": 0,
                       "args": {"node": int(idx)}})
        t += ms
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)
    return path


def export_chrome_trace(compiled, *inputs, trace_file="cuvil_trace.json", include_ops=True, exclude_kernels=None,
                        runs=10):
    """Run `compiled` (a model compiled with profile=True) `runs` times on `inputs` and write one run's
    per-node times as a Chrome trace to `trace_file`. include_ops: True for every node, False for
    one event for the whole run, or op names to keep (e.g. {"conv", "matmul_fused"}); exclude_kernels:
    op names or glob patterns to leave out (e.g. ["relayout*"]). Returns the path."""
    _, nodes = profile(compiled, *inputs, runs=runs)
    if include_ops is False:
        nodes = [(f"0:run ({len(nodes)} nodes)", sum(ms for _, ms in nodes))]
    elif include_ops is not True:
        keep = _names(include_ops, "include_ops")
        nodes = [(label, ms) for label, ms in nodes if label.split(":", 1)[1] in keep]
    if exclude_kernels:
        drop = _names(exclude_kernels, "exclude_kernels")
        nodes = [(label, ms) for label, ms in nodes
                 if not any(fnmatch.fnmatchcase(label.split(":", 1)[1], pat) for pat in drop)]
    return chrome_trace(nodes, trace_file)


def _names(value, what):
    names = [value] if isinstance(value, str) else value
    try:
        names = set(names)
    except TypeError:
        raise TypeError(f"{what} must be True/False or a collection of op names, got {type(value).__name__}") from None
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what} must hold op names (strings)")
    return names
