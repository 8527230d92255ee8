"""Random command lines: the CLI exits 0 or 2 and never shows a traceback (issue 37).

Argv lists are drawn from the real parser's subcommands and option names, mixed with junk and with
values of every awkward kind (unicode, huge and negative numbers, empty strings, NUL, missing files,
existing files and folders, broken models and artifacts). Compiling and starting a server are
mocked out, so no example spends seconds in the toolchain or listens on a port; everything before
them (model import, example inputs, option checks, loading an artifact) runs for real."""
import argparse
import contextlib
import io
import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil
import cuvil.api
import cuvil.llm
from cuvil import cli
from cuvil.errors import CuvilError

from .test_cli_errors import make_files


def _commands(ap, prefix=()):
    """{('compile',): ({option taking a value: its choices or default}, [flags]), ...} from the real parser."""
    out = {}
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_commands(sub, prefix + (name,)))
    if not out and prefix:
        opts = [a for a in ap._actions if a.option_strings]
        good = {o: [str(c) for c in a.choices or ([a.default] if a.default not in (None, []) else [])]
                for a in opts if a.nargs != 0 for o in a.option_strings}
        out[prefix] = (good, [o for a in opts if a.nargs == 0 for o in a.option_strings])
    return out


COMMANDS = _commands(cli.parser())


def _skipped(*args, **kwargs):
    raise CuvilError("compile skipped in the fuzz")


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return make_files(tmp_path_factory.mktemp("cli_fuzz"))


def paths(d):
    files = [str(d / f) for f in ("m.py::Net", "m.py::NeedsArgs", "m.py::Boom", "bad.py::Net", "syntax.py::Net",
                                  "junk.onnx", "empty.npy", "pickled.npy", "arrays.npz", "afile", "dir.npy",
                                  "notart", "fake.cuvil", "ckpt", "nothere.py::Net", "nothere.onnx", "nothere.npy",
                                  "o")] + [str(d), "/", "/dev/null", ".", ""]
    return st.sampled_from(files)


def values(d):
    shapes = st.lists(st.sampled_from([0, 1, 3, 2 ** 31, 10 ** 12]), max_size=4).map(
        lambda s: "[" + ",".join(map(str, s)) + "]")
    return st.one_of(
        paths(d),
        st.sampled_from(["0", "-1", "1", "2", "nan", "inf", "-inf", "1e999", "0x10", "\x00", "é", "🙂", "--",
                         "py:torch.zeros(2)", "py:1/0", "py:(", "py:undefined_name", "float32[2,3]", "int64[]",
                         "0:0:batch:1:64", "0:0:b:x:y", "shape=1,2", "shape=", "=1", f"s={d}/empty.npy"]),
        st.builds(lambda t, s: t + s, st.sampled_from(["float32", "int64", "bool", "complex64", "x"]), shapes),
        st.integers(-2 ** 70, 2 ** 70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
        # never "py:...": random text must not be evaluated even here
        st.text(max_size=20).filter(lambda s: not s.startswith("py:")),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_argv_exits_0_or_2_without_traceback(d, data, monkeypatch):
    monkeypatch.delenv("CUVIL_DEBUG", raising=False)
    cmd = data.draw(st.sampled_from(sorted(COMMANDS)), label="command")
    good, flags = COMMANDS[cmd]
    # three times in four well-formed (real options, half the time with a value the parser accepts),
    # to get past argparse into the commands; else junk options and stray tokens too
    messy = data.draw(st.integers(0, 3), label="messy") == 0
    options = sorted(good) + (["--bogus"] if messy else [])
    pair = st.sampled_from(options).flatmap(
        lambda o: st.tuples(st.just(o), st.one_of(st.sampled_from(good.get(o) or ["1"]), values(d)))).map(list)
    flags = [f for f in flags if messy or f not in ("-h", "--help")] + (["-x", "-", "--"] if messy else [])
    token = [pair] * 2 + [st.sampled_from(flags).map(lambda f: [f])] * bool(flags) + \
        [values(d).map(lambda v: [v])] * messy
    parts = data.draw(st.lists(st.one_of(token), max_size=6), label="options")
    required = {"compile": ["-o"], "llm": ["--prompt"] if cmd[-1] == "run" else ["-o"]}.get(cmd[0], [])
    argv = list(cmd) + [data.draw(st.one_of(paths(d), paths(d), values(d)), label="positional")]
    for opt in required:
        if data.draw(st.integers(0, 9), label=opt) > 0:  # left out one time in ten
            argv += [opt, data.draw(values(d), label=opt + " value")]
    argv += [t for p in parts for t in p]
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(cuvil, "compile", _skipped), mock.patch.object(cuvil.api, "inspect_stages", _skipped), \
            mock.patch.object(cuvil.llm, "from_transformers", _skipped), mock.patch("uvicorn.run", _skipped), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cwd = os.getcwd()
        os.chdir(d)  # relative junk paths land in the scratch folder
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
        finally:
            os.chdir(cwd)
    assert rc in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
    if rc == 2:
        assert err.getvalue().count("error:") >= 1, (argv, err.getvalue())
    assert "internal error" not in err.getvalue(), (argv, err.getvalue())
