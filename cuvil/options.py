"""Validation of compile() options: every unknown or invalid value is a ValueError naming the
option and what it accepts."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .target import TARGET_NAMES, resolve_target, vector_floats

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")
# layout="auto" / "blocked": channel-blocked convs (passes/layout.py) in blocks of the target's vector
# width ("nchw16c" on AVX-512, "nchw8c" on AVX2, "nchw4c" on SSE2 / NEON; naming one checks it against
# the target); "nchw" keeps every conv in NCHW
LAYOUT_CHOICES = ("auto", "blocked", "nchw", "nchw4c", "nchw8c", "nchw16c")
SUPPORTED_PRECISIONS = ("fp32", "bf16", "fp16", "int8")      # int4: the LLM path only (cuvil.llm)
# int8 convs' input ranges over calibration_data: "minmax" (every value inside), "percentile" (the 0.01th
# and 99.99th percentiles: a rare outlier clipped rather than stretching the byte grid for the rest)
CALIBRATION_METHODS = ("minmax", "percentile")
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}\Z")


@dataclass(frozen=True)
class Options:
    target: str = "native"
    precision: str = "fp32"
    fusion_level: int = 2
    dynamic_shapes: object = None
    verify: bool = False
    num_threads: int | None = None
    cache_dir: str | None = None
    verbose: bool = False
    layout: str = "auto"           # conv layout: LAYOUT_CHOICES
    profile: bool = False          # per-node timers in the generated code (cuvil.profiler reads them)
    constant_inputs: object = None  # ONNX: {input name: array} fixed at compile time (shape-deciding inputs)
    name: str | None = None        # the C API's prefix: cuvil_<name>_run (default cuvil_run)
    device: str = "cpu"            # where it runs: CPUs only (the targets); anything else is refused
    rtol: float | None = None      # verify=True's tolerances against the source model (None: the
    atol: float | None = None      # precision's default, accuracy.TOLERANCE)
    calibration_data: object = None  # lossy precisions: more inputs to measure the error on (accuracy.py);
                                     # int8: its convs' input ranges too (passes/quantize.calibrate)
    calibration_method: str = "minmax"  # how those ranges are taken: CALIBRATION_METHODS

    def key(self):
        d = asdict(self)
        for k in ("verify", "num_threads", "cache_dir", "verbose", "device", "rtol", "atol",  # same artifact
                  "calibration_data"):
            d.pop(k)
        d["dynamic_shapes"] = repr(self.dynamic_shapes)
        d["constant_inputs"] = _values_digest(self.constant_inputs)
        if self.precision == "int8" and self.calibration_data:      # the int8 convs' ranges come from it
            d["calibration"] = _values_digest({str(i): calibration_leaves(x) for i, x in enumerate(self.calibration_data)})
        return repr(sorted(d.items()))


def value_key(v):
    """A hashable, comparable form of an ONNX input value: an array (dtype, shape, bytes), a list of
    them (a sequence) or None (an empty optional)."""
    if v is None:
        return ("none",)
    if isinstance(v, (list, tuple)):
        return ("sequence",) + tuple(value_key(e) for e in v)
    import numpy as np
    a = np.ascontiguousarray(v)
    return (str(a.dtype), a.shape, a.tobytes())


def _values_digest(values):
    """A short digest of {name: value} (see value_key) for cache keys."""
    if not values:
        return None
    import hashlib
    h = hashlib.sha256()
    for name in sorted(values):
        _digest_into(h, (name, value_key(values[name])))
    return h.hexdigest()[:24]


def _digest_into(h, key):
    """key (value_key's nested tuples of strings, ints and bytes) into hash h, the bytes as they are, not
    through repr (calibration data: megabytes an image)."""
    if isinstance(key, bytes):
        h.update(b"%d:" % len(key))
        h.update(key)
    elif isinstance(key, tuple):
        h.update(b"(")
        for part in key:
            _digest_into(h, part)
        h.update(b")")
    else:
        h.update(repr(key).encode() + b";")


def calibration_leaves(example_inputs) -> list:
    """One calibration_data entry as the artifact's flat inputs, numpy arrays: the leaves of (args, kwargs)
    in the order the compiled model's call flattens them (driver.CompiledModel.__call__)."""
    import numpy as np
    if isinstance(example_inputs, dict):
        args, kwargs = (), example_inputs
    else:
        args, kwargs = (tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)), {}
    import sys
    if "torch" in sys.modules:
        from torch.utils import _pytree
        leaves = _pytree.tree_leaves((args, kwargs))
    else:
        leaves = list(args) + list(kwargs.values())
    return [np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a) for a in leaves]


def make_options(**kw) -> Options:
    allowed = Options.__dataclass_fields__
    for k in kw:
        if k not in allowed:
            raise ValueError(f"unknown option {k!r}; compile() takes {', '.join(allowed)}")
    data = kw.get("calibration_data")
    if data is not None and not isinstance(data, (str, bytes, dict)) and hasattr(data, "__iter__"):
        kw["calibration_data"] = list(data)        # read twice (ranges, then the error): a generator once
    o = Options(**kw)
    if o.target not in TARGET_NAMES:
        raise ValueError(f"option target={o.target!r} is not one of {', '.join(TARGET_NAMES)}")
    if o.precision not in PRECISIONS:
        raise ValueError(f"option precision={o.precision!r} is not one of {', '.join(PRECISIONS)}")
    if o.precision not in SUPPORTED_PRECISIONS:
        raise ValueError(f"option precision={o.precision!r}: general models take {', '.join(SUPPORTED_PRECISIONS)}; "
                         "int4 weights are for language models (cuvil.llm.from_transformers(..., precision='int4'))")
    if not isinstance(o.fusion_level, int) or isinstance(o.fusion_level, bool) or not 0 <= o.fusion_level <= 3:
        raise ValueError(f"option fusion_level={o.fusion_level!r} is not one of 0, 1, 2, 3")
    if o.layout not in LAYOUT_CHOICES:
        raise ValueError(f"option layout={o.layout!r} is not one of {', '.join(LAYOUT_CHOICES)}")
    if o.layout.endswith("c") and int(o.layout[4:-1]) != vector_floats(resolve_target(o.target)):
        width = vector_floats(resolve_target(o.target))
        raise ValueError(f"option layout={o.layout!r} needs vectors of {o.layout[4:-1]} floats; target {o.target!r} has "
                         f"{width}: use layout='blocked' (nchw{width}c here) or 'nchw'")
    if not isinstance(o.verify, bool):
        raise ValueError(f"option verify={o.verify!r} must be True or False")
    if o.num_threads is not None and (not isinstance(o.num_threads, int) or isinstance(o.num_threads, bool)
                                      or o.num_threads < 1):
        raise ValueError(f"option num_threads={o.num_threads!r} must be a positive int or None")
    if o.dynamic_shapes is not None and not isinstance(o.dynamic_shapes, (dict, list, tuple)):
        raise ValueError("option dynamic_shapes must be a dict (input name -> {axis: Dim}) or a tuple per input, "
                         f"got {type(o.dynamic_shapes).__name__}")
    if o.name is not None and not (isinstance(o.name, str) and NAME.match(o.name)):
        raise ValueError(f"option name={o.name!r} must be a C identifier of letters, digits and _ "
                         "(at most 32, starting with a letter): the model's functions become cuvil_<name>_run ...")
    check_device(o.device)
    for k in ("rtol", "atol"):
        v = getattr(o, k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf")):
            raise ValueError(f"option {k}={v!r} must be a finite number >= 0 (verify's tolerance)")
    if o.calibration_data is not None and (isinstance(o.calibration_data, (str, bytes, dict))
                                           or not hasattr(o.calibration_data, "__iter__")):
        raise ValueError("option calibration_data must be an iterable of example inputs (each a tuple of arrays, "
                         f"one array or a dict), got {type(o.calibration_data).__name__}")
    if o.calibration_method not in CALIBRATION_METHODS:
        raise ValueError(f"option calibration_method={o.calibration_method!r} is not one of "
                         f"{', '.join(CALIBRATION_METHODS)}")
    if o.calibration_data is not None and o.precision == "fp32":
        raise ValueError("option calibration_data applies to the lossy precisions (bf16, fp16, int8), not fp32")
    if o.constant_inputs is not None and not (isinstance(o.constant_inputs, dict)
                                               and all(isinstance(k, str) for k in o.constant_inputs)):
        raise ValueError("option constant_inputs must be a dict of ONNX input name -> array, "
                         f"got {type(o.constant_inputs).__name__}")
    return o


def check_device(device) -> None:
    """device="cpu" (or "cpu:0"); cuvil builds for CPUs only, so a GPU or other device is refused
    rather than ignored."""
    if device is None or (isinstance(device, str) and device.lower() in ("cpu", "cpu:0")):
        return
    if type(device).__name__ == "device" and getattr(device, "type", None) == "cpu":     # torch.device("cpu")
        return
    raise ValueError(f"device={device!r}: cuvil compiles for CPUs (target= picks which: "
                     f"{', '.join(TARGET_NAMES)}); GPU devices are not supported. Use device='cpu'")
