"""ONNX frontend: ModelProto (or a path / bytes) -> cuvil IR, op by op.

- Initializers become constants; external data is read relative to the model's directory.
- `dim_param` dims become symbolic dims (bounds from `dynamic_shapes={input: {axis: (name, lo, hi)}}`,
  else [1, DEFAULT_MAX_DIM]).
- Values known at compile time (initializers, Constant nodes, Shape of a typed tensor, and everything
  computed from them) are evaluated here, as numpy arrays; shape vectors may hold symbolic dims
  (numpy object arrays of ints and sympy expressions). So Shape->Gather->Concat->Reshape chains give
  Reshape/Expand/Slice/... static or symbolic attributes.
- Ops with no direct mapping but an ONNX function body (schema functions, model-local functions)
  are expanded into their body.
- Every op that cannot be mapped is collected, and all are reported at once in one
  UnsupportedOpError with the node name and opset.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import sympy

from ..errors import CuvilError, GraphError, InputValuesNeededError, ShapeError, UnsupportedOpError
from ..ir import dims as D
from ..ir.graph import DTYPES, Graph, TensorType, Value

DEFAULT_MAX_DIM = 4096
MAX_TENSOR_BYTES = 1 << 34          # a declared tensor above 16 GiB is treated as hostile
MAX_KNOWN_ELEMS = 1 << 12           # compile-time-known tensors up to this size are kept as numpy
MAX_FOLD_BYTES = 1 << 28
MAX_NODES = 1 << 20

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


class Unsupported(Exception):
    """Raised by a handler: this node (in this configuration) cannot be mapped."""


class NeedsConstant(Unsupported):
    """A shape-determining input is only known at run time."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise CuvilError("compiling ONNX models needs the onnx package: pip install onnx") from None
    return onnx


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------
def load_model(model):
    """A path, bytes or ModelProto -> ModelProto (external data loaded), with clear errors."""
    onnx = _onnx()
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
    onnx = _onnx()
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


def _ident(name, prefix="x_"):
    """An ONNX name as a plain ASCII identifier (value and dim names are model text, untrusted)."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", str(name or ""))
    if not s or s[0].isdigit():
        s = prefix + s
    return s[:60]


def _safe_name(name, used):
    s = _ident(name)
    base, k = s, 1
    while s in used:
        s = f"{base}_{k}"
        k += 1
    used.add(s)
    return s


def _tensor_to_numpy(t, what):
    onnx = _onnx()
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
    return _contig(a.astype(ONNX_DTYPES[t.data_type], copy=False))


# ------------------------------------------------------------------------------------------------
# compile-time-known values
# ------------------------------------------------------------------------------------------------
def _contig(a):
    a = np.asarray(a)
    return np.ascontiguousarray(a) if a.ndim else a.copy()   # ascontiguousarray makes 0-d arrays 1-d


def _is_sym(a):
    return isinstance(a, np.ndarray) and a.dtype == object


def _known_dtype(a):
    return "int64" if _is_sym(a) else str(a.dtype)


def _dim(x):
    if isinstance(x, (int, np.integer)):
        return int(x)
    return D.as_dim(x)


def _sym_array(vals, shape=None):
    out = np.empty(len(vals), dtype=object)
    for i, v in enumerate(vals):
        out[i] = _dim(v)
    out = out.reshape(shape if shape is not None else (len(vals),))
    return _maybe_int(out)


def _maybe_int(a):
    """An object array whose entries are all ints becomes int64."""
    if _is_sym(a) and all(isinstance(x, (int, np.integer)) for x in a.ravel()):
        return a.astype(np.int64)
    return a


def _ints(a):
    return [int(x) for x in np.asarray(a).ravel()]


# ------------------------------------------------------------------------------------------------
# the converter
# ------------------------------------------------------------------------------------------------
class Converter:
    def __init__(self, model, dynamic_shapes=None, default_max_dim=DEFAULT_MAX_DIM, constant_inputs=None):
        self.model = model
        self.constant_inputs = dict(constant_inputs or {})   # graph input name -> value fixed at compile time
        self.g = Graph()
        self.env = {}                   # onnx name -> Value | np.ndarray | None (optional absent)
        self.poison = set()
        self.unsupported = []           # (op, loc)
        self.need_const = set()         # graph inputs that had to be compile-time constants
        self.dynamic_shapes = dynamic_shapes or {}
        self.default_max_dim = default_max_dim
        self.used_names = set()
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        if "ai.onnx" in self.opsets:
            self.opsets.setdefault("", self.opsets["ai.onnx"])
        self.graph_inputs = set()
        self._uid = 0
        self.node = None
        self.opset = self.opsets.get("", 1)

    # ---- values -------------------------------------------------------------------------------
    def val(self, x) -> Value:
        if isinstance(x, Value):
            return x
        if isinstance(x, np.ndarray):
            x = _maybe_int(x)
            if _is_sym(x):
                raise Unsupported("a symbolic shape value is used as tensor data")
            return self.g.const(x)
        raise Unsupported(f"cannot use {type(x).__name__} as a tensor")

    def inp(self, i):
        ins = self.node.input
        if i >= len(ins) or not ins[i]:
            return None
        return self.env[ins[i]]

    def known(self, i, what=None):
        """Input i as a compile-time numpy array; raises if only known at run time."""
        x = self.inp(i)
        if x is None or isinstance(x, np.ndarray):
            return x
        name = self.node.input[i]
        if name in self.graph_inputs:
            self.need_const.add(name)
        else:
            self.need_const.update(self._input_ancestors(x))
        raise NeedsConstant(f"input {i} ({what or name}) must be a compile-time constant")

    def _input_ancestors(self, v):
        """ONNX names of the graph inputs a run-time value is computed from."""
        names = {id(x): n for x, n in zip(self.g.inputs, self.g.input_names)}
        seen, stack, out = set(), [v], set()
        while stack:
            x = stack.pop()
            if x is None or id(x) in seen:
                continue
            seen.add(id(x))
            if id(x) in names:
                out.add(names[id(x)])
            elif x.producer is not None:
                stack += list(x.producer.inputs)
        return out

    def attr(self, name, default=None):
        for a in self.node.attribute:
            if a.name == name:
                return _attr_value(a)
        return default

    def op(self, op, inputs, **attrs):
        return self.g.add(op, [self.val(i) if i is not None else None for i in inputs], attrs,
                          loc=self.loc)

    @property
    def loc(self):
        n = self.node
        return f"node {n.name!r} ({n.op_type}, opset {self.opset})" if n is not None else None

    def scalar(self, v, dtype):
        return self.g.const(np.array(v, dtype=dtype))

    def cast(self, x, dtype):
        if isinstance(x, np.ndarray) and not _is_sym(x):
            return x.astype(dtype)
        return x if dtype_of(x) == dtype else self.op("cast", [x], to=dtype)

    def reshape(self, x, shape):
        shape = tuple(_dim(d) for d in shape)
        if isinstance(x, np.ndarray):
            return x.reshape(tuple(int(d) for d in shape)) if all(isinstance(d, int) for d in shape) \
                else self.op("reshape", [x], shape=shape)
        if len(shape) == x.type.rank and all(D.dims_equal(a, b) for a, b in zip(shape, x.shape)):
            return x
        return self.op("reshape", [x], shape=shape)

    # ---- driver -------------------------------------------------------------------------------
    def convert(self):
        m, g = self.model, self.model.graph
        if not m.opset_import:
            self.opsets[""] = 1
        for d, v in self.opsets.items():
            if d in ("", "ai.onnx") and v < 1:
                raise GraphError(f"invalid opset version {v}")
        inits = {}
        for t in g.initializer:
            if not t.name:
                raise GraphError("an initializer has no name")
            inits[t.name] = _tensor_to_numpy(t, f"initializer {t.name!r}")
        for t in g.sparse_initializer:
            raise UnsupportedOpError([("sparse initializer", t.values.name)])
        for name, a in inits.items():
            self.env[name] = a
        for vi in g.input:
            if vi.name in inits:
                continue
            if not vi.name:
                raise GraphError("a graph input has no name")
            if vi.name in self.env:
                raise GraphError(f"graph input {vi.name!r} is declared twice")
            if vi.name in self.constant_inputs:
                self.env[vi.name] = self._constant_input(vi)
                continue
            v = self._input_value(vi)
            self.env[vi.name] = v
            self.graph_inputs.add(vi.name)
            self.g.inputs.append(v)
            self.g.input_names.append(vi.name)
        if len(g.node) > MAX_NODES:
            raise GraphError(f"graph has {len(g.node)} nodes; cuvil refuses more than {MAX_NODES}")
        unknown = sorted(set(self.constant_inputs) - {vi.name for vi in g.input} - set(inits))
        if unknown:
            raise ShapeError(f"constant_inputs names {unknown}, which are not inputs of the model "
                             f"(inputs: {[vi.name for vi in g.input if vi.name not in inits]})")
        self.run_nodes(_toposort(g.node, set(self.env)), self.opsets)
        if self.unsupported:
            if self.need_const:
                raise InputValuesNeededError(self.unsupported, self.need_const)
            raise UnsupportedOpError(self.unsupported)
        if not g.output:
            raise GraphError("the graph has no outputs")
        for o in g.output:
            if o.name not in self.env:
                raise GraphError(f"graph output {o.name!r} is never produced")
            x = self.env[o.name]
            if x is None:
                raise GraphError(f"graph output {o.name!r} is an absent optional value")
            if o.type.HasField("sequence_type") or o.type.HasField("optional_type") or o.type.HasField("map_type"):
                raise UnsupportedOpError([("non-tensor graph output", f"output {o.name!r}")])
            self.g.outputs.append(self.val(x))
            self.g.output_names.append(o.name)
        return self.g

    def _constant_input(self, vi):
        """A graph input whose value is fixed at compile time: checked against its declared type."""
        a = np.asarray(self.constant_inputs[vi.name])
        tt = vi.type.tensor_type
        want = ONNX_DTYPES.get(tt.elem_type)
        if want is None or a.dtype != np.dtype(want):
            raise ShapeError(f"constant input {vi.name!r}: dtype {a.dtype}, expected {want}")
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if len(dims) != a.ndim or any(d is not None and d != s for d, s in zip(dims, a.shape)):
                raise ShapeError(f"constant input {vi.name!r}: shape {list(a.shape)}, expected "
                                 f"{['?' if d is None else d for d in dims]}")
        return a.copy()

    def _input_value(self, vi):
        t = vi.type
        if not t.HasField("tensor_type"):
            raise UnsupportedOpError([("non-tensor graph input", f"input {vi.name!r}")])
        et = t.tensor_type.elem_type
        if et not in ONNX_DTYPES:
            raise UnsupportedOpError([(f"dtype {DTYPE_NAMES.get(et, et)}", f"input {vi.name!r}")])
        if not t.tensor_type.HasField("shape"):
            raise ShapeError(f"graph input {vi.name!r} has no shape; cuvil needs its rank")
        spec = self.dynamic_shapes.get(vi.name, {}) if isinstance(self.dynamic_shapes, dict) else {}
        shape = []
        for axis, d in enumerate(t.tensor_type.shape.dim):
            if axis in spec:
                name, lo, hi = spec[axis]
                sname = _ident(name, "d_")
                self.g.symbols[sname] = (int(lo), int(hi))
                shape.append(D.Sym(sname))
            elif d.HasField("dim_value"):
                if d.dim_value < 0:
                    raise ShapeError(f"graph input {vi.name!r}: negative dim {d.dim_value}")
                shape.append(int(d.dim_value))
            else:
                name = d.dim_param or f"{vi.name}_dim{axis}"
                sname = _ident(name, "d_")
                self.g.symbols.setdefault(sname, (1, self.default_max_dim))
                shape.append(D.Sym(sname))
        v = Value(TensorType(tuple(shape), ONNX_DTYPES[et]), name=_safe_name(vi.name, self.used_names))
        bound = D.numel([D.upper_bound(d, self.g.symbols) for d in shape]) * v.type.itemsize
        if bound > MAX_TENSOR_BYTES:
            raise ShapeError(f"graph input {vi.name!r}: declared shape {list(shape)} is absurdly large")
        return v

    def run_nodes(self, nodes, opsets):
        saved = self.opsets
        self.opsets = opsets
        try:
            for node in nodes:
                self._run_node(node)
        finally:
            self.opsets = saved

    def _run_node(self, node):
        domain = node.domain if node.domain != "ai.onnx" else ""
        opset = self.opsets.get(domain)
        self.node, self.opset = node, opset or 0
        ins = [i for i in node.input if i]
        for i in ins:
            if i not in self.env:
                raise GraphError(f"node {node.name!r} ({node.op_type}) reads {i!r}, which nothing produces")
        if any(i in self.poison for i in ins):
            if not self.can_handle(node, domain):
                self.unsupported.append((f"{node.op_type} (opset {opset})", self.loc))
            self._poison(node)
            return
        try:
            outs = self.dispatch(node, domain, opset)
        except Unsupported as e:
            self.node, self.opset = node, opset or 0
            self.unsupported.append((f"{node.op_type} (opset {opset}): {e}" if str(e) else
                                     f"{node.op_type} (opset {opset})", self.loc))
            self._poison(node)
            return
        except (ShapeError, GraphError) as e:
            self.node, self.opset = node, opset or 0
            raise type(e)(f"{self.loc}: {e}") from None
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError,
                NotImplementedError, AttributeError) as e:
            self.node, self.opset = node, opset or 0
            raise GraphError(f"{self.loc}: cannot convert ({type(e).__name__}: {e})") from None
        if outs is None:
            return      # expanded into a function body: outputs already bound
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        missing = [k for k, name in enumerate(node.output) if name and (k >= len(outs) or outs[k] is None)]
        if missing:
            self.unsupported.append((f"{node.op_type} (opset {opset}): output {missing[0]}", self.loc))
            self._poison(node)
            return
        outs = [np.asarray(x) if isinstance(x, (np.generic, bool, int, float)) else x for x in outs]
        for k, name in enumerate(node.output):
            if not name:
                continue
            if name in self.env and name not in self.poison:
                raise GraphError(f"{self.loc}: value {name!r} is produced twice")
            x = outs[k]
            if isinstance(x, np.ndarray) and not _is_sym(x) and x.nbytes > MAX_TENSOR_BYTES:
                raise ShapeError(f"{self.loc}: output is absurdly large")
            if isinstance(x, Value):
                bound = D.numel([D.upper_bound(d, self.g.symbols) for d in x.shape]) * x.type.itemsize
                if bound > MAX_TENSOR_BYTES:
                    raise ShapeError(f"{self.loc}: output {x.type} is absurdly large")
            self.env[name] = x

    def _poison(self, node):
        for o in node.output:
            if o:
                self.poison.add(o)
                self.env[o] = None

    def can_handle(self, node, domain):
        if domain == "":
            return node.op_type in HANDLERS or _schema_function(node.op_type, self.opsets.get("", 1)) is not None
        return (node.domain, node.op_type) in self.functions or f"{node.domain}:{node.op_type}" in HANDLERS or (
            domain in self.opsets and _schema_function(node.op_type, self.opsets[domain], domain=domain) is not None)

    def dispatch(self, node, domain, opset):
        if domain != "" and f"{node.domain}:{node.op_type}" in HANDLERS and opset is not None:
            return HANDLERS[f"{node.domain}:{node.op_type}"](self)      # ops of other domains: "domain:Op"
        if domain != "":
            f = self.functions.get((node.domain, node.op_type))
            if f is None and opset is not None:
                f = self.function_body(node, opset)           # a schema function of another domain
            if f is None:
                raise Unsupported(f"domain {node.domain!r} is not supported" if opset is None else "")
            return self.expand(node, f)
        if opset is None:
            raise Unsupported("no opset import for the default domain")
        ins = [self.env[i] if i else None for i in node.input]
        if ins and all(x is None or isinstance(x, np.ndarray) for x in ins) and any(
                isinstance(x, np.ndarray) for x in ins) and node.op_type not in NO_FOLD:
            r = self.fold(node, ins)
            if r is not None:
                return r
        elif not ins and node.op_type in FOLD_NO_INPUT:
            r = self.fold(node, ins)
            if r is not None:
                return r
        h = HANDLERS.get(node.op_type)
        if h is not None:
            try:
                return h(self)
            except NeedsConstant:
                raise
            except Unsupported:
                body = self.function_body(node, opset)
                if body is None:
                    raise
                return self.expand(node, body)
        body = self.function_body(node, opset)
        if body is None:
            raise Unsupported("")
        return self.expand(node, body)

    # ---- compile-time evaluation ------------------------------------------------------------
    def fold(self, node, ins):
        """All inputs known: evaluate now (symbolic shape arithmetic here, the rest through onnx's
        reference evaluator). Returns None when folding is not possible."""
        if any(_is_sym(x) for x in ins if x is not None):
            f = SYM_FOLD.get(node.op_type)
            if f is None:
                return None
            try:
                r = f(self, [x for x in ins])
            except Unsupported:
                return None
            return r
        total = sum(x.nbytes for x in ins if x is not None)
        if total > MAX_FOLD_BYTES:
            return None
        if node.op_type in SYM_FOLD and node.op_type not in SYM_ONLY:
            try:
                r = SYM_FOLD[node.op_type](self, ins)
                if r is not None:
                    return r
            except Unsupported:
                pass
        return self.ref_eval(node, ins)

    def ref_eval(self, node, ins):
        onnx = _onnx()
        from onnx import helper
        try:
            from onnx.reference import ReferenceEvaluator
        except ImportError:
            return None
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        names = [f"i{k}" if n else "" for k, n in enumerate(node.input)]
        n2 = helper.make_node(node.op_type, names, [f"o{k}" for k in range(len(node.output))],
                              domain=node.domain)
        n2.attribute.extend(node.attribute)
        inputs = [helper.make_tensor_value_info(nm, IR_TO_ONNX[str(x.dtype)], x.shape)
                  for nm, x in zip(names, ins) if nm and x is not None]
        outs = [helper.make_tensor_value_info(f"o{k}", 0, None) for k in range(len(node.output))]
        model = helper.make_model(helper.make_graph([n2], "fold", inputs, outs),
                                  opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        try:
            import warnings
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                sess = ReferenceEvaluator(model)
                res = sess.run(None, {nm: x for nm, x in zip(names, ins) if nm and x is not None})
        except Exception:  # noqa: BLE001 - fall back to mapping the node
            return None
        out = []
        for r in res:
            if not isinstance(r, np.ndarray) or str(r.dtype) not in IR_TO_ONNX:
                return None
            if r.nbytes > MAX_FOLD_BYTES:
                return None
            out.append(_contig(r))
        if any(r.size > MAX_KNOWN_ELEMS for r in out) and node.op_type in ("ConstantOfShape", "Expand", "Tile"):
            return None
        return out

    # ---- function expansion -------------------------------------------------------------------
    def function_body(self, node, opset):
        return _schema_function(node.op_type, opset, node=node, types=self._input_types(node),
                                domain=node.domain if node.domain != "ai.onnx" else "")

    def _input_types(self, node):
        from onnx import helper
        types = []
        for i in node.input:
            x = self.env.get(i) if i else None
            if x is None:
                types.append(helper.make_tensor_type_proto(0, None))
                continue
            dt = dtype_of(x)
            shape = [d if isinstance(d, int) else None for d in shape_of(x)]
            types.append(helper.make_tensor_type_proto(IR_TO_ONNX[dt], shape))
        return types

    def expand(self, node, f):
        """Run the body of FunctionProto f in place of node."""
        onnx = _onnx()
        self._uid += 1
        pre = f"__f{self._uid}_"
        rename = {}
        for formal, actual in zip(f.input, node.input):
            rename[formal] = actual
        for formal in list(f.input)[len(node.input):]:
            rename[formal] = ""
        for formal, actual in zip(f.output, node.output):
            rename[formal] = actual
        attrs = {a.name: a for a in node.attribute}
        defaults = {a.name: a for a in getattr(f, "attribute_proto", [])}
        nodes = []
        for fn in f.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(fn)
            del n2.input[:]
            del n2.output[:]
            n2.input.extend([rename.get(i, pre + i) if i else "" for i in fn.input])
            n2.output.extend([rename.get(o, pre + o) if o else "" for o in fn.output])
            n2.name = f"{node.name}/{fn.name or fn.op_type}"
            del n2.attribute[:]
            for a in fn.attribute:
                if a.ref_attr_name:
                    src = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name) or \
                        _schema_default(node.op_type, self.opset, a.ref_attr_name)
                    if src is None:
                        continue
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(src)
                    a2.name = a.name
                    n2.attribute.append(a2)
                elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(a)
                    for sub in ([a2.g] if a2.HasField("g") else list(a2.graphs)):
                        _rename_outer_refs(sub, lambda i: rename.get(i, pre + i))
                    n2.attribute.append(a2)
                else:
                    n2.attribute.append(a)
            nodes.append(n2)
        opsets = dict(self.opsets)
        for o in f.opset_import:
            opsets[o.domain or ""] = o.version
        for formal in f.output:
            if rename.get(formal) and rename[formal] in self.env:
                raise GraphError(f"{self.loc}: value {rename[formal]!r} is produced twice")
        outer_node = node
        self.run_nodes(nodes, opsets)
        self.node = outer_node
        for formal, actual in zip(f.output, node.output):
            if actual and actual not in self.env:
                raise Unsupported(f"function body of {node.op_type} does not produce {formal}")
        return None


def _rename_outer_refs(g, fn, local=None):
    """Rewrite, in place, the names subgraph g reads from enclosing scopes."""
    local = set(local or ()) | {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(o for o in n.output if o)
    for n in g.node:
        ins = [(i if (not i or i in local) else fn(i)) for i in n.input]
        del n.input[:]
        n.input.extend(ins)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else list(a.graphs)):
                _rename_outer_refs(sub, fn, local)
    outs = [o for o in g.output]
    for o in outs:
        if o.name not in local:
            o.name = fn(o.name)


def inline_subgraph(c, g, bindings):
    """Run the nodes of subgraph g in place (outer names stay visible); returns its outputs."""
    onnx = _onnx()
    c._uid += 1
    pre = f"__g{c._uid}_"
    rename = {}
    for formal, val in bindings.items():
        rename[formal] = pre + formal
        c.env[pre + formal] = val
    for t in g.initializer:
        rename[t.name] = pre + t.name
        c.env[pre + t.name] = _tensor_to_numpy(t, f"initializer {t.name!r}")
    for n in g.node:
        for o in n.output:
            if o:
                rename[o] = pre + o
    nodes = []
    for n in g.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        del n2.input[:]
        del n2.output[:]
        n2.input.extend([rename.get(i, i) if i else "" for i in n.input])
        n2.output.extend([rename[o] if o else "" for o in n.output])
        for a in n2.attribute:
            for sub in ([a.g] if a.HasField("g") else list(a.graphs)):
                _rename_outer_refs(sub, lambda i: rename.get(i, i))
        nodes.append(n2)
    outer = c.node
    c.run_nodes(_toposort(nodes, set(c.env)), c.opsets)
    c.node = outer
    return [c.env.get(rename.get(o.name, o.name)) for o in g.output]


def _attr_value(a):
    onnx = _onnx()
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


_SCHEMA_CACHE = {}


def _schema_default(op_type, opset, name):
    """The default value (an AttributeProto) of an attribute of a standard op, or None."""
    onnx = _onnx()
    try:
        a = onnx.defs.get_schema(op_type, opset, "").attributes.get(name)
    except Exception:  # noqa: BLE001
        return None
    if a is None or not a.default_value.name and a.default_value.type == 0:
        return None
    return a.default_value


def _schema_function(op_type, opset, node=None, types=None, domain=""):
    onnx = _onnx()
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - SchemaError: unknown op or version
        return None
    if schema.has_function:
        key = (domain, op_type, schema.since_version)
        if key not in _SCHEMA_CACHE:
            f = None
            try:
                f = onnx.FunctionProto()
                f.ParseFromString(schema.get_function_with_opset_version(opset)
                                  if hasattr(schema, "get_function_with_opset_version") else b"")
                if not f.node:
                    f = schema.function_body
            except Exception:  # noqa: BLE001
                f = schema.function_body
            _SCHEMA_CACHE[key] = f
        return _SCHEMA_CACHE[key]
    if schema.has_context_dependent_function:
        if node is None:
            return True
        try:
            body = schema.get_context_dependent_function(node.SerializeToString(),
                                                         [t.SerializeToString() for t in types])
        except Exception:  # noqa: BLE001
            return None
        f = onnx.FunctionProto()
        f.ParseFromString(body)
        return f if f.node else None
    return None


def _toposort(nodes, available):
    """Nodes in an order where every input is defined first; cycles are an error."""
    produced = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced.setdefault(o, idx)
    order, state = [], [0] * len(nodes)
    import sys
    for start in range(len(nodes)):
        if state[start]:
            continue
        stack = [(start, 0)]
        state[start] = 1
        while stack:
            idx, k = stack.pop()
            ins = [i for i in nodes[idx].input if i]
            ins += _subgraph_reads(nodes[idx])
            while k < len(ins):
                dep = produced.get(ins[k])
                k += 1
                if dep is None or ins[k - 1] in available:
                    continue
                if state[dep] == 1:
                    raise GraphError(f"the graph has a cycle through node {nodes[dep].name!r} ({nodes[dep].op_type})")
                if state[dep] == 0:
                    stack.append((idx, k))
                    stack.append((dep, 0))
                    state[dep] = 1
                    break
            else:
                state[idx] = 2
                order.append(nodes[idx])
    del sys
    return order


def _subgraph_reads(node):
    out = []
    for a in node.attribute:
        gs = [a.g] if a.HasField("g") else list(a.graphs)
        for g in gs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                out += [i for i in n.input if i and i not in local]
    return out


# ------------------------------------------------------------------------------------------------
# shape/type helpers
# ------------------------------------------------------------------------------------------------
def shape_of(x):
    return tuple(x.shape)


def dtype_of(x):
    return x.dtype if isinstance(x, Value) else _known_dtype(x)


def rank_of(x):
    return len(shape_of(x))


def _norm_axis(a, r):
    if not -r <= a < max(r, 1):
        raise ShapeError(f"axis {a} out of range for rank {r}")
    return a % r if r else 0


def _onnx_pads(pads, nsp):
    if not pads:
        return [(0, 0)] * nsp
    if len(pads) != 2 * nsp:
        raise ShapeError(f"pads {pads} do not fit {nsp} spatial dims")
    return [(int(pads[i]), int(pads[i + nsp])) for i in range(nsp)]


def _auto_pad(c, in_sp, kernel, strides, dilations):
    ap = c.attr("auto_pad", "NOTSET")
    if ap in ("NOTSET", ""):
        return _onnx_pads(c.attr("pads"), len(kernel))
    if ap == "VALID":
        return [(0, 0)] * len(kernel)
    out = []
    for n, k, s, d in zip(in_sp, kernel, strides, dilations):
        if not isinstance(n, int):
            raise Unsupported("auto_pad SAME over a symbolic dim")
        o = -(-n // s)
        total = max((o - 1) * s + (k - 1) * d + 1 - n, 0)
        small = total // 2
        out.append((small, total - small) if ap == "SAME_UPPER" else (total - small, small))
    return out


HANDLERS = {}
SYM_FOLD = {}
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
           "If", "Loop", "Scan"}
MAX_UNROLL = 1024
FOLD_NO_INPUT = {"Constant"}
SYM_ONLY = {"Shape", "Size", "Add", "Sub", "Mul", "Div", "Cast", "Equal", "Max", "Min", "Where", "ConstantOfShape",
            "Expand"}


def handler(*names):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco


def symfold(*names):
    def deco(fn):
        for n in names:
            SYM_FOLD[n] = fn
        return fn
    return deco


from . import onnx_ops  # noqa: E402,F401  (registers HANDLERS and SYM_FOLD)


# ------------------------------------------------------------------------------------------------
# public entry points
# ------------------------------------------------------------------------------------------------
def to_graph(model, dynamic_shapes=None, default_max_dim=DEFAULT_MAX_DIM, constant_inputs=None):
    """ONNX model (path, bytes or ModelProto) -> IR Graph. Inputs named in constant_inputs are fixed
    to the given values (they are not inputs of the graph)."""
    m = _inlined(load_model(model))
    conv = Converter(m, dynamic_shapes, default_max_dim, constant_inputs)
    g = conv.convert()
    g.verify()
    return g


def specialize(model, feed, dynamic_shapes=None, default_max_dim=DEFAULT_MAX_DIM):
    """-> (graph, names): the graph with every shape-deciding input fixed to its value in feed.
    Fixing one input can expose another (a Slice's end computed from a fixed Reshape), so this
    repeats until the model converts; names are the inputs that were fixed."""
    m = _inlined(load_model(model))
    fixed = {}
    while True:
        try:
            return to_graph(m, dynamic_shapes, default_max_dim, fixed), sorted(fixed)
        except InputValuesNeededError as e:
            new = [n for n in e.names if n in feed and n not in fixed]
            if not new:
                raise
            fixed.update((n, np.asarray(feed[n])) for n in new)


def shape_deciding_inputs(model, dynamic_shapes=None):
    """Names of the inputs whose values decide shapes ([] for a model that compiles as it is)."""
    try:
        to_graph(model, dynamic_shapes)
    except InputValuesNeededError as e:
        return e.names
    return []


def _inlined(m):
    if not m.HasField("graph"):
        raise GraphError("the ONNX model has no graph")
    if m.functions:
        try:
            import onnx.inliner
            m = onnx.inliner.inline_local_functions(m)
        except Exception:  # noqa: BLE001 - expansion happens node by node anyway
            pass
    return m


def example_inputs(model, seed=0):
    """Random inputs matching the model's declared input types (symbolic dims take 2)."""
    m = load_model(model)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    out = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dt = ONNX_DTYPES.get(tt.elem_type)
        if dt is None:
            raise UnsupportedOpError([(f"dtype {DTYPE_NAMES.get(tt.elem_type, tt.elem_type)}", f"input {vi.name!r}")])
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        if dt.startswith(("float", "bfloat")):
            a = rng.standard_normal(shape).astype(dt)
        elif dt == "bool":
            a = rng.random(shape) < 0.5
        else:
            a = rng.integers(0, 10, shape).astype(dt)
        out.append(a)
    return out


def reference_outputs(model, args, constant_inputs=None):
    """Outputs of the source model on args (onnxruntime where installed, else onnx's reference
    evaluator) and the flat list of numpy inputs (those not in constant_inputs)."""
    m = load_model(model)
    consts = constant_inputs or {}
    inits = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits and i.name not in consts]
    flat = [np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a) for a in args]
    if not flat and names:
        flat = [a for vi, a in zip([i for i in m.graph.input if i.name not in inits], example_inputs(m))
                if vi.name not in consts]
    if len(flat) != len(names):
        raise ShapeError(f"the model takes {len(names)} inputs ({', '.join(names)}), got {len(flat)}")
    feed = dict(zip(names, flat))
    feed.update((k, np.asarray(v)) for k, v in consts.items())
    try:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in sess.run(None, feed)], flat
    except ImportError:
        pass
    from onnx.reference import ReferenceEvaluator
    return [np.asarray(o) for o in ReferenceEvaluator(m).run(None, feed)], flat
