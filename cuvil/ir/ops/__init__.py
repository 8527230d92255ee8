"""The op registry: every op is declared once, with its attribute schema, type inference
and a numpy reference implementation (the oracle for tests, folding and verification).
registry.py holds the table; one module per op family declares into it, imported here once."""
from __future__ import annotations

from . import bitwise, control, detection, elementwise, fused, linalg, llm, movement, nn, reduce  # noqa: F401  (populate the registry)
from .control import REGIONS  # noqa: F401
from .registry import REGISTRY, REQUIRED, OpDef, check_attrs, declare, infer_types, register  # noqa: F401
