/* cuvil_run: run one compiled model with no Python: inputs from .npy files, outputs to .npy files.
 *
 *   cuvil_run [-w weights.bin] [-t threads] [-o outdir] [-n repeat] [-i 1] input0.npy [input1.npy ...]
 *
 * -i 1 also writes the inputs back, after the run, to OUTDIR/input<i>.npy: a model that updates an
 * input in place (an LLM step's KV cache) hands the caller its new state.
 * Built with the model (model.c, the kernel library) for its target, statically, so the binary and
 * weights.bin are all a device needs. cuvil_run_io.h (generated) names the model's API prefix and
 * its inputs' and outputs' dtypes and ranks; output i is written to OUTDIR/output<i>.npy. Every .npy file is untrusted: its header is parsed with
 * bounds on every number, its dtype and rank must be the model's and its size must match its shape
 * exactly; the model's own run checks the dims. Exit codes: 0 ok, 1 usage, 2 bad input file,
 * 3 the model refused the inputs, 4 out of memory or an I/O error. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "cuvil_run_io.h"

#define MAX_RANK 16
#define MAX_HEADER 65536
#define MAX_DIM ((int64_t)1 << 40)

typedef struct {
    const char *descr;              /* numpy's dtype string ("<f4") */
    int itemsize, rank;
} io_spec;

static const io_spec INPUTS[] = {CUVIL_RUN_INPUTS};
static const io_spec OUTPUTS[] = {CUVIL_RUN_OUTPUTS};
enum { N_IN = sizeof(INPUTS) / sizeof(INPUTS[0]) - 1, N_OUT = sizeof(OUTPUTS) / sizeof(OUTPUTS[0]) - 1 };

static void fail(int code, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "cuvil_run: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    exit(code);
}

static void *aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) fail(4, "out of memory (%s%s)", "", "");
    return p;
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) fail(2, "cannot open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || ftell(f) < 0) fail(2, "cannot read %s%s", path, "");
    *size = (size_t)ftell(f);
    rewind(f);
    unsigned char *buf = aligned(*size);
    if (*size && fread(buf, 1, *size, f) != *size) fail(2, "cannot read %s%s", path, "");
    fclose(f);
    return buf;
}

/* The value text after 'key': in a .npy header dict, or NULL. */
static const char *find_key(const char *hdr, const char *key) {
    const char *p = strstr(hdr, key);
    if (!p) return NULL;
    p += strlen(key);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* A .npy file's data: checks the header against the model's input `spec`, fills shape, returns the
 * offset of the data (64-byte aligned files from numpy, but any offset is accepted: data is copied). */
static size_t parse_npy(const char *path, const unsigned char *buf, size_t size, const io_spec *spec,
                        int64_t *shape) {
    if (size < 10 || memcmp(buf, "\x93NUMPY", 6)) fail(2, "%s is not a .npy file%s", path, "");
    size_t hlen, start;
    if (buf[6] == 1) { hlen = buf[8] | (size_t)buf[9] << 8; start = 10; }
    else if ((buf[6] == 2 || buf[6] == 3) && size >= 12) {
        hlen = buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
        start = 12;
    } else fail(2, "%s: unsupported .npy version%s", path, "");
    if (hlen > MAX_HEADER || hlen > size - start) fail(2, "%s: .npy header is truncated or too long%s", path, "");
    char hdr[MAX_HEADER + 1];
    memcpy(hdr, buf + start, hlen);
    hdr[hlen] = 0;
    if (strlen(hdr) != hlen) fail(2, "%s: .npy header holds a NUL byte%s", path, "");

    const char *d = find_key(hdr, "'descr'");
    size_t dl = strlen(spec->descr);
    if (!d || *d != '\'' || strncmp(d + 1, spec->descr, dl) || d[1 + dl] != '\'')
        fail(2, "%s: expected dtype %s (numpy descr)", path, spec->descr);
    const char *fo = find_key(hdr, "'fortran_order'");
    if (!fo || strncmp(fo, "False", 5)) fail(2, "%s: expected a C-order array (fortran_order False)%s", path, "");
    const char *s = find_key(hdr, "'shape'");
    if (!s || *s != '(') fail(2, "%s: .npy header has no shape%s", path, "");
    s++;
    int rank = 0;
    int64_t count = 1;
    for (;;) {
        while (*s == ' ') s++;
        if (*s == ')') break;
        if (*s < '0' || *s > '9') fail(2, "%s: bad shape in .npy header%s", path, "");
        int64_t v = 0;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (*s++ - '0');
            if (v > MAX_DIM) fail(2, "%s: a dim of the shape is too large%s", path, "");
        }
        if (rank == MAX_RANK) fail(2, "%s: shape has more than 16 dims%s", path, "");
        shape[rank++] = v;
        if (v && count > MAX_DIM / v) fail(2, "%s: shape holds too many elements%s", path, "");
        count *= v;
        while (*s == ' ') s++;
        if (*s == ',') s++;
        else if (*s != ')') fail(2, "%s: bad shape in .npy header%s", path, "");
    }
    if (rank != spec->rank) {
        char want[32];
        snprintf(want, sizeof want, "%d", spec->rank);
        fail(2, "%s: expected an array of rank %s", path, want);
    }
    size_t data = start + hlen;
    if ((uint64_t)count * (uint64_t)spec->itemsize != size - data)
        fail(2, "%s: data size does not match the shape in its header%s", path, "");
    return data;
}

static void write_npy(const char *path, const io_spec *spec, const int64_t *shape, const void *data, size_t bytes) {
    char dims[MAX_RANK * 24 + 8] = "";
    size_t n = 0;
    for (int i = 0; i < spec->rank; i++)
        n += (size_t)snprintf(dims + n, sizeof dims - n, "%lld,%s", (long long)shape[i], i + 1 < spec->rank ? " " : "");
    if (spec->rank > 1) dims[n - 1] = 0;             /* numpy writes (2, 3) and (5,) */
    char hdr[MAX_RANK * 24 + 128];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", spec->descr, dims);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) fail(4, "cannot write %s: %s", path, strerror(errno));
    unsigned short hl = (unsigned short)(len + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    if ((bytes && fwrite(data, 1, bytes, f) != bytes) || fclose(f)) fail(4, "cannot write %s%s", path, "");
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    const char *weights_path = "weights.bin", *outdir = ".";
    int threads = 1, repeat = 1, write_inputs = 0, first = 1;
    for (; first < argc && argv[first][0] == '-' && argv[first][1]; first += 2) {
        char opt = argv[first][1];
        if (first + 1 >= argc || argv[first][2]) fail(1, "option %s needs a value%s", argv[first], "");
        const char *v = argv[first + 1];
        if (opt == 'w') weights_path = v;
        else if (opt == 'o') outdir = v;
        else if (opt == 't' || opt == 'n' || opt == 'i') {
            char *end, name[2] = {opt, 0};
            long x = strtol(v, &end, 10), lo = opt == 'i' ? 0 : 1, hi = opt == 'i' ? 1 : 4096;
            if (*end || !*v || x < lo || x > hi) fail(1, "option -%s wants a number in range, got %s", name, v);
            *(opt == 't' ? &threads : opt == 'n' ? &repeat : &write_inputs) = (int)x;
        } else fail(1, "unknown option %s (use -w weights.bin -t threads -o outdir -n repeat -i 0|1)%s", argv[first], "");
    }
    if (argc - first != N_IN) {
        char want[32];
        snprintf(want, sizeof want, "%d", N_IN);
        fail(1, "expected %s input .npy files, one per model input%s", want, "");
    }
    size_t wsize;
    unsigned char *weights = read_file(weights_path, &wsize);
    cuvil_model *m = CUVIL_RUN_FN(create)(weights, (int64_t)wsize, threads);
    if (!m) fail(3, "%s: %s", weights_path, CUVIL_RUN_FN(last_error)());

    const void *in[N_IN + 1];
    int64_t in_shape[N_IN + 1][MAX_RANK];
    const int64_t *in_shapes[N_IN + 1];
    for (int i = 0; i < N_IN; i++) {
        size_t size;
        unsigned char *buf = read_file(argv[first + i], &size);
        size_t off = parse_npy(argv[first + i], buf, size, &INPUTS[i], in_shape[i]);
        unsigned char *data = aligned(size - off);       /* the kernels read aligned data */
        memcpy(data, buf + off, size - off);
        free(buf);
        in[i] = data;
        in_shapes[i] = in_shape[i];
    }
    void *out[N_OUT + 1];
    int64_t out_shape[N_OUT + 1][MAX_RANK];
    size_t out_bytes[N_OUT + 1];
    for (int i = 0; i < N_OUT; i++) {
        if (CUVIL_RUN_FN(output_shape)(in_shapes, i, out_shape[i]))
            fail(3, "model refused the inputs: %s%s", CUVIL_RUN_FN(last_error)(), "");
        uint64_t n = (uint64_t)OUTPUTS[i].itemsize;
        for (int j = 0; j < OUTPUTS[i].rank; j++) n *= (uint64_t)out_shape[i][j];
        out_bytes[i] = (size_t)n;
        out[i] = aligned(out_bytes[i]);
    }
    void *arena = aligned((size_t)CUVIL_RUN_FN(arena_size)());
    double best = 1e300, t0 = 0;
    for (int r = 0; r < repeat; r++) {
        t0 = now_ms();
        if (CUVIL_RUN_FN(run)(m, in, in_shapes, out, arena))
            fail(3, "model refused the inputs: %s%s", CUVIL_RUN_FN(last_error)(), "");
        double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    if (repeat > 1) fprintf(stderr, "cuvil_run: best of %d runs %.3f ms\n", repeat, best);
    for (int i = 0; i < N_OUT; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/output%d.npy", outdir, i) >= (int)sizeof path)
            fail(1, "output path too long%s%s", "", "");
        write_npy(path, &OUTPUTS[i], out_shape[i], out[i], out_bytes[i]);
    }
    for (int i = 0; write_inputs && i < N_IN; i++) {
        char path[4096];
        uint64_t n = (uint64_t)INPUTS[i].itemsize;
        for (int j = 0; j < INPUTS[i].rank; j++) n *= (uint64_t)in_shape[i][j];
        if (snprintf(path, sizeof path, "%s/input%d.npy", outdir, i) >= (int)sizeof path)
            fail(1, "output path too long%s%s", "", "");
        write_npy(path, &INPUTS[i], in_shape[i], in[i], (size_t)n);
    }
    CUVIL_RUN_FN(destroy)(m);
    return 0;
}
