"""A fast subset of the OpInfo runner (tests/opinfo.py; the full run: `python -m tests.opinfo`): the ops
that the common model families need pass their first float32 samples against eager, and the
known-failure list holds no wrong answers or crashes, only clean refusals."""
import json

import pytest

from . import opinfo

# ops the zoo's models (CNNs, ViT/Swin/SegFormer, wav2vec2, CLIP/SigLIP, UNets, LLMs) are built from
MODEL_OPS = [
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.linear", "matmul", "bmm", "addmm", "nn.functional.layer_norm",
    "nn.functional.group_norm", "nn.functional.rms_norm", "softmax", "log_softmax",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus", "nn.functional.hardswish",
    "nn.functional.mish", "sigmoid", "tanh", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.bilinear", "nn.functional.interpolate.bicubic", "nn.functional.interpolate.linear",
    "nn.functional.interpolate.trilinear", "nn.functional.adaptive_avg_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.max_pool2d", "nn.functional.pad.constant", "nn.functional.normalize", "linalg.vector_norm",
    "topk", "sort", "argsort", "cumsum", "where", "masked_fill", "index_select", "gather", "index_put",
    "slice_scatter", "select_scatter", "histc", "roll", "flip", "tril", "triu", "cat", "stack", "split",
    "chunk", "transpose", "permute", "reshape", "expand", "repeat", "mean", "sum", "amax", "var", "std",
    "logsumexp", "clamp", "isfinite", "isclose", "logaddexp", "nn.functional.embedding", "einsum",
]
# one op per family of the special functions, the linear algebra, the complex / FFT ops and the
# data-dependent sizes (torch's names -> the IR's): the
# frontend's mapping of each family checked against eager; their kernels against scipy in test_ops.py
FAMILY_OPS = ["erfinv", "polygamma.polygamma_n_1", "special.i1e", "special.bessel_y1", "special.legendre_polynomial_p",
              "igammac", "linalg.det", "linalg.solve", "linalg.cholesky", "linalg.lu_factor",
              "fft.rfft2", "fft.ihfftn", "view_as_complex", "nonzero", "masked_select", "unique"]


@pytest.fixture(scope="module")
def ops():
    return opinfo.opinfos()


@pytest.mark.parametrize("name", MODEL_OPS + FAMILY_OPS)
def test_model_op_matches_eager(ops, name, tmp_path):
    status, detail = opinfo.check_op(ops[name], samples=2, cache_dir=str(tmp_path))
    assert status == "pass", f"{name}: {status}: {detail}"


def test_known_failures_are_clean_refusals(ops):
    """Every op the full run does not pass is listed with its status; none of them may be a wrong
    answer or a crash (those are bugs to fix, not coverage to add)."""
    known = json.loads(opinfo.KNOWN_FAILURES.read_text())
    assert known and set(known) <= set(ops)
    bad = {n: s for n, s in known.items() if s not in ("unsupported", "error")}
    assert not bad, f"wrong answers or crashes in the OpInfo run: {bad}"
    assert not set(known) & set(MODEL_OPS)
