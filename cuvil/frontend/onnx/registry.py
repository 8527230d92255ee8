"""The handler tables and the decorators that fill them.

HANDLERS maps an ONNX op type ("Op", or "domain:Op" for other domains) to its handler and SYM_FOLD to
its folder over symbolic shape vectors; NO_FOLD, FOLD_NO_INPUT and SYM_ONLY are the op-name sets the
converter's dispatch consults. This module imports nothing of the package: op-family modules register
into it and the converter reads it, so neither imports the other. A handler reads its node through the
converter `c` (c.inp(i), c.known(i), c.attr(name)) and returns its outputs: IR Values, or numpy arrays
for values known at compile time."""
from __future__ import annotations


HANDLERS = {}
SYM_FOLD = {}
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
           "If", "Loop", "Scan",
           # sequences and optionals: their handlers build Seq / ABSENT values, which a folded node would not
           "SequenceEmpty", "SequenceConstruct", "SequenceLength", "SequenceAt", "SequenceInsert", "SequenceErase",
           "ConcatFromSequence", "SplitToSequence", "SequenceMap", "Optional", "OptionalHasElement",
           "OptionalGetElement"}
FOLD_NO_INPUT = {"Constant"}
SYM_ONLY = {"Shape", "Size", "Add", "Sub", "Mul", "Div", "Cast", "Equal", "Max", "Min", "Where", "ConstantOfShape",
            "Expand"}


def handler(*names):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn
    return deco


def symfold(*names):
    def deco(fn):
        for n in names:
            SYM_FOLD[n] = fn
        return fn
    return deco
