"""Concats whose producers write their inputs in place (passes/memplan.in_place_concats), against the
reference interpreter: the cases it takes (one image, NCHW and channel-blocked, inputs read again after
the concat), the cases it must leave to a copy (more than one image, offsets off the arena's alignment,
an input that is a graph output, read by a second concat or given twice, an output that is the graph's),
and random graphs of convs and concats."""
import numpy as np
import pytest

from cuvil.ir.graph import Graph, TensorType, Value

from .util import check_graph

IN_PLACE = "its inputs were written in place"


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv(g, rng, x, cout, k=1, act="relu"):
    cin = x.type.shape[1]
    y = g.add("conv", [x, g.const(f32(rng, cout, cin, k, k) * 0.3), g.const(f32(rng, cout))],
              {"strides": [1, 1], "pads": [(k // 2, k // 2), (k // 2, k // 2)]})
    return g.add(act, [y]) if act else y


def fire(batch, cin, squeeze, expand, hw):
    """SqueezeNet's fire module between two convs (so a blocked layout has a region to take)."""
    rng = np.random.default_rng(cin + expand)
    g = Graph()
    x = Value(TensorType((batch, cin, hw, hw), "float32"), "x")
    g.inputs = [x]
    s = conv(g, rng, conv(g, rng, x, cin), squeeze)
    y = g.add("concat", [conv(g, rng, s, expand), conv(g, rng, s, expand, 3)], {"axis": 1})
    g.outputs = [conv(g, rng, y, 16, act=None)]
    return g, [f32(rng, batch, cin, hw, hw)]


@pytest.mark.parametrize("cin,squeeze,expand,hw", [(64, 16, 64, 13), (48, 12, 58, 28), (32, 8, 24, 8)])
def test_fire_module_concat_in_place_at_one_image(cin, squeeze, expand, hw):
    """64 -> 2 x 64: channel blocks; 58 at 28x28 and 24 at 8x8: NCHW runs of 181888 and 6144 bytes,
    both multiples of 64. Two images: each input is two runs of the output, so a copy."""
    for batch, placed in ((1, 1), (2, 0)):
        g, inputs = fire(batch, cin, squeeze, expand, hw)
        cm = check_graph(g, inputs)
        assert cm.c_source.count(IN_PLACE) == placed, (batch, cm.c_source.count(IN_PLACE))


def test_inputs_read_again_after_the_concat_stay_live():
    """a and b are read after the concat's reader (their bytes are the concat's): nothing planned after
    the concat may take their place while they are still read."""
    rng = np.random.default_rng(1)
    g = Graph()
    x = Value(TensorType((1, 32, 10, 10), "float32"), "x")
    g.inputs = [x]
    a, b = conv(g, rng, x, 32), conv(g, rng, x, 16, 3)
    y = conv(g, rng, g.add("concat", [a, b], {"axis": 1}), 48)
    z = conv(g, rng, conv(g, rng, y, 64), 32)                      # new buffers while a and b live on
    g.outputs = [g.add("add", [z, g.add("relu", [a])]), g.add("mul", [b, b])]
    cm = check_graph(g, [f32(rng, 1, 32, 10, 10)])
    assert cm.c_source.count(IN_PLACE) == 1


def _case(kind):
    rng = np.random.default_rng(2)
    g = Graph()
    c, hw = (3, 5) if kind == "misaligned" else (16, 8)
    x = Value(TensorType((1, c, hw, hw), "float32"), "x")
    g.inputs = [x]
    a, b = conv(g, rng, x, c), conv(g, rng, x, c, 3)
    if kind == "twice":
        g.outputs = [conv(g, rng, g.add("concat", [a, a, b], {"axis": 1}), 8)]
    elif kind == "two_concats":
        y1, y2 = g.add("concat", [a, b], {"axis": 1}), g.add("concat", [b, a], {"axis": 1})
        g.outputs = [g.add("add", [conv(g, rng, y1, 8), conv(g, rng, y2, 8)])]
    elif kind == "graph_output_input":
        g.outputs = [conv(g, rng, g.add("concat", [a, b], {"axis": 1}), 8), a]
    elif kind == "graph_output":
        g.outputs = [g.add("concat", [a, b], {"axis": 1})]
    else:
        g.outputs = [conv(g, rng, g.add("concat", [a, b], {"axis": 1}), 8)]
    return g, [f32(rng, 1, c, hw, hw)]


@pytest.mark.parametrize("kind,placed", [("misaligned", 0), ("twice", 0), ("two_concats", 0),
                                         ("graph_output_input", 0), ("graph_output", 0), ("plain", 1)])
def test_concats_left_to_a_copy(kind, placed):
    """Where an input's place would be off the alignment (3 x 5 x 5 floats), taken twice, shared by two
    concats (neither takes them), a graph output, or the concat is one: a copy."""
    g, inputs = _case(kind)
    cm = check_graph(g, inputs)
    assert cm.c_source.count(IN_PLACE) == placed


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_of_convs_and_concats(seed):
    """Fuzz: chains of convs whose outputs are concatenated in random groups (some read again later,
    some by two concats, some returned), at channel counts that fill blocks and counts that do not."""
    rng = np.random.default_rng(100 + seed)
    g = Graph()
    x = Value(TensorType((1, 16, 7, 7), "float32"), "x")
    g.inputs = [x]
    pool = [x]
    for _ in range(int(rng.integers(4, 8))):
        if len(pool) > 2 and rng.random() < 0.4:
            picks = rng.choice(len(pool), size=int(rng.integers(2, min(4, len(pool)) + 1)), replace=False)
            v = g.add("concat", [pool[i] for i in picks], {"axis": 1})
        else:
            src = pool[int(rng.integers(len(pool)))]
            v = conv(g, rng, src, int(rng.choice([8, 16, 24, 32])), int(rng.choice([1, 3])))
        pool.append(v)
    outs = [pool[-1]] + ([pool[int(rng.integers(1, len(pool)))]] if rng.random() < 0.5 else [])
    g.outputs = [conv(g, rng, o, 8, act=None) if o.type.shape[1] > 64 else o for o in outs]
    check_graph(g, [f32(rng, 1, 16, 7, 7)])


def test_buffers_sized_by_a_bound_on_two_symbols_product():
    """dims.numel_upper_bound with Graph.symbol_products: a count whose terms grow with both symbols is
    bounded at the corners of a <= 8, b <= 64, a * b <= 64 (each term a^i b^j is largest at one of
    (8, 8) and (1, 64)); a symbol alone keeps its own bound; a negative term keeps the plain bound."""
    from cuvil.ir import dims as D
    a, b, c = D.Sym("a"), D.Sym("b"), D.Sym("c")
    bounds, prods = {"a": (1, 8), "b": (1, 64), "c": (1, 3)}, [("a", "b", 64)]
    assert D.numel_upper_bound([a, b, 100], bounds, prods) == 64 * 100
    assert D.numel_upper_bound([a, b, 100], bounds) == 8 * 64 * 100
    assert D.numel_upper_bound([a, 5], bounds, prods) == 40
    assert D.numel_upper_bound([a, b * b], bounds, prods) == 64 * 64            # (1, 64): 4096 > (8, 8): 512
    assert D.numel_upper_bound([a * a, b], bounds, prods) == 8 * 8 * 8           # (8, 8): 512 > (1, 64): 64
    assert D.numel_upper_bound([a, b + 1, c], bounds, prods) == (64 + 8) * 3      # terms a*b*c and a*c
    assert D.numel_upper_bound([a, b - 1], bounds, prods) == 8 * 63               # a negative term: plain
    assert D.numel_upper_bound([a, b], bounds, [("a", "b", 10 ** 6)]) == 8 * 64   # a loose bound changes nothing
    # brute force over every (a, b) the bound allows: never above the computed bound
    for shape in ([a, b, b], [a, a, b], [a, b + 1], [a * b + a, 2]):
        got = D.numel_upper_bound(shape, bounds, prods)
        worst = max(D.evaluate(D.numel(shape), {"a": x, "b": y, "c": 3})
                    for x in range(1, 9) for y in range(1, 65) if x * y <= 64)
        assert worst <= got <= D.numel_upper_bound(shape, bounds)
