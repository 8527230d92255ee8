"""C lowering of matmul, convolution, pooling and the composite ops (softmax, norms)."""
from __future__ import annotations

import numpy as np

from ...ir import dims as D
from ...ir.ops.movement import layout_block
from . import cexpr, lower_blocked
from .conv_plan import CONV2D_PATHS, WINOGRAD_MAX_W, conv_plan, conv_shape, is_blocked, winograd_filters
from .emit import lowering
from .gemm_plan import GEMM_KC, GEMM_MC, mat_dims, matmul_plan, pack_a, pack_b, panel_width, tile_rows
from .gen_activations import ACT_CODES
from .tuning import plan_value
from .direct_nd import conv_nd, pool_nd
from .loops import broadcast_strides

def _matmul_supports(node):
    dt = node.inputs[0].dtype
    return None if dt in ("float32", "float64", "int64", "int32") else f"dtype {dt} (float32, float64, int64, int32)"




def _epilogue(em, node):
    """C initialiser of the cuvil_epilogue of a matmul_fused node (None for a plain matmul)."""
    if node.op != "matmul_fused":
        return None
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    res = em.ptr(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else "0"
    n = D.to_c(node.outputs[0].shape[-1])
    return (f"{{.bias_row = 0, .bias_col = {bias}, .residual = {res}, .ldr = {n}, "
            f".alpha = {cexpr.float_literal(node.attrs['alpha'], 'f')}, .act = {ACT_CODES[node.attrs['act']]}}}")


def _fused_supports(node):
    return None if matmul_plan(node).kind == "prepacked" else "epilogue fusion needs a float32 weight"


@lowering("matmul_fused", supports=_fused_supports)
def lower_matmul_fused(em, node):
    return lower_matmul(em, node)


def _matmul_scratch(node, bounds):
    return matmul_plan(node, bounds).scratch_bytes


@lowering("matmul", scratch=_matmul_scratch, supports=_matmul_supports)
def lower_matmul(em, node):
    a, b = node.inputs[:2]
    y = node.outputs[0]
    abatch, M, K = mat_dims(a, False)
    bbatch, _, N = mat_dims(b, True)
    obatch = y.type.shape[:len(y.type.shape) - (a.type.rank >= 2) - (b.type.rank >= 2)]
    A, Y = em.ptr(a), em.ptr(y)
    kind = matmul_plan(node).kind
    B = None if kind == "prepacked" else em.ptr(b)      # a prepacked weight is stored only as panels
    Mc, Nc, Kc = D.to_c(M), D.to_c(N), D.to_c(K)
    lines = ["{"]
    if kind != "naive":
        if kind == "prepacked":
            # weights: packed at compile time; all batch rows form one tall GEMM
            nr = panel_width(em)
            Bp = em.packed("panels", b, lambda d: pack_b(d if d.ndim == 2 else d.reshape(-1, 1), nr))
            Mt = cexpr.prod(list(abatch) + [M])
            ep = _epilogue(em, node)
            if ep:
                lines.append(f"  const cuvil_epilogue ep = {ep};")
            lines.append(f"  cuvil_sgemm_packed({Mt}, {Nc}, {Kc}, {A}, {Kc}, {Bp}, {Y}, {Nc}, {'&ep' if ep else '0'}, NT, "
                         f"{int(em.weights_cached)});")
            lines.append("}")
            return lines
        body = [f"cuvil_pack_b({Kc}, {Nc}, {B} + boff, {Nc}, 0, {em.scratch()}, NT);",
                f"cuvil_sgemm_packed({Mc}, {Nc}, {Kc}, {A} + aoff, {Kc}, {em.scratch()}, {Y} + yoff, {Nc}, 0, NT, 1);"]
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


def _grouped_matmul_scratch(node, bounds):
    w = node.inputs[1]
    if w.is_const:
        return 0
    K, N = (D.upper_bound(d, bounds) for d in w.type.shape[1:])
    return -(-N // 64) * 64 * K * 4      # one group's panels, at the widest panel (AVX-512)


def _float32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"dtype {node.inputs[0].dtype} (float32 is supported)"


@lowering("grouped_matmul", scratch=_grouped_matmul_scratch, supports=_float32_only)
def lower_grouped_matmul(em, node):
    """One packed GEMM per group over its rows; constant weights (experts) packed at compile time."""
    x, w, offs = node.inputs
    y = node.outputs[0]
    S, K = (D.to_c(d) for d in x.type.shape)
    E, _, N = (D.to_c(d) for d in w.type.shape)
    if w.is_const:
        nr = panel_width(em)
        Bp = em.packed("panels", w, lambda d: np.stack([pack_b(m, nr) for m in d]))
        panel, pack = f"{Bp} + e * cuvil_packed_b_size({K}, {N})", []
    else:
        panel = em.scratch()
        pack = [f"      cuvil_pack_b({K}, {N}, {em.ptr(w)} + e * {K} * {N}, {N}, 0, {panel}, NT);"]
    X, Y, O = em.ptr(x), em.ptr(y), em.ptr(offs)
    return ["{", "  int64_t start = 0;",
            f"  for (int64_t e = 0; e < {E}; e++) {{",
            f"    int64_t end = (int64_t){O}[e];",
            f"    end = end < start ? start : end > {S} ? {S} : end;      /* malformed offsets: clamped */",
            "    if (end > start) {", *pack,
            f"      cuvil_sgemm_packed(end - start, {N}, {K}, {X} + start * {K}, {K}, {panel}, {Y} + start * {N}, "
            f"{N}, 0, NT, 0);",
            "    }", "    start = end;", "  }",
            f"  if (start < {S}) memset({Y} + start * {N}, 0, (size_t)(({S} - start) * {N}) * sizeof(float));",
            "}"]


def _conv_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4, 5) or (x.type.rank == 5 and not all(
            isinstance(d, int) for v in node.inputs[:2] + node.outputs for d in v.shape)):
        return f"{x.type.rank - 2}-d convolution (1-d, 2-d and static 3-d are supported)"
    if x.dtype != "float32":
        return f"dtype {x.dtype} (float32 is supported)"
    return None


def _shape_struct(s):
    return "{" + ", ".join(f".{k} = {v}" for k, v in s.items()) + "}"


def _conv_scratch(node, bounds):
    return conv_plan(node, bounds=bounds).scratch_bytes


@lowering("conv", scratch=_conv_scratch, supports=_conv_supports)
def lower_conv(em, node):
    lines = _lower_conv_call(em, node)
    live = node.attrs.get("live_channels")
    if not live:
        return lines
    # channels widened to whole blocks (passes/pad_channels.py): the padding's outputs zeroed
    y = node.outputs[0]
    n, c, h, w = (D.to_c(d) for d in y.shape)
    if not (isinstance(live, int) and 0 < live < y.shape[1]):
        raise AssertionError(f"conv at {node.loc}: live_channels {live!r} outside its {y.shape[1]} channels")
    return lines + [f"cuvil_zero_channels({n}, {c}, (int64_t)({h}) * ({w}), {live}, {int(y.layout != 'nchw')}, "
                    f"{em.ptr(y)});"]


def _lower_conv_call(em, node):
    nr = panel_width(em)
    plan = conv_plan(node, nr, winograd4_min=plan_value("blocked_winograd4_min_outputs", em.target),
                     grouped_min_w=plan_value("grouped_direct_block_min_width", em.target))
    if plan.kind == "nd":
        return conv_nd(em, node)
    s, _ = conv_shape(node, D.to_c)
    bias = em.ptr(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else "0"
    res = em.ptr(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else "0"
    act = ACT_CODES[node.attrs["act"]]
    if plan.kind.startswith("blocked"):
        return lower_blocked.lower_conv(em, node, plan, _shape_struct(s), bias, res, act)
    if plan.kind == "int8_nchw":
        kind = "BYTES" if node.attrs.get("int8_in") else "NCHW"
        return lower_blocked.lower_int8_conv(em, node, _shape_struct(s), bias, res, act, kind, nchw_out=True)
    w, groups = node.inputs[1], node.attrs.get("groups", 1)
    m, mr = plan.winograd, tile_rows(em)
    if plan.kind == "winograd":
        up = em.packed(plan.pack, w, lambda d: winograd_filters(d, m, mr))
        return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
                f"  _Static_assert(CUVIL_MR == {mr} && CUVIL_KC == {GEMM_KC} && CUVIL_WINOGRAD_MAX_W == "
                f"{WINOGRAD_MAX_W}, \"winograd filters packed for another kernel\");",
                f"  cuvil_conv3x3_winograd{'4' if m == 4 else ''}(&s, {em.ptr(node.inputs[0])}, {up}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    if plan.kind == "swapped":
        wb = em.packed(plan.pack, w, lambda d: pack_b(d.reshape(d.shape[0], -1).T.astype(np.float32), nr))
        return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
                f"  _Static_assert(CUVIL_NR == {nr}, \"conv filters packed for another panel width\");",
                f"  cuvil_conv_swapped(&s, {em.ptr(node.inputs[0])}, {wb}, {bias}, {res}, "
                f"{em.ptr(node.outputs[0])}, {act}, {em.scratch()}, NT);", "}"]
    assert plan.kind == "gemm", plan.kind
    wp, wptr = "0", None
    if plan.pack:                        # filters packed at compile time into the GEMM's A tiles only
        og = w.shape[0] // groups
        wp = em.packed(plan.pack, w, lambda d: np.concatenate(
            [pack_a(g.reshape(og, -1), mr) for g in np.split(d.astype(np.float32), groups)]))
        wptr = "0"
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  _Static_assert(CUVIL_MR == {mr} && CUVIL_KC == {GEMM_KC} && CUVIL_MC == {GEMM_MC}, "
            "\"conv filters packed for another tile\");",
            f"  cuvil_conv2d(&s, {CONV2D_PATHS[plan.path]}, {em.ptr(node.inputs[0])}, {wptr or em.ptr(w)}, {wp}, "
            f"{bias}, {res}, {em.ptr(node.outputs[0])}, {act}, "
            f"{'0' if plan.path in ('depthwise', 'implicit') else em.scratch()}, NT);", "}"]


def _pool_supports(node):
    x = node.inputs[0]
    if x.type.rank not in (3, 4, 5) or x.dtype != "float32" or (
            x.type.rank == 5 and not all(isinstance(d, int) for d in x.shape)):
        return f"{x.type.rank - 2}-d {x.dtype} pooling (static 1-d, 2-d and 3-d float32 are supported)"
    return None


@lowering("max_pool", "avg_pool", supports=_pool_supports)
def lower_pool(em, node):
    x, y, a = node.inputs[0], node.outputs[0], node.attrs
    if x.type.rank == 5:
        return pool_nd(em, node)
    fake = type("N", (), {})()
    fake.inputs = [x, type("W", (), {"shape": (x.shape[1], 1, *a["kernel"])})()]
    fake.outputs = [y]
    fake.attrs = dict(strides=a["strides"], pads=a["pads"], dilations=a["dilations"], groups=1)
    s, (ph1, pw1) = conv_shape(fake, D.to_c)
    s["O"] = s["C"]
    mode = 0 if node.op == "max_pool" else (2 if a.get("count_include_pad") else 1)
    if is_blocked(node) and mode:
        return lower_blocked.lower_avg_pool(em, node, _shape_struct(s), ph1, pw1, mode)
    if is_blocked(node):
        return lower_blocked.lower_max_pool(em, node, _shape_struct(s))
    return ["{", f"  const cuvil_conv_shape s = {_shape_struct(s)};",
            f"  cuvil_pool2d(&s, {ph1}, {pw1}, {mode}, {em.ptr(x)}, {em.ptr(y)}, NT);", "}"]


def _f32_only(node):
    return None if node.inputs[0].dtype == "float32" else f"dtype {node.inputs[0].dtype} (float32 is supported)"


@lowering("softmax", "log_softmax", supports=_f32_only)
def lower_softmax(em, node):
    x, ax = node.inputs[0], node.attrs["axis"]
    s = x.type.shape
    return [f"cuvil_softmax({cexpr.prod(s[:ax])}, {D.to_c(s[ax])}, {cexpr.prod(s[ax + 1:])}, {em.ptr(x)}, "
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
    return [f"cuvil_layer_norm({cexpr.prod(s[:ax])}, {cexpr.prod(s[ax:])}, {em.ptr(x)}, {g}, {b}, "
            f"{cexpr.float_literal(node.attrs['eps'], 'f')}, {int(node.op == 'rms_norm')}, {em.ptr(node.outputs[0])}, "
            "NT);"]


@lowering("group_norm", supports=_f32_only)
def lower_group_norm(em, node):
    """NCHW: each image's groups are rows of C / groups * H * W values (the layer norm's kernel); a
    channel-blocked map (passes/layout.py): kernels/norm.c cuvil_group_norm_blocked."""
    x, y = node.inputs[0], node.outputs[0]
    n, c, h, w = (D.to_c(d) for d in x.shape)
    g, eps = node.attrs["groups"], cexpr.float_literal(node.attrs["eps"], "f")
    if x.layout != "nchw":
        block, cg = layout_block(x.layout), x.shape[1] // g
        if cg % block and block % cg:     # passes/layout.py blocks no other
            raise AssertionError(f"group_norm at {node.loc}: groups of {cg} channels in blocks of {block}")
        return ["{", "  " + lower_blocked.block_check(x.layout),
                f"  cuvil_group_norm_blocked({n}, {c}, (int64_t)({h}) * ({w}), {g}, {em.ptr(x)}, {eps}, "
                f"{em.ptr(y)}, NT);", "}"]
    return [f"cuvil_layer_norm((int64_t)({n}) * {g}, (int64_t)({c} / {g}) * ({h}) * ({w}), {em.ptr(x)}, 0, 0, "
            f"{eps}, 0, {em.ptr(y)}, NT);"]


@lowering("batch_norm", supports=_f32_only)
def lower_batch_norm(em, node):
    x = node.inputs[0]
    s = x.type.shape
    ps = ", ".join(em.ptr(v) for v in node.inputs[1:])
    return [f"cuvil_batch_norm({D.to_c(s[0])}, {D.to_c(s[1])}, {cexpr.prod(s[2:])}, {em.ptr(x)}, {ps}, "
            f"{cexpr.float_literal(node.attrs['eps'], 'f')}, {em.ptr(node.outputs[0])}, NT);"]


def _attention_supports(node):
    if any(v.dtype != "float32" for v in node.inputs[:3]):
        return "float32 q, k, v are supported"
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        if node.inputs[3].dtype not in ("bool", "float32"):
            return "bool or float32 masks are supported"
        if node.inputs[0].type.rank > 4:
            return "masks on attention with more than one batch dim"
    return None


@lowering("attention", supports=_attention_supports)
def lower_attention(em, node):
    q, k, v = node.inputs[:3]
    y = node.outputs[0]
    a = node.attrs
    B, H, L, qs = _attn_dims(q, a["layout_q"])
    _, Hk, S, ks = _attn_dims(k, a["layout_k"])
    _, _, _, vs = _attn_dims(v, a["layout_v"])
    _, _, _, os_ = _attn_dims(y, a["layout_out"])
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    mkind, mptr, mst = 0, "0", ("0", "0", "0", "0")
    if mask is not None:
        mkind = 1 if mask.dtype == "bool" else 2
        mptr = em.ptr(mask)
        full = _bhsd_full(q, a["layout_q"], S)
        from .loops import broadcast_strides
        st = broadcast_strides(mask.type.shape, full)
        mst = tuple(D.to_c(x) for x in _fold_batch(st, full))
    E, Ev = q.shape[-1], v.shape[-1]
    init = (f"{{.B = {D.to_c(B)}, .H = {D.to_c(H)}, .Hk = {D.to_c(Hk)}, .L = {D.to_c(L)}, .S = {D.to_c(S)}, "
            f".E = {D.to_c(E)}, .Ev = {D.to_c(Ev)}, "
            f".qb = {qs[0]}, .qh = {qs[1]}, .ql = {qs[2]}, .kb = {ks[0]}, .kh = {ks[1]}, .kl = {ks[2]}, "
            f".vb = {vs[0]}, .vh = {vs[1]}, .vl = {vs[2]}, .ob = {os_[0]}, .oh = {os_[1]}, .ol = {os_[2]}, "
            f".mask_kind = {mkind}, .mask = {mptr}, .mb = {mst[0]}, .mh = {mst[1]}, .ml = {mst[2]}, .ms = {mst[3]}, "
            f".scale = {cexpr.float_literal(a['scale'], 'f')}, .causal = {int(a['causal'])}}}")
    return ["{", f"  const cuvil_attn at = {init};",
            f"  cuvil_attention(&at, {em.ptr(q)}, {em.ptr(k)}, {em.ptr(v)}, {em.ptr(y)}, NT);", "}"]


def _attn_dims(v, layout):
    """(batch, heads, seq, (batch, head, seq) C strides) of an attention operand."""
    s = v.type.shape
    st, acc = [], 1
    for d in reversed(s):
        st.append(acc)
        acc = D.as_dim(acc * d)
    st = st[::-1]
    if len(s) == 2:
        return 1, 1, s[0], ("0", "0", D.to_c(st[0]))
    if layout == "bshd":
        return s[0], s[2], s[1], (D.to_c(st[0]), D.to_c(st[2]), D.to_c(st[1]))
    return D.numel(s[:-3]), s[-3], s[-2], (D.to_c(st[-3] * s[-3]) if len(s) > 3 else "0", D.to_c(st[-3]),
                                           D.to_c(st[-2]))


def _bhsd_full(q, layout, S):
    """The [..., heads, L, S] score shape (bhsd order) that a mask broadcasts against."""
    s = q.type.shape
    if layout == "bshd":
        return (s[0], s[2], s[1], S)
    return tuple(s[:-1]) + (S,)


def _fold_batch(st, full):
    """Mask strides over the score shape -> (batch, head, q, kv) strides."""
    st = [0] * (4 - len(st)) + list(st)
    return tuple(st[-4:])
