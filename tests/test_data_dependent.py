"""Outputs whose size depends on the input's values (frontend/aten_dynamic.py, the bind_dim op): nonzero,
boolean-mask indexing, masked_select, unique and unique_consecutive, and ops after them that run over
the computed size, against torch eager on inputs that give every count from none to all; the saved
artifact returns each output at the size the run computed; the reference interpreter agrees."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cases compile torch modules and compare with eager")
from torch.utils._pytree import tree_leaves  # noqa: E402


class _Selections(torch.nn.Module):
    def forward(self, x, keep):
        picked = x[x > 0]
        vals, inverse, counts = torch.unique(torch.round(x * 2), return_inverse=True, return_counts=True)
        runs, run_counts = torch.unique_consecutive(keep.long(), return_counts=True)
        return (picked * 2 + 1, picked.sum(), torch.nonzero(x > 0.5), torch.argwhere(keep),
                vals, inverse, counts, runs, run_counts, torch.masked_select(x, keep.unsqueeze(0)),
                x[:, keep].mean(dim=1))


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 5, generator=g), torch.rand(5, generator=g) > 0.5


def _check(got, want):
    got, want = tree_leaves(got), tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = torch.as_tensor(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_selections_match_eager_for_every_count(tmp_path):
    import cuvil
    m = _Selections()
    cm = cuvil.compile(m, _inputs(0), cache_dir=str(tmp_path / "c"))
    cases = [_inputs(s) for s in range(1, 6)]
    cases += [(-torch.ones(3, 5), torch.zeros(5, dtype=torch.bool)),        # nothing selected
              (torch.ones(3, 5), torch.ones(5, dtype=torch.bool)),          # everything selected
              (torch.zeros(3, 5), torch.tensor([True, False, True, False, True]))]
    for x, keep in cases:
        _check(cm(x, keep), m(x, keep))
    cm.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    manifest = json.loads((tmp_path / "m.cuvil" / "manifest.json").read_text())
    assert manifest["data_dims"] and all(d in manifest["symbols"] for d in manifest["data_dims"])
    x, keep = cases[0]
    got = loaded.run(x.numpy(), keep.numpy())
    _check([torch.as_tensor(a) for a in got], m(x, keep))


def test_out_buffers_are_refused_for_data_sized_outputs(tmp_path):
    import cuvil
    from cuvil.errors import ShapeError

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nonzero(x)
    cm = cuvil.compile(M(), (torch.randn(4),), cache_dir=str(tmp_path))
    with pytest.raises(ShapeError, match="sized by the data"):
        cm.run(np.ones(4, np.float32), out=[np.empty((4, 1), np.int64)])


def test_an_edited_data_dims_entry_is_caught(tmp_path):
    """Dropping data_dims from the manifest would hand back the padded buffers: the signature check
    the library makes refuses the artifact instead."""
    import cuvil
    from cuvil.errors import ArtifactError

    class M(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]
    cuvil.compile(M(), (torch.randn(6),), cache_dir=str(tmp_path / "c")).save(tmp_path / "m.cuvil")
    path = tmp_path / "m.cuvil" / "manifest.json"
    m = json.loads(path.read_text())
    del m["data_dims"]
    path.write_text(json.dumps(m))
    with pytest.raises(ArtifactError):
        cuvil.load(tmp_path / "m.cuvil", verify_checksum=False)


def test_bind_dim_in_the_reference_interpreter():
    """A hand-built graph: the interpreter binds the symbol from the count and a later reshape reads it;
    the compiled code agrees on shapes and values."""
    from cuvil.ir import dims as D
    from cuvil.ir.graph import Graph, TensorType, Value
    from tests.util import check_graph
    g = Graph(symbols={"n": (0, 6)})
    x, count = Value(TensorType((6, 2), "float32"), name="x"), Value(TensorType((), "int64"), name="count")
    g.inputs, g.input_names = [x, count], ["x", "count"]
    front = g.add("bind_dim", [x, count], {"symbol": "n", "axis": 0})
    flat = g.add("reshape", [front], {"shape": [D.as_dim(D.Sym("n") * 2)]})
    g.outputs = [g.add("mul", [flat, g.const(np.float32(3))]), g.add("reduce_sum", [front], {"axes": [0],
                                                                                           "keepdims": False})]
    xs = np.arange(12, dtype=np.float32).reshape(6, 2)
    cm = check_graph(g, [xs, np.array(4, np.int64)])
    got = cm.run(xs, np.array(2, np.int64))
    np.testing.assert_allclose(got[0], xs[:2].reshape(-1) * 3)
    with pytest.raises(Exception, match="outside"):
        cm.run(xs, np.array(7, np.int64))


def test_python_numbers_returned_as_numbers(tmp_path):
    """x.item() (also used inside the graph) and a size come back as python numbers, as eager returns
    them; run() keeps them as 0-d arrays."""
    import cuvil

    class M(torch.nn.Module):
        def forward(self, x):
            return x.sum().item(), x * x.max().item(), x.shape[0]
    x = torch.randn(5)
    cm = cuvil.compile(M(), (x,), cache_dir=str(tmp_path / "c"))
    y = torch.randn(5)
    got, want = cm(y), M()(y)
    assert isinstance(got[0], float) and got[0] == pytest.approx(want[0], rel=1e-6)
    torch.testing.assert_close(got[1], want[1])
    assert got[2] == 5 and isinstance(got[2], int)
    cm.save(tmp_path / "m.cuvil")
    loaded = cuvil.load(tmp_path / "m.cuvil")
    assert isinstance(loaded(y)[0], float)
    assert loaded.run(y.numpy())[0].shape == ()


class _SizeOnly(torch.nn.Module):
    def forward(self, x):
        return torch.unique(x.round()).shape[0], (x > 0).sum().item()


def test_a_computed_size_used_only_as_a_number(tmp_path):
    """len(unique(x)) and an int x.item() returned: the count is computed (not the bound)."""
    import cuvil
    cm = cuvil.compile(_SizeOnly(), (torch.randn(6),), cache_dir=str(tmp_path))
    for x in (torch.tensor([1.0, 1, 2, 3, 3, 3]), torch.tensor([-1.0, -2, -3, -4, -5, -6])):
        assert cm(x) == _SizeOnly()(x)


class _Shrinks(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape[0] - x[x > 0].shape[0])


class _ItemAsSize(torch.nn.Module):
    def forward(self, x):
        return x[:(x > 0).sum().item()]


@pytest.mark.parametrize("model, message", [(_Shrinks, "shrinks as the data-dependent size"),
                                            (_ItemAsSize, "depends on the input's values")])
def test_sizes_that_cannot_be_planned_are_refused(tmp_path, model, message):
    """A size that falls as a computed one grows would be planned too small; a value used as a size (not
    one of the data-sized ops) has no computed bound: both are clean refusals."""
    import cuvil
    with pytest.raises(cuvil.UnsupportedOpError, match=message):
        cuvil.compile(model(), (torch.randn(6),), cache_dir=str(tmp_path))


@pytest.mark.parametrize("axis,sorted_", [(0, 1), (1, 1), (-1, 0), (2, 0)])
def test_onnx_unique_along_an_axis(axis, sorted_):
    """ONNX Unique over slices (compared element by element: a stable sort per element of a slice),
    sorted or by first occurrence, against ONNX Runtime: the unique slices, first indices, inverse
    indices and counts, several inputs through one artifact (the count differs per input)."""
    pytest.importorskip("onnx", reason="the model is built with onnx (a dev requirement)")
    ort = pytest.importorskip("onnxruntime", reason="the oracle is onnxruntime (a dev requirement)")
    import cuvil
    from onnx import TensorProto as T
    from onnx import helper as h
    v = h.make_tensor_value_info
    g = h.make_graph([h.make_node("Unique", ["x"], ["y", "i", "inv", "n"], axis=axis, sorted=sorted_)], "m",
                     [v("x", T.FLOAT, [4, 6, 3])],
                     [v("y", T.FLOAT, None), v("i", T.INT64, None), v("inv", T.INT64, None), v("n", T.INT64, None)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    cm, sess = cuvil.compile(model), ort.InferenceSession(model)
    rng = np.random.default_rng(axis + 5)
    for hi in (1, 2, 5):                          # few distinct values: many equal slices
        x = rng.integers(0, hi, (4, 6, 3)).astype(np.float32)
        for got, want in zip(cm.run(x), sess.run(None, {"x": x})):
            np.testing.assert_array_equal(got, want)
