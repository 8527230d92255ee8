"""Text from a model file never reaches generated C unescaped (issue 37, defect 1): the escaping
functions against the C compiler itself, and whole ONNX models whose names attack the generator."""
from __future__ import annotations

import random
import subprocess

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cuvil
from cuvil.build import toolchain
from cuvil.codegen.c import cstr

NASTY = ["*/ system(\"touch /tmp/cuvil_pwned\"); /*", "// trailing backslash \\", "line\nbreak\r\n",
         'quote " and \' and \\"', "??/ trigraph ??= ??(", "nul\x00byte", "bad utf8 \udcff\udc80",
         "%s%n%lld percent", "é ü 漢字 \u202e rtl", "", "*", "/", "\\", "?", "%"]


def _random_strings(n, seed=0):
    rng = random.Random(seed)
    alphabet = [chr(c) for c in range(0, 128)] + ["é", "漢", "\u202e", "\udcff", "*/", "??/", "\\\n"]
    return [("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))) for _ in range(n)]


def _code_only(src: str) -> str:
    """C source without its comments and string/char literals (a small lexer: enough for model.c)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            i = src.index("*/", i + 2) + 2
        elif src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src[i] in "\"'":
            q, i = src[i], i + 1
            while src[i] != q:
                i += 2 if src[i] == "\\" else 1
            i += 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def test_escaped_text_round_trips_through_the_c_compiler(tmp_path):
    """Each string goes into a comment, a string literal and a printf format; the program prints the
    literal's bytes and the formatted text. What comes out must be exactly the text's UTF-8 bytes,
    so nothing ended a comment, split a literal or added a printf conversion."""
    texts = NASTY + _random_strings(300)
    lines = ["#include <stdio.h>", "#include <string.h>", "int main(void) {"]
    for t in texts:
        lines.append(f"  /* {cstr.comment(t)} */")
        lines.append(f"  {{ const char *s = {cstr.string(t)}; for (size_t i = 0; i < {len(cstr._clip(t).encode('utf-8', 'surrogatepass'))}; i++)"
                     " printf(\"%02x\", (unsigned char)s[i]); printf(\"|\"); }")
        lines.append(f"  {{ char b[4096]; int k = snprintf(b, sizeof b, {cstr.format_string(t)});"
                     " for (int i = 0; i < k; i++) printf(\"%02x\", (unsigned char)b[i]); printf(\"\\n\"); }")
    lines.append("  return 0;\n}")
    src = tmp_path / "t.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "t"
    subprocess.run([toolchain.find_compiler(), "-std=c99", "-trigraphs", "-Wall", "-Werror", "-Wno-trigraphs", "-Wno-format-contains-nul", "-Wno-format-zero-length",
                    "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True).stdout.split(b"\n")[:-1]
    assert len(out) == len(texts)
    for t, line in zip(texts, out):
        want = cstr._clip(t).encode("utf-8", "surrogatepass")
        hexed, printed = line.split(b"|", 1)
        assert bytes.fromhex(hexed.decode()) == want, t
        assert bytes.fromhex(printed.decode()) == want.split(b"\0")[0], t   # a format ends at a NUL, as C strings do


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)))
def test_escapes_hold_no_c_syntax(text):
    c = cstr.comment(text)
    assert "*/" not in c and "\\" not in c and "?" not in c and "\n" not in c and c.isascii() and "/" not in c
    s = cstr.string(text)[1:-1]
    assert '"' not in s and "?" not in s and s.isascii() and "\n" not in s
    f = cstr.format_string(text)[1:-1]
    assert "%" not in f.replace("%%", "")


@pytest.mark.parametrize("name", ["S_x; system(\"id\")", "a b", "9lives", "", "é", "x" * 200, None, 3])
def test_identifiers_are_never_copied_from_text(name):
    with pytest.raises(cuvil.CompileError):
        cstr.ident(name)
    assert cstr.ident("batch_size") == "batch_size"


def test_hostile_onnx_names_compile_and_run_correctly(tmp_path):
    """A model whose every name is an attack: node, input, output and graph names, dim_params and doc
    strings. It must compile, run to the right answer, and run nothing of its author's."""
    onnx = pytest.importorskip("onnx", reason="builds an ONNX model with hostile names")
    ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the oracle")
    from onnx import TensorProto, helper
    canary = tmp_path / "pwned"
    attack = f'*/ system("touch {canary}"); /*'
    names = [attack, "//x\\", "a\nb", 'q"uote', "??/", "n\x00ul", "%n%s", "é漢\u202e"]
    x_name, y_name = names[0], names[1]
    nodes, prev = [], x_name
    for i, n in enumerate(names):
        out = y_name if i == len(names) - 1 else f"t{i}{n}"
        op = "Relu" if i % 2 else "Neg"
        nodes.append(helper.make_node(op, [prev], [out], name=n, doc_string=n))
        prev = out
    x = helper.make_tensor_value_info(x_name, TensorProto.FLOAT, [names[6], 3])
    y = helper.make_tensor_value_info(y_name, TensorProto.FLOAT, [names[6], 3])
    g = helper.make_graph(nodes, attack, [x], [y], doc_string=attack)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], doc_string=attack)
    data = model.SerializeToString()
    feed = np.array([[-1, 2, -3], [4, -5, 6], [0.5, -0.5, 7]], np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {x_name: feed})[0]
    for level in (0, 2):                    # level 0 keeps one node (and one comment) per ONNX node
        cm = cuvil.compile(data, dynamic_shapes={x_name: {0: ("batch", 1, 8)}}, fusion_level=level)
        assert "system" not in _code_only(cm.c_source)     # only ever inside comments and literals
        np.testing.assert_allclose(cm.run(feed)[0], want, rtol=1e-6)
        assert not canary.exists()
        with pytest.raises(cuvil.ShapeError):
            cm.run(np.zeros((9, 3), np.float32))      # the message names the hostile dim, escaped
        assert not canary.exists()


NAME = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=30)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(node=NAME, x=NAME, y=NAME, dim=NAME, doc=st.text(max_size=50))
def test_fuzz_names_through_the_whole_compiler(node, x, y, dim, doc):
    """Random names on a real ONNX model, compiled and run: the right answer, whatever the names."""
    from hypothesis import assume
    from onnx import TensorProto, helper
    assume(x != y and not x.startswith("t_") and not y.startswith("t_"))
    nodes = [helper.make_node("Neg", [x], ["t_" + node], name=node, doc_string=doc),
             helper.make_node("Relu", ["t_" + node], [y], name=node + doc)]
    g = helper.make_graph(nodes, doc or "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [dim, 2])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, [dim, 2])], doc_string=doc)
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    cm = cuvil.compile(data, fusion_level=0)
    feed = np.array([[1.5, -2.0], [-0.5, 3.0]], np.float32)
    np.testing.assert_array_equal(cm.run(feed)[0], np.maximum(-feed, 0))


def test_invalid_utf8_and_nul_in_a_raw_onnx_name():
    """Bytes no encoder would write (invalid UTF-8, NUL, a trigraph, a comment end) patched into the
    serialized model: parsed, escaped, compiled, and the answer is right."""
    from onnx import TensorProto, helper
    node = helper.make_node("Neg", ["x"], ["y"], name="MARKERNAME")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    bad = data.replace(b"MARKERNAME", b"*/\xff\xfe\x00??/ x")        # same length: the framing stays valid
    cm = cuvil.compile(bad, fusion_level=0)
    np.testing.assert_array_equal(cm.run(np.array([1, -2], np.float32))[0], [-1, 2])
    assert "*/" not in _code_only(cm.c_source) and "??/" not in cm.c_source


def test_float_literals_parse_as_c_for_every_float(tmp_path):
    """cexpr.float_literal, through which a model's floats (epsilons, scales, fills) reach the C: every
    float, NaN and the infinities included, is a C expression with the same value (repr alone wrote `inf`
    and `nan`, which failed the C compiler on a model whose norm's epsilon was one of them)."""
    from cuvil.codegen.c.cexpr import float_literal
    values = [0.0, -0.0, 1e-5, -2.5, 3.4e38, 1e-45, 1e300, float("inf"), float("-inf"), float("nan")]
    values += [random.Random(1).uniform(-1e6, 1e6) for _ in range(5)]
    body = "\n".join(f"  {{ float f = {float_literal(v, 'f')}; double d = {float_literal(v)}; "
                     f"printf(\"%a %a\\n\", f, d); }}" for v in values)
    src = f"#include <math.h>\n#include <stdio.h>\nint main(void) {{\n{body}\n  return 0;\n}}\n"
    (tmp_path / "f.c").write_text(src)
    exe = tmp_path / "f"
    subprocess.run([toolchain.find_compiler(), "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(tmp_path / "f.c")],
                   check=True, capture_output=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    for v, line in zip(values, lines):
        f, d = (float.fromhex(t) if "nan" not in t and "inf" not in t else float(t) for t in line.split())
        np.testing.assert_equal([f, d], [float(np.float32(v)), v])


@settings(max_examples=12, deadline=None)
@given(eps=st.floats(allow_nan=True, allow_infinity=True, width=32), op=st.sampled_from(["group_norm", "layer_norm"]))
@example(eps=float("nan"), op="group_norm")
@example(eps=float("inf"), op="layer_norm")
def test_fuzz_norm_epsilon_through_the_whole_compiler(eps, op):
    """A norm's epsilon from a model (any float32, NaN and the infinities included) compiles and gives the
    reference interpreter's answer: no C compiler failure on `nan` or `inf`."""
    from cuvil.ir.graph import Graph, TensorType, Value
    from .util import check_graph
    g = Graph()
    x = Value(TensorType((1, 4, 3, 5), "float32"), "x")
    g.inputs = [x]
    attrs = {"groups": 2, "eps": eps} if op == "group_norm" else {"axis": 1, "eps": eps}
    g.outputs = [g.add(op, [x], attrs)]
    with np.errstate(invalid="ignore", divide="ignore"):
        check_graph(g, [np.random.default_rng(0).standard_normal((1, 4, 3, 5)).astype(np.float32)],
                    rtol=1e-4, atol=1e-4)
