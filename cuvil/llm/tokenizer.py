"""Tokenization through the Hugging Face `tokenizers` library, streaming text that is correct
across multi-byte characters, and the checkpoint's chat template."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import CuvilError

FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


class Tokenizer:
    def __init__(self, path):
        path = Path(path)
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise CuvilError("text in and out needs the `tokenizers` package: pip install tokenizers") from None
        if not (path / "tokenizer.json").exists():
            raise CuvilError(f"{path} has no tokenizer.json; pass token ids instead of text")
        self.tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = path / "tokenizer_config.json"
        self.config = json.loads(cfg.read_text()) if cfg.exists() else {}

    def _special(self, key):
        v = self.config.get(key)
        return v.get("content") if isinstance(v, dict) else v

    @property
    def add_bos(self):
        return bool(self.config.get("add_bos_token", False))

    def encode(self, text: str, add_special_tokens=True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, text):
        return self.tok.token_to_id(text)

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        tmpl = self.config.get("chat_template")
        if not tmpl:
            raise CuvilError("this checkpoint's tokenizer_config.json has no chat_template")
        import jinja2
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise CuvilError(f"chat template: {msg}")
        env.globals["raise_exception"] = raise_exception
        return env.from_string(tmpl).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=self._special("bos_token") or "",
                                            eos_token=self._special("eos_token") or "")


class StreamDecoder:
    """Turns a growing list of token ids into text pieces; a piece is held back while it ends in
    an incomplete UTF-8 sequence (the tokenizer decodes those to U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""
        piece, self.emitted = text[len(self.emitted):], text
        return piece

    def flush(self) -> str:
        text = self.tok.decode(self.ids)
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece
