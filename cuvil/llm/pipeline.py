"""A Hugging Face `pipeline("text-generation")`-shaped wrapper of a compiled LLM, so code written for
transformers' pipeline runs on cuvil: `pipe(text)` -> [{"generated_text": ...}], a list of texts ->
one such list per text; max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
return_full_text, stop (cuvil's) and seed as keywords."""
from __future__ import annotations

from ..errors import CuvilError


class TextGenerationPipeline:
    task = "text-generation"

    def __init__(self, llm):
        if llm.tokenizer is None:
            raise CuvilError(f"{llm.path} has no tokenizer.json: a text-generation pipeline takes and gives text")
        self.llm = llm
        self.tokenizer = llm.tokenizer

    def __call__(self, text_inputs, *, max_new_tokens=64, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                 repetition_penalty=1.0, return_full_text=True, stop=None, seed=None):
        if isinstance(text_inputs, str):
            return self._one(text_inputs, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
                             return_full_text, stop, seed)
        if not isinstance(text_inputs, (list, tuple)) or not all(isinstance(t, str) for t in text_inputs):
            raise TypeError(f"text_inputs must be a string or a list of strings, got {type(text_inputs).__name__}")
        return [self._one(t, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
                          return_full_text, stop, seed) for t in text_inputs]

    def _one(self, text, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
             return_full_text, stop, seed):
        new = self.llm.generate(text, max_new_tokens, temperature=temperature if do_sample else 0.0, top_k=top_k,
                                top_p=top_p, repetition_penalty=repetition_penalty, stop=stop, seed=seed)
        return [{"generated_text": text + new if return_full_text else new}]


def pipeline(task="text-generation", model=None, **load_options):
    """`pipeline("text-generation", model=llm_or_artifact_path)`, or `pipeline(llm)`."""
    from .model import LLM
    if not isinstance(task, str):               # pipeline(llm)
        task, model = "text-generation", task
    if task != "text-generation":
        raise ValueError(f"cuvil.llm.pipeline supports the text-generation task, not {task!r}")
    if model is None:
        raise TypeError("pipeline() needs model= (a cuvil LLM or the path of a saved one)")
    return TextGenerationPipeline(model if isinstance(model, LLM) else LLM(model, **load_options))
