"""Per-CPU tuning of the kernels: one table, which gen_tuning.py renders into kernels/tuning.h.

A row sets one knob (a C macro gemm.c, qgemm.c or blocked.c reads) to one value on the CPUs its `when` names: a
preprocessor condition on the macros the compiler and common.h define (CUVIL_VL, CUVIL_ZEN from the
__znver*__ core -march=native names, __AVX512F__, __AVXVNNI__ ...), so how a CPU is told apart stays
in the preprocessor. Rows of one `ladder` become one `#if / #elif / #else` chain, tried in the
table's order ("else": every target no earlier condition took); rows with `when` ALL are defined
everywhere, and rows with `when` DEFAULT become `#ifndef` fallbacks after the ladders (a knob no
ladder row set). A ladder with a hook in HOOKS is
skipped whole where that macro is set from outside (-D, a tuning experiment).

`reason` says why in a few words; `chosen_by` names the measurement that chose the value (the
numbers are in the commit that set it: `git log -S<knob> -- cuvil/codegen/c/kernels`). Zen 5 is
Zen with AVX-VNNI: GCC 12 does not know znver5 and reads it as Zen 4 (znver3 with AVX-512).

PLAN_TUNING, the second table, holds the choices the code generator makes in Python (which kernel a
node gets, so which weights are packed): each row's `when` tests a native target's CPU (its cpuinfo
flags and vendor); plan_value(knob, target) is the first row's value that holds, else PLAN_DEFAULTS'.
A portable target (x86_64-avx2 ...) gets the defaults: the CPU it will run on is not known."""
from __future__ import annotations

from typing import Callable, NamedTuple

from ... import target as target_module
from ...target import resolve_target

DEFAULT = "default"
ALL = "all"
ELSE = "else"

ZEN5 = "CUVIL_VL == 16 && defined(CUVIL_ZEN) && defined(__AVXVNNI__)"
ZEN4 = "CUVIL_VL == 16 && defined(CUVIL_ZEN)"
INTEL_512 = "CUVIL_VL == 16"
# qgemm.c's 512-bit VNNI tiles exist (CUVIL_QGEMM_512): its AVX2 path plus AVX-512 VNNI and BW
QGEMM_512 = ("defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512VNNI__) && "
             "defined(__AVX512BW__)")

AB_DECODE = "benchmarks.ab, TinyLlama-shaped decode, artifacts interleaved"
AB_PREFILL = "benchmarks.ab, TinyLlama prefill of 128 tokens, artifacts interleaved"
C_HARNESS = "benchmarks.kernel_ab 1x5632x2048 / benchmarks.qgemv: GEMVs of 2048 x 5632 from DRAM, rounds interleaved"


class Row(NamedTuple):
    ladder: str       # rows of one ladder form one #if/#elif/#else chain
    cpu: str          # the CPU family in words
    when: str         # preprocessor condition, ELSE or DEFAULT
    knob: str
    value: str
    reason: str
    chosen_by: str


TUNING: tuple[Row, ...] = (
    # ---- gemm.c: one-row GEMV (batch-1 decode) over panels, fp32 or bf16 ----
    # Zen 5 reads DRAM faster as one sequential stream than as several side by side (read probe, 1 GiB,
    # 9 rounds interleaved: one stream 35-39 GB/s at 1 thread, 46-48 at 2; six 25-31 / 38-39), so it
    # reads the panels one after another, each non-temporally 8 KB ahead. 48 GEMVs of 2048 x 5632 from
    # DRAM (1.1 GB), against six streams 1 KB ahead into L1, three runs of 7 rounds interleaved: bf16
    # 37.9-38.2 against 35.0-35.8 GB/s at 1 thread, 43.0-48.5 against 39.4-47.5 at 2; fp32 38.5-39.3
    # against 36.8-37.9 and 44.5-48.7 against 40.1-47.9.
    Row("gemv", "Zen 5", ZEN5, "CUVIL_GEMV_DRAM_STREAMS", "1",
        "one sequential DRAM stream reads faster than six side by side", "read probe + " + C_HARNESS),
    Row("gemv", "Zen 5", ZEN5, "CUVIL_GEMV_PREFETCH", "8192", "prefetch 8 KB ahead", C_HARNESS),
    Row("gemv", "Zen 5", ZEN5, "CUVIL_GEMV_PREFETCH_HINT", "0", "non-temporal prefetch", C_HARNESS),
    Row("gemv", "Zen 5", ZEN5, "CUVIL_GEMV_PREFETCH_FP32", "1", "fp32 weights prefetched too", C_HARNESS),
    # Zen 4: toward L2 (prefetcht2), where Intel wants L1. Decode of 8 TinyLlama-shaped layers against
    # prefetcht0, artifacts interleaved, speed: fp32 1.24x (1 thread) 1.09x (2), bf16 1.13x / 1.05x; 4 KB
    # ahead no better; MLP b1 (weights held in L3) unchanged. bf16 nearer: 8 GEMVs of 2048 x 5632 from
    # DRAM (C harness, 4 runs each), 512 bytes ahead against 2048: 1 thread 27.6-30.8 GB/s against
    # 25.0-26.7, 2 threads 37.5-39.5 against 33.6-37.9; fp32 alike at either distance.
    Row("gemv", "Zen 4", ZEN4, "CUVIL_GEMV_PREFETCH", "2048", "2 KB ahead; 4 KB no better", AB_DECODE),
    Row("gemv", "Zen 4", ZEN4, "CUVIL_GEMV_PREFETCH_HINT", "1", "toward L2 (prefetcht2), not L1", AB_DECODE),
    Row("gemv", "Zen 4", ZEN4, "CUVIL_GEMV_PREFETCH_FP32", "1", "fp32 weights prefetched too", AB_DECODE),
    Row("gemv", "Zen 4", ZEN4, "CUVIL_GEMV_PREFETCH_BF16", "512", "bf16 nearer: 512 bytes ahead", C_HARNESS),
    # Intel with AVX-512: the read probe on a Sapphire-Rapids-class Xeon (1 thread, 1 GiB): one or four
    # streams with a T0 prefetch 17.7-17.9 GB/s, six 16.9. 12 TinyLlama-shaped layers (1.2 GB bf16),
    # artifacts interleaved, decode speed against six streams 2 KB ahead: bf16 1.098x (1 thread) 1.078x
    # (2), fp32 1.047x / 1.039x; two streams 2 KB ahead 1.04-1.07x, 4 KB 1.06x; four streams
    # 1.01-1.03x; one stream 0.89x; prefetcht2 or 4 KB ahead with six streams 0.94-1.0x.
    Row("gemv", "Intel AVX-512", INTEL_512, "CUVIL_GEMV_PREFETCH", "1024", "1 KB ahead", AB_DECODE),
    Row("gemv", "Intel AVX-512", INTEL_512, "CUVIL_GEMV_PREFETCH_HINT", "3", "into L1 (prefetcht0)", AB_DECODE),
    Row("gemv", "Intel AVX-512", INTEL_512, "CUVIL_GEMV_PREFETCH_FP32", "1", "fp32 weights prefetched too",
        AB_DECODE),
    Row("gemv", "Intel AVX-512", INTEL_512, "CUVIL_GEMV_DRAM_STREAMS", "2",
        "two panels side by side from DRAM, not six", "read probe + " + AB_DECODE),
    Row("gemv", "AVX2 and narrower", ELSE, "CUVIL_GEMV_PREFETCH", "256", "256 bytes ahead", "none recorded"),
    Row("gemv", "AVX2 and narrower", ELSE, "CUVIL_GEMV_PREFETCH_HINT", "1", "toward L2 (prefetcht2)",
        "none recorded"),
    Row("gemv", "AVX2 and narrower", ELSE, "CUVIL_GEMV_PREFETCH_FP32", "0", "fp32 weights not prefetched",
        "none recorded"),
    # Six streams, the most whose 12 accumulators stay in AVX2 registers: against four, a 16 MB GEMV held
    # in L3 0.89x the time, 64 MB 0.96x, MLP b1 0.95x; a decode step's GEMVs 0.99x. (gemm.c's GEMV_CASES
    # lists 1..6 streams: a fixed 6, not a knob to set from outside.)
    Row("gemv", "all", ALL, "CUVIL_GEMV_STREAMS", "6",
        "most panels whose 12 accumulators stay in AVX2 registers", "benchmarks.kernel_ab GEMVs + " + AB_DECODE),
    Row("gemv", "all", DEFAULT, "CUVIL_GEMV_PREFETCH_BF16", "CUVIL_GEMV_PREFETCH", "bf16 as fp32",
        "-"),
    Row("gemv", "all", DEFAULT, "CUVIL_GEMV_DRAM_STREAMS", "CUVIL_GEMV_STREAMS",
        "from DRAM as from cache: all streams side by side", "-"),
    # ---- gemm.c: how gemm_driver and cuvil_pack_b split work over the threads (every CPU alike) ----
    # The measurements behind these: benchmarks/README.md, "Kernel notes".
    Row("gemm_partition", "all", ALL, "CUVIL_GEMV_PARALLEL_MIN", "65536",
        "a GEMV of more than N x K weights runs on every thread", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMV_EQUAL_PARTS_GROUPS", "4",
        "up to 4 stream groups a thread: equal parts, one a thread; more: chunks claimed as threads come free",
        "benchmarks.kernel_ab 1x256x2048, 1x1024x1024 + " + AB_DECODE),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_PARALLEL_MIN_FLOPS", "65536",
        "a GEMM of more than M x N x K runs on every thread", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_PACK_A_PARALLEL_MIN", "8192",
        "pack A in parallel from M x K above this: rows mostly just written, half by the other core",
        "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_PACK_B_PARALLEL_MIN", "16384",
        "pack B (panels x K) in parallel above this", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_IN_TASK_MIN_A_BYTES", "(1 << 20)",
        "A larger than L2: each task packs its own M block of A, K block by K block", "benchmarks.kernel_ab 4096x1536x384, 4096x384x384, 2048x768x3072"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_IN_TASK_MAX_PANELS", "32",
        "A packed in the tasks over at most 32 panels: over more each task streams B from L3",
        "benchmarks.kernel_ab 4096x1536x384, 4096x384x384, 2048x768x3072"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_IN_TASK_MIN_BLOCKS_PER_THREAD", "2",
        "A packed in the tasks only with at least 2 M blocks a thread", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_ROWS_MIN_PER_THREAD", "64",
        "split by rows (each thread reads the rows written on its core) from 64 rows a thread",
        "benchmarks.kernel_ab --rows-written 128xNxK + benchmarks.ab, BERT-base"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_ROWS_MAX_N_OVER_M", "4",
        "split by rows only while B is at most 4x the size of A (N <= 4 M)",
        "benchmarks.kernel_ab --rows-written 128xNxK + benchmarks.ab, BERT-base"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_TASKS_PER_THREAD", "8",
        "enough tasks: 8 a thread before panels are grouped or M blocks stop growing", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_PANELS_PER_TASK", "4",
        "panels per task where tasks are plenty: reuse A from cache", "none recorded"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_SHALLOW_K", "192",
        "shallow K (1x1 convs, small im2col): rows outer, longer runs of C rows; A rows in place only deeper",
        "1x1 convs 26 -> 60 GFLOP/s with the rows-outer order"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_SHALLOW_MIN_PANELS_PER_THREAD", "32",
        "shallow K takes the wide panel groups from 32 panels x M blocks a thread",
        "1x1 convs 26 -> 60 GFLOP/s with the rows-outer order"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_SHALLOW_PANELS_PER_TASK", "16",
        "shallow K: 16 panels a task, longer runs of C rows", "1x1 convs 26 -> 60 GFLOP/s with the rows-outer order"),
    Row("gemm_partition", "all", ALL, "CUVIL_GEMM_PRODUCED_MIN_TASKS_PER_THREAD", "4",
        "B produced in the tasks (implicit im2col): single panels enough from 4 tasks a thread",
        "3x3 stride-2 conv 128 -> 128 at 28x28 (benchmarks.layers times it in ResNet-50)"),
    # ---- blocked.c: the 6 x 4-vector tile of the channel-blocked convs (AVX-512) ----
    # Channel blocks a K block of its two panels holds. Intel: 8 (128 channels, 32 KB of B), held in its
    # 48 KB L1 beside A's lines. Zen 4 (32 KB L1D): larger K blocks, fewer trips of the partial sums
    # through C; fp32 artifacts with the value built in, interleaved, against 8: ResNet-50 0.980x (1
    # thread) 0.982x (2), MobileNetV1 0.983x / 0.981x; 16: 0.985x / 0.993x (1 thread); 128 (no K
    # blocking up to 2048 channels): 0.976x / 0.987x, 0.981x / 0.989x; 4: 1.015x / 1.028x. Zen 5 (48 KB
    # L1D, full-width AVX-512), against 8, same measure: 32: ResNet-50 0.990x / 0.983x (1 thread), 0.996x /
    # 1.018x / 1.034x (2), MobileNetV1 0.982x (1), 1.061x / 0.979x (2); 16: 0.990x / 1.000x, 0.989x / 1.005x
    # / 1.017x, 0.989x, 1.026x / 0.994x; 128: 1.011x, 1.026x. Nothing clear of the noise: 8 stays.
    Row("blocked_conv", "Zen 5", ZEN5, "CUVIL_BLOCKED_WIDE_KB", "8",
        "K blocks of 128 channels: 16, 32, 128 no better in 48 KB L1D", "benchmarks.ab ResNet-50, MobileNetV1"),
    Row("blocked_conv", "Zen 4", ZEN4, "CUVIL_BLOCKED_WIDE_KB", "32",
        "K blocks of 512 channels: fewer trips of the sums through C", "benchmarks.ab ResNet-50, MobileNetV1"),
    Row("blocked_conv", "Intel AVX-512 and others", ELSE, "CUVIL_BLOCKED_WIDE_KB", "8",
        "K blocks of 128 channels: two panels' B (32 KB) stay in L1", "none recorded"),
    # ---- blocked.c: software prefetch in the blocked convs' tiles ----
    # The output (and residual) lines a tile will store, asked for before its K loop: on Intel each
    # had been a wait on L3 (Sapphire-Rapids class: ResNet-50 0.96-0.98x the time); on Zen 5 the
    # requests cost 1.02-1.05x (1 thread), its own prefetchers having the lines in time.
    # The next wide tile's input lines (its pixels' channel blocks of this K block), asked for as each K
    # block starts. Intel (Emerald-Rapids class, 2 MB L2): where a map outgrows L2 the tile waited on
    # L3 for them; ResNet-50's strided and direct 3x3 convs alone, two builds interleaved in one process
    # (benchmarks/harness/blocked_ab.c, 1 thread, both orders): 0.92-0.95x the time, 1x1 convs 0.99x;
    # ResNet-50 0.95-0.99x, RegNetY-4GF 0.94-0.97x (benchmarks.ab). Zen 4 (1 MB L2): the same waits, on L3
    # or DRAM; ResNet-50's blocked convs with the caches flushed before each call (as in the network, whose
    # weights stream from DRAM; blocked_ab.c, 1 thread): 1x1 convs 0.81-0.94x the time (256 -> 64 at 56x56
    # 0.81x, 1024 -> 256 at 14x14 0.89x, the stride-2 ones 0.90x / 0.94x), 3x3 0.98-1.02x; warm 0.98-1.05x;
    # the output lines too gained nothing more (0.91-1.06x). Zen 5: not measured, left as it was.
    Row("blocked_prefetch", "Zen 5", ZEN5, "CUVIL_BLOCKED_PREFETCH_OUTPUT", "0",
        "the hardware prefetchers have the output lines in time", "benchmarks.ab ResNet-50, 25 rounds"),
    Row("blocked_prefetch", "Zen 5", ZEN5, "CUVIL_BLOCKED_PREFETCH_A", "0", "as before (not measured on Zen 5)", "-"),
    Row("blocked_prefetch", "Zen 4", ZEN4, "CUVIL_BLOCKED_PREFETCH_OUTPUT", "0",
        "as Zen 5: the output lines in time", "benchmarks/harness/blocked_ab.c (cold)"),
    Row("blocked_prefetch", "Zen 4", ZEN4, "CUVIL_BLOCKED_PREFETCH_A", "1",
        "the next tile's input lines as each K block starts", "benchmarks/harness/blocked_ab.c (cold) + benchmarks.ab"),
    Row("blocked_prefetch", "Zen 3 (AVX2: no wide tile reads these)", "defined(CUVIL_ZEN)",
        "CUVIL_BLOCKED_PREFETCH_OUTPUT", "0", "as Zen 5", "-"),
    Row("blocked_prefetch", "Zen 3 (AVX2: no wide tile reads these)", "defined(CUVIL_ZEN)", "CUVIL_BLOCKED_PREFETCH_A",
        "0", "as before", "-"),
    Row("blocked_prefetch", "Intel AVX-512 and others", ELSE, "CUVIL_BLOCKED_PREFETCH_OUTPUT", "1",
        "a tile's output lines before its K loop", "benchmarks.ab ResNet-50"),
    Row("blocked_prefetch", "Intel AVX-512 and others", ELSE, "CUVIL_BLOCKED_PREFETCH_A", "1",
        "the next tile's input lines as each K block starts", "benchmarks/harness/blocked_ab.c + benchmarks.ab ResNet-50"),
    # ---- int8dot.c: the next weight panel asked for toward L2 while a panel's tiles run ----
    # Intel (Emerald-Rapids class, 2 MB L2, a mesh L3): a panel's first tile had read its weights from L3,
    # where ResNet-50's 7x7 stage (9 tiles a panel) ran at 57% of the vpdpbusd peak against 86-90% at
    # 14x14 and 28x28. ResNet-50 int8 calibrated, benchmarks.ab both orders: 0.932x / 0.927x the time at 1 /
    # 2 threads; MobileNetV2 0.991-1.001x; into L1 instead of L2 0.964x against 0.953x; the output lines
    # asked for before the K loop as well: no change (0.961x). Short panels (K < 256) are left out: their
    # weights come from L2 in time and MobileNetV2 took 1.01-1.02x with every panel asked for.
    # Zen 5 (fast L3): ResNet-50 int8 1.043x, then 0.997x swapped: nothing to gain, left off.
    # Zen 4 (thirty-second part): ResNet-50 int8 calibrated 0.996x / 0.991x (1 thread, both orders), 0.994x /
    # 0.966x (2): within this host's noise, left off.
    # ---- int8dot.c: 3 x 3 convs reading their windows in place (cuvil_i8_window_rows) ----
    # Intel (Emerald-Rapids class), ResNet-50's 3 x 3 convs per node, 1 thread: at 56x56 1.365 -> 1.032 ms
    # (3 convs; 1.023 with no copy at all, a measurement with wrong sums), at 28x28 1.107 -> 0.995; the whole
    # network 0.984-0.994x (1 thread, both orders, after the copies a line at a time), 0.993x (2). Narrower
    # maps keep the copy: an output row of 14 or 7 ends in a tile of 2 or 1 rows, and without the copy the
    # 14x14 convs gained 3% at most. Zen: not measured, the same rule.
    Row("int8_window", "all", ALL, "CUVIL_I8_WINDOW_MIN_OW", "28",
        "3 x 3 convs read their windows in place from 28 output columns", "benchmarks.ab ResNet-50 int8"),
    Row("int8_prefetch", "Zen", "defined(CUVIL_ZEN)", "CUVIL_I8_PREFETCH_PANEL_K4", "0",
        "the next panel left to the hardware prefetchers", "benchmarks.ab ResNet-50 int8"),
    Row("int8_prefetch", "Intel AVX-512 and others", ELSE, "CUVIL_I8_PREFETCH_PANEL_K4", "64",
        "the next panel's lines shared out over a panel's first tiles, from 256 input channels",
        "benchmarks.ab ResNet-50, MobileNetV2 int8"),
    # ---- vmath.h: hardswish's division by 6 (cuvil_vdiv_by) on AVX-512 ----
    # Intel's vdivps zmm issues once in 10-16 cycles: a hardswish epilogue took 3.34 ns a vector, 1.48
    # as a multiply and a correction FMA (the same quotients; scratch loop over 4096 floats in L1). In a
    # depthwise conv that was most of the time: MobileNetV3's 72 channels 3x3 at 56x56 (NCHW, 1 thread,
    # benchmarks/harness/dw_bench.c) 206 us with hardswish against 109 with ReLU. Zen keeps vdivps:
    # Zen 4 issues one zmm FMA a cycle, where its division is cheaper (not measured here).
    Row("vector_division", "Zen", "defined(CUVIL_ZEN)", "CUVIL_FAST_DIV", "0", "vdivps", "not measured"),
    Row("vector_division", "Intel AVX-512 and others", ELSE, "CUVIL_FAST_DIV", "1",
        "a multiply and a correction FMA instead of vdivps", "scratch activation loop + benchmarks.ab MobileNetV3-ish"),
    # ---- qgemm.c: int8/int4 weight tiles ----
    # The weight prefetch, one tile ahead. Zen 4, decode of 8 TinyLlama-shaped layers against T0,
    # artifacts interleaved, speed: int8 1.12x (1 thread) 1.10x (2), int4 1.29x / 1.11x (T1 alike).
    # Zen 5 non-temporal: 48 decode GEMVs of 2048 x 5632 from DRAM, rounds interleaved, against T2: int4
    # 44.6 / 61.6 GB/s against 42.1 / 58.1 at 2 threads, int8 45.7 / 44.3 against 39.4 / 43.2 (1 thread
    # alike); 4-16 KB ahead instead of a quad: alike.
    # Intel: into L1 2 KB ahead, not a quad ahead (32-64 KB at K = 2048, more than L1 holds). 12
    # TinyLlama-shaped layers, artifacts interleaved, decode speed against a quad ahead: int8 1.14x (1
    # thread) 1.13x (2), int4 1.26x / 1.25x; 1 KB 1.08x / 1.24x (1 thread), 4 KB 1.14-1.16x /
    # 1.16-1.19x, 8 KB int8 1.14x. And it decodes on the 512-bit tiles: TinyLlama-shaped int4 (22
    # layers) against the 256-bit tile 1.035x the tokens/s (1 thread) 1.062x (2); int8 (12 layers)
    # 1.012x / 1.004x. Zen keeps the 256-bit tile, which read DRAM faster on Zen 5.
    # Prefill blocks: see the comment above cuvil_qgemm in qgemm.c.
    Row("qgemm_prefetch", "Zen 5", "defined(CUVIL_ZEN) && defined(__AVXVNNI__)", "CUVIL_QGEMM_PREFETCH_HINT",
        "_MM_HINT_NTA", "non-temporal; 4-16 KB ahead alike", C_HARNESS),
    Row("qgemm_prefetch", "Zen", "defined(CUVIL_ZEN)", "CUVIL_QGEMM_PREFETCH_HINT", "_MM_HINT_T2",
        "toward L2, not L1", AB_DECODE),
    Row("qgemm_prefetch", "Intel", ELSE, "CUVIL_QGEMM_PREFETCH_HINT", "_MM_HINT_T0", "into L1", AB_DECODE),
    Row("qgemm_prefetch", "Intel", ELSE, "CUVIL_QGEMM_PREFETCH_BYTES", "2048",
        "decode prefetch 2 KB ahead: a quad ahead outruns L1", AB_DECODE),
    Row("qgemm_prefetch", "Intel", ELSE, "CUVIL_QGEMM_DECODE_512", "1", "decode on the 512-bit VNNI tiles too",
        AB_DECODE),
    Row("qgemm_prefill", "512-bit VNNI", QGEMM_512, "CUVIL_QGEMM_PREFILL_BLOCKS", "4",
        "a tile of several rows takes a whole quad (8 or 4 rows x 2 pairs)", AB_PREFILL),
    Row("qgemm_prefill", "AVX2 and others", ELSE, "CUVIL_QGEMM_PREFILL_BLOCKS", "2",
        "two blocks side by side: whole 64-byte lines", AB_PREFILL + " + benchmarks.qgemv --rows 128"),
    Row("blocked_prefetch", "all", DEFAULT, "CUVIL_BLOCKED_PREFETCH_OUTPUT", "1",
        "a tile's output lines before its K loop (where CUVIL_BLOCKED_PREFETCH_A is set from outside)", "-"),
    Row("qgemm_prefetch", "all", DEFAULT, "CUVIL_QGEMM_DECODE_512", "0", "decode on the 256-bit tile",
        "-"),
    Row("qgemm_prefetch", "all", DEFAULT, "CUVIL_QGEMM_PREFETCH_BYTES", "0", "decode prefetch one quad ahead",
        "-"),
)

# Ladders skipped whole where the macro is set from outside (-D...: a tuning experiment). Only hooks
# that build when set alone: the GEMV's CUVIL_GEMV_PREFETCH, set alone, left its hint and fp32 switch
# undefined, so it is gone.
HOOKS = {"qgemm_prefetch": "CUVIL_QGEMM_PREFETCH_HINT", "qgemm_prefill": "CUVIL_QGEMM_PREFILL_BLOCKS",
         "blocked_conv": "CUVIL_BLOCKED_WIDE_KB", "vector_division": "CUVIL_FAST_DIV",
         "blocked_prefetch": "CUVIL_BLOCKED_PREFETCH_A"}


class PlanRow(NamedTuple):
    cpu: str
    when: Callable    # (cpuinfo flags, vendor) -> bool
    knob: str
    value: int
    reason: str
    chosen_by: str


def _zen5(flags, vendor) -> bool:
    return vendor == "AuthenticAMD" and {"avx_vnni", "avx512_bf16", "avx512f"} <= flags


def _zen4_bf16(flags, vendor) -> bool:
    return vendor == "AuthenticAMD" and {"avx512_bf16", "avx512f"} <= flags and "avx_vnni" not in flags


def _amx_bf16(flags, vendor) -> bool:
    return {"amx_bf16", "amx_tile"} <= flags


def _intel_512(flags, vendor) -> bool:
    return vendor == "GenuineIntel" and "avx512f" in flags


PLAN_DEFAULTS = {
    # precision="bf16": 3x3 stride-1 convs of at most this many output pixels take direct bf16 products
    # (vdpbf16ps) instead of fp32 Winograd; 0: Winograd everywhere (Zen 4, ResNet-50: Winograd 0.82x the
    # time of all-direct bf16). Where bf16 dot products run no faster than fp32 FMAs (Intel's AVX512-BF16
    # without AMX), Winograd's saving wins at every size.
    "bf16_direct_3x3_max_outputs": 0,
    # ... and grouped ones whose groups take bf16 products (conv_plan.bf16_filters_fit: RegNet's 64-channel
    # groups), whose Winograd runs a small GEMM per group
    "bf16_direct_grouped_3x3_max_outputs": 0,
    # fp32 3x3 stride-1 convs in the channel-blocked layout take Winograd F(4x4, 3x3) from this many output
    # pixels per image, F(2x2, 3x3) below (conv_plan.winograd_tile)
    "blocked_winograd4_min_outputs": 12 * 12,
    # grouped convs whose groups are one channel block each take the direct grouped kernel
    # (kernels/grouped_blocked.c, conv_plan.grouped_direct) where their output rows are at least this wide,
    # instead of a GEMM (or Winograd) per group of N = one block; 0: never. Narrower groups always take it.
    "grouped_direct_block_min_width": 0,
}

PLAN_TUNING: tuple[PlanRow, ...] = (
    # AMX tiles (Intel Xeon, Sapphire/Granite-Rapids class; bf16dot.c amx_rows) multiply bf16 ~5x faster
    # than fp32 FMAs here: ResNet-50 bf16 on them (profile build, 1 thread) 20.9 ms with its 3x3 convs in
    # Winograd, 15.6 ms with all of them direct (the 512-channel ones at 7x7: 1.5 -> 0.57 ms each)
    PlanRow("AMX", _amx_bf16, "bf16_direct_3x3_max_outputs", 1 << 30,
            "direct bf16 products (AMX tiles) for every 3x3 conv", "profile of ResNet-50 --precision bf16"),
    PlanRow("AMX", _amx_bf16, "bf16_direct_grouped_3x3_max_outputs", 1 << 30,
            "direct bf16 products (AMX tiles) for every grouped 3x3 conv", "as the ungrouped row (not measured alone)"),
    # ResNet-50 bf16, the 3x3 convs direct by output size, 9 rounds interleaved, 1 / 2 threads: 7x7 maps
    # 0.995x / 0.964x, 7x7 and 14x14 0.970x / 0.933x, up to 28x28 0.999x / 0.978x, all 1.011x / 0.983x
    # (Winograd's tiles fit small maps badly: 7x7 outputs in 8x8 of F(4x4, 3x3) tiles)
    PlanRow("Zen 5", _zen5, "bf16_direct_3x3_max_outputs", 196,
            "direct bf16 products for 3x3 convs at 14x14 and smaller", "benchmarks.ab ResNet-50 --precision bf16"),
    # Zen 4, ResNet-50 bf16, direct at 7x7 only, 21 rounds interleaved, both orders: 1 thread 0.965x / 0.974x,
    # 2 threads 0.973x / 1.032x; its two 512-channel 3x3 convs at 7x7 3.05 -> 2.18 ms (F(2x2) tiles overhang
    # a 7x7 map by 30%); at 14x14 Winograd's 244 effective GFLOP/s beat direct bf16 (Winograd everywhere
    # had taken 0.82x the time of direct everywhere)
    PlanRow("Zen 4", _zen4_bf16, "bf16_direct_3x3_max_outputs", 49,
            "direct bf16 products for 3x3 convs at 7x7 and smaller", "benchmarks.ab ResNet-50 --precision bf16"),
    # Zen 4, RegNetX bf16 (profile build, 1 thread): its eleven 512-channel convs in groups of 64 at 14x14
    # 9.40 -> 7.04 ms direct (Winograd at about 135 effective GFLOP/s, a 64 x 64 GEMM per group and tile
    # point); its 192-channel ones at 28x28 3.61 -> 4.73 ms, so they keep Winograd
    PlanRow("Zen 4", _zen4_bf16, "bf16_direct_grouped_3x3_max_outputs", 196,
            "direct bf16 products for grouped 3x3 convs at 14x14 and smaller", "benchmarks.ab RegNetX --precision bf16"),
    # F(2x2) at 14x14 on an Emerald-Rapids-class Xeon (2 MB L2), 9 rounds interleaved, both orders, 1 / 2
    # threads: RegNetY-4GF 0.970x (swapped 1.028x) / 0.975x, ResNet-50 0.983x (1.022x) / 1.004x; F(2x2)
    # also at 28x28 RegNetY 1.004x, direct at 7x7 0.994x. F(4x4) over a 14x14 map is 16 tiles (a 30%
    # overhang), its GEMMs 16 rows against 2.25x the filters of F(2x2)'s 49
    # Zen 4, ResNeXt-50's 16-channel groups, 1 thread (a C harness against the network's profile): 512
    # channels at 14x14 0.92 -> 0.36 ms, 28x28 stride 2 0.83 -> 0.41; its 32-channel groups at 7x7 stay
    # GEMMs (0.39 against 0.56 direct: a 7-wide row fills no tile). The network, 11 rounds interleaved,
    # both orders: 0.973x / 0.949x (1 thread), 0.964x / 0.968x (2 threads)
    PlanRow("Zen 4", _zen4_bf16, "grouped_direct_block_min_width", 12,
            "groups of one block by the direct grouped kernel from 12-wide rows", "benchmarks.ab ResNeXt-50-ish"),
    PlanRow("Intel AVX-512", _intel_512, "blocked_winograd4_min_outputs", 15 * 15,
            "F(2x2) Winograd for blocked 3x3 convs at 14x14 and smaller", "benchmarks.ab RegNetY-4GF, ResNet-50"),
)


def plan_value(knob: str, target: str) -> int:
    if resolve_target(target) == "native":
        flags, vendor = target_module.cpu_flags(), target_module.cpu_vendor()
        for r in PLAN_TUNING:
            if r.knob == knob and r.when(flags, vendor):
                return r.value
    return PLAN_DEFAULTS[knob]
