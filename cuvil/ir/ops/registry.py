"""The registry itself: OpDef, REGISTRY, declare, attribute checking and type inference. It imports
nothing of the package: each op-family module declares into it, and ops/__init__.py imports them once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import GraphError

REQUIRED = object()


@dataclass
class OpDef:
    name: str
    attrs: dict            # attribute name -> default (REQUIRED when it must be given)
    infer: Callable        # (input types, attrs, input values) -> list[TensorType]
    ref: Callable          # (numpy arrays, attrs) -> numpy array or list of arrays
    kind: str = "other"    # "unary", "binary", "reduce", "movement", ... (for passes and codegen)
    doc: str = ""


REGISTRY: dict[str, OpDef] = {}


def register(name, attrs=None, kind="other", doc=""):
    """Decorator over a pair (infer, ref) given as a class with static methods."""
    def deco(cls):
        if name in REGISTRY:
            raise GraphError(f"op {name} declared twice")
        REGISTRY[name] = OpDef(name, dict(attrs or {}), cls.infer, cls.ref, kind, doc or (cls.__doc__ or ""))
        return cls
    return deco


def declare(opdef: OpDef):
    if opdef.name in REGISTRY:
        raise GraphError(f"op {opdef.name} declared twice")
    REGISTRY[opdef.name] = opdef


def check_attrs(op: str, attrs: dict) -> dict:
    d = REGISTRY[op]
    unknown = set(attrs) - set(d.attrs)
    if unknown:
        raise GraphError(f"op {op}: unknown attribute(s) {sorted(unknown)}; it takes {sorted(d.attrs)}")
    full = {}
    for k, default in d.attrs.items():
        if k in attrs:
            full[k] = attrs[k]
        elif default is REQUIRED:
            raise GraphError(f"op {op}: attribute {k!r} is required")
        else:
            full[k] = default
    return full


def infer_types(op, types, attrs, inputs=None):
    if op not in REGISTRY:
        raise GraphError(f"unknown op {op!r}")
    attrs.update(check_attrs(op, attrs))
    return REGISTRY[op].infer(types, attrs, inputs)
