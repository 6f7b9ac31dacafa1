/* kern_quant_fp8_cuda (plugins/fp8/quant_fp8.cu) against the CPU reference
 * kern_quant_fp8 (plugins/fp8/quant_fp8.c), bit for bit: every scheme
 * (per-tensor, per-channel, block-128), F32/F16/BF16 weights, shapes that
 * are not multiples of 128 or of 8 (and empty ones), row-major, padded,
 * transposed and misaligned views of the weight, the output and the
 * scales, and values that reach every edge of the arithmetic: zero rows and
 * tiles (scale 1), subnormal inputs, tiles of subnormals whose scale is
 * itself subnormal so that x / scale passes 448 (saturation), the largest
 * finite values. Each case runs the reference on a junk-filled host
 * allocation and the CUDA kernel on a device copy of the same junk, then
 * compares whole allocations, so bytes outside the views are checked too.
 * Several pieces per call: per-tensor groups sharing a scale, sets larger
 * than the L2 share of the per-tensor schedule, a call of 300 pieces, F32 and 16-bit pieces in
 * one call, per-channel rows at every register depth of the kernel and
 * longer, per-tensor groups spanning many rounds of its schedule;
 * NaN and infinity refused with the lowest piece named. Every case runs
 * with the integer E4M3 encoder and, when the device's conversion
 * instruction agrees with it on every finite f32 (checked first, the
 * check the backend makes before it uses the instruction), with the
 * instruction too. Skipped without a CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/cast.h"
#include "plugins/fp8/fp8_direct.h"
#include "plugins/fp8/fp8_gpu.h"
#include "plugins/fp8/quant_fp8.h"

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

static int hw_ok;      /* the conversion instruction matched the encoder */
static int encoders;   /* runs per case: 1, or 2 with the instruction */
static kern_fp8_arith arith; /* of every case: test_reciprocal sets it */

/* The launcher's flags word for encoder hw in the current arithmetic. */
static int flags(int hw)
{
    return (hw ? QF_HW : 0) | (arith == KERN_FP8_RECIPROCAL ? QF_RECIP : 0);
}

/* ---- values ---- */

enum pat { PAT_MIXED, PAT_ZERO, PAT_SUBNORMAL, PAT_BIG, PAT_RANDOM };

/* A finite subnormal of the dtype: raw bits (16-bit) or an f32. */
static void subnormal(refit_dtype dt, float *f, uint16_t *raw)
{
    uint32_t m = (uint32_t)(twin_rnd() & 0x7fffffu) | 1u;
    uint32_t b = (uint32_t)(twin_rnd() & 0x80000000u) | (m >> (twin_rnd() % 20));
    if (!(b & 0x7fffffffu))
        b |= 1u;
    memcpy(f, &b, 4);
    uint16_t s = (uint16_t)(twin_rnd() & 0x8000u);
    *raw = dt.code == REFIT_DTYPE_BFLOAT ? (uint16_t)(s | ((twin_rnd() & 0x7fu) | 1u))
                                         : (uint16_t)(s | ((twin_rnd() & 0x3ffu) | 1u));
}

static float biggest(refit_dtype dt)
{
    return dt.bits == 16 && dt.code == REFIT_DTYPE_FLOAT ? 65504.0f : 3.3895314e38f;
}

/* Fill x (a host view) with pattern p. Random: values over a wide range
 * of magnitudes (the amax of a group is mostly one element, so a lost
 * partial maximum shows). Mixed: the same with zero rows, subnormal rows,
 * rows near the dtype's largest magnitude, and a zero and a subnormal
 * 128x128 tile. */
static void fill(const refit_view *x, enum pat p)
{
    int64_t n = x->shape[0], k = x->shape[1];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            float f = 0.0f;
            uint16_t raw = 0;
            int use_raw = 0;
            int kind = p;
            if (p == PAT_MIXED) {
                kind = i % 7 == 3 ? PAT_ZERO : i % 11 == 5 ? PAT_SUBNORMAL : i % 13 == 6 ? PAT_BIG
                                                                                        : PAT_MIXED;
                if (i >= 128 && i < 256 && j >= 128 && j < 256)
                    kind = PAT_ZERO;
                if (i < 128 && j >= 256 && j < 384)
                    kind = PAT_SUBNORMAL;
            }
            switch (kind) {
            case PAT_ZERO:
                f = (twin_rnd() & 1) ? -0.0f : 0.0f;
                break;
            case PAT_SUBNORMAL:
                subnormal(x->dtype, &f, &raw);
                use_raw = x->dtype.bits == 16;
                break;
            case PAT_BIG:
                f = biggest(x->dtype) * (0.5f + 0.5f * twin_uniform());
                if (twin_rnd() % 997 == 0)
                    f = (twin_rnd() & 1) ? biggest(x->dtype) : -biggest(x->dtype);
                break;
            default: {
                int e = (int)(twin_rnd() % 40) - 20;
                f = twin_uniform() * (float)(e < 0 ? 1.0 / (double)(1ull << -e) : (double)(1ull << e));
                if (x->dtype.bits == 16 && x->dtype.code == REFIT_DTYPE_FLOAT)
                    f = f > 60000.0f ? 60000.0f : f < -60000.0f ? -60000.0f : f;
                break;
            }
            }
            view_put(x, i, j, f, raw, use_raw);
        }
}

/* ---- one call, device against reference ---- */

/* The reference for n pieces: kern_quant_fp8 each, per-tensor groups by
 * shared scale element (the contract of kern_quant_fp8_cuda). */
static int reference(uint32_t n, const refit_view *q, const refit_view *s, const refit_view *x,
                     int scheme, int32_t *bad)
{
    *bad = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (scheme != KERN_FP8_PER_TENSOR) {
            int rc = kern_quant_fp8_arith(&q[i], &s[i], &x[i], (kern_fp8_scheme)scheme, arith);
            if (rc)
                *bad = (int32_t)i;
            if (rc)
                return rc;
            continue;
        }
        uint32_t j = 0;
        while (j < i && s[j].data != s[i].data)
            j++;
        if (j < i)
            continue;
        float amax = 0.0f;
        for (j = i; j < n; j++)
            if (s[j].data == s[i].data) {
                float a = kern_amax_f32(&x[j], 0, x[j].shape[0], 0, x[j].shape[1]);
                if (a < 0.0f) {
                    *bad = (int32_t)j;
                    return REFIT_ECORRUPT;
                }
                amax = a > amax ? a : amax;
            }
        float sc = kern_fp8_scale(amax);
        *kern_view_f32_ptr(&s[i], 0, 0) = sc;
        for (j = i; j < n; j++)
            if (s[j].data == s[i].data)
                kern_fp8_encode_tile_arith(&q[j], &x[j], sc, arith, 0, x[j].shape[0], 0,
                                           x[j].shape[1]);
    }
    return REFIT_OK;
}

static const char *const scheme_name[3] = {"per-tensor", "per-channel", "block-128"};

/* One piece: x [n, k] of dt in layout xl, q in layout ql, scales in
 * layout sl (0 row-major, 1 padded), values of pattern p. */
static void one(int scheme, refit_dtype dt, int64_t n, int64_t k, int xl, int ql, int sl,
                enum pat p, void *stream)
{
    lay lx = layout(xl, n, k), lq = layout(ql, n, k);
    int64_t ss[2];
    kern_fp8_scale_shape((kern_fp8_scheme)scheme, n, k, ss);
    lay ls = layout(sl ? 1 : 0, ss[0], ss[1]);
    twin tx = twin_new((size_t)lx.elems * (dt.bits / 8));
    twin tq = twin_new((size_t)lq.elems);
    twin ts = twin_new((size_t)ls.elems * 4);
    refit_view gx = v2(tx.d, dt, n, k, lx.s0, lx.s1, lx.first);
    refit_view gq = v2(tq.d, E4M3, n, k, lq.s0, lq.s1, lq.first);
    refit_view gs = v2(ts.d, F32, ss[0], ss[1], ls.s0, ls.s1, ls.first);
    refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
    fill(&hx, p);
    twin_push(&tx);
    char *jq = twin_save(&tq), *js = twin_save(&ts); /* the junk, for a second run */
    int32_t bad_h, bad_d;
    int rh = reference(1, &hq, &hs, &hx, scheme, &bad_h);
    for (int hw = 0; hw < encoders; hw++) {
        if (hw) { /* the device writes over the same junk again */
            twin_restore(&tq, jq);
            twin_restore(&ts, js);
        }
        int rd = kern_quant_fp8_cuda(1, &gq, &gs, &gx, scheme, flags(hw), &bad_d, stream);
        char what[220];
        snprintf(what, sizeof what, "%s %s [%lld, %lld], x layout %d, q layout %d, scale "
                 "layout %d, values %d, %s, %s", scheme_name[scheme], dt.bits == 32 ? "f32" :
                 dt.code == REFIT_DTYPE_BFLOAT ? "bf16" : "f16", (long long)n, (long long)k, xl,
                 ql, sl, (int)p, hw ? "conversion instruction" : "integer encoder",
                 arith ? "reciprocal" : "divide");
        if (rd != rh)
            fail_msg("%s: device returned %d (%s), the reference %d", what, rd,
                     kern_cuda_last_error(), rh);
        twin_check(&tq, what);
        twin_check(&ts, what);
        twin_check(&tx, what); /* the input is untouched */
    }
    free(jq);
    free(js);
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

static const int64_t shapes[][2] = {
    {1, 1}, {7, 13}, {3, 8}, {129, 257}, {131, 8}, {128, 128}, {300, 1000}, {257, 131},
    {0, 5}, {5, 0}, {2, 20001}, {385, 136},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void sweep(int scheme)
{
    refit_dtype dts[3] = {BF16, F16, F32};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int d = 0; d < 3; d++)
            for (int l = 0; l < 4; l++) {
                one(scheme, dts[d], shapes[si][0], shapes[si][1], l, (l + d) % 4, (l + si) % 2,
                    PAT_MIXED, NULL);
                if (l % 2 == 0)
                    one(scheme, dts[d], shapes[si][0], shapes[si][1], l, (l + d + 1) % 4, 0,
                        PAT_RANDOM, NULL);
            }
}

static void test_per_tensor(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    sweep(KERN_FP8_PER_TENSOR);
}

static void test_per_channel(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    sweep(KERN_FP8_PER_CHANNEL);
}

static void test_block128(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    sweep(KERN_FP8_BLOCK128);
}

/* Whole matrices of one kind: all zeros (scale 1), all subnormal (a tiny
 * or subnormal scale: x / scale rounds past 448 and saturates), all at the
 * largest magnitudes. */
static void test_edges(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[3] = {BF16, F16, F32};
    enum pat pats[3] = {PAT_ZERO, PAT_SUBNORMAL, PAT_BIG};
    for (int sch = 0; sch < 3; sch++)
        for (int d = 0; d < 3; d++)
            for (int p = 0; p < 3; p++) {
                one(sch, dts[d], 130, 260, 0, 0, 0, pats[p], NULL);
                one(sch, dts[d], 33, 17, 2, 1, 1, pats[p], NULL);
            }
}

/* The saturation the edges reach is real: an f32 tile of subnormals up to
 * 2^-140 has amax / 448 = a subnormal scale of a few units, so x / scale
 * lands past 448 and encodes as +-448 (0x7e / 0xfe). */
static void test_saturation_happens(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { N = 4, K = 64 };
    float h[N * K];
    for (int i = 0; i < N * K; i++) {
        uint32_t b = 0x00100000u + (uint32_t)(i * 977 % 0x000fffff);
        if (i % 2)
            b |= 0x80000000u;
        memcpy(&h[i], &b, 4);
    }
    twin tx = twin_new(sizeof h), tq = twin_new(N * K), ts = twin_new(4);
    memcpy(tx.h, h, sizeof h);
    twin_push(&tx);
    refit_view gx = v2(tx.d, F32, N, K, K, 1, 0), gq = v2(tq.d, E4M3, N, K, K, 1, 0);
    refit_view gs = v2(ts.d, F32, 1, 1, 1, 1, 0);
    refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
    int32_t bad;
    assert_int_equal(reference(1, &hq, &hs, &hx, 0, &bad), REFIT_OK);
    assert_int_equal(kern_quant_fp8_cuda(1, &gq, &gs, &gx, 0, 0, &bad, NULL), REFIT_OK);
    int sat = 0;
    for (int i = 0; i < N * K; i++)
        sat += ((unsigned char)tq.h[i] & 0x7f) == 0x7e;
    float sc;
    memcpy(&sc, ts.h, 4);
    print_message("# subnormal tile: scale %g, %d of %d saturated\n", (double)sc, sat, N * K);
    assert_true(sat > 0);
    twin_check(&tq, "saturation");
    twin_check(&ts, "saturation");
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

/* The conversion instruction against the integer encoder on every finite
 * f32; the cases after this one run with both when they agree. The backend
 * makes the same check and agrees on the choice. */
static void test_conversion_check(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    uint64_t bad = 0, bbad = 0;
    uint32_t first = 0;
    int rc = kern_fp8_cvt_check_cuda(&bad, &first, NULL);
    if (rc)
        fail_msg("kern_fp8_cvt_check_cuda: %s", kern_cuda_last_error());
    int dev = 0;
    CU(cudaGetDevice(&dev));
    int enc = kern_fp8_encoder(dev, &bbad, NULL);
    print_message("# cvt.rn.satfinite.e4m3x2.f32 against the integer encoder: %llu of 2^32 - "
                  "2^24 finite inputs differ%s (first %08x); the backend encodes with %s\n",
                  (unsigned long long)bad, bad ? "" : ": both encoders are tested", first,
                  enc == 1 ? "the instruction" : enc == 0 ? "the integer encoder" : "?");
    if (!getenv("REFIT_CUDA_FP8_CVT")) {
        assert_int_equal(enc, bad == 0 ? 1 : 0);
        assert_true(bbad == bad);
    }
    hw_ok = bad == 0;
    encoders = 1 + hw_ok;
}

/* ---- several pieces per call ---- */

#define MULTI_MAX 320

typedef struct multi {
    uint32_t n;
    twin tx, tq, ts;
    refit_view gq[MULTI_MAX], gs[MULTI_MAX], gx[MULTI_MAX], hq[MULTI_MAX], hs[MULTI_MAX],
        hx[MULTI_MAX];
} multi;

/* n pieces [rows[i], ks[i]] of dtype dts[i], each in its own 16-byte
 * aligned region of one allocation per kind; scale element or grid of
 * piece i at slot[i] (per-tensor: pieces with equal slots share it). */
static void multi_new_dts(multi *m, int scheme, const refit_dtype *dts, uint32_t n,
                          const int64_t *rows, const int64_t *ks, const uint32_t *slot)
{
    assert_true(n <= MULTI_MAX);
    memset(m, 0, sizeof *m);
    m->n = n;
    size_t xb = 0, qe = 0, se = 0;
    int64_t ss[2], cells[MULTI_MAX];
    for (uint32_t i = 0; i < n; i++) {
        int64_t k = ks[i];
        kern_fp8_scale_shape((kern_fp8_scheme)scheme, rows[i], k, ss);
        cells[i] = ss[0] * ss[1];
        xb += ((size_t)(rows[i] * k) * (dts[i].bits / 8) + 15) & ~(size_t)15;
        qe += (size_t)(rows[i] * k) + 8;
        se += scheme == KERN_FP8_PER_TENSOR ? 1 : (size_t)cells[i];
    }
    m->tx = twin_new(xb + 16);
    m->tq = twin_new(qe);
    m->ts = twin_new((se + 1) * 4);
    size_t xo = 0, qo = 0, so = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t es = (size_t)dts[i].bits / 8;
        int64_t k = ks[i];
        kern_fp8_scale_shape((kern_fp8_scheme)scheme, rows[i], k, ss);
        m->gx[i] = v2(m->tx.d, dts[i], rows[i], k, k, 1, (int64_t)(xo / es));
        m->gq[i] = v2(m->tq.d, E4M3, rows[i], k, k, 1, (int64_t)qo);
        m->gs[i] = v2(m->ts.d, F32, ss[0], ss[1], ss[1], 1,
                      scheme == KERN_FP8_PER_TENSOR ? (int64_t)slot[i] : (int64_t)so);
        xo += ((size_t)(rows[i] * k) * es + 15) & ~(size_t)15;
        qo += (size_t)(rows[i] * k) + 8;
        so += (size_t)cells[i];
        m->hx[i] = on_host(m->gx[i], &m->tx);
        m->hq[i] = on_host(m->gq[i], &m->tq);
        m->hs[i] = on_host(m->gs[i], &m->ts);
        fill(&m->hx[i], PAT_MIXED);
    }
    twin_push(&m->tx);
}

static void multi_new(multi *m, int scheme, refit_dtype dt, uint32_t n, const int64_t *rows,
                      int64_t k, const uint32_t *slot)
{
    refit_dtype dts[MULTI_MAX];
    int64_t ks[MULTI_MAX];
    for (uint32_t i = 0; i < n && i < MULTI_MAX; i++) {
        dts[i] = dt;
        ks[i] = k;
    }
    multi_new_dts(m, scheme, dts, n, rows, ks, slot);
}

static void multi_free(multi *m)
{
    twin_free(&m->tx);
    twin_free(&m->tq);
    twin_free(&m->ts);
}

/* Each encoder in turn, on the same junk. */
static void multi_run(multi *m, int scheme, const char *what, void *stream)
{
    int32_t bad_h, bad_d;
    char *jq = twin_save(&m->tq), *js = twin_save(&m->ts);
    int rh = reference(m->n, m->hq, m->hs, m->hx, scheme, &bad_h);
    for (int hw = 0; hw < encoders; hw++) {
        twin_restore(&m->tq, jq);
        twin_restore(&m->ts, js);
        int rd = kern_quant_fp8_cuda(m->n, m->gq, m->gs, m->gx, scheme, flags(hw), &bad_d,
                                     stream);
        if (rh != REFIT_OK || rd != REFIT_OK)
            fail_msg("%s (%s): device %d (%s), reference %d", what,
                     hw ? "conversion instruction" : "integer encoder", rd,
                     kern_cuda_last_error(), rh);
        twin_check(&m->tq, what);
        twin_check(&m->ts, what);
    }
    free(jq);
    free(js);
}

/* Per-tensor groups: pieces sharing a scale element (fused q/k/v with one
 * scale; one scale per expert), in any order. */
static void test_groups(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t rows[7] = {200, 40, 40, 1, 0, 129, 77};
    static const uint32_t slot[7] = {0, 1, 0, 2, 1, 0, 3};
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int d = 0; d < 3; d++) {
        multi m;
        multi_new(&m, 0, dts[d], 7, rows, 136, slot);
        multi_run(&m, 0, "per-tensor groups", NULL);
        multi_free(&m);
    }
    for (int sch = 1; sch < 3; sch++) {
        multi m;
        multi_new(&m, sch, BF16, 7, rows, 136, NULL);
        multi_run(&m, sch, scheme_name[sch], NULL);
        multi_free(&m);
    }
}

/* More pieces than one launch carries, and (per-tensor) more input than
 * one L2 set: 30 pieces of 1 MiB, groups interleaved. */
static void test_many_pieces(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    int64_t rows[MULTI_MAX];
    uint32_t slot[MULTI_MAX];
    for (int i = 0; i < 80; i++) {
        rows[i] = 1 + (i * 37) % 50;
        slot[i] = (uint32_t)i;
    }
    for (int sch = 0; sch < 3; sch++) {
        multi m;
        multi_new(&m, sch, BF16, 80, rows, 72, slot);
        multi_run(&m, sch, "80 pieces", NULL);
        multi_free(&m);
    }
    for (int i = 0; i < 30; i++) {
        rows[i] = 512;
        slot[i] = (uint32_t)(i % 4);
    }
    multi m;
    multi_new(&m, 0, BF16, 30, rows, 1024, slot);
    multi_run(&m, 0, "30 MiB in interleaved groups", NULL);
    multi_free(&m);
}

/* Launch shapes: per-channel rows that a warp holds whole at each depth
 * (BF16 rows up to 2048, 4096 and 6144 elements: 8, 16 and 24 groups of
 * 16 bytes a lane) and rows longer than that (the rest read twice), F32
 * rows likewise; calls mixing F32 and 16-bit pieces (an F32 128x128 tile
 * needs 16 groups a thread, a 16-bit one 8); a per-channel call with short
 * rows (up to 256 groups) and long ones, which go in separate launches. */
static void test_launch_shapes(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t ks[] = {2048, 3000, 5632, 6144, 6152, 12000};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        one(KERN_FP8_PER_CHANNEL, BF16, 3, ks[i], 0, 0, 0, PAT_RANDOM, NULL);
        one(KERN_FP8_PER_CHANNEL, F16, 2, ks[i], 0, 1, 1, PAT_MIXED, NULL);
        one(KERN_FP8_PER_CHANNEL, F32, 2, ks[i] / 2 + 1, 0, 0, 0, PAT_RANDOM, NULL);
    }
    static const int64_t rows[6] = {130, 7, 129, 64, 1, 200};
    static const int64_t k300[6] = {300, 300, 300, 300, 300, 300};
    static const uint32_t slot[6] = {0, 1, 0, 2, 1, 3};
    refit_dtype dts[6] = {F32, BF16, F16, BF16, F32, F16};
    for (int sch = 0; sch < 3; sch++) {
        multi m;
        multi_new_dts(&m, sch, dts, 6, rows, k300, slot);
        multi_run(&m, sch, "F32 and 16-bit pieces in one call", NULL);
        multi_free(&m);
    }
    /* short and long rows in one per-channel call (a launch each), in
     * mixed order, F32 rows short or long by their 16-byte groups */
    static const int64_t mrows[7] = {5, 3, 9, 0, 4, 2, 6};
    static const int64_t mks[7] = {5632, 2048, 100, 7000, 3000, 1025, 2049};
    refit_dtype mdts[7] = {BF16, BF16, F16, BF16, F16, F32, BF16};
    multi m;
    multi_new_dts(&m, KERN_FP8_PER_CHANNEL, mdts, 7, mrows, mks, NULL);
    multi_run(&m, KERN_FP8_PER_CHANNEL, "short and long rows in one call", NULL);
    multi_free(&m);
}

/* Many pieces in one call (the table the kernels read, no launch
 * parameters), and per-tensor groups spanning many rounds of the
 * amax/encode schedule: with rounds of 1 and 3 chunks
 * (REFIT_CUDA_FP8_ROUND) and the least lag (REFIT_CUDA_FP8_LAG=1), the
 * encode pass must lag by the largest group's span; under the emulator a
 * shorter lag aborts (a block would wait on a chunk no earlier ticket
 * holds: a deadlock on a GPU). */
static void test_table_and_rounds(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    int64_t rows[MULTI_MAX];
    uint32_t slot[MULTI_MAX];
    for (int i = 0; i < 300; i++) {
        rows[i] = 1 + (i * 37) % 13;
        slot[i] = (uint32_t)(i % 7);
    }
    for (int sch = 0; sch < 3; sch++) {
        multi m;
        multi_new(&m, sch, BF16, 300, rows, 40, slot);
        multi_run(&m, sch, "300 pieces", NULL);
        multi_free(&m);
    }
    static const char *const rounds[2] = {"1", "3"};
    for (int r = 0; r < 2; r++) {
        setenv("REFIT_CUDA_FP8_ROUND", rounds[r], 1);
        setenv("REFIT_CUDA_FP8_LAG", "1", 1);
        int64_t big[24];
        uint32_t bslot[24];
        for (int i = 0; i < 24; i++) {
            big[i] = i % 3 ? 64 : 33;
            bslot[i] = (uint32_t)(i % 5);
        }
        multi m;
        multi_new(&m, 0, BF16, 24, big, 1024, bslot);
        multi_run(&m, 0, "groups over many short rounds", NULL);
        multi_free(&m);
        multi_new(&m, 0, F16, 300, rows, 40, slot);
        multi_run(&m, 0, "300 pieces, short rounds", NULL);
        multi_free(&m);
        unsetenv("REFIT_CUDA_FP8_ROUND");
        unsetenv("REFIT_CUDA_FP8_LAG");
    }
    /* the encode pass walks each group forwards by default; backwards
     * (REFIT_CUDA_FP8_REVERSE=1) gives the same bytes */
    setenv("REFIT_CUDA_FP8_REVERSE", "1", 1);
    setenv("REFIT_CUDA_FP8_ROUND", "3", 1);
    multi m;
    multi_new(&m, 0, BF16, 300, rows, 40, slot);
    multi_run(&m, 0, "300 pieces, groups encoded backwards", NULL);
    multi_free(&m);
    unsetenv("REFIT_CUDA_FP8_ROUND");
    unsetenv("REFIT_CUDA_FP8_REVERSE");
}

/* The caller's stream: a non-blocking one. */
static void test_user_stream(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int sch = 0; sch < 3; sch++)
        one(sch, BF16, 300, 1000, 0, 0, 0, PAT_MIXED, st);
    CU(cudaStreamDestroy(st));
}

/* NaN or infinity: REFIT_ECORRUPT, the lowest piece holding one named. */
static void test_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t rows[4] = {64, 130, 7, 300};
    static const uint32_t slot[4] = {0, 1, 2, 1};
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int sch = 0; sch < 3; sch++)
        for (int d = 0; d < 3; d++)
            for (int which = 0; which < 2; which++) {
                multi m;
                multi_new(&m, sch, dts[d], 4, rows, 200, slot);
                /* a NaN in piece 3, an infinity in piece 1 (or only the NaN) */
                view_put(&m.hx[3], 250, 199, __builtin_nanf(""), 0, 0);
                if (which == 0)
                    view_put(&m.hx[1], 129, 3, -__builtin_inff(), 0, 0);
                twin_push(&m.tx);
                for (int hw = 0; hw < encoders; hw++) {
                    int32_t bad = 99;
                    int rc = kern_quant_fp8_cuda(4, m.gq, m.gs, m.gx, sch, hw, &bad, NULL);
                    if (rc != REFIT_ECORRUPT || bad != (which == 0 ? 1 : 3))
                        fail_msg("%s, dtype %d: status %d, piece %d (%s)", scheme_name[sch], d,
                                 rc, bad, kern_cuda_last_error());
                }
                multi_free(&m);
            }
}

/* ---- the dense fast path beside the general one ---- */

/* A piece of a mixed call: dtype, shape, the layouts of x, q and the
 * scales (gpu_twin's 0-3, or LAY_PAD: rows padded but still aligned, a
 * dense layout whose pitch is not the row; scales transposed (2) put the
 * scale grid's column stride to use), per-tensor slot. */
#define LAY_PAD 4
#define MIX_MAX 120

typedef struct mpiece {
    refit_dtype dt;
    int64_t n, k;
    int xl, ql, sl;
    uint32_t slot;
} mpiece;

typedef struct mix {
    uint32_t n;
    int scheme;
    mpiece pc[MIX_MAX];
    twin tx[MIX_MAX], tq[MIX_MAX], ts;
    char *jq[MIX_MAX], *js; /* the junk each q twin and the scales started with */
    refit_view gq[MIX_MAX], gs[MIX_MAX], gx[MIX_MAX], hq[MIX_MAX], hs[MIX_MAX], hx[MIX_MAX];
} mix;

/* LAY_PAD: 24 elements of padding a row keep a 16-bit row's pitch a
 * multiple of 16 bytes and a q row's of 8. */
static lay mix_layout(int kind, int64_t n, int64_t k)
{
    if (kind != LAY_PAD)
        return layout(kind, n, k);
    lay l = {k + 24, 1, 0, n * (k + 24) + 1};
    return l;
}

/* Each piece in its own twins (x, q), the scales in one (per-tensor:
 * element slot; else each piece's grid in its own region). */
static void mix_new(mix *m, int scheme, const mpiece *pc, uint32_t n, enum pat p)
{
    assert_true(n <= MIX_MAX);
    memset(m, 0, sizeof *m);
    m->n = n;
    m->scheme = scheme;
    int64_t se = 0, ss[2];
    for (uint32_t i = 0; i < n; i++) {
        m->pc[i] = pc[i];
        kern_fp8_scale_shape((kern_fp8_scheme)scheme, pc[i].n, pc[i].k, ss);
        int64_t need = scheme == KERN_FP8_PER_TENSOR ? (int64_t)pc[i].slot + 1
                                                     : se + mix_layout(pc[i].sl, ss[0], ss[1]).elems;
        se = scheme == KERN_FP8_PER_TENSOR ? (need > se ? need : se) : need;
    }
    m->ts = twin_new((size_t)se * 4);
    int64_t so = 0;
    for (uint32_t i = 0; i < n; i++) {
        const mpiece *q = &pc[i];
        size_t es = (size_t)q->dt.bits / 8;
        lay lx = mix_layout(q->xl, q->n, q->k), lq = mix_layout(q->ql, q->n, q->k);
        kern_fp8_scale_shape((kern_fp8_scheme)scheme, q->n, q->k, ss);
        lay ls = mix_layout(q->sl, ss[0], ss[1]);
        m->tx[i] = twin_new((size_t)lx.elems * es);
        m->tq[i] = twin_new((size_t)lq.elems);
        m->gx[i] = v2(m->tx[i].d, q->dt, q->n, q->k, lx.s0, lx.s1, lx.first);
        m->gq[i] = v2(m->tq[i].d, E4M3, q->n, q->k, lq.s0, lq.s1, lq.first);
        if (scheme == KERN_FP8_PER_TENSOR) {
            m->gs[i] = v2(m->ts.d, F32, 1, 1, 1, 1, (int64_t)q->slot);
        } else {
            m->gs[i] = v2(m->ts.d, F32, ss[0], ss[1], ls.s0, ls.s1, so + ls.first);
            so += ls.elems;
        }
        m->hx[i] = on_host(m->gx[i], &m->tx[i]);
        m->hq[i] = on_host(m->gq[i], &m->tq[i]);
        m->hs[i] = on_host(m->gs[i], &m->ts);
        fill(&m->hx[i], p);
        twin_push(&m->tx[i]);
        m->jq[i] = malloc(m->tq[i].bytes);
        assert_non_null(m->jq[i]);
        memcpy(m->jq[i], m->tq[i].h, m->tq[i].bytes);
    }
    m->js = malloc(m->ts.bytes);
    assert_non_null(m->js);
    memcpy(m->js, m->ts.h, m->ts.bytes);
}

static void mix_free(mix *m)
{
    for (uint32_t i = 0; i < m->n; i++) {
        twin_free(&m->tx[i]);
        twin_free(&m->tq[i]);
        free(m->jq[i]);
    }
    twin_free(&m->ts);
    free(m->js);
}

/* The device call against the host bytes (the reference's, or what a
 * refusal must leave): every q twin, the scales, x untouched. */
static void mix_check(mix *m, int hw, int want_rc, int32_t want_bad, const char *what)
{
    for (uint32_t i = 0; i < m->n; i++)
        CU(cudaMemcpy(m->tq[i].d, m->jq[i], m->tq[i].bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(m->ts.d, m->js, m->ts.bytes, cudaMemcpyHostToDevice));
    int32_t bad = 99;
    int rd = kern_quant_fp8_cuda(m->n, m->gq, m->gs, m->gx, m->scheme, flags(hw), &bad, NULL);
    char w[200];
    snprintf(w, sizeof w, "%s, %s, %s", scheme_name[m->scheme], what,
             hw ? "conversion instruction" : "integer encoder");
    if (rd != want_rc || (want_rc != REFIT_OK && bad != want_bad))
        fail_msg("%s: device %d piece %d (%s), want %d piece %d", w, rd, bad,
                 kern_cuda_last_error(), want_rc, want_bad);
    for (uint32_t i = 0; i < m->n; i++) {
        twin_check(&m->tq[i], w);
        twin_check(&m->tx[i], w);
    }
    twin_check(&m->ts, w);
}

/* The reference on every piece, then the device with each encoder. */
static void mix_run(mix *m, const char *what)
{
    int32_t bad;
    int rh = reference(m->n, m->hq, m->hs, m->hx, m->scheme, &bad);
    if (rh != REFIT_OK)
        fail_msg("%s: the reference refused piece %d", what, bad);
    for (int hw = 0; hw < encoders; hw++)
        mix_check(m, hw, REFIT_OK, -1, what);
}

static mpiece mp(refit_dtype dt, int64_t n, int64_t k, int xl, int ql, int sl, uint32_t slot)
{
    mpiece p = {dt, n, k, xl, ql, sl, slot};
    return p;
}

/* Dense pieces beside general ones in one call, per scheme: a dense piece
 * next to a transposed one, a padded-but-aligned dense piece (its last
 * tile one row high) next to a misaligned one, a piece of exactly one
 * group (block-128: one 1x128 tile), pieces one group short of a whole
 * unit (a tile one row short, a row one group short of what a team holds
 * at each team size, and one group past it; a per-tensor chunk one group
 * short),
 * F16 beside BF16, an F32 piece of dense shape (general), per-tensor
 * groups that mix dense and general pieces, and units whose scale is too
 * small for the reciprocal. */
static void test_dense_mixed(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int d = 0; d < 2; d++) {
        refit_dtype dt = d ? F16 : BF16, other = d ? BF16 : F16;
        mpiece t[] = {
            /* block-128 */
            mp(dt, 130, 256, 0, 0, 2, 0), mp(dt, 40, 136, 2, 2, 1, 0),
            mp(dt, 257, 384, LAY_PAD, LAY_PAD, 1, 0), mp(dt, 64, 128, 3, 3, 0, 0),
            mp(dt, 1, 128, 0, 0, 0, 0), mp(dt, 127, 128, 0, 0, 0, 0),
            mp(other, 129, 640, 0, LAY_PAD, 0, 0), mp(F32, 128, 128, 0, 0, 0, 0),
            mp(dt, 5, 128, 0, 1, 0, 0),
        };
        mix m;
        mix_new(&m, KERN_FP8_BLOCK128, t, sizeof t / sizeof t[0], PAT_MIXED);
        mix_run(&m, d ? "f16 dense and general tiles" : "bf16 dense and general tiles");
        mix_free(&m);
        mpiece r[] = {
            /* per-channel: team sizes 32 (rows <= 2048 elements), 64, 128, 256 */
            mp(dt, 9, 256, 0, 0, 2, 0), mp(dt, 7, 136, 2, 0, 1, 0),
            mp(dt, 33, 2048, LAY_PAD, LAY_PAD, 1, 0), mp(dt, 6, 2048, 3, 0, 0, 0),
            mp(dt, 1, 8, 0, 0, 0, 0), mp(dt, 3, 2040, 0, 0, 0, 0),
            mp(other, 3, 4088, 0, 0, 0, 0), mp(dt, 4, 5632, 0, LAY_PAD, 0, 0),
            mp(dt, 2, 8184, LAY_PAD, 0, 0, 0), mp(other, 2, 16376, 0, 0, 1, 0),
            mp(dt, 2, 16384, 0, 0, 0, 0), mp(dt, 2, 16392, 0, 0, 0, 0),
            mp(F32, 3, 256, 0, 0, 0, 0), mp(dt, 5, 64, 0, 1, 0, 0),
            /* one group past a team's capacity: the next team size */
            mp(dt, 2, 2056, 0, 0, 0, 0), mp(dt, 3, 6152, 0, 0, 0, 0),
        };
        mix_new(&m, KERN_FP8_PER_CHANNEL, r, sizeof r / sizeof r[0], PAT_MIXED);
        mix_run(&m, d ? "f16 dense and general rows" : "bf16 dense and general rows");
        mix_free(&m);
        mpiece p[] = {
            /* per-tensor: slots 0 and 2 mix dense and general pieces */
            mp(dt, 130, 256, 0, 0, 0, 0), mp(dt, 40, 136, 2, 2, 0, 0),
            mp(dt, 1, 8, 0, 0, 0, 1), mp(dt, 1, 16376, 0, 0, 0, 2),
            mp(dt, 2047, 8, 0, 0, 0, 3), mp(dt, 64, 128, 3, 3, 0, 2),
            mp(dt, 33, 2048, LAY_PAD, LAY_PAD, 0, 4), mp(dt, 3, 5632, 0, 0, 0, 2),
            mp(other, 5, 4096, 0, 0, 0, 5), mp(dt, 2, 16392, 0, 0, 0, 6),
        };
        mix_new(&m, KERN_FP8_PER_TENSOR, p, sizeof p / sizeof p[0], PAT_MIXED);
        mix_run(&m, d ? "f16 dense and general pieces" : "bf16 dense and general pieces");
        mix_free(&m);
    }
    /* BF16 subnormals only: scales below 2^-100, so dense units re-read
     * their groups the general way (qf_slots_slow), here with tiles of an
     * odd height (131 rows: the last tile 3) and rows one group short */
    mpiece tiny[] = {
        mp(BF16, 131, 256, 0, 0, 0, 0), mp(BF16, 3, 2040, 0, 0, 0, 1),
        mp(BF16, 2, 5632, 0, 0, 0, 2), mp(BF16, 1, 16376, 0, 0, 0, 3),
    };
    for (int sch = 0; sch < 3; sch++) {
        mix m;
        mix_new(&m, sch, sch == KERN_FP8_BLOCK128 ? tiny : tiny + 1,
                sch == KERN_FP8_BLOCK128 ? 1 : 3, PAT_SUBNORMAL);
        mix_run(&m, "bf16 subnormals: scales below 2^-100");
        mix_free(&m);
    }
}

/* Many dense pieces in one call (their units in runs that cross piece
 * edges inside a block), with a general one among them; per-tensor
 * groups interleaved; and whole calls of random values. */
static void test_dense_many(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static mpiece pcs[MIX_MAX];
    for (int sch = 0; sch < 3; sch++)
        for (int all = 0; all < 2; all++) { /* all dense: per-tensor's k_tensor<1> */
            uint32_t n = 100;
            for (uint32_t i = 0; i < n; i++) {
                int64_t rows = 1 + (i * 37) % 41;
                int64_t k = sch == KERN_FP8_BLOCK128 ? 128 * (1 + i % 3) : 8 * (1 + (i * 13) % 70);
                /* per-tensor groups (slots) of one dtype, so that they divide
                 * by the reciprocal (a group mixing dtypes takes __fdiv_rn) */
                pcs[i] = mp((i % 9) % 5 == 2 ? F16 : BF16, rows, k, i == 50 && !all ? 3 : 0, 0,
                            0, i % 9);
            }
            mix m;
            mix_new(&m, sch, pcs, n, PAT_RANDOM);
            mix_run(&m, all ? "100 dense pieces" : "100 dense pieces, one general");
            mix_free(&m);
        }
}

/* Zero at x[i][j] of a host view (the reference's value where the
 * device sees a NaN or an infinity). */
static void put_zero(const refit_view *x, int64_t i, int64_t j)
{
    view_put(x, i, j, 0.0f, 0, 0);
}

/* The unit holding (i, j) of piece p as the junk it started with: q's
 * bytes and the scale, after a refusal (per-tensor: the whole group). */
static void mix_unwritten(mix *m, uint32_t p, int64_t i, int64_t j)
{
    const refit_view *q = &m->hq[p], *s = &m->hs[p];
    int64_t r0 = 0, r1 = q->shape[0], c0 = 0, c1 = q->shape[1], si = 0, sj = 0;
    if (m->scheme == KERN_FP8_PER_CHANNEL) {
        r0 = i;
        r1 = i + 1;
        si = i;
    } else if (m->scheme == KERN_FP8_BLOCK128) {
        r0 = i / 128 * 128;
        r1 = r0 + 128 < r1 ? r0 + 128 : r1;
        c0 = j / 128 * 128;
        c1 = c0 + 128 < c1 ? c0 + 128 : c1;
        si = i / 128;
        sj = j / 128;
    }
    size_t at = (size_t)((char *)s->data - m->ts.h) +
                (size_t)(si * s->strides[0] + sj * s->strides[1]) * 4;
    memcpy(m->ts.h + at, m->js + at, 4);
    for (int64_t a = r0; a < r1; a++)
        for (int64_t b = c0; b < c1; b++) {
            size_t o = (size_t)((char *)q->data - m->tq[p].h) +
                       (size_t)(a * q->strides[0] + b * q->strides[1]);
            m->tq[p].h[o] = m->jq[p][o];
        }
}

/* NaN and infinity in dense and general pieces of one call: the lowest
 * piece named, the refused unit (row, tile; per-tensor: its group's
 * pieces and scale) left as it was, every other unit written. */
static void test_dense_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    for (int sch = 0; sch < 3; sch++)
        for (int which = 0; which < 3; which++) {
            int64_t k = 256;
            /* 0 general, 1 dense, 2 general, 3 dense, 4 dense; per-tensor:
             * 1 and 2 one group, 3 and 4 another */
            mpiece t[5] = {
                mp(BF16, 40, k, 2, 0, 0, 0), mp(BF16, 200, k, 0, 0, 0, 1),
                mp(F16, 130, k, 3, 0, 0, 1), mp(F16, 131, k, 0, LAY_PAD, 0, 2),
                mp(BF16, 129, k, LAY_PAD, 0, 1, 2),
            };
            /* which 0: Inf in dense 1, NaN in general 2: piece 1. which 1:
             * NaN in general 2, Inf in dense 3: piece 2. which 2: NaN in
             * dense 4 only: piece 4. */
            static const int64_t at[3][2][3] = {
                {{1, 150, 200}, {2, 129, 3}},
                {{2, 5, 255}, {3, 130, 0}},
                {{4, 128, 130}, {-1, 0, 0}},
            };
            mix m;
            mix_new(&m, sch, t, 5, PAT_MIXED);
            for (int e = 0; e < 2; e++)
                if (at[which][e][0] >= 0)
                    put_zero(&m.hx[at[which][e][0]], at[which][e][1], at[which][e][2]);
            int32_t bad;
            assert_int_equal(reference(5, m.hq, m.hs, m.hx, sch, &bad), REFIT_OK);
            for (int e = 0; e < 2; e++) {
                int64_t p = at[which][e][0];
                if (p < 0)
                    continue;
                view_put(&m.hx[p], at[which][e][1], at[which][e][2],
                         e ? __builtin_nanf("") : -__builtin_inff(), 0, 0);
                twin_push(&m.tx[p]);
                if (sch != KERN_FP8_PER_TENSOR) {
                    mix_unwritten(&m, (uint32_t)p, at[which][e][1], at[which][e][2]);
                    continue;
                }
                for (uint32_t g = 0; g < 5; g++)
                    if (t[g].slot == t[p].slot)
                        mix_unwritten(&m, g, 0, 0);
            }
            for (int hw = 0; hw < encoders; hw++)
                mix_check(&m, hw, REFIT_ECORRUPT, (int32_t)at[which][0][0], "NaN or Inf");
            mix_free(&m);
        }
}

/* Param arithmetic: reciprocal (QF_RECIP, vLLM's x * (1 / scale)) on the
 * device against kern_quant_fp8_arith's on the CPU, bit for bit: every
 * scheme's sweep, the edges (zero, subnormal groups whose reciprocal
 * overflows, the largest values), per-tensor groups, and the dense fast
 * path beside the general one. Then, on the device, a
 * [2048, 1024] per-channel BF16 weight gives other bytes in the two
 * arithmetics (the same scales). */
static void test_reciprocal(void **state)
{
    SKIP_WITHOUT_DEVICE();
    arith = KERN_FP8_RECIPROCAL;
    for (int sch = 0; sch < 3; sch++)
        sweep(sch);
    test_edges(state);
    test_groups(state);
    test_dense_mixed(state);
    test_dense_many(state);
    one(KERN_FP8_PER_CHANNEL, BF16, 2048, 1024, 0, 0, 0, PAT_RANDOM, NULL);
    arith = KERN_FP8_DIVIDE;
    int64_t n = 2048, k = 1024;
    twin tx = twin_new((size_t)(n * k) * 2), tq = twin_new((size_t)(n * k)),
         ts = twin_new((size_t)n * 4);
    refit_view gx = v2(tx.d, BF16, n, k, k, 1, 0), gq = v2(tq.d, E4M3, n, k, k, 1, 0);
    refit_view gs = v2(ts.d, F32, n, 1, 1, 1, 0), hx = on_host(gx, &tx);
    fill(&hx, PAT_RANDOM);
    twin_push(&tx);
    unsigned char *q[2];
    float *sc[2];
    for (int a = 0; a < 2; a++) {
        int32_t bad;
        int rc = kern_quant_fp8_cuda(1, &gq, &gs, &gx, KERN_FP8_PER_CHANNEL,
                                     a ? QF_RECIP : 0, &bad, NULL);
        assert_int_equal(rc, REFIT_OK);
        q[a] = malloc(tq.bytes);
        sc[a] = malloc(ts.bytes);
        assert_true(q[a] && sc[a]);
        CU(cudaMemcpy(q[a], tq.d, tq.bytes, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(sc[a], ts.d, ts.bytes, cudaMemcpyDeviceToHost));
    }
    size_t differ = 0;
    for (size_t i = 0; i < tq.bytes; i++)
        differ += q[0][i] != q[1][i];
    print_message("# [2048, 1024] per-channel bf16 on the device: %zu bytes differ between "
                  "divide and reciprocal\n", differ);
    assert_true(differ > 0);
    assert_memory_equal(sc[0], sc[1], ts.bytes);
    for (int a = 0; a < 2; a++) {
        free(q[a]);
        free(sc[a]);
    }
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

int main(void)
{
    twin_seed(0x51ed2701); /* this program's inputs, as before the shared stream */
    if (twin_skip_suite_without_device())
        return 0;
    encoders = 1;
    /* e.g. REFIT_TEST_FILTER='test_table*' (the emulator is slow); the
     * conversion check runs first whatever the filter, so that the cases
     * chosen run with both encoders (the dense path needs the instruction) */
    if (getenv("REFIT_TEST_FILTER")) {
        const struct CMUnitTest first[] = {cmocka_unit_test(test_conversion_check)};
        if (cmocka_run_group_tests(first, NULL, NULL))
            return 1;
        cmocka_set_test_filter(getenv("REFIT_TEST_FILTER"));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversion_check),
        cmocka_unit_test(test_per_tensor),
        cmocka_unit_test(test_per_channel),
        cmocka_unit_test(test_block128),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_saturation_happens),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_many_pieces),
        cmocka_unit_test(test_launch_shapes),
        cmocka_unit_test(test_table_and_rounds),
        cmocka_unit_test(test_user_stream),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_dense_mixed),
        cmocka_unit_test(test_dense_many),
        cmocka_unit_test(test_dense_nonfinite),
        cmocka_unit_test(test_reciprocal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
