"""Public entry points of the ONNX frontend.

to_graph (model -> IR Graph), specialize (the graph with its shape-deciding inputs fixed to given
values), shape_deciding_inputs, example_inputs (random inputs of the declared types) and
reference_outputs (the source model run by onnxruntime, else by onnx's reference evaluator)."""
from __future__ import annotations

import numpy as np

from ...errors import GraphError, InputValuesNeededError, ShapeError, UnsupportedOpError
from .converter import Converter
from .model import DEFAULT_MAX_DIM, DTYPE_NAMES, ONNX_DTYPES, load_model


def to_graph(model, dynamic_shapes=None, default_max_dim=DEFAULT_MAX_DIM, constant_inputs=None,
             integer_kernels=False):
    """ONNX model (path, bytes or ModelProto) -> IR Graph. Inputs named in constant_inputs are fixed
    to the given values (they are not inputs of the graph). integer_kernels (precision="int8"):
    quantize_dynamic's MatMulInteger becomes a matmul the quantize pass puts on the integer kernels
    (quantization.py), not its exact emulation in int32."""
    m = _inlined(load_model(model))
    conv = Converter(m, dynamic_shapes, default_max_dim, constant_inputs, integer_kernels)
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
            fixed.update((n, feed[n] if feed[n] is None or isinstance(feed[n], (list, tuple)) else np.asarray(feed[n]))
                         for n in new)


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
