"""A graph output that is a reshape of an intermediate has that intermediate written into the output
(passes/memplan.reshaped_outputs), no copy; against the reference interpreter, with the cases it must leave
to a copy (the intermediate read by another node, or itself an output, the reshape given as two outputs,
a reshape of an input), a symbolic batch, and a group norm as torch writes it against eager."""
import numpy as np
import pytest

from cuvil.ir import dims
from cuvil.ir.graph import Graph, TensorType, Value
from cuvil.passes.memplan import reshaped_outputs

from .util import check_graph


def _graph(case):
    g = Graph()
    n = dims.Sym("n")
    x = Value(TensorType((n, 6, 10), "float32"), "x")
    g.symbols["n"] = (1, 4)
    g.inputs = [x]
    h = g.add("tanh", [g.add("mul", [x, g.const(np.float32(0.7))])])
    y = g.add("reshape", [h], {"shape": (n, 3, 20)})
    outputs = {"written in place": lambda: [y], "read again": lambda: [y, g.add("neg", [h])],
               "source is an output": lambda: [y, h], "reshape given twice": lambda: [y, y],
               "reshape of the input": lambda: [y, g.add("reshape", [x], {"shape": (n, 60)})]}
    g.outputs = outputs[case]()
    return g


@pytest.mark.parametrize("case", ["written in place", "read again", "source is an output", "reshape given twice",
                                  "reshape of the input"])
def test_reshaped_output_is_written_in_place_where_it_can_be(case):
    g = _graph(case)
    assert [(a.name, b.name) for a, b in reshaped_outputs(g)] == (
        [(g.outputs[0].producer.inputs[0].name, g.outputs[0].name)] if case in ("written in place", "reshape of the input")
        else [])
    rng = np.random.default_rng(0)
    for n in (1, 3):
        cm = check_graph(_graph(case), [rng.standard_normal((n, 6, 10)).astype(np.float32)], rtol=1e-6, atol=1e-6)
    # the reshape of the input is a copy either way (an input is the caller's), the first output none there
    copies = cm.c_source.count("memcpy(")
    assert copies == 0 if case == "written in place" else copies == 1 if case == "reshape of the input" else copies >= 1


def test_group_norm_writes_its_output_in_place():
    torch = pytest.importorskip("torch", reason="the group norm is torch's")
    import cuvil
    m = torch.nn.GroupNorm(4, 16).eval()
    x = torch.randn(2, 16, 9, 7)
    cm = cuvil.compile(m, (x,))
    assert "memcpy(" not in cm.c_source
    with torch.no_grad():
        np.testing.assert_allclose(cm(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-5)
