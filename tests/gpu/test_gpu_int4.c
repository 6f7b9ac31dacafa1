/* INT4 on the device.
 *
 * Kernel: kern_quant_int4_cuda (plugins/int4/quant_int4.cu) against the CPU
 * reference kern_quant_int4 (plugins/int4/quant_int4.c), bit for bit: F32/F16/
 * BF16 weights and scales, ragged shapes (K not a multiple of 8 or of the
 * group, empty), every group kind (8..256 columns: lanes of a warp; 0 = per
 * row, 24, 100, 512: a block a row), the GPTQ layout's transposed words and
 * scales and the u8 layout's pitched rows, padded, transposed and
 * misaligned weights, zero, subnormal and tie values. Each case runs the
 * reference on a junk-filled host allocation and the kernel on a device
 * copy of the same junk, then compares whole allocations (bytes outside the
 * views too). One call of more pieces than a launch holds; a NaN, an
 * infinity and an F16 scale overflow refused with the lowest piece named.
 *
 * Model (not built under the CPU emulator, tests/gpu/emu/run_int4.sh): the
 * int4 plugin through the public API, the same model in device memory and
 * in host memory (the CPU reference), every update to both, device bytes
 * and fingerprints equal to the host's: checkpoint modules (gptq and u8
 * with its row pad, symmetric and asymmetric, I64 and I32 weight_shape,
 * checked through the host's fetch service) and online modules (BF16, F16
 * and F32 weights; groups of 128 and 32, per row, 100). Reload equals a cold
 * start; a wrong weight_shape and a NaN fail the update naming the tensor
 * and leave every byte; an abort after every post-load restores them.
 * Every module in one refit_load_many (one post_load_many: one launcher
 * call a group size, o3 and o4 sharing one) gives the bytes of one
 * refit_load a tensor, from aligned device sources read in place and from
 * unaligned ones staged; a NaN in one module of that call fails finalize
 * naming the module and tensor, rolled back.
 *
 * Skipped without a CUDA device. REFIT_GPU_INT4_ON_HOST=1 runs the
 * "device" model in host memory (the kernel cases skip), to check the test
 * and the plugin's service path without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/cast.h"
#include "plugins/int4/int4_direct.h"
#include "plugins/int4/quant_int4.h"
#ifndef REFIT_GPU_EMU
#include <refit/refit.h>

#include "gpu_pair.h"
#include "gpu_many.h"
#endif

#define I32 ((refit_dtype){REFIT_DTYPE_INT, 32, 1})
#define I64 ((refit_dtype){REFIT_DTYPE_INT, 64, 1})
#define U8 ((refit_dtype){REFIT_DTYPE_UINT, 8, 1})

static int on_host_only; /* REFIT_GPU_INT4_ON_HOST */

static const char *dt_name(refit_dtype d)
{
    return d.bits == 32 ? "f32" : d.code == REFIT_DTYPE_BFLOAT ? "bf16" : "f16";
}

/* twin_check, the part of the call's output named: "<what>: <part>". */
static void twin_check_part(const twin *t, const char *what, const char *part)
{
    char label[256];
    snprintf(label, sizeof label, "%s: %s", what, part);
    twin_check(t, label);
}

/* Raw bits of f in a float dtype (2 or 4 bytes at p). */
static void put_float(char *p, refit_dtype dt, float f)
{
    if (dt.bits == 32) {
        memcpy(p, &f, 4);
        return;
    }
    uint16_t h = dt.code == REFIT_DTYPE_BFLOAT ? kern_f32_to_bf16(f) : kern_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* ---- kernel against reference ---- */

enum pat { PAT_MIXED, PAT_RANDOM, PAT_ZERO, PAT_SUBNORMAL, PAT_TIES, PAT_NEARTIE, PAT_FARSUB };

static void put(const refit_view *x, int64_t i, int64_t j, float f)
{
    put_float((char *)x->data + (i * x->strides[0] + j * x->strides[1]) * (x->dtype.bits / 8),
              x->dtype, f);
}

/* A subnormal of the dtype, as an f32 that converts to it exactly. */
static float subnormal(refit_dtype dt)
{
    uint32_t b;
    if (dt.bits == 32)
        b = (uint32_t)(twin_rnd() & 0x7fffffu) | 1u;
    else if (dt.code == REFIT_DTYPE_BFLOAT)
        b = ((uint32_t)(twin_rnd() & 0x7fu) | 1u) << 16;
    else
        b = 0x33800000u + ((uint32_t)(twin_rnd() & 0x3ffu) << 13); /* f16 subnormal range */
    if (twin_rnd() & 1)
        b |= 0x80000000u;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Near-tie value j of a row whose amax is 2.25 (every 8th element, so in
 * every group of 8 or more columns): the float nearest (m + 1/2) * scale,
 * m in -7..6, stepped -3..3 ulps, so x / scale lands within a few ulps of
 * a half-integer (for F32 weights): where the kernel's multiply must defer
 * to the division. */
static float near_tie(int64_t j, refit_dtype sdt)
{
    if (j % 8 == 0)
        return 2.25f;
    int kind = kern_int4_float_kind(sdt);
    float sc = kern_int4_scale_value(kern_int4_scale_bits(2.25f, kind), kind);
    float f = (float)(((double)((j / 7) % 14) - 7.0 + 0.5) * (double)sc);
    for (int k = (int)(j % 7) - 3; k != 0; k += k < 0 ? 1 : -1)
        f = nextafterf(f, k < 0 ? -1e30f : 1e30f);
    return f;
}

/* Values: random over a wide range of magnitudes (kept below 60000, so an
 * F16 scale never overflows), zero rows, subnormal rows, tie rows (amax
 * 7.5: scale 1 where the scale dtype holds it, x / scale on the .5s) and
 * near-tie rows for scales of dtype sdt. */
static void fill(const refit_view *x, enum pat p, refit_dtype sdt)
{
    int64_t n = x->shape[0], k = x->shape[1];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            int kind = p;
            if (p == PAT_MIXED)
                kind = i % 7 == 3 ? PAT_ZERO : i % 5 == 2 ? PAT_SUBNORMAL
                       : i % 6 == 1 ? PAT_TIES : i % 4 == 0 ? PAT_NEARTIE : PAT_RANDOM;
            float f;
            switch (kind) {
            case PAT_ZERO:
                f = (twin_rnd() & 1) ? -0.0f : 0.0f;
                break;
            case PAT_SUBNORMAL:
                f = subnormal(x->dtype);
                break;
            case PAT_TIES:
                f = (float)((int)(j % 31) - 15) * 0.5f;
                break;
            case PAT_NEARTIE:
                f = near_tie(j, sdt);
                break;
            case PAT_FARSUB: {
                /* -10, 10 and 7 times the least subnormal of the scale
                 * dtype (where x's dtype holds it): amax / 7.5 rounds down
                 * to that subnormal, so x / scale reaches -10 and 10 (the
                 * codes clamp at both ends) */
                int tiny = sdt.code == REFIT_DTYPE_BFLOAT && x->dtype.code == REFIT_DTYPE_BFLOAT;
                float q = ldexpf(1.0f, tiny ? -133 : -24);
                f = (float)(j % 3 == 0 ? -10 : j % 3 == 1 ? 10 : 7) * q;
                break;
            }
            default: {
                int e = (int)(twin_rnd() % 30) - 20;
                f = twin_uniform() * (float)(e < 0 ? 1.0 / (double)(1ull << -e) : (double)(1ull << e));
                break;
            }
            }
            put(x, i, j, f);
        }
}

static int lanes_kind(int64_t group)
{
    return group > 0 && group % 8 == 0 && group <= 256 && ((group / 8) & (group / 8 - 1)) == 0;
}

/* One piece: x [n, k] of dt in layout xl; words as the GPTQ layout
 * (transposed) or the u8 one (pitched rows, ql 1); scales of sdt,
 * transposed or row-major (sl). */
static void one(refit_dtype dt, refit_dtype sdt, int64_t n, int64_t k, int64_t group, int xl,
                int ql, int sl, enum pat p)
{
    int64_t words = (k + 7) / 8, groups = group > 0 ? (k + group - 1) / group : 1;
    lay lx = layout(xl, n, k);
    lay lq = ql ? (lay){words + 3, 1, 0, n * (words + 3) + 1} : layout(2, n, words);
    lay ls = layout(sl ? 1 : 2, n, groups);
    twin tx = twin_new((size_t)lx.elems * (dt.bits / 8));
    twin tq = twin_new((size_t)lq.elems * 4);
    twin ts = twin_new((size_t)ls.elems * (sdt.bits / 8));
    refit_view gx = v2(tx.d, dt, n, k, lx.s0, lx.s1, lx.first);
    refit_view gq = v2(tq.d, I32, n, words, lq.s0, lq.s1, lq.first);
    refit_view gs = v2(ts.d, sdt, n, groups, ls.s0, ls.s1, ls.first);
    refit_view hx = on_host(gx, &tx), hq = on_host(gq, &tq), hs = on_host(gs, &ts);
    fill(&hx, p, sdt);
    twin_push(&tx);
    int rh = kern_quant_int4(&hq, &hs, &hx, group);
    int32_t bad;
    int rd = kern_quant_int4_cuda(1, &gq, &gs, &gx, group, &bad, NULL);
    char what[200];
    snprintf(what, sizeof what, "%s x, %s scales, [%lld, %lld], group %lld (%s), x layout %d, "
             "%s words, scale layout %d, values %d", dt_name(dt), dt_name(sdt), (long long)n,
             (long long)k, (long long)group, lanes_kind(group) ? "lanes" : "rows", xl,
             ql ? "u8" : "gptq", sl, (int)p);
    if (rd != rh)
        fail_msg("%s: device returned %d (%s), the reference %d", what, rd,
                 kern_cuda_last_error(), rh);
    assert_int_equal(rh, REFIT_OK);
    twin_check_part(&tq, what, "words");
    twin_check_part(&ts, what, "scales");
    twin_check_part(&tx, what, "weight (untouched)");
    twin_free(&tx);
    twin_free(&tq);
    twin_free(&ts);
}

#ifdef REFIT_GPU_EMU /* every thread a fiber: fewer, smaller cases */
static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {3, 8}, {9, 100}, {0, 5}, {5, 0}, {2, 520}};
static const int64_t groups[] = {8, 32, 128, 0, 24, 100};
#else
static const int64_t shapes[][2] = {
    {1, 1}, {7, 13}, {3, 8}, {129, 257}, {64, 100}, {33, 136}, {0, 5}, {5, 0}, {2, 2001},
    {40, 520}, {300, 1024},
};
static const int64_t groups[] = {8, 16, 32, 64, 128, 256, 0, 24, 100, 512};
#endif
#define N_SHAPES (sizeof shapes / sizeof shapes[0])
#define N_GROUPS (sizeof groups / sizeof groups[0])

/* A kernel case skips without a device, and with the "device" model in
 * host memory (on_host_only). */
#define SKIP_KERNEL_CASE()                                                    \
    do {                                                                      \
        if (on_host_only) {                                                   \
            print_message("# no CUDA device: %s\n", backend_cuda_unavailable()); \
            skip();                                                           \
        }                                                                     \
        SKIP_WITHOUT_DEVICE();                                                \
    } while (0)

static void test_kernel_sweep(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
    refit_dtype dts[3] = {BF16, F16, F32};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (size_t gi = 0; gi < N_GROUPS; gi++)
            for (int d = 0; d < 3; d++) {
                int l = (int)((si + gi + d) % 4);
                one(dts[d], dts[(d + gi) % 3], shapes[si][0], shapes[si][1], groups[gi], l,
                    (int)((gi + d) % 2), (int)(si % 2), PAT_MIXED);
            }
}

/* Whole matrices of one kind: zeros (every scale the dtype's epsilon),
 * subnormals (tiny or epsilon scales), ties, near-ties. */
static void test_kernel_edges(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
    refit_dtype dts[3] = {BF16, F16, F32};
    enum pat pats[4] = {PAT_ZERO, PAT_SUBNORMAL, PAT_TIES, PAT_NEARTIE};
    int64_t gs[3] = {32, 0, 100};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 3; s++)
            for (int p = 0; p < 4; p++) {
                one(dts[d], dts[s], 17, 136, gs[p % 3], 0, p % 2, s % 2, pats[p]);
                one(dts[d], dts[s], 5, 45, gs[(p + 1) % 3], 2, (p + 1) % 2, 0, pats[p]);
            }
}

/* ---- the dense fast path (k_q4_dense) beside the general kernels ----
 * Pieces of one call, some taking the dense path (F16/BF16 weights and
 * scales, aligned contiguous rows, K whole groups of 32..256) and some
 * not, each compared with the reference. A tile of the dense path is
 * R = 1024 / group rows of one group. */

/* x layouts beside gpu_twin's 0..3: rows padded by 8 elements (still
 * 16-byte aligned: dense). */
#define XL_PAD8 4

typedef struct dspec {
    refit_dtype dt, sdt;
    int64_t n, k;
    int xl;                      /* layout() kinds, or XL_PAD8 */
    int u8;                      /* words as u8 (pitched rows), else GPTQ (transposed) */
    int srow;                    /* scales row-major (padded), else transposed */
    enum pat p;
} dspec;

typedef struct dpiece {
    twin tx, tq, ts;
    refit_view gx, gq, gs, hx, hq, hs;
} dpiece;

static void dpiece_make(dpiece *d, const dspec *s, int64_t group)
{
    int64_t words = (s->k + 7) / 8, groups = (s->k + group - 1) / group;
    lay lx = s->xl == XL_PAD8 ? (lay){s->k + 8, 1, 0, s->n * (s->k + 8) + 1}
                              : layout(s->xl, s->n, s->k);
    lay lq = s->u8 ? (lay){words + 3, 1, 0, s->n * (words + 3) + 1} : layout(2, s->n, words);
    lay ls = layout(s->srow ? 1 : 2, s->n, groups);
    d->tx = twin_new((size_t)lx.elems * (s->dt.bits / 8));
    d->tq = twin_new((size_t)lq.elems * 4);
    d->ts = twin_new((size_t)ls.elems * (s->sdt.bits / 8));
    d->gx = v2(d->tx.d, s->dt, s->n, s->k, lx.s0, lx.s1, lx.first);
    d->gq = v2(d->tq.d, I32, s->n, words, lq.s0, lq.s1, lq.first);
    d->gs = v2(d->ts.d, s->sdt, s->n, groups, ls.s0, ls.s1, ls.first);
    d->hx = on_host(d->gx, &d->tx);
    d->hq = on_host(d->gq, &d->tq);
    d->hs = on_host(d->gs, &d->ts);
    fill(&d->hx, s->p, s->sdt);
    twin_push(&d->tx);
}

static void dpiece_free(dpiece *d)
{
    twin_free(&d->tx);
    twin_free(&d->tq);
    twin_free(&d->ts);
}

/* One call of np pieces; every piece's words and scales (whole
 * allocations) equal the reference's. */
static void dense_call(const dspec *specs, int np, int64_t group, const char *what)
{
    dpiece *d = calloc((size_t)np, sizeof *d);
    refit_view *gq = calloc((size_t)np * 3, sizeof *gq), *gs = gq + np, *gx = gs + np;
    assert_non_null(d);
    assert_non_null(gq);
    for (int i = 0; i < np; i++) {
        dpiece_make(&d[i], &specs[i], group);
        gq[i] = d[i].gq;
        gs[i] = d[i].gs;
        gx[i] = d[i].gx;
        assert_int_equal(kern_quant_int4(&d[i].hq, &d[i].hs, &d[i].hx, group), REFIT_OK);
    }
    int32_t bad;
    int rc = kern_quant_int4_cuda((uint32_t)np, gq, gs, gx, group, &bad, NULL);
    if (rc)
        fail_msg("%s, group %lld: %d (%s), piece %d", what, (long long)group, rc,
                 kern_cuda_last_error(), bad);
    for (int i = 0; i < np; i++) {
        char label[200];
        snprintf(label, sizeof label, "%s, group %lld, piece %d of %d (%s x, %s scales, "
                 "[%lld, %lld], x layout %d, %s words, values %d)", what, (long long)group, i,
                 np, dt_name(specs[i].dt), dt_name(specs[i].sdt), (long long)specs[i].n,
                 (long long)specs[i].k, specs[i].xl, specs[i].u8 ? "u8" : "gptq", (int)specs[i].p);
        twin_check_part(&d[i].tq, label, "words");
        twin_check_part(&d[i].ts, label, "scales");
        twin_check_part(&d[i].tx, label, "weight (untouched)");
        dpiece_free(&d[i]);
    }
    free(d);
    free(gq);
}

/* DENSE_LONG pieces of up to DENSE_TALL * 4 tiles of rows: more tiles
 * than the device has warps, so a warp's run of tiles steps through rows
 * and groups and crosses pieces (the emulated device has 2 SMs: 64 warps
 * of the dense kernel; an H200 4224) */
#ifdef REFIT_GPU_EMU
enum { DENSE_RANDOM = 10, DENSE_LONG = 24, DENSE_TALL = 1 };
#else
enum { DENSE_RANDOM = 60, DENSE_LONG = 24, DENSE_TALL = 64 };
#endif
static const int64_t dense_groups[] = {32, 64, 128, 256};

/* Dense pieces next to strided, misaligned, ragged and F32 ones; a piece
 * of exactly one group, one row short of a tile, a tile and a row;
 * padded aligned rows; zero, subnormal (subnormal scales: the exact
 * division), tie and near-tie values; then many dense pieces of random
 * shapes, dtypes and layouts in one call (a warp's run of tiles crosses
 * pieces). */
static void test_kernel_dense(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
    for (size_t gi = 0; gi < sizeof dense_groups / sizeof dense_groups[0]; gi++) {
        int64_t g = dense_groups[gi], R = 1024 / g;
        dspec mixed[] = {
            {BF16, BF16, 2 * R + 3, 2 * g, 0, 0, 0, PAT_MIXED},      /* dense, tail tile */
            {BF16, BF16, 5, g, 2, 0, 0, PAT_MIXED},                  /* strided: general */
            {F16, F16, R, 3 * g, 0, 1, 1, PAT_MIXED},                /* dense u8 */
            {F16, BF16, 3, g + 8, 3, 0, 1, PAT_MIXED},               /* misaligned, ragged */
            {BF16, F16, 1, g, 0, 0, 0, PAT_MIXED},                   /* exactly one group */
            {F16, BF16, R - 1, g, 0, 1, 0, PAT_MIXED},               /* a tile short a row */
            {BF16, BF16, R + 1, 2 * g, XL_PAD8, 0, 1, PAT_SUBNORMAL}, /* subnormal scales */
            {F32, BF16, 4, g, 0, 0, 0, PAT_MIXED},                   /* f32: general */
            {BF16, F16, R, g, 0, 1, 0, PAT_TIES},
            {F16, BF16, R, 2 * g, 0, 0, 1, PAT_NEARTIE},
            {BF16, BF16, R, g, 1, 0, 0, PAT_MIXED},                  /* rows padded by 3 */
            {F16, F16, 2, g, 0, 0, 0, PAT_ZERO},
            {F16, F16, R + 2, g, XL_PAD8, 1, 0, PAT_SUBNORMAL},
            {BF16, F32, R, g, 0, 0, 0, PAT_MIXED},                   /* f32 scales: general */
            {BF16, BF16, R, g, 0, 0, 0, PAT_FARSUB},                 /* |x / scale| up to 10 */
            {BF16, F16, R, 2 * g, 0, 1, 1, PAT_FARSUB},
            {F16, F16, R + 1, g, 0, 0, 1, PAT_FARSUB},
        };
        dense_call(mixed, (int)(sizeof mixed / sizeof mixed[0]), g, "dense beside general");
        dspec many[DENSE_RANDOM];
        for (int i = 0; i < DENSE_RANDOM; i++) {
            many[i] = (dspec){(twin_rnd() & 1) ? BF16 : F16, (twin_rnd() & 1) ? BF16 : F16,
                              1 + (int64_t)(twin_rnd() % (uint64_t)(3 * R)),
                              g * (1 + (int64_t)(twin_rnd() % 3)),
                              (twin_rnd() & 1) ? 0 : XL_PAD8, (int)(twin_rnd() & 1),
                              (int)(twin_rnd() & 1), PAT_MIXED};
        }
        dense_call(many, DENSE_RANDOM, g, "many dense pieces");
        dspec longs[DENSE_LONG];
        for (int i = 0; i < DENSE_LONG; i++) {
            int64_t tiles = 1 + (int64_t)(twin_rnd() % 4);
            longs[i] = (dspec){(twin_rnd() & 1) ? BF16 : F16, (twin_rnd() & 1) ? BF16 : F16,
                               tiles * DENSE_TALL * R - (int64_t)(twin_rnd() % (uint64_t)R),
                               g * (1 + (int64_t)(twin_rnd() % 4)),
                               (twin_rnd() & 1) ? 0 : XL_PAD8, i % 2, (int)(twin_rnd() & 1),
                               PAT_MIXED};
        }
        dense_call(longs, DENSE_LONG, g, "long runs of tiles");
    }
}

/* Refusals in dense pieces: the lowest refused piece named, dense or not;
 * a refused (row, group) of a dense piece leaves its scale and words as
 * they were and every other one is the reference's (as the general
 * kernel does). Pieces: 0 general (F32) clean, 1 dense clean, 2 dense with
 * a NaN, 3 dense with an infinity, 4 general with a NaN, 5 dense whose F16
 * scale overflows. */
static void test_kernel_dense_refusal(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
    for (int gi = 0; gi < 2; gi++) {
        int64_t g = gi ? 32 : 128, R = 1024 / g;
        dspec sp[6] = {
            {F32, BF16, 3, 2 * g, 0, 0, 0, PAT_RANDOM},
            {BF16, BF16, R + 1, 2 * g, 0, 0, 0, PAT_RANDOM},
            {BF16, BF16, 2 * R, 2 * g, 0, 0, 1, PAT_RANDOM},
            {F16, BF16, R + 3, 3 * g, 0, 1, 0, PAT_RANDOM},
            {F32, F32, 2, g, 0, 0, 0, PAT_RANDOM},
            {BF16, F16, R, g, 0, 1, 1, PAT_RANDOM},
        };
        /* the refused (row, column) of pieces 2, 3, 5 */
        const int64_t at[6][2] = {{0, 0}, {0, 0}, {R + 1, g + 3}, {R + 2, 2 * g + 9}, {1, 5},
                                  {R - 1, 0}};
        const float bad_value[6] = {0, 0, __builtin_nanf(""), -__builtin_inff(),
                                    __builtin_nanf(""), 1.0e6f};
        dpiece d[6];
        refit_view gq[6], gs[6], gx[6];
        for (int i = 0; i < 6; i++) {
            dpiece_make(&d[i], &sp[i], g);
            gq[i] = d[i].gq;
            gs[i] = d[i].gs;
            gx[i] = d[i].gx;
        }
        for (int i = 2; i < 6; i++) {
            put(&d[i].hx, at[i][0], at[i][1], bad_value[i]);
            twin_push(&d[i].tx);
        }
        int32_t bad = -7;
        int rc = kern_quant_int4_cuda(6, gq, gs, gx, g, &bad, NULL);
        if (rc != REFIT_ECORRUPT || bad != 2)
            fail_msg("group %lld: refusals in pieces 2..5: %d, piece %d", (long long)g, rc, bad);
        /* the expected bytes: the reference with the refused value made
         * finite, then the refused group's scale and words as they were */
        for (int i = 1; i < 6; i++) {
            if (i == 4)
                continue;
            char *jq = twin_save(&d[i].tq), *js = twin_save(&d[i].ts);
            if (i > 1)
                put(&d[i].hx, at[i][0], at[i][1], 0.5f);
            assert_int_equal(kern_quant_int4(&d[i].hq, &d[i].hs, &d[i].hx, g), REFIT_OK);
            if (i > 1) {
                int64_t row = at[i][0], grp = at[i][1] / g;
                size_t se = d[i].gs.dtype.bits / 8;
                size_t so = (size_t)((char *)d[i].hs.data - d[i].ts.h) +
                            (size_t)(row * d[i].gs.strides[0] + grp * d[i].gs.strides[1]) * se;
                memcpy(d[i].ts.h + so, js + so, se);
                for (int64_t w = grp * g / 8; w < (grp + 1) * g / 8; w++) {
                    size_t qo = (size_t)((char *)d[i].hq.data - d[i].tq.h) +
                                (size_t)(row * d[i].gq.strides[0] + w * d[i].gq.strides[1]) * 4;
                    memcpy(d[i].tq.h + qo, jq + qo, 4);
                }
            }
            char label[96];
            snprintf(label, sizeof label, "group %lld, piece %d after the refused call",
                     (long long)g, i);
            twin_check_part(&d[i].tq, label, "words");
            twin_check_part(&d[i].ts, label, "scales");
            free(jq);
            free(js);
        }
        /* a refusal in general piece 0 as well: it is the lowest */
        put(&d[0].hx, 2, 1, __builtin_inff());
        twin_push(&d[0].tx);
        rc = kern_quant_int4_cuda(6, gq, gs, gx, g, &bad, NULL);
        if (rc != REFIT_ECORRUPT || bad != 0)
            fail_msg("group %lld: refusals in pieces 0, 2..5: %d, piece %d", (long long)g, rc,
                     bad);
        /* only the dense overflow left */
        put(&d[0].hx, 2, 1, 1.0f);
        twin_push(&d[0].tx);
        for (int i = 2; i < 5; i++) {
            put(&d[i].hx, at[i][0], at[i][1], 0.25f);
            twin_push(&d[i].tx);
        }
        rc = kern_quant_int4_cuda(6, gq, gs, gx, g, &bad, NULL);
        if (rc != REFIT_ECORRUPT || bad != 5)
            fail_msg("group %lld: an F16 scale overflow in piece 5 alone: %d, piece %d",
                     (long long)g, rc, bad);
        for (int i = 0; i < 6; i++)
            dpiece_free(&d[i]);
    }
}

/* The status word is kept per device between calls: after a refusal of
 * piece 0, a refusal of piece 1 alone names piece 1 (the 0 left over
 * would win the minimum), and a clean call succeeds with every byte of
 * the reference. Both kernels (groups of 64, whole rows). */
static void test_status_after_refusal(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
    for (int gi = 0; gi < 2; gi++) {
        int64_t group = gi ? 0 : 64, n = 6, k = 128, words = k / 8, g = gi ? 1 : k / 64;
        refit_view gq[2], gs[2], gx[2], hq[2], hs[2], hx[2];
        twin tx[2], tq[2], ts[2];
        for (int i = 0; i < 2; i++) {
            tx[i] = twin_new((size_t)(n * k) * 2);
            tq[i] = twin_new((size_t)(n * words) * 4);
            ts[i] = twin_new((size_t)(n * g) * 4);
            gx[i] = v2(tx[i].d, BF16, n, k, k, 1, 0);
            gq[i] = v2(tq[i].d, I32, n, words, 1, n, 0);
            gs[i] = v2(ts[i].d, F32, n, g, g, 1, 0);
            hx[i] = on_host(gx[i], &tx[i]);
            hq[i] = on_host(gq[i], &tq[i]);
            hs[i] = on_host(gs[i], &ts[i]);
            fill(&hx[i], PAT_MIXED, F32);
        }
        int32_t bad = 99;
        put(&hx[0], 2, 7, __builtin_nanf(""));
        twin_push(&tx[0]);
        twin_push(&tx[1]);
        int rc = kern_quant_int4_cuda(2, gq, gs, gx, group, &bad, NULL);
        if (rc != REFIT_ECORRUPT || bad != 0)
            fail_msg("group %lld, NaN in piece 0: %d, piece %d", (long long)group, rc, bad);
        put(&hx[0], 2, 7, 0.25f);
        put(&hx[1], 5, 127, -__builtin_inff());
        twin_push(&tx[0]);
        twin_push(&tx[1]);
        rc = kern_quant_int4_cuda(2, gq, gs, gx, group, &bad, NULL);
        if (rc != REFIT_ECORRUPT || bad != 1)
            fail_msg("group %lld, -inf in piece 1 after a refusal of piece 0: %d, piece %d",
                     (long long)group, rc, bad);
        put(&hx[1], 5, 127, 1.5f);
        twin_push(&tx[1]);
        rc = kern_quant_int4_cuda(2, gq, gs, gx, group, &bad, NULL);
        if (rc)
            fail_msg("group %lld, a clean call after refusals: %d (%s)", (long long)group, rc,
                     kern_cuda_last_error());
        for (int i = 0; i < 2; i++) {
            assert_int_equal(kern_quant_int4(&hq[i], &hs[i], &hx[i], group), REFIT_OK);
            twin_check_part(&tq[i], "a clean call after refusals", "words");
            twin_check_part(&ts[i], "a clean call after refusals", "scales");
            twin_free(&tx[i]);
            twin_free(&tq[i]);
            twin_free(&ts[i]);
        }
    }
}

/* Many pieces in one call (past a launch's batch): the bytes of the
 * reference piece by piece; then a NaN, an infinity and an F16 scale
 * overflow, the lowest refused piece named. */
static void test_kernel_pieces(void **state)
{
    (void)state;
    SKIP_KERNEL_CASE();
#ifdef REFIT_GPU_EMU
    enum { NP = 40 };
#else
    enum { NP = 300 };
#endif
    for (int gi = 0; gi < 2; gi++) {
        int64_t group = gi ? 0 : 64;
        refit_view gq[NP], gs[NP], gx[NP], hq[NP], hs[NP], hx[NP];
        twin tx[NP], tq[NP], ts[NP];
        for (int i = 0; i < NP; i++) {
            int64_t n = 1 + (int64_t)(twin_rnd() % 40), k = 1 + (int64_t)(twin_rnd() % 200);
            int64_t words = (k + 7) / 8, g = group ? (k + group - 1) / group : 1;
            refit_dtype dt = i % 3 == 0 ? BF16 : i % 3 == 1 ? F16 : F32;
            refit_dtype sdt = i % 2 ? F32 : BF16;
            tx[i] = twin_new((size_t)(n * k) * (dt.bits / 8));
            tq[i] = twin_new((size_t)(n * words) * 4);
            ts[i] = twin_new((size_t)(n * g) * (sdt.bits / 8));
            gx[i] = v2(tx[i].d, dt, n, k, k, 1, 0);
            gq[i] = v2(tq[i].d, I32, n, words, 1, n, 0);
            gs[i] = v2(ts[i].d, sdt, n, g, g, 1, 0);
            hx[i] = on_host(gx[i], &tx[i]);
            hq[i] = on_host(gq[i], &tq[i]);
            hs[i] = on_host(gs[i], &ts[i]);
            fill(&hx[i], PAT_MIXED, sdt);
            twin_push(&tx[i]);
            assert_int_equal(kern_quant_int4(&hq[i], &hs[i], &hx[i], group), REFIT_OK);
        }
        int32_t bad;
        int rc = kern_quant_int4_cuda(NP, gq, gs, gx, group, &bad, NULL);
        if (rc)
            fail_msg("%d pieces: %d (%s)", NP, rc, kern_cuda_last_error());
        for (int i = 0; i < NP; i++) {
            char what[64];
            snprintf(what, sizeof what, "piece %d of %d, group %lld", i, NP, (long long)group);
            twin_check_part(&tq[i], what, "words");
            twin_check_part(&ts[i], what, "scales");
        }
        /* refusals: an infinity at piece NP-5, a NaN at NP/2, an F16-scale
         * overflow at NP/3 (an F32 weight of 1e6 with F16 scales) */
        put(&hx[NP - 5], 0, 0, __builtin_inff());
        twin_push(&tx[NP - 5]);
        put(&hx[NP / 2], hx[NP / 2].shape[0] - 1, hx[NP / 2].shape[1] - 1, __builtin_nanf(""));
        twin_push(&tx[NP / 2]);
        rc = kern_quant_int4_cuda(NP, gq, gs, gx, group, &bad, NULL);
        assert_int_equal(rc, REFIT_ECORRUPT);
        assert_int_equal(bad, NP / 2);
        int j = NP / 3;
        twin big = twin_new(4 * 8), bs = twin_new(2);
        refit_view bx = v2(big.d, F32, 1, 8, 8, 1, 0), hb = on_host(bx, &big);
        for (int e = 0; e < 8; e++)
            put(&hb, 0, e, e == 3 ? 1.0e6f : 1.0f);
        twin_push(&big);
        refit_view bq = v2(tq[j].d, I32, 1, 1, 1, 1, 0), bsc = v2(bs.d, F16, 1, 1, 1, 1, 0);
        refit_view hbq = on_host(bq, &tq[j]), hbs = on_host(bsc, &bs);
        assert_int_equal(kern_quant_int4(&hbq, &hbs, &hb, group), REFIT_ECORRUPT);
        gq[j] = bq;
        gs[j] = bsc;
        gx[j] = bx;
        rc = kern_quant_int4_cuda(NP, gq, gs, gx, group, &bad, NULL);
        assert_int_equal(rc, REFIT_ECORRUPT);
        assert_int_equal(bad, j);
        twin_free(&big);
        twin_free(&bs);
        for (int i = 0; i < NP; i++) {
            twin_free(&tx[i]);
            twin_free(&tq[i]);
            twin_free(&ts[i]);
        }
    }
    /* views the kernel refuses before launching: the piece named */
    twin t = twin_new(64);
    refit_view x = v2(t.d, F32, 2, 8, 8, 1, 0), q = v2(t.d, I32, 2, 2, 2, 1, 0);
    refit_view s = v2(t.d, F32, 2, 1, 1, 1, 0);
    int32_t bad;
    assert_int_equal(kern_quant_int4_cuda(1, &q, &s, &x, 0, &bad, NULL), REFIT_EMISMATCH);
    assert_int_equal(bad, 0);
    q.shape[1] = 1;
    s.dtype = I32;
    assert_int_equal(kern_quant_int4_cuda(1, &q, &s, &x, 0, &bad, NULL), REFIT_EUNSUPPORTED);
    assert_int_equal(kern_quant_int4_cuda(1, &q, &s, &x, -1, &bad, NULL), REFIT_EINVAL);
    twin_free(&t);
}

#ifndef REFIT_GPU_EMU
/* ---- the model through the public API: device against host (the paired
 * harness, gpu_pair.h) ---- */

/* What a checkpoint tensor holds. */
enum ck_kind { CK_PACKED, CK_SCALE, CK_ZP, CK_SHAPE, CK_FLOAT };

/* A checkpoint tensor "module.suffix" [a, b] (ndim 1: [a]). */
static void expect(pair_world *w, const char *module, const char *suffix, enum ck_kind kind,
                   refit_dtype dt, int ndim, int64_t a, int64_t b, const char *target)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    pair_expect(w, module, name, dt, ndim, (int64_t[]){a, b}, target, 0, -1)->kind = kind;
}

/* A checkpoint module: gptq or u8 (row pitch), zero points or not, the
 * weight_shape as sdt (I32/I64). */
static void ckpt_module(pair_world *w, const char *name, const char *params, int64_t n, int64_t k,
                        int64_t group, int u8, int64_t pitch, int asym, refit_dtype scale_dt,
                        refit_dtype shape_dt)
{
    int64_t words = (k + 7) / 8, groups = (k + group - 1) / group;
    OK(w, refit_model_add_module(w->m, name, "int4", params));
    if (u8) {
        pair_bind(w, name, "weight", U8, 2, (int64_t[]){n, pitch});
        pair_bind(w, name, "weight_scale", scale_dt, 2, (int64_t[]){n, groups});
        if (asym)
            pair_bind(w, name, "weight_zero_point", I32, 2, (int64_t[]){(n + 7) / 8, groups});
    } else {
        pair_bind(w, name, "weight", I32, 2, (int64_t[]){words, n});
        pair_bind(w, name, "weight_scale", scale_dt, 2, (int64_t[]){groups, n});
        if (asym)
            pair_bind(w, name, "weight_zero_point", I32, 2, (int64_t[]){groups, (n + 7) / 8});
    }
    expect(w, name, "weight_packed", CK_PACKED, I32, 2, n, words, "weight");
    expect(w, name, "weight_scale", CK_SCALE, scale_dt, 2, n, groups, "weight_scale");
    if (asym)
        expect(w, name, "weight_zero_point", CK_ZP, I32, 2, (n + 7) / 8, groups,
               "weight_zero_point");
    expect(w, name, "weight_shape", CK_SHAPE, shape_dt, 1, 2, 0, "weight");
    w->ck[w->n_ck - 1].aux[0] = n;
    w->ck[w->n_ck - 1].aux[1] = k;
}

/* An online module: a float W.weight [n, k] into gptq or u8. */
static void online_module(pair_world *w, const char *name, const char *params, int64_t n, int64_t k,
                          int64_t group, int u8, int64_t pitch, refit_dtype dt,
                          refit_dtype scale_dt)
{
    int64_t words = (k + 7) / 8, groups = group > 0 ? (k + group - 1) / group : 1;
    OK(w, refit_model_add_module(w->m, name, "int4", params));
    if (u8) {
        pair_bind(w, name, "weight", U8, 2, (int64_t[]){n, pitch});
        pair_bind(w, name, "weight_scale", scale_dt, 2, (int64_t[]){n, groups});
    } else {
        pair_bind(w, name, "weight", I32, 2, (int64_t[]){words, n});
        pair_bind(w, name, "weight_scale", scale_dt, 2, (int64_t[]){groups, n});
    }
    expect(w, name, "weight", CK_FLOAT, dt, 2, n, k, "weight");
}

static void build(pair_world *w)
{
    ckpt_module(w, "c0", "group_size: 32\nin_features: 100", 48, 100, 32, 0, 0, 0, BF16, I64);
    ckpt_module(w, "c1", "group_size: 64\nlayout: u8", 24, 128, 64, 1, 80, 1, F16, I32);
    online_module(w, "o0", "group_size: 128\nonline: true", 96, 520, 128, 0, 0, BF16, BF16);
    online_module(w, "o1", "group_size: -1\nlayout: u8", 33, 77, 0, 1, 48, F32, F16);
    online_module(w, "o2", "group_size: 100", 16, 300, 100, 0, 0, F16, F32);
    online_module(w, "o3", "group_size: 32\nlayout: u8", 64, 256, 32, 1, 136, BF16, BF16);
    /* o3's group size: one launcher call takes both */
    online_module(w, "o4", "group_size: 32", 40, 96, 32, 0, 0, F16, F16);
}

/* Contiguous host bytes of tensor c at version v. bad: 1 a NaN in a float
 * weight, 2 a weight_shape with K + 1. */
static void *ckpt_bytes(const pair_ck *c, int v, int bad, size_t *bytes)
{
    int64_t numel = c->ndim == 1 ? c->shape[0] : c->shape[0] * c->shape[1];
    size_t e = c->dtype.bits / 8, n = (size_t)numel;
    uint64_t seed = pair_seed(c, v);
    char *b = malloc(n * e + 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = twin_mix(seed + i);
        int64_t row = c->ndim == 2 ? (int64_t)i / c->shape[1] : 0;
        if (c->kind == CK_PACKED || c->kind == CK_ZP) {
            uint32_t u = (uint32_t)r;
            memcpy(b + i * 4, &u, 4);
        } else if (c->kind == CK_SHAPE) {
            int64_t x = c->aux[i] + (bad == 2 && i == 1);
            if (e == 8)
                memcpy(b + i * 8, &x, 8);
            else {
                int32_t y = (int32_t)x;
                memcpy(b + i * 4, &y, 4);
            }
        } else if (c->kind == CK_SCALE) {
            put_float(b + i * e, c->dtype, 0.001f + (float)((r >> 40) & 0xffff) / 65536.0f);
        } else {
            float f;
            if (row % 9 == 4) {
                f = 0.0f;
            } else if (row % 7 == 2) {
                uint32_t u = c->dtype.bits == 16 && c->dtype.code == REFIT_DTYPE_FLOAT
                                 ? 0x33800000u + (uint32_t)(r & 0xfffff)
                                 : (uint32_t)(r & 0x7fffffu) | 1u;
                memcpy(&f, &u, 4);
            } else if (row % 6 == 1) {
                f = (float)((int)(i % 31) - 15) * 0.5f;
            } else {
                int ex = (int)(r % 24) - 12;
                f = (float)((double)((r >> 20) & 0xffff) / 32768.0 - 1.0) *
                    (float)(ex < 0 ? 1.0 / (double)(1u << -ex) : (double)(1u << ex));
            }
            if (r & (1ull << 63))
                f = -f;
            if (bad == 1 && i == 37)
                f = __builtin_nanf("");
            put_float(b + i * e, c->dtype, f);
        }
    }
    *bytes = n * e;
    return b;
}

static const pair_format int4_model = {"REFIT_GPU_INT4_ON_HOST", "int4", build, ckpt_bytes};

/* The device model's bytes are the host model's, from every source kind;
 * the u8 row pads are zero. */
static void test_model_matches_host(void **state)
{
    WORLDS(state, d, h);
    (void)h;
    pair_check_matches_host(state);
    /* c1's runtime weight (runtime #2: c0 binds two) holds rows of 80 bytes,
     * 64 of them words */
    unsigned char row[80];
    for (int64_t i = 0; i < 24; i++) {
        pair_mem_get(1, row, (char *)d->rt[2].data + i * 80, 80);
        for (int b = 64; b < 80; b++)
            assert_int_equal(row[b], 0);
    }
}

/* The same weights twice leave the same bytes; B over A equals a cold
 * start on B. */
static void test_model_reload_equals_cold(void **state)
{
    WORLDS(state, d, h);
    (void)h;
    size_t n1, n2, n3;
    char *a = pair_reload_same(d, 11, &n1);
    pair_update(d, 12, SRC_DEVICE, NULL);
    pair_world cold;
    pair_open(&cold, 1);
    pair_update(&cold, 12, SRC_DEVICE, NULL);
    char *c = pair_snapshot(&cold, &n3);
    char *b = pair_snapshot(d, &n2);
    assert_int_equal(n2, n3);
    pair_assert_snap(d, c, b, n2, "reload against a cold start");
    assert_true(memcmp(a, b, n1) != 0);
    pair_close(&cold);
    free(a);
    free(b);
    free(c);
}

/* A refused update (wrong weight_shape of c0 and c1, a NaN in o0 and in
 * o3) names its tensor and leaves every byte; so does an abort after every
 * module's post-load. */
static void test_model_refusals_roll_back(void **state)
{
    WORLDS(state, d, h);
    pair_update(h, 31, SRC_PAGEABLE, NULL);
    pair_update(d, 31, SRC_DEVICE, NULL);
    size_t n0;
    char *before = pair_snapshot(d, &n0);
    static const struct {
        const char *tensor;
        int bad;
        const char *reason;
    } cases[4] = {
        {"c0.weight_shape", 2, "disagrees with the module's params"},
        {"c1.weight_shape", 2, "does not fit"},
        {"o0.weight", 1, "NaN or infinity"},
        {"o3.weight", 1, "NaN or infinity"},
    };
    for (int k = 0; k < 4; k++) {
        int at = 0;
        while (strcmp(d->ck[at].name, cases[k].tensor))
            at++;
        pair_check_refused(d, at, cases[k].bad, cases[k].reason, before, n0, cases[k].tensor);
    }
    pair_check_abort_restores(d, before, n0);
    free(before);
    pair_assert_same(d, h, "after the refusals");
}

/* ---- many modules in one loading call ---- */

static void test_model_load_many(void **state)
{
    pair_check_load_many_watched(state, &int4_model);
}

/* A NaN in o0 (a launch of its own), then in o4 (a launch with o3). */
static void test_model_load_many_nan(void **state)
{
    const pair_world *d = *state; /* NULL without a device: the case skips */
    int bads[2] = {-1, -1};
    for (int k = 0; d && k < d->n_ck; k++) {
        if (!strcmp(d->ck[k].name, "o0.weight"))
            bads[0] = k;
        if (!strcmp(d->ck[k].name, "o4.weight"))
            bads[1] = k;
    }
    pair_check_load_many_nan(state, &int4_model, bads, d ? 2 : 0);
}

/* A wrong weight_shape of c0, then of c1, in a call of every module: the
 * call's weight_shapes come back in one read (check_shapes_at_once), and
 * the refusal still names the module and tensor. */
static void test_model_load_many_shape(void **state)
{
    const pair_world *d = *state; /* NULL without a device: the case skips */
    int bads[2] = {-1, -1};
    for (int k = 0; d && k < d->n_ck; k++) {
        if (!strcmp(d->ck[k].name, "c0.weight_shape"))
            bads[0] = k;
        if (!strcmp(d->ck[k].name, "c1.weight_shape"))
            bads[1] = k;
    }
    pair_check_load_many_refused(state, &int4_model, bads, d ? 2 : 0, 2, "shape (");
}
#endif /* REFIT_GPU_EMU */

int main(void)
{
    twin_seed(0x1a7e4c3d); /* this program's inputs, as before the shared stream */
#ifndef REFIT_GPU_EMU
    on_host_only = pair_use(&int4_model);
#else
    const char *e = getenv("REFIT_GPU_INT4_ON_HOST");
    on_host_only = e && *e && strcmp(e, "0");
#endif
    if (!on_host_only && twin_skip_suite_without_device())
        return 0;
    /* one group (one TAP plan): the kernel cases where the kernel runs, the
     * model cases where the library is linked */
    struct CMUnitTest tests[12];
    size_t n = 0;
    if (!on_host_only) {
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_sweep);
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_edges);
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_pieces);
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_status_after_refusal);
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_dense);
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_kernel_dense_refusal);
    }
#ifndef REFIT_GPU_EMU
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_matches_host);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_reload_equals_cold);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_refusals_roll_back);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_load_many);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_load_many_nan);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_model_load_many_shape);
    return _cmocka_run_group_tests("gpu-int4", tests, n, pair_setup, pair_teardown);
#else
    return _cmocka_run_group_tests("gpu-int4", tests, n, NULL, NULL);
#endif
}
