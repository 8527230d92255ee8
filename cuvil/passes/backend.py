"""What the passes know of the code generator they prepare a graph for: handed to them as an
argument, never imported (DESIGN: passes never import codegen). The C backend describes itself in
codegen/c/__init__.py; the driver hands that description to passes.pipeline."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backend:
    ops: frozenset              # the ops it has a lowering for
    supports: Callable          # node -> None when it lowers the node as it stands, else the reason why not
    scratch_bytes: Callable     # (node, dim bounds) -> bytes of scratch memory the node's code needs (memplan)
    # node -> whether it can write the next integer conv's input bytes (an integer conv, or a depthwise
    # conv reading bytes, precision="int8"), and the [hp, wp, ph, pw] of the padded byte image a conv can
    # read from a channel-blocked input (None: it reads no such image), whether a conv can read its
    # residual as such bytes, and whether a max pool can pass bytes through
    int8_conv: Callable = lambda node: False
    int8_input_image: Callable = lambda node: None
    int8_residual: Callable = lambda node: False
    int8_pool: Callable = lambda node: False
    # node -> whether a conv runs on bf16 dot products where the target has them (precision="bf16") and
    # can read its input and residual, and write its output, as bf16 maps (a stem's input is an NCHW map,
    # which no conv that writes bf16 maps produces)
    bf16_conv: Callable = lambda node: False

    def lowers(self, node) -> bool:
        return node.op in self.ops and self.supports(node) is None

    def unsupported(self, graph) -> list:
        """Every node it cannot lower, as (op, location) pairs (the op followed by the reason, where
        the lowering gives one)."""
        bad = []
        for n in graph.nodes:
            if n.op not in self.ops:
                bad.append((n.op, n.loc))
            elif reason := self.supports(n):
                bad.append((f"{n.op} ({reason})", n.loc))
        return bad
