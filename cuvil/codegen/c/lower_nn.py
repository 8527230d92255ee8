"""C lowering of matmul, convolution, pooling and the composite ops (softmax, norms)."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from .emit import lowering
from .loops import broadcast_strides

def _prod_c(ds):
    return " * ".join(f"(int64_t)({D.to_c(d)})" for d in ds) or "1"


def panel_width(em):
    """Columns per packed panel for this build's target (2 vectors): see kernels/gemm.h."""
    from ...build.toolchain import vector_floats
    return 2 * vector_floats(em.target)


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> panels [ceil(N/nr), K, nr], zero padded (the layout cuvil_sgemm_packed reads)."""
    K, N = b.shape
    npan = -(-N // nr)
    out = np.zeros((npan, K, nr), np.float32)
    padded = np.zeros((K, npan * nr), np.float32)
    padded[:, :N] = b
    out[:] = padded.reshape(K, npan, nr).transpose(1, 0, 2)
    return out


def _mat_dims(v, is_b):
    s = v.type.shape
    if len(s) == 1:
        return ((), s[0], 1) if is_b else ((), 1, s[0])
    return s[:-2], s[-2], s[-1]


def _prepacked(node):
    """A constant B without batch dims is packed at compile time; every other B at run time."""
    a, b = node.inputs
    abatch, bbatch = _mat_dims(a, False)[0], _mat_dims(b, True)[0]
    obatch = node.outputs[0].type.shape[:node.outputs[0].type.rank - (a.type.rank >= 2) - (b.type.rank >= 2)]
    return b.is_const and not bbatch and (not abatch or len(abatch) == len(obatch))


def _matmul_scratch(node, bounds):
    a, b = node.inputs
    if a.dtype != "float32" or _prepacked(node):
        return 0
    _, K, N = _mat_dims(b, True)
    K, N = D.upper_bound(K, bounds), D.upper_bound(N, bounds)
    nr = 64  # widest panel (AVX-512): safe upper bound for every target
    return (-(-N // nr) * nr * K) * 4


@lowering("matmul", scratch=_matmul_scratch)
def lower_matmul(em, node):
    a, b = node.inputs
    y = node.outputs[0]
    abatch, M, K = _mat_dims(a, False)
    bbatch, _, N = _mat_dims(b, True)
    obatch = y.type.shape[:len(y.type.shape) - (a.type.rank >= 2) - (b.type.rank >= 2)]
    A, B, Y = em.ptr(a), em.ptr(b), em.ptr(y)
    Mc, Nc, Kc = D.to_c(M), D.to_c(N), D.to_c(K)
    lines = ["{"]
    if a.dtype == "float32":
        if _prepacked(node):
            # weights: packed at compile time; all batch rows form one tall GEMM
            nr = panel_width(em)
            Bp = em.packed("panels", b, lambda d: pack_b(d if d.ndim == 2 else d.reshape(-1, 1), nr))
            Mt = _prod_c(list(abatch) + [M])
            lines.append(f"  cuvil_sgemm_packed({Mt}, {Nc}, {Kc}, {A}, {Kc}, {Bp}, {Y}, {Nc}, 0, 0, 0, 0, NT);")
            lines.append("}")
            return lines
        body = [f"cuvil_pack_b({Kc}, {Nc}, {B} + boff, {Nc}, 0, {em.scratch()}, NT);",
                f"cuvil_sgemm_packed({Mc}, {Nc}, {Kc}, {A} + aoff, {Kc}, {em.scratch()}, {Y} + yoff, {Nc}, 0, 0, 0, 0, NT);"]
    else:
        fn = {"float64": "cuvil_matmul_f64", "int64": "cuvil_matmul_i64", "int32": "cuvil_matmul_i32"}[a.dtype]
        body = [f"{fn}({Mc}, {Nc}, {Kc}, {A} + aoff, {Kc}, {B} + boff, {Nc}, {Y} + yoff, {Nc});"]
    # batch loop with broadcast strides (in matrices)
    ast = broadcast_strides(abatch, obatch)
    bst = broadcast_strides(bbatch, obatch)
    iv = [f"n{k}" for k in range(len(obatch))]
    for k, d in enumerate(obatch):
        lines.append("  " * (k + 1) + f"for (int64_t {iv[k]} = 0; {iv[k]} < {D.to_c(d)}; {iv[k]}++)")
    yoff = "0"
    for k, d in enumerate(obatch):
        yoff = f"({yoff}) * ({D.to_c(d)}) + {iv[k]}"
    aoff = " + ".join([f"{iv[k]} * {D.to_c(s)}" for k, s in enumerate(ast) if s != 0] or ["0"])
    boff = " + ".join([f"{iv[k]} * {D.to_c(s)}" for k, s in enumerate(bst) if s != 0] or ["0"])
    ind = "  " * (len(obatch) + 1)
    lines.append(ind + "{")
    lines.append(ind + f"  const int64_t aoff = ({aoff}) * {Mc} * {Kc}, boff = ({boff}) * {Kc} * {Nc}, "
                 f"yoff = ({yoff}) * {Mc} * {Nc};")
    lines += [ind + "  " + s for s in body]
    lines.append(ind + "}")
    lines.append("}")
    return lines


def _conv_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4):
        return f"{x.type.rank - 2}-d convolution (1-d and 2-d are supported)"
    if x.dtype != "float32":
        return f"dtype {x.dtype} (float32 is supported)"
    return None


def _conv_shape(node, spatial_of):
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if x.type.rank == 3:
        H, W, KH, KW, OH, OW = 1, x.shape[2], 1, w.shape[2], 1, y.shape[2]
        st, pads, dl = (1, *node.attrs["strides"]), ((0, 0), *node.attrs["pads"]), (1, *node.attrs["dilations"])
    else:
        H, W, KH, KW, OH, OW = x.shape[2], x.shape[3], w.shape[2], w.shape[3], y.shape[2], y.shape[3]
        st, pads, dl = node.attrs["strides"], node.attrs["pads"], node.attrs["dilations"]
    vals = dict(N=x.shape[0], C=x.shape[1], H=H, W=W, O=w.shape[0], KH=KH, KW=KW, OH=OH, OW=OW,
                sh=st[0], sw=st[1], ph=pads[0][0], pw=pads[1][0], dh=dl[0], dw=dl[1],
                groups=node.attrs.get("groups", 1))
    return {k: spatial_of(v) for k, v in vals.items()}, (pads[0][1], pads[1][1])


def _conv_scratch(node, bounds):
    s, _ = _conv_shape(node, lambda d: D.upper_bound(d, bounds))
    K = (s["C"] // s["groups"]) * s["KH"] * s["KW"]
    N = s["OH"] * s["OW"]
    return (-(-N // 64) * 64 * K) * 4


def _shape_struct(s):
    return "{" + ", ".join(f".{k} = {v}" for k, v in s.items()) + "}"


@lowering("conv", scratch=_conv_scratch, supports=_conv_supports)
def lower_conv(em, node):
    s, _ = _conv_shape(node, D.to_c)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    act = {"none": 0, "relu": 1, "gelu": 2}[node.attrs.get("act", "none")] if "act" in node.attrs else 0
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  cuvil_conv2d(&s, {em.ptr(node.inputs[0])}, {em.ptr(node.inputs[1])}, {bias}, {em.ptr(node.outputs[0])}, "
            f"{act}, {em.scratch()}, NT);", "}"]


def _pool_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4) or x.dtype != "float32":
        return f"{x.type.rank - 2}-d {x.dtype} pooling (1-d and 2-d float32 are supported)"
    return None


@lowering("max_pool", "avg_pool", supports=_pool_supports)
def lower_pool(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    fake = type("N", (), {})()
    fake.inputs = [x, type("W", (), {"shape": (x.shape[1], 1, *a["kernel"])})()]
    fake.outputs = [y]
    fake.attrs = dict(strides=a["strides"], pads=a["pads"], dilations=a["dilations"], groups=1)
    s, (ph1, pw1) = _conv_shape(fake, D.to_c)
    s["O"] = s["C"]
    mode = 0 if node.op == "max_pool" else (2 if a.get("count_include_pad") else 1)
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  cuvil_pool2d(&s, {ph1}, {pw1}, {mode}, {em.ptr(x)}, {em.ptr(y)}, NT);", "}"]


def _f32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"dtype {node.inputs[0].dtype} (float32 is supported)"


@lowering("softmax", "log_softmax", supports=_f32_only)
def lower_softmax(em, node):
    x, ax = node.inputs[0], node.attrs["axis"]
    s = x.type.shape
    return [f"cuvil_softmax({_prod_c(s[:ax])}, {D.to_c(s[ax])}, {_prod_c(s[ax + 1:])}, {em.ptr(x)}, "
            f"{em.ptr(node.outputs[0])}, {int(node.op == 'log_softmax')}, NT);"]


def _norm_supports(node):
    r = _f32_only(node)
    if r:
        return r
    x = node.inputs[0]
    inner = x.type.shape[node.attrs["axis"]:]
    for p in node.inputs[1:]:
        if p is not None and not D.dims_equal(D.numel(p.type.shape), D.numel(inner)):
            return "broadcast norm parameters"
    return None


@lowering("layer_norm", "rms_norm", supports=_norm_supports)
def lower_norm(em, node):
    x, ax = node.inputs[0], node.attrs["axis"]
    s = x.type.shape
    g = em.ptr(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else "0"
    b = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    return [f"cuvil_layer_norm({_prod_c(s[:ax])}, {_prod_c(s[ax:])}, {em.ptr(x)}, {g}, {b}, "
            f"{float(node.attrs['eps'])!r}f, {int(node.op == 'rms_norm')}, {em.ptr(node.outputs[0])}, NT);"]


@lowering("batch_norm", supports=_f32_only)
def lower_batch_norm(em, node):
    x = node.inputs[0]
    s = x.type.shape
    ps = ", ".join(em.ptr(v) for v in node.inputs[1:])
    return [f"cuvil_batch_norm({D.to_c(s[0])}, {D.to_c(s[1])}, {_prod_c(s[2:])}, {em.ptr(x)}, {ps}, "
            f"{float(node.attrs['eps'])!r}f, {em.ptr(node.outputs[0])}, NT);"]
