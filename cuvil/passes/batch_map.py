"""Run a batched network image by image: the longest prefix of the graph whose nodes treat the images
of dim 0 independently becomes one batch_map node (ir/ops/control.py) whose body is that prefix at
batch 1. The C code runs the body once per image, or one image per thread (codegen/c/lower_batch_map.py).

Why: at batch 8 a 224-px CNN's maps are 8x those of batch 1 and leave L2 (and L3) between one layer
and the next; image by image they stay. Per-node profiles on Zen 5, one thread, 8 x batch 1 against
batch 8: ResNet-50 231 against 263 ms (its stem's output is 3.2 MB an image, 25 MB at batch 8: the
max pool after it took 3x its batch-1 time per image, reading from DRAM), and every network of
benchmarks/cnn_models ran faster at 8 x batch 1.

Only batches whose largest map in the prefix is MIN_BYTES or more are split (smaller ones stay in L2
either way, and an image's GEMMs are smaller than the batch's), and only networks with a conv there: a transformer's matmuls read their weights once
for all rows of a batch, and an image's rows are few. The prefix stops at the first node that is not
in SEPARABLE (or pointwise), couples images (an axis over dim 0; a rank-2 matmul: the classifier
reads its weights once for the whole batch), or takes a batched input as a weight, and never between
two integer convs that pass bytes."""
from __future__ import annotations

from ..errors import GraphError
from ..ir.graph import Graph, Node, Value
from ..ir.ops import REGISTRY
from ..ir.types import TensorType
from .cleanup import replace_uses
from .memplan import value_bytes

POINTWISE_KINDS = ("unary", "binary", "where", "cast", "fused")
MIN_BYTES = 1 << 20      # the batch's largest map: at least an L2 of today's cores (1-2 MB)


def _axis_free(key):
    """The op's axis (or axes) attribute leaves dim 0 alone."""
    def check(node):
        a = node.attrs.get(key)
        axes = a if isinstance(a, (list, tuple)) else [a]
        rank = len(node.inputs[0].type.shape)
        return a is not None and all(isinstance(x, int) and x % rank != 0 for x in axes)
    return check


def _perm_keeps_batch(node):
    return list(node.attrs["perm"])[:1] == [0]


def _matmul_per_image(node):
    """An image's rows times a weight: A of rank 3 or more ([N, rows, K], [N, H, W, C])."""
    return len(node.inputs[0].type.shape) >= 3


# op -> (input positions that must be constants, attribute check or None); pointwise kinds take
# (), None with every batched input of the output's rank (broadcasting aligns dims from the right)
SEPARABLE = {
    "conv": ((1, 2), None),
    "max_pool": ((), None),
    "avg_pool": ((), None),
    "relayout": ((), None),
    "reduce_mean": ((), _axis_free("axes")),
    "reduce_sum": ((), _axis_free("axes")),
    "reduce_max": ((), _axis_free("axes")),
    "reduce_min": ((), _axis_free("axes")),
    "softmax": ((), _axis_free("axis")),
    "log_softmax": ((), _axis_free("axis")),
    "layer_norm": ((1, 2), _axis_free("axis")),
    "rms_norm": ((1,), _axis_free("axis")),
    "transpose": ((), _perm_keeps_batch),
    "slice": ((), _axis_free("axis")),
    "concat": ((), _axis_free("axis")),
    "reshape": ((), None),        # batch in and out (as every node's): row-major, each image the same run
    "matmul": ((1,), _matmul_per_image),
    "matmul_fused": ((1, 2), _matmul_per_image),
}


def _batched(v, n) -> bool:
    """v carries the images in dim 0 (n a number, or a symbol: the very same symbol)."""
    return v is not None and not v.is_const and len(v.type.shape) >= 1 and v.type.shape[0] == n


def separable(node, n) -> bool:
    """Whether `node` computes image i of its outputs from image i of its inputs alone (batch n)."""
    pointwise = REGISTRY[node.op].kind in POINTWISE_KINDS
    if node.op not in SEPARABLE and not pointwise:
        return False
    const_at, check = SEPARABLE.get(node.op, ((), None))
    rank = len(node.outputs[0].type.shape)
    for i, v in enumerate(node.inputs):
        if v is None or v.is_const:
            continue
        if i in const_at or not _batched(v, n) or (pointwise and len(v.type.shape) != rank):
            return False
    return all(_batched(o, n) for o in node.outputs) and (check is None or check(node))


def _like(v: Value, batch) -> Value:
    """A new value of v's type and layout with `batch` images."""
    out = Value(TensorType((batch, *v.type.shape[1:]), v.type.dtype))
    out.layout = v.layout
    return out


def _per_image(v: Value) -> Value:
    return _like(v, 1)


def _body(prefix, inputs, outputs, symbols):
    """The prefix at batch 1, as a graph of its own (constants shared with the outer graph)."""
    img = {id(v): _per_image(v) for v in inputs}
    nodes = []
    for nd in prefix:
        attrs = dict(nd.attrs)
        if nd.op == "reshape":
            attrs["shape"] = [1, *attrs["shape"][1:]]
        outs = [_per_image(o) for o in nd.outputs]
        img.update((id(o), p) for o, p in zip(nd.outputs, outs))
        nodes.append(Node(nd.op, [img.get(id(i), i) if i is not None else None for i in nd.inputs], attrs, outs,
                          nd.loc))
    return Graph(inputs=[img[id(v)] for v in inputs], outputs=[img[id(o)] for o in outputs], nodes=nodes,
                 symbols=dict(symbols))


def _outputs(graph, prefix):
    """The prefix's values read after it (or returned)."""
    rest = graph.nodes[len(prefix):]
    read_after = {id(i) for nd in rest for i in nd.inputs if i is not None} | {id(o) for o in graph.outputs}
    return [o for nd in prefix for o in nd.outputs if id(o) in read_after]


def _cut_between_linked_convs(graph, prefix):
    """(prefix, its outputs) with no output that an integer conv stores as the next one's padded byte
    image (passes/quantize.link_int8_convs: int8_out; its place holds no image-sized run of floats):
    the prefix ends before such a conv, so both convs of a linked pair stay on one side."""
    while True:
        outputs = _outputs(graph, prefix)
        linked = {id(o) for o in outputs if o.producer is not None and o.producer.attrs.get("int8_out") is not None}
        cut = next((i for i, nd in enumerate(prefix) if any(id(o) in linked for o in nd.outputs)), None)
        if cut is None:
            return prefix, outputs
        prefix = prefix[:cut]


def batch_dim(graph):
    """The first input's dim 0, where it can hold two images or more: a number, or a dynamic dim's
    symbol (the C code then loops over as many images as the call brings)."""
    n = graph.inputs[0].type.shape[0] if graph.inputs and graph.inputs[0].type.shape else None
    if isinstance(n, int):
        return n if n >= 2 else None
    if getattr(n, "is_Symbol", False) and graph.symbols.get(n.name, (0, 0))[1] >= 2:
        return n
    return None


def run(graph):
    n = batch_dim(graph)
    if n is None:
        return graph
    prefix = []
    for nd in graph.nodes:
        if not separable(nd, n):
            break
        prefix.append(nd)
    prefix, outputs = _cut_between_linked_convs(graph, prefix)
    if not outputs or not any(nd.op == "conv" for nd in prefix) or \
            max(value_bytes(o, graph.symbols) for nd in prefix for o in nd.outputs) < MIN_BYTES:
        return graph
    rest = graph.nodes[len(prefix):]
    made = {id(o) for nd in prefix for o in nd.outputs}
    inputs = list({id(v): v for nd in prefix for v in nd.inputs
                   if v is not None and not v.is_const and id(v) not in made}.values())     # first use first
    body = _body(prefix, inputs, outputs, graph.symbols)
    try:
        body.verify()
    except GraphError:       # an op whose attributes still name the batch: left batched
        return graph
    outer = [_like(o, n) for o in outputs]
    graph.nodes = [Node("batch_map", inputs, {"body_graph": body}, outer)] + rest
    return replace_uses(graph, {id(o): v for o, v in zip(outputs, outer)})
