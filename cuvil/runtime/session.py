"""ONNX-Runtime-style sessions over compiled artifacts.

    sess = cuvil.InferenceSession("model.cuvil")       # a saved artifact: needs only numpy
    sess = cuvil.InferenceSession("model.onnx")        # compiles through the cache first
    outs = sess.run(None, {"x": arr})                  # output_names None = all, in order

Loading an artifact imports nothing but numpy (runtime/module.py); an .onnx path imports the
compiler lazily."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CuvilError, ShapeError
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


def _arg(spec, name=None):
    shape = None if spec["shape"] is None else [d if isinstance(d, int) else str(d) for d in spec["shape"]]
    return NodeArg(name or spec["name"], shape, ORT_TYPES.get(spec["dtype"], f"tensor({spec['dtype']})"))


class InferenceSession:
    """ONNX Runtime's session surface over a cuvil artifact (or an ONNX file compiled on the spot)."""

    def __init__(self, path_or_artifact, sess_options=None, providers=None, *, num_threads=None, **compile_options):
        self._special = None         # set for ONNX models whose inputs decide shapes (cuvil/specialize.py)
        self._module = self._open(path_or_artifact, num_threads, compile_options)
        if self._special is not None:
            ins, outs = self._special.declared()
            self._inputs = [_arg(s) for s in ins]
            self._outputs = [_arg(s) for s in outs]
        else:
            m = self._module.manifest
            out_names = m.get("output_names") or [o["name"] for o in m["outputs"]]
            self._inputs = [_arg(s) for s in m["inputs"]]
            self._outputs = [_arg(s, n) for s, n in zip(m["outputs"], out_names)]
        self._out_index = {o.name: i for i, o in enumerate(self._outputs)}

    def _open(self, src, num_threads, compile_options):
        if isinstance(src, Module):
            if num_threads:
                src.set_num_threads(num_threads)
            return src
        if hasattr(src, "module") and isinstance(getattr(src, "module"), Module):   # a CompiledModel
            if num_threads:
                src.module.set_num_threads(num_threads)
            return src.module
        is_onnx = isinstance(src, (bytes, bytearray)) or type(src).__name__ == "ModelProto" or (
            isinstance(src, (str, Path)) and str(src).endswith(".onnx"))
        if is_onnx:
            from ..api import compile as _compile      # the compiler, only for ONNX sources
            from ..errors import InputValuesNeededError
            try:
                cm = _compile(src, (), num_threads=num_threads, **compile_options)
            except InputValuesNeededError as e:
                from ..specialize import Specialized
                self._special = Specialized(src, e.names, num_threads, compile_options)
                return None
            return cm.module
        if compile_options:
            raise CuvilError(f"compile options {sorted(compile_options)} only apply to ONNX sources, "
                             "not to a compiled artifact")
        return Module(src, num_threads=num_threads)

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
        if self._special is not None:
            module = self._special.module(input_feed)
            arrays = [input_feed[s["name"]] for s in module.manifest["inputs"]]
        else:
            module = self._module
            arrays = [input_feed[n] for n in names]
        outs = module.run(*arrays)
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
        if self._special is not None:
            self._special.num_threads = n
            for mod in self._special.loaded.values():
                mod.set_num_threads(n)
        else:
            self._module.set_num_threads(n)

    @property
    def module(self) -> Module:
        """The loaded artifact (for a value-specialized model: the one used last)."""
        if self._special is not None:
            if not self._special.loaded:
                raise CuvilError("this session compiles on its first run (its inputs decide shapes)")
            return next(reversed(self._special.loaded.values()))
        return self._module

    @property
    def specialized_inputs(self) -> list:
        """Inputs whose values decide shapes: one artifact is compiled per distinct value ([] if none)."""
        return list(self._special.names) if self._special is not None else []

    def __repr__(self):
        if self._special is not None:
            return (f"<cuvil.InferenceSession specialized on {self._special.names}, "
                    f"{self._special.compiles} artifact(s) compiled>")
        return f"<cuvil.InferenceSession {self._module.path}>"


__all__ = ["InferenceSession", "NodeArg", "np"]
