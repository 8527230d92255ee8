"""The one door through which text from a model (node, tensor, dim and file names, docstrings) enters
generated C. Model files are untrusted: a node name holding `*/` would otherwise end a comment and
become code inside cuvil_run. Comments and string literals keep a short list of harmless ASCII
characters and escape everything else; identifiers are never copied from a model, only checked."""
from __future__ import annotations

import re

from ...errors import CompileError

# no '*' or '/' (comment ends, '//'), no '\\' (line splices, escapes), no '?' (trigraphs such as
# '??/'), no '%' (our own escape character), no '"' (string ends); no control characters, no
# non-ASCII (the compiler's input charset is not ours to guess)
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.,:;@#()[]<>{}=+-!&|^~$'")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MAX_TEXT = 200


def _clip(text) -> str:
    """Names are labels, not payloads: long ones are cut (a megabyte doc string stays out of model.c)."""
    text = text if isinstance(text, str) else str(text)
    return text[:MAX_TEXT] + "..." if len(text) > MAX_TEXT else text


def _escape(text, escape, clip=True) -> str:
    out = []
    for ch in (_clip(text) if clip else text):
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(escape(b) for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def comment(text) -> str:
    """`text` as the inside of a /* */ comment: unsafe bytes as %XX, so the name stays readable."""
    return _escape(text, lambda b: f"%{b:02X}")


def string(text, clip=True) -> str:
    """`text` as a C string literal, quotes included: unsafe bytes as 3-digit octal escapes (a hex
    escape would swallow the hex digits that follow it). clip=False keeps all of a long text."""
    return '"' + _escape(text, lambda b: f"\\{b:03o}", clip) + '"'


def format_string(text) -> str:
    """`text` as a printf format literal that prints `text` (the error messages of CUVIL_FAIL):
    as string(), with '%' doubled so a name cannot add conversions."""
    return '"' + _escape(text, lambda b: "%%" if b == 0x25 else f"\\{b:03o}") + '"'


def ident(name) -> str:
    """`name` if it is a plain ASCII C identifier, else CompileError: callers generate identifiers
    (in0, out1, S_batch after the frontend normalised it), so anything else is a bug or an attack."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise CompileError(f"refusing to emit {name!r} as a C identifier (not [A-Za-z_][A-Za-z0-9_]*)")
    return name
