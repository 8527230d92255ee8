"""Lower-precision weights for general models (compile's precision="bf16" | "fp16" | "int8"): every
matmul with a constant float32 [K, N] weight (linear layers, after fusion, with their epilogue)
becomes a matmul_q reading that weight in the precision, with fp32 accumulation and the same fused
bias / residual / activation:

  bf16, fp16  weights stored in 16 bits, widened in registers (AVX2: a shift for bf16, F16C for fp16);
              the arithmetic stays fp32, so memory-bound layers (batch 1) gain and the rest pay little.
              Where the CPU multiplies in bf16 (AVX512-BF16), bf16's activations are rounded to bf16 too
              and the products summed in fp32 by vdpbf16ps (matmul_q's bf16_act; codegen decides).
  int8        symmetric per-output-channel int8 weights (a weight already on an int8 grid, as a QAT,
              ONNX QDQ or PT2E model's dequantized weights are, keeps its values and scales); activations quantized dynamically to int8 per
              block of 32-128 values along K (ONNX Runtime's quantize_dynamic quantizes per tensor) and
              multiplied in integers (qgemm.c: AVX-512 VNNI, AVX2 maddubs, NEON SDOT, portable); a K that
              is no multiple of 32 gets zero weight rows up to the next one.

What is not a constant-weight matmul (attention, norms, softmax, reductions, and convs except below)
stays fp32. bf16 marks convs with constant filters (bf16_act): a channel-blocked conv of one group that
is no Winograd or depthwise conv runs in bf16 products where the target has them (codegen decides).
int8 marks them (int8_act) for a target with integer convs (int8_convs: 2 AVX-512 VNNI, 1 AVX2): a
channel-blocked conv of one group that is not depthwise then runs on its input quantized to bytes
(per image, or over its calibrated range; 0..255 on VNNI, 0..127 on AVX2) and its filters to int8 per
output channel, 3x3 convs included on VNNI (direct integer products outrun fp32 Winograd: 250 -> 390
GOP/s on ResNet-50's);
precision_summary() says which nodes got which format, for the compile report and --verbose."""
from __future__ import annotations

import functools
from collections import Counter

import numpy as np

from ..errors import CuvilError, QuantizationError
from ..ir import interpreter, quant
from ..ir.graph import Node, nodes_within
from ..ir.ops import REGISTRY
from ..ir.ops.llm import act_block

LOSSY = ("bf16", "fp16", "int8")


def _weight(n):
    """The constant float32 [K, N] weight of a matmul node, or None."""
    if n.op not in ("matmul", "matmul_fused") or n.inputs[0].dtype != "float32" or n.inputs[0].type.rank < 2:
        return None
    w = n.inputs[1]
    return w if w.is_const and w.dtype == "float32" and w.data.ndim == 2 and w.data.size else None


def _quantized(graph, n, weight, precision, int8_dots=0):
    """The matmul_q node doing n's work (weight: its constant [K, N]) in `precision`; int8_dots: the
    target's integer dot kernels (run's int8_convs); VNNI's (2) take a model's own activation grid."""
    w = weight.data.astype(np.float32)
    K = w.shape[0]
    fused = n.op == "matmul_fused"
    if fused and n.attrs["alpha"] != 1.0:
        w = w * np.float32(n.attrs["alpha"])
    if precision == "int8" and int8_dots == 2 and n.attrs.get("int8_range") is not None:
        # x on a QDQ / PT2E model's grid: multiplied on those very bytes (kernels/int8dot.h cuvil_matmul_int8),
        # where they take all 256 levels (VNNI). AVX2's 128 would halve the grid: a QDQ MLP came out 2-4
        # output steps from ONNX Runtime that way, 2 with the dynamic int8 blocks it keeps there; VNNI's: 0-1
        q, s = quant.int8_grid(w) or quant.quantize_int8(w)
        ins = [n.inputs[0], graph.const(q), graph.const(s)]
        attrs = {"bits": 8, "group": K, "int8_range": list(n.attrs["int8_range"])}
    elif precision == "int8":
        q, s = quant.int8_grid(w) or quant.quantize_int8(w)     # a grid already there (QDQ, QAT) is kept
        Kp = -(-K // 32) * 32                   # zero rows to whole activation blocks: integer dots at any K
        if Kp != K:
            q = np.concatenate([q, np.zeros((Kp - K, q.shape[1]), np.int8)])
        ins = [n.inputs[0], graph.const(q), graph.const(s)]
        # dynamic_range: a target with AMX tiles maps x onto bytes, each row over its own range, instead
        # (lower_int8dot.computes_int8_matmul_on_tiles); the LLM path's int8 layers keep their blocks
        attrs = {"bits": 8, "group": Kp, "act_block": act_block(8, Kp, Kp), "dynamic_range": 1}
    else:
        store = quant.to_bf16 if precision == "bf16" else quant.to_fp16
        try:
            ins, attrs = [n.inputs[0], graph.const(store(w)), None], {"bits": 16, "bf16_act": int(precision == "bf16")}
        except QuantizationError as e:
            raise QuantizationError(f"{n.op} at {n.loc or 'an unknown location'}: {e}") from None
    bias = n.inputs[2] if fused and len(n.inputs) > 2 else None
    res = n.inputs[3] if fused and len(n.inputs) > 3 else None
    attrs["act"] = n.attrs["act"] if fused else "none"
    ins += [res, bias]
    while ins[-1] is None:
        ins.pop()
    attrs = {**REGISTRY["matmul_q"].attrs, **attrs}
    node = Node("matmul_q", ins, attrs, n.outputs, n.loc)
    REGISTRY["matmul_q"].infer([None if i is None else i.type for i in ins], attrs, ins)
    return node


PERCENTILES = (0.01, 99.99)       # calibration_method="percentile": the range's ends
PERCENTILE_SAMPLES = 1 << 16      # values kept per conv and input set (evenly spaced) for the percentiles


def calibrate(graph, calibration, method="minmax"):
    """Each int8 conv's input range (int8_range) over the calibration inputs (each a list of arrays in
    the graph's input order), run through the reference interpreter: min / max, or with method
    "percentile" the PERCENTILES of its values (of up to PERCENTILE_SAMPLES each set). The conv then maps
    its input onto bytes over that range, values outside it clipped, instead of over each image's own.
    Its residual's range too (int8_res_seen), for link_int8_convs to store a map only residuals read
    as bytes."""
    convs = {id(n): n for n in graph.nodes if n.op == "conv" and n.attrs.get("int8_act")
             and n.attrs.get("int8_range") is None}           # a QDQ model's grid (frontend/onnx/conv.py) kept
    if not convs or not calibration:
        return graph
    seen, samples = {}, {}

    def see(key, node, x, what):
        lo, hi = float(x.min()), float(x.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise QuantizationError(f"conv at {node.loc or 'an unknown location'}: its {what} holds NaN or "
                                    "infinity on the calibration data")
        old = seen.get(key, (lo, hi))
        seen[key] = (min(old[0], lo), max(old[1], hi))
        if method == "percentile":
            flat = x.reshape(-1)
            samples.setdefault(key, []).append(flat[::max(1, flat.size // PERCENTILE_SAMPLES)])

    def observe(node, arrays):
        if id(node) in convs and arrays[0].size:
            see((id(node), 0), node, arrays[0], "input")
            if len(arrays) > 3 and arrays[3] is not None and arrays[3].size:
                see((id(node), 3), node, arrays[3], "residual")
    for i, arrays in enumerate(calibration):
        arrays = [a.astype(v.dtype) if a.dtype.kind == "f" and np.dtype(v.dtype).kind == "f" else a
                  for a, v in zip(arrays, graph.inputs)]           # float64 data for a float32 input
        try:
            interpreter.run(graph, *arrays, observe=observe)
        except CuvilError as e:
            raise type(e)(f"calibration_data[{i}]: {e}") from None
    for key, (lo, hi) in seen.items():
        if method == "percentile":
            lo, hi = (float(v) for v in np.percentile(np.concatenate(samples[key]), PERCENTILES))
        convs[key[0]].attrs["int8_range" if key[1] == 0 else "int8_res_seen"] = [lo, hi]
    return graph


def run(graph, precision, int8_convs=0, calibration=None, calibration_method="minmax", bf16_direct_outputs=(0, 0)):
    """graph with its constant-weight matmuls in `precision` (fp32: unchanged); int8_convs: what the
    target's integer convs are (0 none, 1 AVX2's, 2 VNNI's, which take 3x3 convs from Winograd), the
    value int8 marks them with; calibration: input sets over which their input ranges are taken
    (calibrate, by calibration_method), else each image's own at run time; a range the model fixed
    itself (an ONNX QDQ or PT2E conv's input grid) is kept. bf16_direct_outputs: (ungrouped, grouped):
    bf16 marks 3x3 stride-1 convs of at most that many output pixels bf16_act 2, direct bf16 products rather
    than fp32 Winograd (codegen/c/tuning.py PLAN_TUNING, per CPU)."""
    if precision == "fp32":
        return graph
    if precision not in LOSSY:
        raise QuantizationError(f"precision {precision!r}: general models take one of fp32, {', '.join(LOSSY)}")
    graph.nodes = [n if (w := _weight(n)) is None else _quantized(graph, n, w, precision, int8_convs)
                   for n in graph.nodes]
    if precision == "bf16" or (precision == "int8" and int8_convs):
        for n in graph.nodes:
            if n.op == "conv" and n.inputs[1].is_const and n.inputs[0].dtype == "float32":
                n.attrs[f"{precision}_act"] = (int8_convs if precision == "int8" else
                                               2 if _small_3x3(n, bf16_direct_outputs) else 1)
    return calibrate(graph, calibration, calibration_method) if precision == "int8" else graph


def _small_3x3(n, max_outputs) -> bool:
    """A 3x3 stride-1 undilated conv with at most max_outputs static output pixels: max_outputs (ungrouped,
    grouped)."""
    a, y = n.attrs, n.outputs[0]
    limit = max_outputs[0] if a.get("groups", 1) == 1 else max_outputs[1]
    return (tuple(n.inputs[1].shape[2:]) == (3, 3) and y.type.rank == 4
            and tuple(a["strides"]) == (1, 1) and tuple(a["dilations"]) == (1, 1)
            and all(isinstance(d, int) for d in y.shape[2:]) and y.shape[2] * y.shape[3] <= limit)


def link_int8_convs(graph, backend):
    """Integer convs that feed integer convs bytes: where a conv's output is read only by integer convs,
    as their input over one fixed range (calibrated, or a QDQ model's grid) and the same byte image, or as
    their residual, and is no graph output, the producer stores it as those readers' quantized input
    (int8_out: the readers' padded byte image; the same bytes each would make of the floats), the
    readers skip their quantization pass (int8_in) and the residual readers widen the bytes in their
    epilogue (int8_res_range; only where the image is the unpadded map, pixel-major). A ResNet block's
    output goes to the next block's first conv, its projection and its last conv's residual that way:
    a quarter of the bytes written and read back. A map read only as residuals (a projection's output)
    is stored so over the range its readers saw in calibration (int8_res_seen): the block's last conv
    then takes the byte epilogue too, where a float residual had sent its sums through the float store.
    The residual then carries the input grid's rounding, as the QDQ models of ONNX Runtime and OpenVINO
    keep it.
    A max pool between an integer conv and such readers passes the bytes through (int8_in on the pool:
    the maximum of the bytes is the bytes of the maximum).
    A depthwise conv over a fixed range reads them too (its input's quantization the only loss), and then
    writes the next integer conv's bytes itself: MobileNet's expand -> depthwise -> project convs pass
    bytes along. Runs after layout: which convs are integer ones follows from their layout
    (backend.int8_conv: the convs that can write bytes; backend.int8_input_image: those that read them;
    backend.int8_residual: those whose residual can be bytes)."""
    users, outputs = graph.users(), {id(v) for v in graph.outputs}
    readers = functools.partial(_readers, users)
    for m in graph.nodes:           # ResNet's stem -> max pool -> the first block's convs: bytes all the way
        p = m.inputs[0].producer if backend.int8_pool(m) and not m.attrs.get("int8_in") else None
        y = m.outputs[0]
        if (p is None or not backend.int8_conv(p) or p.attrs.get("int8_out") is not None
                or len(readers(m.inputs[0])) != 1 or {id(m.inputs[0]), id(y)} & outputs):
            continue
        link = _byte_readers(y, readers(y), backend)
        if link is None or link[0] != [*y.shape[2:], 0, 0]:       # the pool writes the map itself
            continue
        p.attrs.update(int8_out=[*m.inputs[0].shape[2:], 0, 0], int8_out_range=link[1])
        m.attrs.update(int8_in=1)
        _link(m, *link)
    for p in graph.nodes:
        if not backend.int8_conv(p) or p.attrs.get("int8_out") is not None or id(p.outputs[0]) in outputs:
            continue
        link = _byte_readers(p.outputs[0], readers(p.outputs[0]), backend)
        if link is not None:
            _link(p, *link)
    return graph


def _readers(users, v):
    """The nodes that read v (graph.users()), each once, whichever of its inputs v is."""
    return list({id(n): n for n in users.get(id(v), [])}.values())


def _link(p, image, rng, inputs, residuals):
    p.attrs.update(int8_out=image, int8_out_range=rng)
    for q in inputs:
        q.attrs["int8_in"] = 1
    for q in residuals:
        q.attrs["int8_res_range"] = rng


def _byte_readers(y, readers, backend):
    """(image, range, input readers, residual readers) where every reader of y can take it as bytes
    (link_int8_convs), else None."""
    def reads(q, i):                     # y at input i of q, and nowhere else in it
        return len(q.inputs) > i and q.inputs[i] is y and sum(v is y for v in q.inputs) == 1
    inputs = [q for q in readers if reads(q, 0) and q.attrs.get("int8_range") is not None]
    residuals = [q for q in readers if reads(q, 3) and backend.int8_residual(q)]
    if len(inputs) + len(residuals) != len(readers):
        return None
    if not inputs:          # read only as residuals (a projection's output): over the range they saw
        seen = [q.attrs.get("int8_res_seen") for q in residuals]
        if not residuals or None in seen or y.type.rank != 4:
            return None
        return [*y.shape[2:], 0, 0], [min(r[0] for r in seen), max(r[1] for r in seen)], [], residuals
    rng, image = list(inputs[0].attrs["int8_range"]), backend.int8_input_image(inputs[0])
    if image is None or any(list(q.attrs["int8_range"]) != rng or backend.int8_input_image(q) != image for q in inputs):
        return None
    # the bytes take the floats' place in the memory plan: they must fit (a 3x3 conv's padded 1x1 map
    # does not); a residual reads the map itself
    if image[0] * image[1] > 4 * int(np.prod(y.shape[2:])) or (residuals and image != [*y.shape[2:], 0, 0]):
        return None
    return image, rng, inputs, residuals


def link_bf16_convs(graph, backend):
    """bf16 convs that feed bf16 convs bf16 maps: where a conv's output is read only by convs in bf16
    products (backend.bf16_conv), as their input or their residual, and is no graph output, the producer
    stores it in bf16 (bf16_out) and its readers read it so (bf16_in, bf16_res). A reader rounds its input
    to bf16 anyway, so its products are unchanged; a residual carries bf16's rounding. A ResNet block's
    output (3.2 MB of floats at 56x56 x 256) is written once and read by the next block's first conv,
    its projection and its last conv's residual: half the bytes each time. Runs after layout, where a
    target multiplies in bf16 (the pipeline's bf16_convs)."""
    users, outputs = graph.users(), {id(v) for v in graph.outputs}
    for p in graph.nodes:
        y = p.outputs[0]
        if not backend.bf16_conv(p) or id(y) in outputs:
            continue
        readers = _readers(users, y)
        slots = [[i for i, v in enumerate(q.inputs) if v is y] for q in readers]
        # each reader a bf16 conv taking y once, as its input (0) or its residual (3)
        if not readers or any(not backend.bf16_conv(q) or s not in ([0], [3]) for q, s in zip(readers, slots)):
            continue
        p.attrs["bf16_out"] = 1
        for q, s in zip(readers, slots):
            q.attrs["bf16_in" if s == [0] else "bf16_res"] = 1
    return graph


# the instruction each kind of dot product runs on: vector products, or AMX tiles where the target has them
# (kernels/amx.h; driver.build_graph picks)
DOT_INSTRUCTIONS = {"bf16": "vdpbf16ps", "int8": "vpdpbusd"}
AMX_INSTRUCTIONS = {"bf16": "AMX tdpbf16ps", "int8": "AMX tdpbusd"}


def describe(node, dot=None, instructions=DOT_INSTRUCTIONS) -> str | None:
    """The precision a node computes in, as precision_summary counts it (None: not a weighted op);
    dot(node): the dot products the target runs it on, "bf16", "int8" (VNNI), "int8_avx2", "int8_tiles",
    "bytes_depthwise" or None; instructions: DOT_INSTRUCTIONS or AMX_INSTRUCTIONS."""
    kind = dot(node) if dot is not None else None
    if node.op == "matmul_q":
        w = node.inputs[1]
        if node.attrs["bits"] == 16:
            if kind == "bf16":
                return f"bf16 weights and activations, fp32 sums ({instructions['bf16']})"
            return "fp16 weights" if w.dtype == "float16" else "bf16 weights"
        fmt = f"int{node.attrs['bits']} weights"
        if node.attrs.get("int8_range") is not None:
            return fmt + ", uint8 activations on the model's grid (integer dot)"
        if kind == "int8_tiles":
            return fmt + f", uint8 activations, each row over its own range ({instructions['int8']})"
        return fmt + (", int8 activations (integer dot)" if node.attrs.get("act_block") else ", fp32 activations")
    if node.op == "conv" and kind == "bf16":
        return f"bf16 input and filters, fp32 sums ({instructions['bf16']})"
    if node.op == "conv" and kind == "int8":
        return f"int8 filters, uint8 input, int32 sums ({instructions['int8']})"
    if node.op == "conv" and kind == "int8_avx2":
        return "int8 filters, 7-bit input, int32 sums (vpmaddubsw)"
    if node.op == "conv" and kind == "bytes_depthwise":
        return "uint8 input widened, fp32 filters and sums (depthwise)"
    if node.op in ("matmul", "matmul_fused", "conv", "grouped_matmul", "attention", "expert_matmul"):
        return "fp32"
    return None


def precision_summary(graph, dot=None, instructions=DOT_INSTRUCTIONS) -> dict:
    """{"<op>: <format>": count} over the weighted ops (matmuls, convs, attention) of an optimised graph."""
    counts = Counter(f"{'matmul' if n.op.startswith('matmul') else n.op}: {d}"
                     for n in nodes_within(graph) if (d := describe(n, dot, instructions)) is not None)
    return dict(sorted(counts.items()))

