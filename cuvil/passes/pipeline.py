"""The pass order of DESIGN.md: cleanup -> fold -> simplify -> (quantize, fuse, layout) -> memplan.
fusion_level 0 runs only what correctness needs (dead code removal). Layout comes after fusion here:
a conv's fused residual has to be read in the conv's layout (passes/layout.py)."""
from __future__ import annotations

from . import cleanup, fold, fuse, legalize, simplify
from . import layout as layout_pass

PASSES = {
    "cleanup": cleanup.run,
    "fold": fold.run,
    "simplify": simplify.run,
    "legalize": legalize.run,
    "layout": layout_pass.run,
}


def optimize(graph, fusion_level=2, verify=False, log=None, layout="nchw"):
    """layout: the layout pass's target layout, "nchw16c" to run it (api.py picks it per target)."""
    order = ["cleanup", "legalize"] if fusion_level == 0 else \
        ["cleanup", "fold", "simplify", "cleanup", "fold", "cleanup", "legalize", "fuse"]
    if fusion_level > 0 and layout == layout_pass.BLOCKED:
        order.append("layout")
    for name in order:
        graph = fuse.run(graph, fusion_level) if name == "fuse" else PASSES[name](graph)
        if verify:
            graph.verify()
        if log:
            log(name, graph)
    return graph
