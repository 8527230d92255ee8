"""The passes in their order, for a backend that describes what it lowers (passes/backend.py):

    fusion_level 0:  cleanup -> legalize (-> quantize -> cleanup)
    fusion_level 1+: cleanup -> fold -> simplify -> cleanup -> fold -> cleanup -> legalize -> fuse
                     (-> quantize -> cleanup, for a precision other than fp32)
                     (-> pad_channels at fp32 -> layout, where the convs run channel-blocked; -> squeeze_excite after
                     it at fp32; -> link_int8 after it at int8,
                     link_bf16 at bf16 where the target multiplies in bf16)
                     -> batch_map (a batched CNN's per-image prefix as one region, after the regions'
                     own passes)

then plan_memory (memplan) on the result. quantize comes after fusion: a linear layer's bias and
activation are fused first and kept in its quantized form. The LLM path builds its quantized graph
directly (llm/lower.py). Layout comes after fusion: a conv's fused residual has to be
read in the conv's layout (passes/layout.py). Under the tests (CUVIL_VERIFY_PASSES set, tests/conftest.py)
Graph.verify() runs after every pass."""
from __future__ import annotations

import os

from ..errors import UnsupportedOpError
from ..ir.graph import regions
from . import batch_map, cleanup, fold, fuse, squeeze_excite, legalize, memplan, pad_channels, quantize, simplify
from . import layout as layout_pass
from ..ir.ops.movement import layout_block


def optimize(graph, fusion_level=2, *, backend, layout="nchw", precision="fp32", int8_convs=0, calibration=None,
             calibration_method="minmax", bf16_direct_outputs=(0, 0), bf16_convs=False, verify=None, log=None):
    """backend: passes/backend.py's Backend; layout: the layout pass's target layout, a blocked
    "nchw<B>c" to run it (driver.conv_layout picks it per target); precision: quantize.py's (int8_convs: what the target's integer
    convs are, 0 none, 1 AVX2's, 2 VNNI's; calibration: input sets, each a list of arrays, over which int8 convs
    take their input ranges by calibration_method; bf16_direct_outputs: quantize.run's; bf16_convs: whether the
    target multiplies in bf16, so that bf16 convs pass bf16 maps, quantize.link_bf16_convs); verify: Graph.verify() after every pass (default: when
    CUVIL_VERIFY_PASSES is set to anything but 0); log(name, graph) after every pass."""
    if verify is None:
        verify = os.environ.get("CUVIL_VERIFY_PASSES", "0") not in ("", "0")
    passes = {
        "cleanup": cleanup.run,
        "fold": fold.run,
        "simplify": simplify.run,
        "legalize": lambda g: legalize.run(g, backend),
        "fuse": lambda g: fuse.run(g, fusion_level, backend),
        "layout": lambda g: layout_pass.run(g, layout),
        "pad_channels": lambda g: pad_channels.run(g, layout_block(layout)),
        "squeeze_excite": squeeze_excite.run,
        "quantize": lambda g: quantize.run(g, precision, int8_convs, calibration, calibration_method,
                                           bf16_direct_outputs),
        "link_int8": lambda g: quantize.link_int8_convs(g, backend),
        "link_bf16": lambda g: quantize.link_bf16_convs(g, backend),
        "batch_map": batch_map.run,
    }
    order = ["cleanup", "legalize"] if fusion_level == 0 else \
        ["cleanup", "fold", "simplify", "cleanup", "fold", "cleanup", "legalize", "fuse"]
    if precision != "fp32":
        order += ["quantize", "cleanup"]
    if fusion_level > 0 and layout != "nchw":
        if precision == "fp32":          # the quantized paths keep their maps' channels as they are
            order.append("pad_channels")
        order.append("layout")
        if precision == "fp32":
            order.append("squeeze_excite")
        if precision == "int8" and int8_convs:
            order.append("link_int8")
        if precision == "bf16" and bf16_convs:
            order.append("link_bf16")
    def apply(name, graph):
        graph = passes[name](graph)
        if verify:
            graph.verify()
        if log:
            log(name, graph)
        return graph

    for name in order:
        graph = apply(name, graph)
    for n in graph.nodes:          # control flow: each region is a graph of its own, kept in NCHW
        for k, sub in regions(n):
            n.attrs[k] = optimize(sub, fusion_level, backend=backend, precision=precision, int8_convs=int8_convs,
                                  bf16_direct_outputs=bf16_direct_outputs, bf16_convs=bf16_convs, verify=verify,
                                  log=log)
    if fusion_level > 0:           # last: its body is the optimized prefix, not a region to optimize again
        graph = apply("batch_map", graph)
    return graph


def _unsupported(graph, backend) -> list:
    """What the backend cannot lower, in the graph and in the regions its nodes hold."""
    bad = backend.unsupported(graph)
    for n in graph.nodes:
        for _, sub in regions(n):
            bad += _unsupported(sub, backend)
    return bad


def plan_memory(graph, backend) -> memplan.MemoryPlan:
    """The last pass: every intermediate's place in the arena, and every node's scratch memory as the
    backend sizes it. The graph must be one the backend lowers whole (else UnsupportedOpError)."""
    bad = _unsupported(graph, backend)
    if bad:
        raise UnsupportedOpError(bad)
    return memplan.plan(graph, backend.scratch_bytes)
