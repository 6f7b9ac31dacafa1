/* MXFP8 and MXFP4 on the device.
 *
 * Kernel: kern_quant_mx_cuda (plugins/mxfp8/quant_mx.cu) against the CPU
 * references kern_quant_mxfp8 and kern_quant_mxfp4, bit for bit: F32, F16
 * and BF16 weights, shapes that are not multiples of 32 (ragged last
 * blocks, odd K for the packed nibbles) and empty ones, row-major, padded,
 * transposed and misaligned views of weight, output and scales, zero rows,
 * subnormal rows, the largest finite values, a block amax at every f32
 * binade (every scale code, both clamps), stacked experts (evenly spaced
 * pieces merge into one) mixed with pieces that do not, more pieces than
 * one launch carries, a caller's stream, NaN and infinity refused with the
 * lowest piece (or expert) named, and the encoders on every input they can
 * meet (|x / X| below 2^(emax+1): every f32 there, through the kernel;
 * REFIT_GPU_MX_STRIDE=S takes every S-th plus the neighbourhoods of every
 * code and rounding boundary, for the emulator). Each case runs the
 * reference on a junk-filled host allocation and the kernel on a device
 * copy of the same junk, then compares whole allocations, so bytes outside
 * the views are checked too. MXFP8 runs with the integer encoder and, where
 * the backend's check passed, with the conversion instruction. The dense
 * path (BF16, contiguous aligned rows, k a multiple of 32) beside the
 * general one in one call: strided, ragged and misaligned neighbours, lines
 * ending inside a unit, stacks (one line, a line a matrix, a line a row),
 * 200 dense pieces, NaN/infinity naming the lowest piece with the bad block
 * left unwritten, and every BF16 value at 17 amax exponents.
 *
 * Public API (not in the emulator build, REFIT_GPU_MX_EMU): online mxfp8
 * and mxfp4 modules through the plugins and the host's quant_mx service,
 * the model in device memory against the same model in host memory (the
 * CPU reference): fused q/k/v with a ragged K, an F32 weight, fused F16
 * weights with F8_E8M0 scales, stacked experts (mxfp8 one tensor each,
 * mxfp4 one [E, N, K] tensor), an odd K for mxfp4; every source kind and a
 * caller's stream; reload equals a cold start; a NaN refused (module and
 * tensor named) with every byte kept; an abort with rollback after every
 * post-load; every module in one refit_load_many (one post_load_many a
 * format, each source read in place: counted through wrappers of the
 * plugins) equal to the per-call path and the CPU reference, and a NaN in
 * one module of that batch named at finalize, rolled back.
 * REFIT_GPU_MX_ON_HOST=1 runs the "device" model in host memory
 * (the service's host path), so CI checks it without a GPU.
 *
 * Without a device the suite is skipped. */
#include <dlfcn.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include <refit/format.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/cast.h"
#include "kernels/minifloat.h"
#include "plugins/fp8/fp8_direct.h"
#include "plugins/mxfp8/mx_direct.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"

#ifndef REFIT_GPU_MX_EMU
#include <refit/refit.h>

#include "gpu_pair.h"
#endif

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})
#define U8 ((refit_dtype){REFIT_DTYPE_UINT, 8, 1})
#define E8M0 ((refit_dtype){REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1})

static int encoders = 1; /* MXFP8 runs per case: 1, or 2 with the instruction */

static const char *dt_name(refit_dtype d)
{
    return d.bits == 32 ? "f32" : d.code == REFIT_DTYPE_BFLOAT ? "bf16" : "f16";
}

/* ---- a host allocation and its device twin, same junk ---- */

/* ---- values ---- */

enum pat { PAT_MIXED, PAT_ZERO, PAT_SUBNORMAL, PAT_BIG, PAT_RANDOM };

static float biggest(refit_dtype dt)
{
    if (dt.bits == 32)
        return 3.4028235e38f;
    return dt.code == REFIT_DTYPE_FLOAT ? 65504.0f : 3.3895314e38f; /* bf16's largest */
}

/* One value of kind p (raw 16-bit bits for subnormals of F16/BF16). */
static void value(refit_dtype dt, int p, float *f, uint16_t *raw, int *use_raw)
{
    *use_raw = 0;
    *f = 0.0f;
    switch (p) {
    case PAT_ZERO:
        *f = (twin_rnd() & 1) ? -0.0f : 0.0f;
        break;
    case PAT_SUBNORMAL: {
        uint32_t b = (uint32_t)(twin_rnd() & 0x80000000u) | ((uint32_t)(twin_rnd() & 0x7fffffu) >>
                                                         (twin_rnd() % 23));
        memcpy(f, &b, 4);
        uint16_t s = (uint16_t)(twin_rnd() & 0x8000u);
        *raw = dt.code == REFIT_DTYPE_BFLOAT ? (uint16_t)(s | (twin_rnd() & 0x7fu))
                                             : (uint16_t)(s | (twin_rnd() & 0x3ffu));
        *use_raw = dt.bits == 16;
        break;
    }
    case PAT_BIG:
        *f = biggest(dt) * (0.5f + 0.5f * twin_uniform());
        if (twin_rnd() % 61 == 0)
            *f = (twin_rnd() & 1) ? biggest(dt) : -biggest(dt);
        break;
    default: {
        int e = (int)(twin_rnd() % 60) - 30;
        *f = twin_uniform() * (float)(e < 0 ? 1.0 / (double)(1ull << -e) : (double)(1ull << e));
        if (dt.bits == 16 && dt.code == REFIT_DTYPE_FLOAT)
            *f = *f > 60000.0f ? 60000.0f : *f < -60000.0f ? -60000.0f : *f;
        break;
    }
    }
}

/* Fill x with pattern p; mixed: rows of zeros, subnormals and the largest
 * values among random rows, and some blocks of one kind in a random row. */
static void fill(const refit_view *x, enum pat p)
{
    int64_t n = x->shape[0], k = x->shape[1];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            int kind = p;
            if (p == PAT_MIXED) {
                kind = i % 7 == 3 ? PAT_ZERO : i % 11 == 5 ? PAT_SUBNORMAL : i % 13 == 6 ? PAT_BIG
                                                                                        : PAT_RANDOM;
                if (kind == PAT_RANDOM && (j / 32) % 5 == 2)
                    kind = (int)((i + j / 32) % 3) + PAT_ZERO;
            }
            float f;
            uint16_t raw = 0;
            int use_raw;
            value(x->dtype, kind, &f, &raw, &use_raw);
            view_put(x, i, j, f, raw, use_raw);
        }
}

/* ---- one call, device against reference ---- */

static int reference(int bits, uint32_t n, const refit_view *q, const refit_view *s,
                     const refit_view *x, int32_t *bad)
{
    *bad = -1;
    for (uint32_t i = 0; i < n; i++) {
        int rc = bits == 8 ? kern_quant_mxfp8(&q[i], &s[i], &x[i])
                           : kern_quant_mxfp4(&q[i], &s[i], &x[i]);
        if (rc) {
            *bad = (int32_t)i;
            return rc;
        }
    }
    return REFIT_OK;
}

/* Layout of the output: MXFP4 rows must be contiguous (no transposed). */
static lay q_layout(int bits, int kind, int64_t n, int64_t k)
{
    if (bits == 4 && kind == 2)
        kind = 1;
    return layout(kind, n, bits == 4 ? (k + 1) / 2 : k);
}

/* One piece: x [n, k] of dt in layout xl, q in ql, scales in sl, values
 * of pattern p, on stream. */
static void one(int bits, refit_dtype dt, int64_t n, int64_t k, int xl, int ql, int sl,
                enum pat p, void *stream)
{
    int64_t qk = bits == 4 ? (k + 1) / 2 : k, nb = kern_mx_blocks(k);
    lay lx = layout(xl, n, k), lq = q_layout(bits, ql, n, k), ls = layout(sl, n, nb);
    twin tx = twin_new((size_t)lx.elems * (dt.bits / 8));
    twin tq = twin_new((size_t)lq.elems);
    twin ts = twin_new((size_t)ls.elems);
    refit_view gx = v2(tx.d, dt, n, k, lx.s0, lx.s1, lx.first);
    refit_view gq = v2(tq.d, bits == 8 ? E4M3 : U8, n, qk, lq.s0, lq.s1, lq.first);
    refit_view gs = v2(ts.d, (sl & 1) ? E8M0 : U8, n, nb, ls.s0, ls.s1, ls.first);
    refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
    fill(&hx, p);
    twin_push(&tx);
    char *jq = twin_save(&tq), *js = twin_save(&ts);
    int32_t bad_h, bad_d;
    int rh = reference(bits, 1, &hq, &hs, &hx, &bad_h);
    for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
        if (hw) {
            twin_restore(&tq, jq);
            twin_restore(&ts, js);
        }
        int rd = kern_quant_mx_cuda(1, &gq, &gs, &gx, bits, hw, &bad_d, stream);
        char what[200];
        snprintf(what, sizeof what, "mxfp%d %s [%lld, %lld], layouts x %d q %d scales %d, "
                 "values %d, %s", bits, dt_name(dt), (long long)n, (long long)k, xl, ql, sl,
                 (int)p, hw ? "conversion instruction" : "integer encoder");
        if (rd != rh)
            fail_msg("%s: device returned %d (%s), the reference %d", what, rd,
                     kern_cuda_last_error(), rh);
        twin_check(&tq, what);
        twin_check(&ts, what);
        twin_check(&tx, what);
    }
    free(jq);
    free(js);
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

static const int64_t shapes[][2] = {
    {1, 1}, {7, 13}, {3, 32}, {5, 33}, {2, 64}, {31, 95}, {129, 257}, {4, 1000}, {0, 5},
    {5, 0}, {40, 256}, {3, 4099},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void sweep(int bits)
{
    refit_dtype dts[3] = {BF16, F16, F32};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int d = 0; d < 3; d++)
            for (int l = 0; l < 4; l++) {
                one(bits, dts[d], shapes[si][0], shapes[si][1], l, (l + d) % 4,
                    (int)((l + si) % 3), PAT_MIXED, NULL);
                if (l % 2 == 0)
                    one(bits, dts[d], shapes[si][0], shapes[si][1], l, (l + d + 1) % 4, 0,
                        PAT_RANDOM, NULL);
            }
}

/* The backend's E4M3 encoder choice: MXFP8 cases then run with both. */
static void test_encoder_choice(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    uint64_t bad = 0;
    int enc = kern_fp8_encoder(0, &bad, NULL);
    print_message("# backend E4M3 encoder: %s (%llu mismatches)\n",
                  enc == 1 ? "the conversion instruction" : enc == 0 ? "integer" : "?",
                  (unsigned long long)bad);
    assert_true(enc == 0 || enc == 1);
    encoders = 1 + (enc == 1);
}

static void test_mxfp8_layouts(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    sweep(8);
}

static void test_mxfp4_layouts(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    sweep(4);
}

/* Whole matrices of one kind: zeros (scale code 0), subnormals (tiny or
 * clamped scales), the largest finite values. */
static void test_edges(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[3] = {BF16, F16, F32};
    enum pat pats[3] = {PAT_ZERO, PAT_SUBNORMAL, PAT_BIG};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int d = 0; d < 3; d++)
            for (int p = 0; p < 3; p++) {
                one(bits, dts[d], 9, 130, 0, 0, 0, pats[p], NULL);
                one(bits, dts[d], 33, 17, 2, 1, 2, pats[p], NULL);
            }
}

/* A block amax at every f32 binade and every subnormal bit position, with
 * random smaller elements: every scale code the rule gives, both clamps. */
static void test_scales(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { ROWS = 254 + 23, K = 64 };
    for (int bits = 8; bits >= 4; bits -= 4) {
        int64_t qk = bits == 4 ? K / 2 : K;
        twin tx = twin_new(ROWS * K * 4), tq = twin_new(ROWS * qk), ts = twin_new(ROWS * 2);
        refit_view gx = v2(tx.d, F32, ROWS, K, K, 1, 0);
        refit_view gq = v2(tq.d, bits == 8 ? E4M3 : U8, ROWS, qk, qk, 1, 0);
        refit_view gs = v2(ts.d, U8, ROWS, 2, 2, 1, 0);
        refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < K; j++) {
                /* rows 0..253: amax 2^(r-126) * (1 + m); 254..: a subnormal amax */
                uint32_t top = r < 254
                                   ? (uint32_t)(r + 1) << 23 | (uint32_t)(twin_rnd() & 0x7fffffu)
                                   : 1u << (r - 254);
                uint32_t b = j % 32 == 7 ? top : (uint32_t)(twin_rnd() % (top + 1u));
                b |= (uint32_t)(twin_rnd() & 0x80000000u);
                float f;
                memcpy(&f, &b, 4);
                view_put(&hx, r, j, f, 0, 0);
            }
        twin_push(&tx);
        int32_t bad;
        assert_int_equal(reference(bits, 1, &hq, &hs, &hx, &bad), REFIT_OK);
        for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
            assert_int_equal(kern_quant_mx_cuda(1, &gq, &gs, &gx, bits, hw, &bad, NULL),
                             REFIT_OK);
            twin_check(&tq, bits == 8 ? "mxfp8 every binade" : "mxfp4 every binade");
            twin_check(&ts, bits == 8 ? "mxfp8 scales" : "mxfp4 scales");
        }
        int lo = 255, hi = -1;
        for (int r = 0; r < ROWS * 2; r++) {
            int s = (unsigned char)ts.h[r];
            lo = s < lo ? s : lo;
            hi = s > hi ? s : hi;
        }
        print_message("# mxfp%d: scale codes %d..%d\n", bits, lo, hi);
        assert_int_equal(lo, 0); /* the low clamp (subnormal amaxes) */
        assert_int_equal(hi, 254 - (bits == 8 ? 8 : 2));
        twin_free(&tx);
        twin_free(&tq);
        twin_free(&ts);
    }
}

/* ---- several pieces per call ---- */

enum { MAXP = 200 };

typedef struct multi {
    uint32_t n;
    twin tx, tq, ts;
    refit_view gq[MAXP], gs[MAXP], gx[MAXP], hq[MAXP], hs[MAXP], hx[MAXP];
} multi;

/* n pieces [rows[i], k]; gap[i] elements of padding after piece i (0:
 * evenly spaced stacks merge; odd: they do not). */
static void multi_new(multi *m, int bits, refit_dtype dt, uint32_t n, const int64_t *rows,
                      int64_t k, const int64_t *gap)
{
    memset(m, 0, sizeof *m);
    m->n = n;
    int64_t qk = bits == 4 ? (k + 1) / 2 : k, nb = kern_mx_blocks(k);
    size_t xe = 0, qe = 0, se = 0;
    for (uint32_t i = 0; i < n; i++) {
        xe += (size_t)(rows[i] * k + gap[i]);
        qe += (size_t)(rows[i] * qk + gap[i]);
        se += (size_t)(rows[i] * nb + gap[i]);
    }
    m->tx = twin_new((xe + 1) * (dt.bits / 8));
    m->tq = twin_new(qe + 1);
    m->ts = twin_new(se + 1);
    size_t xo = 0, qo = 0, so = 0;
    for (uint32_t i = 0; i < n; i++) {
        m->gx[i] = v2(m->tx.d, dt, rows[i], k, k, 1, (int64_t)xo);
        m->gq[i] = v2(m->tq.d, bits == 8 ? E4M3 : U8, rows[i], qk, qk, 1, (int64_t)qo);
        m->gs[i] = v2(m->ts.d, U8, rows[i], nb, nb, 1, (int64_t)so);
        xo += (size_t)(rows[i] * k + gap[i]);
        qo += (size_t)(rows[i] * qk + gap[i]);
        so += (size_t)(rows[i] * nb + gap[i]);
        m->hx[i] = on_host(m->gx[i], &m->tx);
        m->hq[i] = on_host(m->gq[i], &m->tq);
        m->hs[i] = on_host(m->gs[i], &m->ts);
        fill(&m->hx[i], PAT_MIXED);
    }
    twin_push(&m->tx);
}

static void multi_free(multi *m)
{
    twin_free(&m->tx);
    twin_free(&m->tq);
    twin_free(&m->ts);
}

static void multi_run(multi *m, int bits, const char *what, void *stream)
{
    int32_t bad_h, bad_d;
    char *jq = twin_save(&m->tq), *js = twin_save(&m->ts);
    int rh = reference(bits, m->n, m->hq, m->hs, m->hx, &bad_h);
    for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
        twin_restore(&m->tq, jq);
        twin_restore(&m->ts, js);
        int rd = kern_quant_mx_cuda(m->n, m->gq, m->gs, m->gx, bits, hw, &bad_d, stream);
        if (rh != REFIT_OK || rd != REFIT_OK)
            fail_msg("%s, mxfp%d: device %d (%s), reference %d", what, bits, rd,
                     kern_cuda_last_error(), rh);
        twin_check(&m->tq, what);
        twin_check(&m->ts, what);
    }
    free(jq);
    free(js);
}

/* Stacked experts (evenly spaced: one merged piece), broken by a padded
 * piece, an empty one and a different shape; then more pieces than a
 * launch carries. */
static void test_pieces(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    /* stacks: [0, 1] (2 is further away), [2, 3, 4], [6, 7]; 5 is empty */
    static const int64_t rows[10] = {40, 40, 40, 40, 40, 0, 40, 40, 17, 40};
    static const int64_t gap[10] = {0, 3, 0, 0, 0, 0, 0, 0, 0, 0};
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int d = 0; d < 3; d++) {
            multi m;
            multi_new(&m, bits, dts[d], 10, rows, 136, gap);
            multi_run(&m, bits, "stacks", NULL);
            multi_free(&m);
        }
    int64_t r2[MAXP], g2[MAXP];
    for (int i = 0; i < MAXP; i++) {
        r2[i] = 1 + (i * 37) % 23;
        g2[i] = i % 3 == 0;
    }
    for (int bits = 8; bits >= 4; bits -= 4) {
        multi m;
        multi_new(&m, bits, BF16, MAXP, r2, 72, g2);
        multi_run(&m, bits, "200 pieces", NULL);
        multi_free(&m);
    }
}

/* A caller's non-blocking stream. */
static void test_user_stream(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    one(8, BF16, 300, 1000, 0, 0, 0, PAT_MIXED, st);
    one(4, BF16, 300, 1001, 0, 0, 0, PAT_MIXED, st);
    CU(cudaStreamDestroy(st));
}

/* NaN or infinity: REFIT_ECORRUPT, the lowest piece holding one named; a
 * merged stack names its expert. */
static void test_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t rows[6] = {64, 64, 64, 64, 7, 300};
    static const int64_t gap[6] = {0, 0, 0, 5, 0, 0};
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int d = 0; d < 3; d++)
            for (int which = 0; which < 3; which++) {
                multi m;
                multi_new(&m, bits, dts[d], 6, rows, 200, gap);
                /* a NaN in piece 5; -inf in piece 2 (inside the stack of
                 * 0..3); or +inf in piece 1 as well */
                view_put(&m.hx[5], 250, 199, __builtin_nanf(""), 0, 0);
                if (which >= 1)
                    view_put(&m.hx[2], 63, 3, -__builtin_inff(), 0, 0);
                if (which == 2)
                    view_put(&m.hx[1], 0, 0, __builtin_inff(), 0, 0);
                twin_push(&m.tx);
                int want = which == 0 ? 5 : which == 1 ? 2 : 1;
                for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
                    int32_t bad = 99;
                    int rc = kern_quant_mx_cuda(6, m.gq, m.gs, m.gx, bits, hw, &bad, NULL);
                    if (rc != REFIT_ECORRUPT || bad != want)
                        fail_msg("mxfp%d %s case %d: status %d, piece %d, want %d (%s)", bits,
                                 dt_name(dts[d]), which, rc, bad, want, kern_cuda_last_error());
                }
                multi_free(&m);
            }
}

/* The status word is kept per device between calls: after a refusal a
 * later call names its own piece (a lower one left over would win the
 * minimum), and a clean call after a refusal succeeds with every byte of
 * the reference; both the short and the full parameter block. */
static void test_status_after_refusal(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    int64_t rows[MAXP], gap[MAXP];
    for (int i = 0; i < MAXP; i++) {
        rows[i] = 3 + i % 5;
        gap[i] = 1; /* no stacks: each launch carries every piece */
    }
    static const uint32_t counts[2] = {4, MAXP};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int c = 0; c < 2; c++) {
            uint32_t n = counts[c];
            multi m;
            multi_new(&m, bits, BF16, n, rows, 96, gap);
            for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
                int32_t bad = 99;
                view_put(&m.hx[1], 1, 40, __builtin_nanf(""), 0, 0);
                twin_push(&m.tx);
                int rc = kern_quant_mx_cuda(n, m.gq, m.gs, m.gx, bits, hw, &bad, NULL);
                if (rc != REFIT_ECORRUPT || bad != 1)
                    fail_msg("mxfp%d, %u pieces: NaN in 1: status %d, piece %d", bits, n, rc,
                             bad);
                view_put(&m.hx[1], 1, 40, 0.5f, 0, 0);
                view_put(&m.hx[n - 1], 0, 95, -__builtin_inff(), 0, 0);
                twin_push(&m.tx);
                rc = kern_quant_mx_cuda(n, m.gq, m.gs, m.gx, bits, hw, &bad, NULL);
                if (rc != REFIT_ECORRUPT || bad != (int32_t)n - 1)
                    fail_msg("mxfp%d, %u pieces: after a refusal of piece 1, -inf in %u: "
                             "status %d, piece %d", bits, n, n - 1, rc, bad);
                view_put(&m.hx[n - 1], 0, 95, 2.0f, 0, 0);
                twin_push(&m.tx);
            }
            multi_run(&m, bits, "a clean call after refusals", NULL);
            multi_free(&m);
        }
}

/* ---- the dense path (BF16, rows contiguous and aligned, k a multiple of
 * 32) beside the general one in one call ---- */

/* A piece of a mixed call: x [n, k] BF16; layouts of x, q and scales:
 * 0 row-major, 1 rows padded to a 16-byte multiple (dense: lines are
 * rows), 2 transposed (q of MXFP4: padded by 3), 3 one element past an
 * aligned start, 4 rows padded by 3 elements. */
typedef struct pspec {
    int64_t n, k;
    int xl, ql, sl;
} pspec;

static lay dense_lay(int kind, int64_t n, int64_t k)
{
    lay l = {k, 1, 0, n * k};
    if (kind == 1 || kind == 4) {
        l.s0 = k + (kind == 1 ? 8 : 3);
        l.elems = n * l.s0;
    } else if (kind == 2) {
        l.s0 = 1;
        l.s1 = n;
    } else if (kind == 3) {
        l.first = 1;
    }
    l.elems += l.first;
    return l;
}

/* Pieces ps[0..n) in one allocation each for x, q and scales, every
 * piece starting 64-byte aligned (plus its layout's offset). */
static void multi_specs(multi *m, int bits, const pspec *ps, uint32_t n, enum pat p)
{
    memset(m, 0, sizeof *m);
    m->n = n;
    size_t xo[MAXP], qo[MAXP], so[MAXP], xe = 0, qe = 0, se = 0;
    lay lx[MAXP], lq[MAXP], ls[MAXP];
    for (uint32_t i = 0; i < n; i++) {
        int64_t k = ps[i].k, qk = bits == 4 ? (k + 1) / 2 : k;
        lx[i] = dense_lay(ps[i].xl, ps[i].n, k);
        lq[i] = dense_lay(bits == 4 && ps[i].ql == 2 ? 4 : ps[i].ql, ps[i].n, qk);
        ls[i] = dense_lay(ps[i].sl, ps[i].n, kern_mx_blocks(k));
        xo[i] = xe;
        qo[i] = qe;
        so[i] = se;
        xe += ((size_t)lx[i].elems + 31) / 32 * 32;
        qe += ((size_t)lq[i].elems + 63) / 64 * 64;
        se += ((size_t)ls[i].elems + 63) / 64 * 64;
    }
    m->tx = twin_new(xe * 2 + 64);
    m->tq = twin_new(qe + 64);
    m->ts = twin_new(se + 64);
    for (uint32_t i = 0; i < n; i++) {
        int64_t k = ps[i].k, qk = bits == 4 ? (k + 1) / 2 : k;
        m->gx[i] = v2(m->tx.d, BF16, ps[i].n, k, lx[i].s0, lx[i].s1, (int64_t)xo[i] + lx[i].first);
        m->gq[i] = v2(m->tq.d, bits == 8 ? E4M3 : U8, ps[i].n, qk, lq[i].s0, lq[i].s1,
                      (int64_t)qo[i] + lq[i].first);
        m->gs[i] = v2(m->ts.d, U8, ps[i].n, kern_mx_blocks(k), ls[i].s0, ls[i].s1,
                      (int64_t)so[i] + ls[i].first);
        m->hx[i] = on_host(m->gx[i], &m->tx);
        m->hq[i] = on_host(m->gq[i], &m->tq);
        m->hs[i] = on_host(m->gs[i], &m->ts);
        fill(&m->hx[i], p);
    }
    twin_push(&m->tx);
}

static void mixed(int bits, const pspec *ps, uint32_t n, const char *what)
{
    for (int p = 0; p < 2; p++) {
        multi m;
        multi_specs(&m, bits, ps, n, p ? PAT_RANDOM : PAT_MIXED);
        multi_run(&m, bits, what, NULL);
        multi_free(&m);
    }
}

/* Dense pieces beside strided, ragged and misaligned ones; dense pieces
 * whose lines end inside a unit (one block, one short of a segment or of
 * a unit of 32 or 64 blocks, padded rows); stacks of dense pieces (one line; a line a
 * matrix); many dense pieces (two launches). */
static void test_dense_mix(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const pspec beside[] = {
        {64, 256, 0, 0, 0}, {40, 256, 2, 0, 0}, {33, 128, 0, 2, 0}, {17, 96, 1, 1, 1},
        {5, 100, 0, 0, 0},  {8, 64, 0, 0, 0},   {8, 64, 3, 0, 0},   {8, 64, 0, 3, 0},
        {8, 64, 4, 0, 0},   {3, 160, 0, 0, 2},  {9, 64, 0, 4, 0},   {2, 2048, 0, 0, 0},
    };
    static const pspec tails[] = {
        {1, 32, 0, 0, 0},        {1, 31 * 32, 0, 0, 0}, {1, 7 * 32, 0, 0, 0},
        {1, 33 * 32, 0, 0, 0},   {3, 31 * 32, 1, 1, 1}, {5, 96, 0, 0, 0},
        {4, 9 * 32, 1, 0, 0},    {2, 32, 1, 1, 0},      {1, 64 * 32 + 32, 0, 0, 0},
        {1, 63 * 32, 0, 0, 0},   {2, 63 * 32, 1, 1, 0}, {3, 100 * 32, 0, 0, 0},
    };
    /* [0..3] one stack, one line; [4..6] a stack with a line a matrix
     * (each matrix's q and scales padded to 64 bytes); [7..9] rows padded:
     * a stack with a line a row; [10..12] rows padded unevenly: no stack,
     * a line a row each */
    static const pspec stacks[] = {
        {6, 64, 0, 0, 0},  {6, 64, 0, 0, 0},  {6, 64, 0, 0, 0},  {6, 64, 0, 0, 0},
        {5, 96, 0, 0, 0},  {5, 96, 0, 0, 0},  {5, 96, 0, 0, 0},  {64, 32, 1, 1, 0},
        {64, 32, 1, 1, 0}, {64, 32, 1, 1, 0}, {7, 32, 1, 1, 1},  {7, 32, 1, 1, 1},
        {7, 32, 1, 1, 1},
    };
    pspec many[MAXP];
    for (int i = 0; i < MAXP; i++)
        many[i] = (pspec){1 + (i * 37) % 23, 32 * (1 + i % 5), i % 7 == 3 ? 1 : 0, 0, 0};
    for (int bits = 8; bits >= 4; bits -= 4) {
        mixed(bits, beside, sizeof beside / sizeof beside[0], "dense beside general pieces");
        mixed(bits, tails, sizeof tails / sizeof tails[0], "dense lines ending inside a unit");
        mixed(bits, stacks, sizeof stacks / sizeof stacks[0], "dense stacks");
        mixed(bits, many, MAXP, "200 dense pieces");
    }
}

/* Device bytes of 1-byte view hv (host side of twin t) equal the host's:
 * back is the device copy of the whole twin. */
static void view_equal(const refit_view *hv, const twin *t, const unsigned char *back,
                       const char *what)
{
    for (int64_t i = 0; i < hv->shape[0]; i++)
        for (int64_t j = 0; j < hv->shape[1]; j++) {
            size_t at = (size_t)((const char *)hv->data - t->h) +
                        (size_t)(i * hv->strides[0] + j * hv->strides[1]);
            if (back[at] != (unsigned char)t->h[at])
                fail_msg("%s: [%lld, %lld] device %02x, host %02x", what, (long long)i,
                         (long long)j, back[at], (unsigned char)t->h[at]);
        }
}

static unsigned char *device_copy(const twin *t)
{
    unsigned char *b = malloc(t->bytes);
    assert_non_null(b);
    CU(cudaMemcpy(b, t->d, t->bytes, cudaMemcpyDeviceToHost));
    return b;
}

/* NaN and infinity in dense pieces beside general ones: the lowest piece
 * (the expert of a dense stack) named; the non-finite block left
 * unwritten (scale and elements keep their junk) while the rest of its
 * piece and the clean pieces are written as the reference writes them. */
static void test_dense_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    /* 0..3: a dense stack (one line); 4: general (transposed x); 5: dense,
     * rows padded; 6: general (k = 100); 7: dense, 33 blocks a row; 8..10:
     * a dense stack, a line a matrix; 11..13: a dense stack, a line a row */
    enum { NP = 14 };
    static const pspec ps[NP] = {
        {16, 256, 0, 0, 0}, {16, 256, 0, 0, 0}, {16, 256, 0, 0, 0}, {16, 256, 0, 0, 0},
        {20, 64, 2, 0, 0},  {9, 96, 1, 1, 1},   {6, 100, 0, 0, 0},  {3, 33 * 32, 0, 0, 0},
        {5, 96, 0, 0, 0},   {5, 96, 0, 0, 0},   {5, 96, 0, 0, 0},   {64, 32, 1, 1, 0},
        {64, 32, 1, 1, 0},  {64, 32, 1, 1, 0},
    };
    /* bad pieces (row, column) per case; want: the piece named */
    static const struct {
        int piece[2];
        int64_t row[2], col[2];
        int want;
    } cases[] = {
        {{2, -1}, {13, 0}, {200, 0}, 2},  /* inside the stack: its expert */
        {{7, 4}, {2, 5}, {33 * 32 - 1, 3}, 4}, /* a general piece below a dense one */
        {{6, 5}, {5, 8}, {99, 95}, 5},    /* a dense piece below a general one */
        {{7, -1}, {0, 0}, {32 * 31 + 5, 0}, 7}, /* the last block of a unit */
        {{0, 3}, {0, 15}, {0, 255}, 0},   /* the first and last element of a line */
        {{10, -1}, {4, 0}, {95, 0}, 10},  /* the last matrix of a line-a-matrix stack */
        {{13, 12}, {63, 5}, {31, 7}, 12}, /* line-a-row stack: its matrix, not its line */
    };
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
                multi m;
                multi_specs(&m, bits, ps, NP, PAT_RANDOM);
                for (int b = 0; b < 2; b++)
                    if (cases[c].piece[b] >= 0)
                        view_put(&m.hx[cases[c].piece[b]], cases[c].row[b], cases[c].col[b],
                                 b ? -__builtin_inff() : __builtin_nanf(""), 0, 0);
                twin_push(&m.tx);
                int32_t bad = 99;
                int rc = kern_quant_mx_cuda(NP, m.gq, m.gs, m.gx, bits, hw, &bad, NULL);
                if (rc != REFIT_ECORRUPT || bad != cases[c].want)
                    fail_msg("mxfp%d case %zu: status %d, piece %d, want %d (%s)", bits, c, rc,
                             bad, cases[c].want, kern_cuda_last_error());
                unsigned char *bq = device_copy(&m.tq), *bs = device_copy(&m.ts);
                for (uint32_t i = 0; i < NP; i++) {
                    int hit = -1;
                    for (int b = 0; b < 2; b++)
                        if (cases[c].piece[b] == (int)i)
                            hit = b;
                    char what[120];
                    snprintf(what, sizeof what, "mxfp%d case %zu piece %u", bits, c, i);
                    if (hit < 0) { /* clean: the reference's bytes */
                        int32_t bh;
                        assert_int_equal(reference(bits, 1, &m.hq[i], &m.hs[i], &m.hx[i], &bh),
                                         REFIT_OK);
                        view_equal(&m.hq[i], &m.tq, bq, what);
                        view_equal(&m.hs[i], &m.ts, bs, what);
                        continue;
                    }
                    /* the bad block keeps its junk (host bytes untouched so far) */
                    int64_t r = cases[c].row[hit], blk = cases[c].col[hit] / 32;
                    refit_view sv = m.hs[i], qv = m.hq[i];
                    sv.data = (char *)sv.data + r * sv.strides[0] + blk * sv.strides[1];
                    sv.shape[0] = sv.shape[1] = 1;
                    int64_t q0 = blk * (bits == 8 ? 32 : 16);
                    int64_t qn = qv.shape[1] - q0 < (bits == 8 ? 32 : 16) ? qv.shape[1] - q0
                                                                         : (bits == 8 ? 32 : 16);
                    qv.data = (char *)qv.data + r * qv.strides[0] + q0 * qv.strides[1];
                    qv.shape[0] = 1;
                    qv.shape[1] = qn;
                    snprintf(what, sizeof what, "mxfp%d case %zu piece %u: the bad block", bits,
                             c, i);
                    view_equal(&sv, &m.ts, bs, what);
                    view_equal(&qv, &m.tq, bq, what);
                    /* a clean row of the same piece: written */
                    int64_t cr = r == 0 ? m.hx[i].shape[0] - 1 : 0;
                    refit_view rx = m.hx[i], rq = m.hq[i], rs = m.hs[i];
                    rx.data = (char *)rx.data + cr * rx.strides[0] * 2;
                    rq.data = (char *)rq.data + cr * rq.strides[0];
                    rs.data = (char *)rs.data + cr * rs.strides[0];
                    rx.shape[0] = rq.shape[0] = rs.shape[0] = 1;
                    int32_t bh;
                    assert_int_equal(reference(bits, 1, &rq, &rs, &rx, &bh), REFIT_OK);
                    snprintf(what, sizeof what, "mxfp%d case %zu piece %u: a clean row", bits,
                             c, i);
                    view_equal(&rq, &m.tq, bq, what);
                    view_equal(&rs, &m.ts, bs, what);
                }
                free(bq);
                free(bs);
                multi_free(&m);
            }
}

/* Every BF16 value through the dense path: blocks of one anchor (the
 * block's amax, exponent field E, mantissa all ones) and 31 values of
 * magnitude up to it, both signs, for amax exponents around the clamps,
 * around MXFP4's table threshold (scale 3: E = 5) and MXFP8's (E = 8 + 3),
 * and across the range; whole allocations against the reference. */
static void test_dense_every_bf16(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int es[] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 60, 127, 200, 253, 254};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t e = 0; e < sizeof es / sizeof es[0]; e++) {
            uint32_t amax = (uint32_t)es[e] << 7 | 0x7fu, count = 2 * (amax + 1);
            int64_t rows = (count + 30) / 31, qk = bits == 8 ? 32 : 16;
            twin tx = twin_new((size_t)rows * 64), tq = twin_new((size_t)(rows * qk));
            twin ts = twin_new((size_t)rows);
            refit_view gx = v2(tx.d, BF16, rows, 32, 32, 1, 0);
            refit_view gq = v2(tq.d, bits == 8 ? E4M3 : U8, rows, qk, qk, 1, 0);
            refit_view gs = v2(ts.d, U8, rows, 1, 1, 1, 0);
            refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
            for (int64_t r = 0; r < rows; r++) {
                view_put(&hx, r, 0, 0.0f, (uint16_t)amax, 1);
                for (int j = 1; j < 32; j++) {
                    uint32_t t = (uint32_t)(r * 31 + j - 1) % count;
                    view_put(&hx, r, j, 0.0f, (uint16_t)((t >> 1) | (t & 1) << 15), 1);
                }
            }
            twin_push(&tx);
            int32_t bad;
            assert_int_equal(reference(bits, 1, &hq, &hs, &hx, &bad), REFIT_OK);
            for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
                char what[80];
                snprintf(what, sizeof what, "mxfp%d every bf16 up to amax exponent %d%s", bits,
                         es[e], hw ? " (instruction)" : "");
                int rc = kern_quant_mx_cuda(1, &gq, &gs, &gx, bits, hw, &bad, NULL);
                if (rc != REFIT_OK)
                    fail_msg("%s: %d (%s)", what, rc, kern_cuda_last_error());
                twin_check(&tq, what);
                twin_check(&ts, what);
            }
            twin_free(&tx);
            twin_free(&tq);
            twin_free(&ts);
        }
}

/* ---- the encoders on every input they can meet ---- */

/* With one element of each 32-block at 2^emax (X = 1, s = 127) and the
 * other 31 below 2^(emax+1), x / X = x: the kernel encodes x itself.
 * Values: f32 bits 0 .. limit in steps of `stride`, signs alternating;
 * with stride > 1 also +-24 bits around every code and rounding boundary
 * of the format. */
typedef struct sweep_src {
    int bits;
    uint32_t limit, stride;
    uint32_t edges[16384];
    uint32_t n_edges;
    uint64_t total;
} sweep_src;

static void add_edge(sweep_src *s, float c)
{
    uint32_t b;
    memcpy(&b, &c, 4);
    for (int d = -24; d <= 24; d++) {
        int64_t e = (int64_t)b + d;
        if (e >= 0 && e < s->limit && s->n_edges < 16384)
            s->edges[s->n_edges++] = (uint32_t)e;
    }
}

static void sweep_init(sweep_src *s, int bits, uint32_t stride)
{
    memset(s, 0, sizeof *s);
    s->bits = bits;
    s->stride = stride;
    s->limit = bits == 8 ? 0x44000000u : 0x41000000u; /* 512, 8 */
    if (stride > 1) {
        int codes = bits == 8 ? 0x7f : 8;
        for (int c = 0; c < codes; c++) {
            float v = bits == 8 ? kern_e4m3_to_f32((uint8_t)c) : kern_e2m1_to_f32((uint8_t)c);
            float w = c + 1 < codes ? (bits == 8 ? kern_e4m3_to_f32((uint8_t)(c + 1))
                                                 : kern_e2m1_to_f32((uint8_t)(c + 1)))
                                    : 2 * v;
            add_edge(s, v);
            add_edge(s, (v + w) / 2);
        }
        add_edge(s, 0.0f);
        if (bits == 8) { /* past 448: 464 rounds to even (448), 480 would be 0x7f */
            add_edge(s, 464.0f);
            add_edge(s, 480.0f);
        }
    }
    s->total = s->n_edges + ((uint64_t)s->limit + stride - 1) / stride;
}

static uint32_t sweep_at(const sweep_src *s, uint64_t i)
{
    uint32_t b = i < s->n_edges ? s->edges[i] : (uint32_t)((i - s->n_edges) * s->stride);
    return (i & 1) ? b | 0x80000000u : b;
}

static void test_encoders(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const char *e = getenv("REFIT_GPU_MX_STRIDE");
    uint32_t stride = e && atoi(e) > 1 ? (uint32_t)atoi(e) : 1;
    enum { ROWS = 1 << 16, PER = 31 };
    twin tx = twin_new((size_t)ROWS * 32 * 4), tq = twin_new((size_t)ROWS * 32);
    twin ts = twin_new(ROWS);
    uint8_t *back = malloc((size_t)ROWS * 32), *sback = malloc(ROWS);
    assert_non_null(back);
    assert_non_null(sback);
    for (int bits = 8; bits >= 4; bits -= 4) {
        sweep_src src;
        sweep_init(&src, bits, stride);
        float anchor = bits == 8 ? 256.0f : 4.0f;
        int64_t qk = bits == 8 ? 32 : 16;
        uint64_t checked = 0;
        for (uint64_t at = 0; at < src.total; at += (uint64_t)ROWS * PER) {
            uint64_t left = src.total - at;
            int64_t rows = left >= (uint64_t)ROWS * PER ? ROWS : (int64_t)((left + PER - 1) / PER);
            float *x = (float *)tx.h;
            for (int64_t r = 0; r < rows; r++) {
                x[r * 32] = anchor;
                for (int j = 0; j < PER; j++) {
                    uint64_t i = at + (uint64_t)r * PER + (uint64_t)j;
                    uint32_t b = i < src.total ? sweep_at(&src, i) : 0;
                    memcpy(&x[r * 32 + 1 + j], &b, 4);
                }
            }
            CU(cudaMemcpy(tx.d, tx.h, (size_t)rows * 128, cudaMemcpyHostToDevice));
            refit_view gx = v2(tx.d, F32, rows, 32, 32, 1, 0);
            refit_view gq = v2(tq.d, bits == 8 ? E4M3 : U8, rows, qk, qk, 1, 0);
            refit_view gs = v2(ts.d, U8, rows, 1, 1, 1, 0);
            for (int hw = 0; hw < (bits == 8 ? encoders : 1); hw++) {
                int32_t bad;
                if (kern_quant_mx_cuda(1, &gq, &gs, &gx, bits, hw, &bad, NULL) != REFIT_OK)
                    fail_msg("sweep: %s", kern_cuda_last_error());
                CU(cudaMemcpy(back, tq.d, (size_t)(rows * qk), cudaMemcpyDeviceToHost));
                CU(cudaMemcpy(sback, ts.d, (size_t)rows, cudaMemcpyDeviceToHost));
                for (int64_t r = 0; r < rows; r++) {
                    if (sback[r] != 127)
                        fail_msg("mxfp%d sweep: row %lld has scale %u, not 127", bits,
                                 (long long)r, sback[r]);
                    for (int j = 0; j < 32; j++) {
                        float f = x[r * 32 + j];
                        uint8_t want = bits == 8 ? kern_f32_to_e4m3_sat(f) : kern_f32_to_e2m1(f);
                        uint8_t got = bits == 8 ? back[r * 32 + j]
                                                : (uint8_t)((back[r * 16 + j / 2] >> (4 * (j & 1))) & 15u);
                        if (got != want) {
                            uint32_t b;
                            memcpy(&b, &f, 4);
                            fail_msg("mxfp%d (%s): x = %a (bits %08x) encodes to %02x, the "
                                     "reference %02x", bits, hw ? "instruction" : "integer",
                                     (double)f, b, got, want);
                        }
                    }
                }
            }
            checked += (uint64_t)rows * PER;
        }
        print_message("# mxfp%d: %llu inputs below 2^%d (stride %u, %u edge values) encode as "
                      "the reference\n", bits, (unsigned long long)src.total,
                      bits == 8 ? 9 : 3, stride, src.n_edges);
        assert_true(checked >= src.total);
    }
    free(back);
    free(sback);
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

#ifndef REFIT_GPU_MX_EMU
/* ---- through the public API: a model on the device against the same
 * model in host memory (the paired harness, gpu_pair.h) ---- */

/* The plugins through counting wrappers: each world registers them (so
 * the modules use them, not the loader's copies) and mxc counts their
 * post_load and post_load_many calls and records the staged view of
 * every checkpoint tensor a post-load saw. */
enum { MXC_FORMATS = 2 };
/* Post-load units of the model below: five modules, and the mxfp8 stack
 * l0.experts post-loaded an expert at a time (REFIT_MODULE_EXPERT_SLICES:
 * four slices): 5 + 4. */
enum { MXC_UNITS = 9 };
static const char *const mxc_names[MXC_FORMATS] = {"mxfp8", "mxfp4"};
static const refit_format_v2 *mxc_inner[MXC_FORMATS];
static refit_format_v2 mxc_wrapped[MXC_FORMATS];
static struct {
    int post, many, many_modules, n;
    char name[PAIR_MAX_CK][64];
    const void *staged[PAIR_MAX_CK];
} mxc;

static void mxc_reset(void)
{
    memset(&mxc, 0, sizeof mxc);
}

static void mxc_record(const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt && mxc.n < PAIR_MAX_CK; i++, mxc.n++) {
        snprintf(mxc.name[mxc.n], sizeof mxc.name[mxc.n], "%s", refit_ckpt(m, i)->name);
        mxc.staged[mxc.n] = refit_ckpt(m, i)->staged.data;
    }
}

#define MXC_WRAP(F)                                                                      \
    static int mxc_one_##F(const refit_host_v2 *h, const refit_fmt_module *m, void *st)  \
    {                                                                                    \
        mxc.post++;                                                                      \
        mxc_record(m);                                                                   \
        return mxc_inner[F]->post_load(h, m, st);                                        \
    }                                                                                    \
    static int mxc_many_##F(const refit_host_v2 *h, const refit_fmt_module *const *m,    \
                            uint32_t n, void *st)                                        \
    {                                                                                    \
        mxc.many++;                                                                      \
        mxc.many_modules += (int)n;                                                      \
        for (uint32_t i = 0; i < n; i++)                                                 \
            mxc_record(m[i]);                                                            \
        return mxc_inner[F]->post_load_many(h, m, n, st);                                \
    }
MXC_WRAP(0)
MXC_WRAP(1)

/* refit-fmt-<fmt>.so's format, from $REFIT_PLUGIN_PATH (tests/gpu/run_all.sh
 * sets it), $REFIT_BUILD_ROOT/plugins (meson test), or beside this program
 * (plugins/ of a tests/gpu/stage.sh folder, ../../plugins of a build). */
static const refit_format_v2 *mxc_open(const char *fmt)
{
    char dirs[4096], path[4200], self[1024] = ".";
    const char *root = getenv("REFIT_BUILD_ROOT");
    const char *env = getenv("REFIT_PLUGIN_PATH");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = 0;
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = 0;
    }
    snprintf(dirs, sizeof dirs, "%s:%s/plugins:%s/plugins:%s/../../plugins", env ? env : "",
             root ? root : ".", self, self);
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof path, "%s/refit-fmt-%s.so", d, fmt);
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        const refit_format_v2 *f = dl ? dlsym(dl, REFIT_FORMAT_PLUGIN_SYMBOL) : NULL;
        if (f)
            return f; /* kept open: the worlds use it */
    }
    fail_msg("refit-fmt-%s.so not found in $REFIT_PLUGIN_PATH or $REFIT_BUILD_ROOT/plugins",
             fmt);
    return NULL;
}

static void mxc_register(pair_world *w)
{
    for (int f = 0; f < MXC_FORMATS; f++) {
        if (!mxc_inner[f]) {
            mxc_inner[f] = mxc_open(mxc_names[f]);
            mxc_wrapped[f] = *mxc_inner[f];
            mxc_wrapped[f].post_load = f ? mxc_one_1 : mxc_one_0;
            /* without post_load_many the host calls post_load a module */
            mxc_wrapped[f].post_load_many =
                mxc_inner[f]->post_load_many ? (f ? mxc_many_1 : mxc_many_0) : NULL;
        }
        OK(w, refit_format_register(w->ctx, &mxc_wrapped[f]));
    }
}

/* An online module: runtime weight [e,] n, kq and its scales [e,] n, kb. */
static void module(pair_world *w, const char *name, const char *fmt, refit_dtype wdt,
                   refit_dtype sdt, int64_t e, int64_t n, int64_t kq, int64_t kb)
{
    OK(w, refit_model_add_module(w->m, name, fmt, NULL));
    if (e) {
        pair_bind(w, name, "weight", wdt, 3, (int64_t[]){e, n, kq});
        pair_bind(w, name, "weight_scale", sdt, 3, (int64_t[]){e, n, kb});
    } else {
        pair_bind(w, name, "weight", wdt, 2, (int64_t[]){n, kq});
        pair_bind(w, name, "weight_scale", sdt, 2, (int64_t[]){n, kb});
    }
}

/* A checkpoint weight [(e3,) rows, k] at row `row` of expert e (-1: none). */
static void weight(pair_world *w, const char *module, const char *name, refit_dtype dt,
                   int64_t e3, int64_t rows, int64_t k, int64_t row, int64_t e)
{
    if (e3)
        pair_expect(w, module, name, dt, 3, (int64_t[]){e3, rows, k}, "weight", 0, e);
    else
        pair_expect(w, module, name, dt, 2, (int64_t[]){rows, k}, "weight", row, e);
}

static void build(pair_world *w)
{
    char n[64];
    mxc_register(w);
    /* mxfp8: fused q/k/v, K = 136 (a ragged last block) */
    module(w, "l0.qkv", "mxfp8", E4M3, U8, 0, 280, 136, 5);
    weight(w, "l0.qkv", "l0.q_proj.weight", BF16, 0, 200, 136, 0, -1);
    weight(w, "l0.qkv", "l0.k_proj.weight", BF16, 0, 40, 136, 200, -1);
    weight(w, "l0.qkv", "l0.v_proj.weight", BF16, 0, 40, 136, 240, -1);
    /* an F32 weight; fused F16 weights with E8M0 scales */
    module(w, "l0.down", "mxfp8", E4M3, U8, 0, 200, 600, 19);
    weight(w, "l0.down", "l0.down_proj.weight", F32, 0, 200, 600, 0, -1);
    module(w, "l0.gate_up", "mxfp8", E4M3, E8M0, 0, 600, 200, 7);
    weight(w, "l0.gate_up", "l0.gate_proj.weight", F16, 0, 300, 200, 0, -1);
    weight(w, "l0.gate_up", "l0.up_proj.weight", F16, 0, 300, 200, 300, -1);
    /* stacked experts, one checkpoint tensor each */
    module(w, "l0.experts", "mxfp8", E4M3, U8, 4, 96, 64, 2);
    for (int e = 0; e < 4; e++) {
        snprintf(n, sizeof n, "l0.experts.%d.down_proj.weight", e);
        weight(w, "l0.experts", n, BF16, 0, 96, 64, 0, e);
    }
    /* mxfp4: experts in one [E, N, K] tensor; a 2-D weight with odd K */
    module(w, "l1.experts", "mxfp4", U8, U8, 3, 64, 65, 5);
    weight(w, "l1.experts", "l1.experts.weight", BF16, 3, 64, 130, 0, -1);
    module(w, "l1.o", "mxfp4", U8, E8M0, 0, 100, 39, 3);
    weight(w, "l1.o", "l1.o_proj.weight", F32, 0, 100, 77, 0, -1);
}

/* Every checkpoint tensor is a float weight; defect 1: a NaN at element 37. */
static const pair_format mx_model = {"REFIT_GPU_MX_ON_HOST", "mx", build, pair_float_ckpt};

/* The shared model cases; reloads and a cold start agree byte for byte
 * (fingerprints not compared here, as before the harness). */
#define MX_MODEL_CASES(setup, teardown)                                       \
    PAIR_MODEL_CASES(pair_case_reload_bytes_equal_cold, setup, teardown)

/* A NaN refused with module and tensor named and every byte kept; an abort
 * after every post-load ran restores every byte. */
static void test_model_nan_and_abort(void **state)
{
    /* l0.k_proj, l0.down_proj (F32), an mxfp8 expert, the mxfp4 experts,
     * the mxfp4 odd-K weight */
    static const int bads[5] = {1, 3, 7, 10, 11};
    pair_check_nan_and_abort(state, bads, 5);
}

/* A NaN in l0.k_proj (mxfp8) and in the mxfp4 experts: every post-load is
 * enqueued, finalize names the first only, the next update commits. */
static void test_model_status_at_finalize(void **state)
{
    pair_check_status_at_finalize(state, 1, 10, "NaN or infinity");
}

/* Every checkpoint tensor of w at version v in one refit_load_many, from
 * the world's own memory (cudaMalloc'd for the device world, 64-byte
 * aligned host memory otherwise: read in place by the post-loads), tensor
 * defect_at with a NaN (defect 1); returns its status. bufs[0 .. w->n_ck)
 * are the sources, for free_sources once the update has ended. */
static int load_many_v(pair_world *w, refit_txn *t, int v, int defect_at, void **bufs)
{
    const char *names[PAIR_MAX_CK];
    refit_tensor src[PAIR_MAX_CK];
    int64_t shapes[PAIR_MAX_CK][3];
    int dev = w->device && !pair_on_host_only();
    mxc_reset();
    for (int i = 0; i < w->n_ck; i++) {
        const pair_ck *c = &w->ck[i];
        size_t n;
        void *h = mx_model.ckpt_bytes(c, v, i == defect_at, &n);
        if (dev) {
            bufs[i] = pair_mem_alloc(1, n);
            pair_mem_put(1, bufs[i], h, n);
        } else {
            bufs[i] = aligned_alloc(64, (n + 63) / 64 * 64);
            assert_non_null(bufs[i]);
            memcpy(bufs[i], h, n);
        }
        free(h);
        memcpy(shapes[i], c->shape, sizeof shapes[i]);
        names[i] = c->name;
        src[i] = (refit_tensor){.data = bufs[i],
                                .device = {dev ? REFIT_DEVICE_CUDA : REFIT_DEVICE_CPU, 0},
                                .ndim = c->ndim, .dtype = c->dtype, .shape = shapes[i]};
    }
    return refit_load_many(t, (size_t)w->n_ck, names, src, NULL);
}

static void free_sources(pair_world *w, void **bufs)
{
    int dev = w->device && !pair_on_host_only();
    for (int i = 0; i < w->n_ck; i++)
        if (dev)
            pair_mem_free(1, bufs[i]);
        else
            free(bufs[i]);
}

/* The last load_many_v ran one post_load_many a format over every staging
 * unit (MXC_UNITS), no post_load, each post-load reading its sources bufs
 * in place. */
static void assert_one_batch_in_place(pair_world *w, void *const *bufs)
{
    assert_int_equal(mxc.many, MXC_FORMATS);
    assert_int_equal(mxc.many_modules, MXC_UNITS);
    assert_int_equal(mxc.post, 0);
    assert_int_equal(mxc.n, w->n_ck);
    for (int i = 0; i < w->n_ck; i++) {
        int j = 0;
        while (j < mxc.n && strcmp(mxc.name[j], w->ck[i].name))
            j++;
        assert_true(j < mxc.n);
        if (mxc.staged[j] != bufs[i])
            fail_msg("%s: the post-load read a staged copy, not the source", w->ck[i].name);
    }
}

/* Version v by one refit_load_many, committed, one batch read in place. */
static void update_many(pair_world *w, int v)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    char label[32];
    snprintf(label, sizeof label, "v%d-many", v);
    o.version_label = label;
    o.rollback = 1;
    refit_txn *t;
    OK(w, refit_begin(&t, w->m, &o));
    void *bufs[PAIR_MAX_CK];
    int rc = load_many_v(w, t, v, -1, bufs);
    if (rc)
        fail_msg("load_many v%d: %s: %s [%s]", v, refit_status_name(rc), refit_errmsg(w->ctx),
                 backend_cuda_last_error());
    assert_one_batch_in_place(w, bufs);
    OK(w, refit_finalize(t));
    free_sources(w, bufs);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* Every module (four mxfp8, two mxfp4) in one refit_load_many: one
 * post_load_many a format (one launcher call for its modules on the
 * device), no post_load, every source read in place; the bytes equal the
 * per-call path on the device and the CPU reference, bit for bit. */
static void test_model_load_many_equals_per_call(void **state)
{
    WORLDS(state, d, h);
    mxc_reset();
    pair_update(d, 5, SRC_DEVICE, NULL);
    assert_int_equal(mxc.post, MXC_UNITS); /* refit_load: a post_load a unit, at once */
    assert_int_equal(mxc.many, 0);
    pair_update(h, 5, SRC_PAGEABLE, NULL);
    size_t n, n2;
    char *per_call = pair_snapshot(d, &n);
    update_many(d, 6);
    update_many(d, 5);
    char *batched = pair_snapshot(d, &n2);
    assert_int_equal(n, n2);
    pair_assert_snap(d, per_call, batched, n, "load_many v5 against per-call v5");
    pair_assert_same(d, h, "device load_many v5 against host per-call v5");
    update_many(h, 6);
    update_many(d, 6);
    pair_assert_same(d, h, "load_many v6 on both");
    free(per_call);
    free(batched);
}

/* A NaN in one module of the batch (mxfp8 l0.k_proj, fused; the mxfp4
 * experts): the call is accepted, finalize fails naming that module and
 * tensor, and rollback keeps every byte. */
static void test_model_load_many_nan_rolled_back(void **state)
{
    WORLDS(state, d, h);
    static const int bads[2] = {1, 10};
    pair_world *worlds[2] = {d, h};
    for (int wi = 0; wi < 2; wi++) {
        pair_world *w = worlds[wi];
        update_many(w, 31);
        size_t n, n2;
        char *before = pair_snapshot(w, &n);
        for (int b = 0; b < 2; b++) {
            refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
            o.rollback = 1;
            refit_txn *t;
            OK(w, refit_begin(&t, w->m, &o));
            void *bufs[PAIR_MAX_CK];
            int rc = load_many_v(w, t, 32, bads[b], bufs);
            if (rc)
                fail_msg("load_many with a NaN in %s: %s: %s (held until finalize)",
                         w->ck[bads[b]].name, refit_status_name(rc), refit_errmsg(w->ctx));
            assert_one_batch_in_place(w, bufs);
            assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
            free_sources(w, bufs);
            const char *msg = refit_errmsg(w->ctx);
            const pair_ck *c = &w->ck[bads[b]];
            char mod[48];
            snprintf(mod, sizeof mod, "module %s", c->module);
            if (!strstr(msg, mod) || !strstr(msg, c->name) || !strstr(msg, "NaN or infinity") ||
                !strstr(msg, "rolled back"))
                fail_msg("message \"%s\" lacks %s, tensor %s, \"NaN or infinity\" or "
                         "\"rolled back\"", msg, mod, c->name);
            assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
            char *after = pair_snapshot(w, &n2);
            assert_int_equal(n, n2);
            pair_assert_snap(w, before, after, n, "after a NaN in a load_many");
            free(after);
        }
        free(before);
    }
    pair_assert_same(d, h, "both after the refusals");
}
#endif

int main(void)
{
    twin_seed(0x6d78667034ull); /* this program's inputs, as before the shared stream */
#ifndef REFIT_GPU_MX_EMU
    if (pair_use(&mx_model)) {
        const struct CMUnitTest model[] = {
            MX_MODEL_CASES(NULL, NULL),
            cmocka_unit_test(test_model_nan_and_abort),
            cmocka_unit_test(test_model_status_at_finalize),
            cmocka_unit_test(test_model_load_many_equals_per_call),
            cmocka_unit_test(test_model_load_many_nan_rolled_back),
        };
        return cmocka_run_group_tests(model, pair_setup, pair_teardown);
    }
#endif
    if (twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder_choice),
        cmocka_unit_test(test_mxfp8_layouts),
        cmocka_unit_test(test_mxfp4_layouts),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_scales),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_user_stream),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_status_after_refusal),
        cmocka_unit_test(test_dense_mix),
        cmocka_unit_test(test_dense_nonfinite),
        cmocka_unit_test(test_dense_every_bf16),
        cmocka_unit_test(test_encoders),
#ifndef REFIT_GPU_MX_EMU
        MX_MODEL_CASES(pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(test_model_nan_and_abort, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(test_model_status_at_finalize, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_model_load_many_equals_per_call, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_model_load_many_nan_rolled_back, pair_setup,
                                        pair_teardown),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
