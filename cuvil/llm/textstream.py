"""One sequence's output as its tokens arrive: stop token ids, stop strings (text is released only
where it can no longer become one), a budget of new tokens, and streaming that never splits a UTF-8
character. Shared by LLM.generate and the continuous batcher."""
from __future__ import annotations

from .tokenizer import StreamDecoder


class TextStream:
    def __init__(self, tokenizer, stop_ids, stop_strings, budget, tokens=None):
        self.decoder = StreamDecoder(tokenizer) if tokenizer else None
        self.stop_ids, self.stop_strings = stop_ids, stop_strings
        self.budget = budget
        self.tokens = tokens if tokens is not None else []      # the accepted tokens (no stop token)
        self.text, self.sent = "", 0
        self.finish_reason = None if budget > 0 else "length"

    def push(self, tok) -> list:
        """The pieces a reader may see now (text, or the token ids where there is no tokenizer);
        finish_reason is set once the sequence has ended."""
        if tok in self.stop_ids:
            self.finish_reason = "stop"
            return self._rest()                # what was held back for a stop string that never came
        self.tokens.append(tok)
        if self.decoder is None:
            pieces = [tok]
        else:
            self.text += self.decoder.push(tok)
            hit = min((self.text.index(s) for s in self.stop_strings if s in self.text), default=None)
            if hit is not None:
                self.finish_reason = "stop"
                piece, self.sent = self.text[self.sent:hit], max(hit, self.sent)
                return [piece] if piece else []
            pieces = self._release(len(self.text) - _held_back(self.text, self.stop_strings))
        if len(self.tokens) >= self.budget:
            self.finish_reason = "length"
            if self.decoder is not None:
                self.text += self.decoder.flush()
                pieces += self._rest()
        return pieces

    def _release(self, upto):
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent:upto], upto
        return [piece]

    def _rest(self):
        return self._release(len(self.text)) if self.decoder is not None else []


def _held_back(text, stops):
    """Length of the longest end of `text` that begins some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
