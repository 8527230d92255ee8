"""The pass order of DESIGN.md: cleanup -> fold -> simplify -> (layout, quantize, fuse) -> memplan.
fusion_level 0 runs only what correctness needs (dead code removal)."""
from __future__ import annotations

from . import cleanup, fold, fuse, legalize, simplify

PASSES = {
    "cleanup": cleanup.run,
    "fold": fold.run,
    "simplify": simplify.run,
    "legalize": legalize.run,
}


def optimize(graph, fusion_level=2, verify=False, log=None):
    order = ["cleanup", "legalize"] if fusion_level == 0 else \
        ["cleanup", "fold", "simplify", "cleanup", "fold", "cleanup", "legalize", "fuse"]
    for name in order:
        graph = fuse.run(graph, fusion_level) if name == "fuse" else PASSES[name](graph)
        if verify:
            graph.verify()
        if log:
            log(name, graph)
    return graph
