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

The package, bottom up: `registry` (the handler tables), `helpers` (what the converter and handlers
share), `model` (dtype tables, limits, loading), `subgraphs` (function bodies, inlined subgraphs, node
order), `converter` (the graph walk) and `entry` (the public functions below); one module per op family
registers its handlers into the registry. This file is the one registration point: it imports the op
families, and no module of the package imports a family module or this file.
"""
from __future__ import annotations

# the op families: importing them fills registry.HANDLERS and registry.SYM_FOLD
from . import (control_flow, conv, data_sized, detection, elementwise, linalg, movement, normalization,  # noqa: F401
               quantization, recurrent, reduce, sampling, scan, sequences, shape, spectral, training)
from .converter import Converter
from .entry import example_inputs, reference_outputs, shape_deciding_inputs, specialize, to_graph
from .helpers import NeedsConstant, Unsupported, dtype_of, rank_of, shape_of
from .model import (DEFAULT_MAX_DIM, DTYPE_NAMES, IR_TO_ONNX, MAX_FOLD_BYTES, MAX_KNOWN_ELEMS, MAX_NODES,
                    MAX_TENSOR_BYTES, MAX_UNROLL, ONNX_DTYPES, ORT_TYPE, load_model)
from .registry import FOLD_NO_INPUT, HANDLERS, NO_FOLD, SYM_FOLD, SYM_ONLY, handler, symfold
from .subgraphs import inline_subgraph

__all__ = [
    "to_graph", "specialize", "shape_deciding_inputs", "example_inputs", "reference_outputs", "load_model",
    "Converter", "Unsupported", "NeedsConstant", "inline_subgraph", "shape_of", "dtype_of", "rank_of",
    "handler", "symfold", "HANDLERS", "SYM_FOLD", "NO_FOLD", "FOLD_NO_INPUT", "SYM_ONLY",
    "ONNX_DTYPES", "DTYPE_NAMES", "IR_TO_ONNX", "ORT_TYPE",
    "DEFAULT_MAX_DIM", "MAX_TENSOR_BYTES", "MAX_KNOWN_ELEMS", "MAX_FOLD_BYTES", "MAX_NODES", "MAX_UNROLL",
]
