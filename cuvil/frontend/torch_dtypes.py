"""torch dtype -> IR dtype name: the one table the torch frontend's modules share (a leaf)."""
from __future__ import annotations

import torch

from ..errors import UnsupportedOpError

TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
                torch.uint8: "uint8", torch.uint16: "uint16", torch.uint32: "uint32", torch.uint64: "uint64",
                torch.bool: "bool", torch.bfloat16: "bfloat16"}


def dtype_of(t) -> str:
    try:
        return TORCH_DTYPES[t]
    except KeyError:
        raise UnsupportedOpError([(f"dtype {t} (cuvil supports {', '.join(TORCH_DTYPES.values())})", None)]) \
            from None


def to_numpy(t):
    """A torch tensor's values as a numpy array; bfloat16 (which numpy lacks) as ml_dtypes' by its bits."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
