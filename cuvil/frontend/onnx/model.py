"""The model file: what the converter reads before it walks the graph.

ONNX dtype tables, the size limits applied to an untrusted model, loading a path / bytes / ModelProto
(external data only from the model's own directory), initializer tensors to numpy, attributes to Python
values, and ONNX names made into plain identifiers."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from ...errors import CuvilError, GraphError, ShapeError
from ...ir.graph import DTYPES
from .helpers import Unsupported, contig, require_onnx


DEFAULT_MAX_DIM = 4096
MAX_TENSOR_BYTES = 1 << 34          # a declared tensor above 16 GiB is treated as hostile
MAX_KNOWN_ELEMS = 1 << 12           # compile-time-known tensors up to this size are kept as numpy
MAX_FOLD_BYTES = 1 << 28
MAX_NODES = 1 << 20
MAX_UNROLL = 1024

# ONNX TensorProto.DataType -> IR dtype
ONNX_DTYPES = {1: "float32", 11: "float64", 10: "float16", 7: "int64", 6: "int32", 5: "int16", 3: "int8",
               2: "uint8", 9: "bool", 4: "uint16", 12: "uint32", 13: "uint64"}
ONNX_DTYPES.update({k: v for k, v in {16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
                                      20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
                                      25: "uint2", 26: "int2"}.items() if v in DTYPES})
DTYPE_NAMES = {1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "STRING",
               9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64", 14: "COMPLEX64",
               15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2",
               20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0",
               25: "UINT2", 26: "INT2"}
IR_TO_ONNX = {v: k for k, v in ONNX_DTYPES.items()}
ORT_TYPE = {"float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
            "int64": "tensor(int64)", "int32": "tensor(int32)", "int16": "tensor(int16)", "int8": "tensor(int8)",
            "uint8": "tensor(uint8)", "bool": "tensor(bool)"}


# ---- loading --------------------------------------------------------------------------------------
def load_model(model):
    """A path, bytes or ModelProto -> ModelProto (external data loaded), with clear errors."""
    onnx = require_onnx()
    from google.protobuf.message import DecodeError
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        m = onnx.ModelProto()
        try:
            m.ParseFromString(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as e:
            raise CuvilError(f"not a valid ONNX model (protobuf decode failed: {e})") from None
        _check_no_external(m)
        return m
    path = Path(model)
    if not path.is_file():
        raise CuvilError(f"ONNX model file {path} does not exist")
    try:
        m = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise CuvilError(f"{path} is not a valid ONNX model (protobuf decode failed: {e})") from None
    except Exception as e:  # noqa: BLE001 - protobuf raises several types on garbage
        raise CuvilError(f"{path} is not a valid ONNX model ({type(e).__name__}: {e})") from None
    try:
        from onnx.external_data_helper import load_external_data_for_model
        base = str(path.resolve().parent)
        for t in _all_tensors(m):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                loc = info.get("location", "")
                full = os.path.realpath(os.path.join(base, loc))
                if not loc or os.path.isabs(loc) or not full.startswith(base + os.sep):
                    raise CuvilError(f"initializer {t.name!r}: external data location {loc!r} is outside the "
                                     f"model's directory {base}")
                if not os.path.isfile(full):
                    raise CuvilError(f"initializer {t.name!r}: external data file {loc!r} not found next to {path}")
        load_external_data_for_model(m, base)
    except CuvilError:
        raise
    except Exception as e:  # noqa: BLE001
        raise CuvilError(f"{path}: cannot load external data ({type(e).__name__}: {e})") from None
    return m


def _check_no_external(m):
    onnx = require_onnx()
    for t in _all_tensors(m):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise CuvilError(f"initializer {t.name!r} keeps its data in an external file; pass the model's path "
                             "(not bytes) so the file can be found")


def _all_tensors(m):
    for t in m.graph.initializer:
        yield t
    for n in m.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t


def ident(name, prefix="x_"):
    """An ONNX name as a plain ASCII identifier (value and dim names are model text, untrusted)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", str(name or ""))
    if not s or s[0].isdigit():
        s = prefix + s
    return s[:60]


def safe_name(name, used):
    s = ident(name)
    base, k = s, 1
    while s in used:
        s = f"{base}_{k}"
        k += 1
    used.add(s)
    return s


def tensor_to_numpy(t, what):
    onnx = require_onnx()
    from onnx import numpy_helper
    if t.data_type not in ONNX_DTYPES:
        raise Unsupported(f"{what}: dtype {DTYPE_NAMES.get(t.data_type, t.data_type)}")
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise GraphError(f"{what}: negative dim in {dims}")
    n = math.prod(dims)
    if n * np.dtype(ONNX_DTYPES[t.data_type]).itemsize > MAX_TENSOR_BYTES:
        raise ShapeError(f"{what}: declared shape {dims} is absurdly large")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise CuvilError(f"{what}: external data was not loaded")
    try:
        a = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - truncated or inconsistent raw data
        raise GraphError(f"{what}: tensor data does not match its declared shape {dims} "
                         f"({type(e).__name__}: {e})") from None
    if a.size != n:
        raise GraphError(f"{what}: tensor holds {a.size} values, its shape {dims} needs {n}")
    return contig(a.astype(ONNX_DTYPES[t.data_type], copy=False))


def attr_value(a):
    onnx = require_onnx()
    A = onnx.AttributeProto
    if a.type == A.FLOAT:
        return float(a.f)
    if a.type == A.INT:
        return int(a.i)
    if a.type == A.STRING:
        return a.s.decode("utf-8", "replace")
    if a.type == A.FLOATS:
        return [float(x) for x in a.floats]
    if a.type == A.INTS:
        return [int(x) for x in a.ints]
    if a.type == A.STRINGS:
        return [s.decode("utf-8", "replace") for s in a.strings]
    if a.type == A.TENSOR:
        return a.t
    if a.type == A.GRAPH:
        return a.g
    if a.HasField("f"):
        return float(a.f)
    if a.HasField("i"):
        return int(a.i)
    if a.HasField("s"):
        return a.s.decode("utf-8", "replace")
    if a.HasField("t"):
        return a.t
    if a.floats:
        return [float(x) for x in a.floats]
    if a.ints:
        return [int(x) for x in a.ints]
    return None
