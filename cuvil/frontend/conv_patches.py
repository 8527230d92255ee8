"""A 2-d transposed conv whose kernel equals its stride (no padding, dilation or groups: UNet's 2x2 stride-2
upsampling), shared by the torch and ONNX frontends. Each input pixel writes its own kh x kw patch of
outputs, so the conv is one GEMM of the pixels by the weight as [C, O kh kw], its columns then moved to
their patches (depth to space). The zero-spread conv it replaces multiplied the stride's zeros too: kh kw
times the work."""
from __future__ import annotations


def patches_transposed(add, x, w, b):
    """add(op, inputs, attrs) -> the new node's value (the frontend's builder); x [N, C, H, W] with a static
    N, w [C, O, kh, kw], b [O] or None. Constant weights and bias fold into the GEMM's operands."""
    n, c, h, wd = x.shape
    o, kh, kw = w.shape[1:]
    y = add("matmul", [add("transpose", [x], {"perm": [0, 2, 3, 1]}), add("reshape", [w], {"shape": [c, o * kh * kw]})],
            {})
    if b is not None:              # each output channel's bias on its kh kw columns
        bias = add("expand", [add("reshape", [b], {"shape": [o, 1]})], {"shape": [o, kh * kw]})
        y = add("add", [y, add("reshape", [bias], {"shape": [o * kh * kw]})], {})
    y = add("transpose", [add("reshape", [y], {"shape": [n, h, wd, o, kh, kw]})], {"perm": [0, 3, 1, 4, 2, 5]})
    return add("reshape", [y], {"shape": [n, o, h * kh, wd * kw]})
