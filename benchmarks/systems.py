"""Each system under test: prepare(model, args, threads) -> (run callable, compile seconds).
Baselines (ONNX Runtime, OpenVINO, torch.compile) are optional; a missing one is reported, not faked."""
from __future__ import annotations

import os
import time

import numpy as np
import torch
from benchmarks.scratch import temp_dir


def eager(model, args, threads):
    torch.set_num_threads(threads)

    def run():
        with torch.no_grad():
            model(*args)
    return run, 0.0


def torch_compile(model, args, threads):
    torch.set_num_threads(threads)
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config
    inductor_config.force_disable_caches = True      # a cold first call, like cuvil's empty cache
    dynamo.reset()
    cm = torch.compile(model)
    t = time.perf_counter()
    with torch.no_grad():
        cm(*args)                                   # the first call compiles
    secs = time.perf_counter() - t

    def run():
        with torch.no_grad():
            cm(*args)
    return run, secs


_ONNX_CACHE = {}


def export_onnx(model, args):
    """(path, seconds) of the model's ONNX export, made once per model object. The cache holds the model
    too: keyed by id() alone, a model built after another was freed could take its id and be handed the
    other's file (the CNN table's ConvNeXt row once timed ONNX Runtime on EfficientNet's export)."""
    key = id(model)
    if key not in _ONNX_CACHE or _ONNX_CACHE[key][0] is not model:
        d = temp_dir("cuvil-bench-onnx-")
        path = os.path.join(d, "model.onnx")
        t = time.perf_counter()
        names = [f"input{i}" for i in range(len(args))]
        with torch.no_grad():
            try:
                torch.onnx.export(model, args, path, input_names=names, dynamo=True, opset_version=18,
                                  external_data=False)
            except Exception:  # noqa: BLE001 - fall back to the TorchScript exporter
                torch.onnx.export(model, args, path, input_names=names, dynamo=False, opset_version=17)
        _ONNX_CACHE[key] = (model, path, time.perf_counter() - t)
    return _ONNX_CACHE[key][1:]


def onnxruntime(model, args, threads):
    import onnxruntime as ort
    path, export_secs = export_onnx(model, args)
    t = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    secs = export_secs + time.perf_counter() - t
    names = [i.name for i in sess.get_inputs()]
    feed = {n: a.numpy() for n, a in zip(names, args)}
    return (lambda: sess.run(None, feed)), secs


def openvino(model, args, threads):
    import openvino as ov
    path, export_secs = export_onnx(model, args)
    t = time.perf_counter()
    core = ov.Core()
    compiled = core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
                                                "PERFORMANCE_HINT": "LATENCY"})
    secs = export_secs + time.perf_counter() - t
    req = compiled.create_infer_request()
    feed = [a.numpy() for a in args]
    return (lambda: req.infer(feed)), secs


WARM_COMPILE = {}


def cuvil_system(model, args, threads):
    import cuvil
    cache = temp_dir("cuvil-bench-cache-")
    t = time.perf_counter()
    cm = cuvil.compile(model, args, num_threads=threads, cache_dir=cache)
    secs = time.perf_counter() - t
    t = time.perf_counter()
    cuvil.compile(model, args, num_threads=threads, cache_dir=cache)      # a cache hit
    WARM_COMPILE[id(model)] = time.perf_counter() - t
    arrays = [a.numpy() for a in args]
    outs = [np.empty(o.shape, o.dtype) for o in cm.run(*arrays)]
    return (lambda: cm.run(*arrays, out=outs)), secs


SYSTEMS = {"eager": eager, "torch.compile": torch_compile, "onnxruntime": onnxruntime, "openvino": openvino,
           "cuvil": cuvil_system}
BASELINES = ("onnxruntime", "openvino", "torch.compile")
