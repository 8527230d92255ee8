"""Every error cuvil raises on purpose derives from CuvilError."""


class CuvilError(Exception):
    """Base class of cuvil's errors."""


class UnsupportedOpError(CuvilError):
    """The model uses ops cuvil cannot lower; `ops` lists (op, location) pairs, all of them."""

    def __init__(self, ops):
        self.ops = list(ops)
        lines = [f"  {op}  at {loc or '<unknown location>'}" for op, loc in self.ops]
        names = sorted({op for op, _ in self.ops})
        super().__init__(
            f"{len(names)} unsupported op(s): {', '.join(names)}\n" + "\n".join(lines))


class InputValuesNeededError(UnsupportedOpError):
    """Some graph inputs decide shapes (a Reshape's target, Slice starts, ...): an ahead-of-time
    artifact needs their values. `names` lists them; compile with constant_inputs={name: array},
    or run through cuvil.InferenceSession, which specializes on their values at run time."""

    def __init__(self, ops, names):
        self.names = sorted(names)
        super().__init__(ops)
        self.args = (f"input(s) {self.names} decide shapes inside the model, so their values must be known at "
                     f"compile time: pass constant_inputs={{name: array}} to cuvil.compile, or use "
                     f"cuvil.InferenceSession, which compiles one specialization per distinct value\n"
                     + str(self.args[0]),)


class ShapeError(CuvilError, ValueError):
    """An input has the wrong shape or dtype: the message says expected vs got."""


class VerificationError(CuvilError):
    """Compiled outputs differ from the source model; `errors` maps output -> (max_abs, max_rel)."""

    def __init__(self, errors, rtol, atol):
        self.errors = errors
        lines = [f"  output {k}: max abs err {a:.3g}, max rel err {r:.3g}" for k, (a, r) in errors.items()]
        super().__init__(f"compiled model disagrees with the source (rtol={rtol}, atol={atol}):\n"
                         + "\n".join(lines))


class QuantizationError(CuvilError, ValueError):
    """A weight cannot be stored in the precision asked for (the message names it and why)."""


class CompileError(CuvilError):
    """The C toolchain failed or is missing."""


class ArtifactError(CuvilError):
    """An artifact directory is missing files, corrupt, or of another format version."""


class GraphError(CuvilError):
    """The IR is not well formed (raised by Graph.verify)."""


class PrecisionWarning(UserWarning):
    """A computation runs at lower precision than its dtype says (e.g. float64 ops with no float64 kernel)."""
