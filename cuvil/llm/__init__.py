"""Llama-family language models: `from_transformers` compiles one (compiler side, needs torch and
transformers); `load` runs a saved one (numpy, plus `tokenizers` for text)."""
from .model import LLM


def load(path, num_threads=None) -> LLM:
    return LLM(path, num_threads=num_threads)


def pipeline(task="text-generation", model=None, **load_options):
    from .pipeline import pipeline as _pipeline
    return _pipeline(task, model, **load_options)


def from_transformers(model_or_checkpoint_dir, **kw) -> LLM:
    from .compile import from_transformers as _ft
    return _ft(model_or_checkpoint_dir, **kw)


__all__ = ["LLM", "load", "from_transformers", "pipeline"]
