"""ONNX-Runtime-style sessions over compiled artifacts.

    sess = cuvil.InferenceSession("model.cuvil")       # a saved artifact: needs only numpy
    outs = sess.run(None, {"x": arr})                  # output_names None = all, in order

Loading an artifact imports nothing but numpy (runtime/module.py). The session that also takes
an ONNX model, compiling it first, stands above the compiler: cuvil/session.py."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .loader import load
from .module import Module

ORT_TYPES = {"float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
             "int64": "tensor(int64)", "int32": "tensor(int32)", "int16": "tensor(int16)", "int8": "tensor(int8)",
             "uint8": "tensor(uint8)", "bool": "tensor(bool)",
             "uint16": "tensor(uint16)", "uint32": "tensor(uint32)", "uint64": "tensor(uint64)"}


@dataclass(frozen=True)
class NodeArg:
    """What ONNX Runtime's get_inputs()/get_outputs() return: name, shape (ints, or strings for
    symbolic dims) and type ('tensor(float)' style)."""
    name: str
    shape: list
    type: str

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape})"


def node_arg(spec, name=None):
    shape = None if spec["shape"] is None else [d if isinstance(d, int) else str(d) for d in spec["shape"]]
    kind = spec.get("kind")           # "seq" / "optional": ONNX Runtime's seq(tensor(float)) style
    t = ORT_TYPES.get(spec["dtype"], f"tensor({spec['dtype']})")
    return NodeArg(name or spec["name"], shape, f"{kind}({t})" if kind else t)


def _layout(m):
    """Where each output the source model returns lies among the library's outputs: (name, index) for
    a tensor, (name, slice) for a sequence (manifest output_sequences: name -> [first, count]), in order."""
    names = m.get("output_names") or [o["name"] for o in m["outputs"]]
    out, i = [], 0
    for first, count, name in sorted((f, c, n) for n, (f, c) in (m.get("output_sequences") or {}).items()):
        out += [(names[k], k) for k in range(i, first)]
        out.append((name, slice(first, first + count)))
        i = first + count
    return out + [(names[k], k) for k in range(i, len(names))]


def visible_outputs(m):
    """The model's outputs as the source declares them (a sequence is one), as NodeArg specs."""
    specs = m["outputs"]
    return [dict(specs[at], name=name) if isinstance(at, int) else
            {"name": name, "shape": None, "kind": "seq",
             "dtype": specs[at.start]["dtype"] if at.stop > at.start else "float32"} for name, at in _layout(m)]


def group_outputs(m, outs):
    """The library's outputs in the source's structure: a sequence output as a list of arrays (a model
    without sequences, nearly every one: as they are, with no work per call)."""
    if not m.get("output_sequences"):
        return outs
    return [outs[at] if isinstance(at, int) else list(outs[at]) for _, at in _layout(m)]


class InferenceSession:
    """ONNX Runtime's session surface over a compiled artifact (a path, a loaded Module or a
    CompiledModel). cuvil.InferenceSession (cuvil/session.py) also takes ONNX models."""

    def __init__(self, path_or_artifact, sess_options=None, providers=None, *, num_threads=None):
        self._module = _open(path_or_artifact, num_threads)
        m = self._module.manifest
        self._declare([node_arg(s) for s in m["inputs"]], [node_arg(s) for s in visible_outputs(m)])

    def _declare(self, inputs, outputs):
        self._inputs, self._outputs = inputs, outputs
        self._out_index = {o.name: i for i, o in enumerate(outputs)}

    def _select(self, input_feed):
        """The module that runs this (checked) feed, and its arrays in the module's input order."""
        return self._module, [input_feed[i.name] for i in self._inputs]

    # ---- ONNX Runtime's API ------------------------------------------------------------------
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_modelmeta(self):
        return self.module.manifest

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def run(self, output_names, input_feed, run_options=None):
        if not isinstance(input_feed, dict):
            raise TypeError(f"input_feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        names = [i.name for i in self._inputs]
        unknown = sorted(set(input_feed) - set(names))
        if unknown:
            raise ShapeError(f"unknown input name(s) {unknown}; the model takes {names}")
        missing = [n for n in names if n not in input_feed]
        if missing:
            raise ShapeError(f"missing input(s) {missing}; the model takes {names}")
        module, arrays = self._select(input_feed)
        outs = group_outputs(module.manifest, module.run(*arrays))
        if output_names is None:
            return outs
        if isinstance(output_names, str):
            raise TypeError("output_names must be a list of names or None")
        res = []
        for n in output_names:
            if n not in self._out_index:
                raise ShapeError(f"unknown output name {n!r}; the model returns {list(self._out_index)}")
            res.append(outs[self._out_index[n]])
        return res

    def set_num_threads(self, n: int):
        self._module.set_num_threads(n)

    @property
    def module(self) -> Module:
        """The loaded artifact."""
        return self._module

    @property
    def specialized_inputs(self) -> list:
        """Inputs whose values decide shapes ([] for an artifact: its shapes are compiled in)."""
        return []

    def __repr__(self):
        return f"<cuvil.InferenceSession {self._module.path}>"


def _open(src, num_threads) -> Module:
    if isinstance(src, Module):
        if num_threads:
            src.set_num_threads(num_threads)
        return src
    if hasattr(src, "module") and isinstance(getattr(src, "module"), Module):   # a CompiledModel
        if num_threads:
            src.module.set_num_threads(num_threads)
        return src.module
    return load(src, num_threads=num_threads)


__all__ = ["InferenceSession", "NodeArg", "np"]
