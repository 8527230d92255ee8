"""Value specialization for ONNX models whose inputs decide shapes.

Some ONNX graphs take a Reshape's target shape, Slice's starts or Pad's pads as graph inputs.
An ahead-of-time artifact needs those values at compile time, so for such models the session
compiles one artifact per distinct value of the shape-deciding inputs, on first use, through the
compile cache (as torch.compile recompiles when a guard fails). The compiled code still does all
the work; only the choice of artifact looks at the values."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .errors import ShapeError

MAX_SPECIALIZATIONS = 16     # loaded artifacts kept per session; older ones are unloaded (the disk cache keeps them)


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
        parts = []
        for n in self.names:
            a = np.ascontiguousarray(feed[n])
            parts.append((n, str(a.dtype), a.shape, a.tobytes()))
        return tuple(parts)

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
        from .errors import InputValuesNeededError
        while True:
            consts = {n: np.asarray(feed[n]) for n in self.names}
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

        def spec(vi):
            tt = vi.type.tensor_type
            shape = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
                     if tt.HasField("shape") else None)
            return {"name": vi.name, "shape": shape, "dtype": ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type))}
        return [spec(vi) for vi in g.input if vi.name not in inits], [spec(vi) for vi in g.output]
