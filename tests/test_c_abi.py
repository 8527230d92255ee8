"""The C API from C, no Python: two compiled models, named apart (compile(name=...)), linked into one
program and run side by side against torch eager; the kernels stay private to each library."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

import cuvil
from cuvil.build import toolchain

from .util import kernel_library, link_kernel_library

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include "a/model.h"
#include "b/model.h"

static void *read_weights(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END); *size = ftell(f); fseek(f, 0, SEEK_SET);
    void *p = aligned_alloc(64, (size_t)((*size + 63) / 64 * 64 + 64));
    if (p && fread(p, 1, (size_t)*size, f) != (size_t)*size) { free(p); p = 0; }
    fclose(f);
    return p;
}

#define RUN(P, DIR, X, XSHAPE, Y)                                                           \
    do {                                                                                    \
        long size; void *w = read_weights(DIR "/weights.bin", &size);                       \
        cuvil_model *m = P##create(w, size, 2);                                             \
        if (!m) { printf("create: %s\n", P##last_error()); return 1; }                     \
        void *arena = aligned_alloc(64, (size_t)(P##arena_size() + 64));                    \
        const void *in[1] = {X}; const int64_t *shapes[1] = {XSHAPE}; void *out[1] = {Y};   \
        if (P##run(m, in, shapes, out, arena)) { printf("run: %s\n", P##last_error()); return 1; } \
        P##destroy(m); free(arena); free(w);                                                \
    } while (0)

int main(void) {
    float x[2 * 8], ya[2 * 4], yb[2 * 3];
    for (int i = 0; i < 16; i++) x[i] = (float)(i % 5) - 2.0f;
    const int64_t shape[2] = {2, 8};
    RUN(cuvil_a_, "a", x, shape, ya);
    RUN(cuvil_b_, "b", x, shape, yb);
    if (CUVIL_ABI_VERSION != 2) return 2;
    for (int i = 0; i < 8; i++) printf("%.7g ", ya[i]);
    printf("\n");
    for (int i = 0; i < 6; i++) printf("%.7g ", yb[i]);
    printf("\n");
    return 0;
}
"""


def test_two_named_models_link_into_one_c_program(tmp_path):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    b = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Tanh()).eval()
    x = (torch.arange(16) % 5 - 2.0).reshape(2, 8)
    for name, m in (("a", a), ("b", b)):
        cm = cuvil.compile(m, (x,), name=name)
        cm.save(tmp_path / name)
        exported = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / name / "model.so")],
                                  capture_output=True, text=True, check=True).stdout.split()
        assert f"cuvil_{name}_run" in exported and "cuvil_run" not in exported
        assert not [s for s in exported if s.startswith("cuvil_parallel")]     # kernels stay private
        np.testing.assert_allclose(cuvil.load(tmp_path / name).run(x.numpy())[0], m(x).detach().numpy(),
                                   rtol=1e-5, atol=1e-6)
    (tmp_path / "main.c").write_text(MAIN)
    subprocess.run([toolchain.find_compiler(), "-std=c11", "-Wall", "-Werror", "-I.", "main.c",
                    str(tmp_path / "a" / "model.so"), str(tmp_path / "b" / "model.so"), "-o", "main",
                    f"-Wl,-rpath,{tmp_path}/a:{tmp_path}/b"], cwd=tmp_path, check=True, capture_output=True)
    out = subprocess.run(["./main"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
    with torch.no_grad():
        np.testing.assert_allclose(np.array(out[0].split(), np.float32), a(x).numpy().ravel(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.array(out[1].split(), np.float32), b(x).numpy().ravel(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", ["1abc", "a-b", "", "x" * 40, "é", 3])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="option name"):
        cuvil.compile(torch.nn.ReLU(), (torch.randn(2),), name=bad)


@pytest.fixture(scope="module")
def gemm_harness(tmp_path_factory):
    from benchmarks import kernel_ab
    return kernel_ab.build(kernel_ab.ROOT / kernel_ab.KERNELS, tmp_path_factory.mktemp("harness") / "bench", "native",
                           archive=kernel_library("native"))


@pytest.mark.parametrize("shape,rows_written", [((1, 100, 70), False), ((37, 200, 450), True), ((130, 64, 33), True)])
def test_gemm_harness_checks_its_product(gemm_harness, shape, rows_written):
    """benchmarks/harness/gemm_bench.c (the C harness benchmarks.kernel_ab runs) builds against the
    kernels as they are and its product agrees with a plain dot product (it exits 1 where not)."""
    from benchmarks import kernel_ab
    assert kernel_ab.time_once(gemm_harness, shape, 2, 3, rows_written) > 0


def test_depthwise_harness_checks_its_outputs(tmp_path):
    """benchmarks/harness/dw_bench.c (behind benchmarks/README.md's depthwise kernel notes) builds against
    the kernels as they are, and its outputs agree with a plain loop (it exits 1 where not): blocked and
    NCHW maps, filters 3 / 5 / 7, strides 1 / 2, pads, activations."""
    import subprocess
    from benchmarks import kernel_ab
    exe = kernel_ab.build(kernel_ab.ROOT / kernel_ab.KERNELS, tmp_path / "dw_bench", "native",
                          harness=kernel_ab.HARNESS.parent / "dw_bench.c", archive=kernel_library("native"))
    runs = ["32 13 29 3 1 2 2", "16 40 41 5 2 1 2 2 7", "16 17 9 7 1 1 2 3 0", "48 14 14 3 1 2 2 1 8",
            "5 13 29 3 1 2 2 1 1 nchw", "3 40 41 5 2 1 2 2 8 nchw", "2 17 9 7 1 1 2 3 0 nchw", "7 14 14 3 2 2 2 1 7 nchw"]
    for args in runs:
        r = subprocess.run([str(exe), *args.split()], capture_output=True, text=True)
        assert r.returncode == 0 and float(r.stdout) > 0, (args, r.stderr)


def test_blocked_ab_harness_compares_two_builds(tmp_path):
    """benchmarks/harness/blocked_ab.c (two kernel builds on ResNet-50's blocked convs, in one process)
    builds, loads the kernels as shared libraries and finds a build's outputs equal to its own copy's."""
    import subprocess

    from benchmarks import kernel_ab
    from cuvil.build.toolchain import find_compiler, target_flags
    kernels = kernel_ab.ROOT / kernel_ab.KERNELS
    # one build as both A and B (the harness's machinery is the subject): the run's kernels, already built
    lib = link_kernel_library("native", tmp_path / "kernels.so")
    exe = tmp_path / "blocked_ab"
    subprocess.run([find_compiler(), "-O2", *target_flags("native"), f"-I{kernels.parent}", f"-I{kernels}",
                    f"-I{kernel_ab.HARNESS.parent}", str(kernel_ab.HARNESS.parent / "blocked_ab.c"), "-ldl", "-o", str(exe)],
                   check=True, capture_output=True)
    for mode in ([], ["cold"]):       # cold: the caches flushed before each call
        r = subprocess.run([str(exe), str(lib), str(lib), "1", "1", *mode], capture_output=True, text=True, timeout=600)
        lines = r.stdout.splitlines()
        assert r.returncode == 0 and len(lines) == 9, r.stderr
        assert all(line.endswith("same output") for line in lines), lines
