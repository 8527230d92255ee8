"""The C backend. Importing this package registers every op's C lowering, once, in emit.LOWERINGS;
C_BACKEND tells the passes which nodes it lowers and the scratch memory each needs."""
from ...passes.backend import Backend
from . import (lower_batch_map, lower_bitwise, lower_blocked, lower_control, lower_detection, lower_linalg, lower_llm, lower_movement,  # noqa: F401
               lower_nn, lower_pointwise, lower_reduce, lower_scatter)
from .emit import LOWERINGS
from .lower_bf16dot import links_bf16
from .lower_int8dot import int8_input_image, pools_bytes, reads_int8_residual, writes_int8_input


def supports(node):
    """None when the node's lowering takes it as it stands (or it has no lowering), else why not."""
    low = LOWERINGS.get(node.op)
    return None if low is None or low.supports is None else low.supports(node)


def scratch_bytes(node, bounds) -> int:
    low = LOWERINGS[node.op]
    return low.scratch(node, bounds) if low.scratch else 0


C_BACKEND = Backend(frozenset(LOWERINGS), supports, scratch_bytes, int8_conv=writes_int8_input,
                    int8_input_image=int8_input_image, int8_residual=reads_int8_residual,
                    int8_pool=pools_bytes, bf16_conv=links_bf16)
