"""Mixture-of-experts layers -> IR: the grouped GEMM over tokens sorted by expert, as transformers
calls it (its fallback custom op, which torch.export keeps whole) and as aten has it (_grouped_mm)."""
from __future__ import annotations

from .aten import Unsupported, aten, handles


@handles("transformers::grouped_mm_fallback", aten._grouped_mm.default)
def _grouped_mm(ctx, x, w, offs=None, bias=None, out_dtype=None):
    if offs is None or x.type.rank != 2 or w.type.rank != 3 or bias is not None or out_dtype is not None:
        raise Unsupported("grouped_mm of 2-d rows, 3-d weights and offsets (no bias, no out_dtype) only")
    return ctx.add("grouped_matmul", [x, ctx.tensor(w, x.dtype), offs])
