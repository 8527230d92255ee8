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


class ShapeError(CuvilError, ValueError):
    """An input has the wrong shape or dtype: the message says expected vs got."""


class VerificationError(CuvilError):
    """Compiled outputs differ from the source model; `errors` maps output -> (max_abs, max_rel)."""

    def __init__(self, errors, rtol, atol):
        self.errors = errors
        lines = [f"  output {k}: max abs err {a:.3g}, max rel err {r:.3g}" for k, (a, r) in errors.items()]
        super().__init__(f"compiled model disagrees with the source (rtol={rtol}, atol={atol}):\n"
                         + "\n".join(lines))


class CompileError(CuvilError):
    """The C toolchain failed or is missing."""


class ArtifactError(CuvilError):
    """An artifact directory is missing files, corrupt, or of another format version."""


class GraphError(CuvilError):
    """The IR is not well formed (raised by Graph.verify)."""


class PrecisionWarning(UserWarning):
    """A computation runs at lower precision than its dtype says (e.g. float64 ops with no float64 kernel)."""
