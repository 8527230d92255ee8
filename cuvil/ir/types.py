"""What a value's type is: the dtypes cuvil knows and TensorType(shape, dtype). A leaf of the IR:
the op declarations (ops/) type their outputs with it, and graph.py builds Values on it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GraphError
from . import dims as D

# low-precision storage dtypes (numpy names of ml_dtypes; stored raw in C, computed in float32)
LOWP_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
               "int4", "uint4", "int2", "uint2")
try:
    import ml_dtypes  # noqa: F401  (registers the LOWP_DTYPES names with numpy)
except ImportError:  # pragma: no cover
    LOWP_DTYPES = ()
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "uint16", "uint32",
          "uint64") + LOWP_DTYPES


@dataclass(frozen=True)
class TensorType:
    shape: tuple
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise GraphError(f"unsupported dtype {self.dtype!r}; cuvil supports {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", tuple(D.as_dim(d) for d in self.shape))

    @property
    def rank(self):
        return len(self.shape)

    @property
    def itemsize(self):
        return np.dtype(self.dtype).itemsize

    def __str__(self):
        return f"{self.dtype}[{', '.join(D.fmt(d) for d in self.shape)}]"
