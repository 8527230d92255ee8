"""Cuvil: an ahead-of-time inference compiler. `compile` needs the compiler parts;
`load` and `InferenceSession` on a saved artifact need only numpy."""
from .errors import (ArtifactError, CompileError, CuvilError, GraphError, InputValuesNeededError, PrecisionWarning,
                     QuantizationError, ShapeError, UnsupportedOpError, VerificationError)
from .runtime.loader import load
from .session import InferenceSession
from .version import __version__


def __getattr__(name):
    if name == "AsyncInferenceSession":       # imported on first use: asyncio stays out of a plain load
        from .serve.batching import AsyncInferenceSession
        return AsyncInferenceSession
    if name == "profiler":                    # cuvil.profiler.export_chrome_trace(...) without an import
        import importlib
        return importlib.import_module(".profiler", __name__)
    raise AttributeError(f"module 'cuvil' has no attribute {name!r}")


def compile(model, example_inputs=(), **options):  # noqa: A001 - mirrors torch.compile
    from .api import compile as _compile
    return _compile(model, example_inputs, **options)


def compile_model(model, example_inputs=(), **options):
    from .api import compile_model as _compile_model
    return _compile_model(model, example_inputs, **options)


__all__ = ["compile", "compile_model", "load", "InferenceSession", "AsyncInferenceSession", "CuvilError",
           "UnsupportedOpError", "ShapeError", "VerificationError", "CompileError",
           "ArtifactError", "GraphError", "InputValuesNeededError", "PrecisionWarning", "QuantizationError",
           "__version__"]
