"""cuvil.InferenceSession: the runtime's session (runtime/session.py) over a compiled artifact, or
over an ONNX model (a path, bytes or a ModelProto) compiled through the compile cache first.

    sess = cuvil.InferenceSession("model.cuvil")       # a saved artifact: needs only numpy
    sess = cuvil.InferenceSession("model.onnx")        # compiles through the cache first
    outs = sess.run(None, {"x": arr})                  # output_names None = all, in order

Loading an artifact imports nothing of the compiler; an ONNX source imports it when it is opened.

Value specialization: some ONNX graphs take a Reshape's target shape, Slice's starts or Pad's pads
as graph inputs. An ahead-of-time artifact needs those values at compile time, so for such models
the session compiles one artifact per distinct value of the shape-deciding inputs, on first use,
through the compile cache (as torch.compile recompiles when a guard fails). The compiled code still
does all the work; only the choice of artifact looks at the values."""
from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .errors import CuvilError, InputValuesNeededError, ShapeError
from .options import check_device, value_key
from .runtime import session as runtime_session

MAX_SPECIALIZATIONS = 16     # loaded artifacts kept per session; older ones are unloaded (the disk cache keeps them)


def _is_onnx(src) -> bool:
    return isinstance(src, (bytes, bytearray)) or type(src).__name__ == "ModelProto" or (
        isinstance(src, (str, Path)) and str(src).endswith(".onnx"))


class InferenceSession(runtime_session.InferenceSession):
    """ONNX Runtime's session surface over a cuvil artifact, or an ONNX model compiled on the spot
    (compile options apply to ONNX sources only)."""

    def __init__(self, path_or_artifact=None, sess_options=None, providers=None, *, model=None, device=None,
                 num_threads=None, **compile_options):
        """model= is another spelling of the first argument; device= must be the CPU (or None)."""
        self._special = None         # set for ONNX models whose inputs decide shapes (Specialized)
        if (path_or_artifact is None) == (model is None):
            raise CuvilError("InferenceSession takes one model: an artifact path, a CompiledModel or an ONNX model "
                             "(positionally or as model=)")
        path_or_artifact = model if model is not None else path_or_artifact
        check_device(device)
        if "torch" in sys.modules and isinstance(path_or_artifact, sys.modules["torch"].nn.Module):
            raise CuvilError("InferenceSession runs compiled models: compile the torch module first, "
                             "sess = cuvil.InferenceSession(cuvil.compile(module, example_inputs))")
        if not _is_onnx(path_or_artifact):
            if compile_options:
                raise CuvilError(f"compile options {sorted(compile_options)} only apply to ONNX sources, "
                                 "not to a compiled artifact")
            super().__init__(path_or_artifact, sess_options, providers, num_threads=num_threads)
            return
        from .api import compile as _compile      # the compiler, only for ONNX sources
        try:
            cm = _compile(path_or_artifact, (), num_threads=num_threads, **compile_options)
        except InputValuesNeededError as e:
            self._special = Specialized(path_or_artifact, e.names, num_threads, compile_options)
            self._module = None
            ins, outs = self._special.declared()
            self._declare([runtime_session.node_arg(s) for s in ins], [runtime_session.node_arg(s) for s in outs])
            return
        super().__init__(cm.module, sess_options, providers)

    def _select(self, input_feed):
        if self._special is None:
            return super()._select(input_feed)
        module = self._special.module(input_feed)
        return module, [input_feed[s["name"]] for s in module.manifest["inputs"]]

    def set_num_threads(self, n: int):
        if self._special is None:
            return super().set_num_threads(n)
        self._special.num_threads = n
        for mod in self._special.loaded.values():
            mod.set_num_threads(n)

    @property
    def module(self):
        """The loaded artifact (for a value-specialized model: the one used last)."""
        if self._special is None:
            return self._module
        if not self._special.loaded:
            raise CuvilError("this session compiles on its first run (its inputs decide shapes)")
        return next(reversed(self._special.loaded.values()))

    @property
    def specialized_inputs(self) -> list:
        """Inputs whose values decide shapes: one artifact is compiled per distinct value ([] if none)."""
        return list(self._special.names) if self._special is not None else []

    def __repr__(self):
        if self._special is None:
            return super().__repr__()
        return (f"<cuvil.InferenceSession specialized on {self._special.names}, "
                f"{self._special.compiles} artifact(s) compiled>")


class Specialized:
    """An ONNX model plus the names of its shape-deciding inputs; .module(feed) -> Module."""

    def __init__(self, model, names, num_threads, compile_options):
        from .frontend import onnx as onnx_frontend
        self.model = onnx_frontend.load_model(model)
        self.names = list(names)
        self.num_threads = num_threads
        self.compile_options = dict(compile_options)
        self.loaded = OrderedDict()          # value key -> Module
        self.compiles = 0

    def key(self, feed):
        return tuple((n, value_key(feed[n])) for n in self.names)

    def module(self, feed):
        missing = [n for n in self.names if n not in feed]
        if missing:
            raise ShapeError(f"missing input(s) {missing}")
        k = self.key(feed)
        mod = self.loaded.get(k)
        if mod is not None:
            self.loaded.move_to_end(k)
            return mod
        from .api import compile as _compile
        while True:
            consts = {n: feed[n] if feed[n] is None or isinstance(feed[n], (list, tuple)) else np.asarray(feed[n])
                      for n in self.names}
            try:
                cm = _compile(self.model, (), num_threads=self.num_threads, constant_inputs=consts,
                              **self.compile_options)
                break
            except InputValuesNeededError as e:   # fixing one input exposed another (a Slice after a Reshape)
                new = [n for n in e.names if n not in self.names]
                if not new:
                    raise
                self.names += new
                if any(n not in feed for n in new):
                    raise ShapeError(f"missing input(s) {[n for n in new if n not in feed]}") from None
                k = self.key(feed)
        self.compiles += 1
        self.loaded[k] = cm.module
        while len(self.loaded) > MAX_SPECIALIZATIONS:
            self.loaded.popitem(last=False)
        return cm.module

    def declared(self):
        """(inputs, outputs) as the ONNX graph declares them: [{name, shape, dtype}]."""
        from .frontend.onnx import ONNX_DTYPES
        g = self.model.graph
        inits = {t.name for t in g.initializer}

        def spec(vi, tp=None, kind=None):
            tp = tp or vi.type
            for k, field in (("seq", "sequence_type"), ("optional", "optional_type")):
                if tp.HasField(field):
                    return spec(vi, getattr(tp, field).elem_type, kind or k)
            tt = tp.tensor_type
            shape = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
                     if tt.HasField("shape") and not kind else None)
            return {"name": vi.name, "shape": shape, "dtype": ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type)),
                    **({"kind": kind} if kind else {})}
        return [spec(vi) for vi in g.input if vi.name not in inits], [spec(vi) for vi in g.output]
