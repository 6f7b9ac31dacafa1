/* NVFP4 post-load on the device.
 *
 * Kernel: kern_quant_nvfp4_cuda (plugins/nvfp4/quant_nvfp4.cu) against the CPU
 * references (kern_quant_nvfp4 for online pieces, kern_swizzle +
 * kern_nvfp4_fuse for checkpoint ones), bit for bit: F32/F16/BF16 weights
 * of ragged shapes (K not a multiple of 16 or of 2, N not of 128, empty),
 * row-major, padded, transposed and misaligned views of the weight and of
 * the packed output, values that reach every edge (zero blocks and a zero
 * tensor, subnormal inputs whose global scale overflows to FLT_MAX,
 * subnormal E4M3 block scales, the largest finite values), checkpoint
 * scales of any strides with both conventions' factors, many pieces of
 * both kinds in one call (more than a launch's batch; on a device, sets
 * larger than the kernel's L2 set), NaN and infinity refused with the
 * lowest piece named. Each case runs the reference on a junk-filled host
 * allocation and the kernel on a device copy of the same junk, then
 * compares whole allocations, so bytes outside the views are checked too.
 *
 * Model (not in the emulator): checkpoint (ModelOpt and compressed-tensors)
 * and online (BF16, F16, F32, ragged) nvfp4 modules through the public API
 * and the nvfp4 plugin, the same model registered in device memory and in
 * host memory (the CPU reference); every update goes to both and the
 * device bytes and fingerprints must equal the host's, from device, pinned
 * and pageable sources and a caller's stream; the same weights twice give
 * the same bytes, a reload equals a cold start; a NaN is refused naming
 * module and tensor with the bytes kept; an abort after every post-load
 * ran restores the previous bytes. Every module in one refit_load_many
 * (one post_load_many, one launcher call) gives the bytes of one
 * refit_load a tensor, from aligned device sources read in place and from
 * unaligned ones staged; a NaN in one module of that call fails finalize
 * naming the module and tensor, rolled back.
 *
 * Skipped without a CUDA device. REFIT_GPU_NVFP4_ON_HOST=1 runs the model
 * tests with the "device" model in host memory (the service's host path),
 * to check the test itself without a GPU. Built with REFIT_GPU_EMU (by
 * tests/gpu/emu/run_nvfp4.sh) it holds the kernel tests only. */
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
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h"
#ifndef REFIT_GPU_EMU
#include "gpu_pair.h"
#include "gpu_many.h"
#endif
#include "core/cuda/kern_cuda.h"
#include "kernels/cast.h"
#include "plugins/nvfp4/nvfp4_direct.h"
#include "plugins/nvfp4/quant_nvfp4.h"

#define U8 ((refit_dtype){REFIT_DTYPE_UINT, 8, 1})
#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

/* ---- kernel against reference ---- */

enum pat { PAT_MIXED, PAT_ZERO, PAT_SUBNORMAL, PAT_BIG, PAT_RANDOM };

static float biggest(refit_dtype dt)
{
    return dt.bits == 16 && dt.code == REFIT_DTYPE_FLOAT ? 65504.0f : 3.3895314e38f;
}

/* Fill x (a host view) with pattern p. Random: magnitudes over 2^-20 ..
 * 2^20 (blocks of very different scales, subnormal E4M3 block scales).
 * Mixed: the same with zero blocks, subnormal rows and rows near the
 * dtype's largest magnitude. */
static void fill(const refit_view *x, enum pat p)
{
    for (int64_t i = 0; i < x->shape[0]; i++)
        for (int64_t j = 0; j < x->shape[1]; j++) {
            float f = 0.0f;
            uint16_t raw = 0;
            int use_raw = 0, kind = p;
            if (p == PAT_MIXED)
                kind = (i + j / 16) % 7 == 3 ? PAT_ZERO : i % 11 == 5 ? PAT_SUBNORMAL
                       : i % 13 == 6 ? PAT_BIG : PAT_RANDOM;
            if (kind == PAT_ZERO) {
                f = (twin_rnd() & 1) ? -0.0f : 0.0f;
            } else if (kind == PAT_SUBNORMAL) {
                uint32_t b = (uint32_t)(twin_rnd() & 0x80000000u) |
                             ((uint32_t)(twin_rnd() & 0x7fffffu) | 1u) >> (twin_rnd() % 20);
                memcpy(&f, &b, 4);
                use_raw = x->dtype.bits == 16;
                raw = (uint16_t)((twin_rnd() & 0x8000u) |
                                 (x->dtype.code == REFIT_DTYPE_BFLOAT
                                      ? (twin_rnd() & 0x7fu) | 1u
                                      : (twin_rnd() & 0x3ffu) | 1u));
            } else if (kind == PAT_BIG) {
                f = biggest(x->dtype) * (0.5f + 0.5f * twin_uniform());
                if (twin_rnd() % 97 == 0)
                    f = (twin_rnd() & 1) ? biggest(x->dtype) : -biggest(x->dtype);
            } else {
                int e = (int)(twin_rnd() % 40) - 20 - (int)((i + j / 16) % 5) * 3;
                f = twin_uniform() * (float)(e < 0 ? 1.0 / (double)(1ull << -e) : (double)(1ull << e));
                if (x->dtype.bits == 16 && x->dtype.code == REFIT_DTYPE_FLOAT)
                    f = f > 60000.0f ? 60000.0f : f < -60000.0f ? -60000.0f : f;
            }
            view_put(x, i, j, f, raw, use_raw);
        }
}

/* One piece's allocations: device views in p, host twins beside. */
typedef struct tpiece {
    refit_nvfp4_piece g, h; /* device, host */
    twin tx, tq, ts, tf;    /* source, packed, scale, factors (alpha, inv, wf, in) */
} tpiece;

/* An online piece: x [n, k] of dt in layout xl, packed in layout ql. */
static void piece_online(tpiece *t, refit_dtype dt, int64_t n, int64_t k, int xl, int ql,
                         enum pat p)
{
    memset(t, 0, sizeof *t);
    int64_t kb = (k + 1) / 2, blocks = (k + 15) / 16;
    lay lx = layout(xl, n, k), lq = layout(ql, n, kb);
    int64_t sw = kern_swizzle_rows(n) * kern_swizzle_cols(blocks);
    t->tx = twin_new((size_t)lx.elems * (dt.bits / 8));
    t->tq = twin_new((size_t)lq.elems);
    t->ts = twin_new((size_t)sw + 2);
    t->tf = twin_new(16);
    t->g.mode = REFIT_NVFP4_ONLINE;
    t->g.src = vw(t->tx.d, dt, 2, n, k, lx.s0, lx.s1, lx.first);
    t->g.packed = vw(t->tq.d, U8, 2, n, kb, lq.s0, lq.s1, lq.first);
    t->g.scale = vw(t->ts.d, E4M3, 1, sw, 0, 1, 0, 1);
    t->g.alpha = vw(t->tf.d, F32, 1, 1, 0, 1, 0, 1);
    t->h = t->g;
    t->h.src = on_host(t->g.src, &t->tx);
    t->h.packed = on_host(t->g.packed, &t->tq);
    t->h.scale = on_host(t->g.scale, &t->ts);
    t->h.alpha = on_host(t->g.alpha, &t->tf);
    fill(&t->h.src, p);
    twin_push(&t->tx);
}

/* A checkpoint piece: staged scales [n, c] in layout sl, factors. */
static void piece_ckpt(tpiece *t, int mode, int64_t n, int64_t c, int sl, int input, int inv)
{
    memset(t, 0, sizeof *t);
    lay ls = layout(sl, n, c);
    int64_t sw = kern_swizzle_rows(n) * kern_swizzle_cols(c);
    t->tx = twin_new((size_t)ls.elems);
    t->ts = twin_new((size_t)sw + 2);
    t->tf = twin_new(20);
    float wf = 0.25f + (float)(twin_rnd() % 1000) / 97.0f,
          in = 0.5f + (float)(twin_rnd() % 1000) / 89.0f;
    memcpy(t->tf.h + 8, &wf, 4);
    memcpy(t->tf.h + 12, &in, 4);
    t->g.mode = mode;
    t->g.src = vw(t->tx.d, E4M3, 2, n, c, ls.s0, ls.s1, ls.first);
    t->g.scale = vw(t->ts.d, U8, 2, kern_swizzle_rows(n), kern_swizzle_cols(c),
                    kern_swizzle_cols(c), 1, 1);
    t->g.alpha = vw(t->tf.d, F32, 1, 1, 0, 1, 0, 0);
    if (inv)
        t->g.input_scale_inv = vw(t->tf.d, F32, 1, 1, 0, 1, 0, 1);
    t->g.weight_factor = vw(t->tf.d, F32, 1, 1, 0, 1, 0, 2);
    if (input)
        t->g.input_factor = vw(t->tf.d, F32, 2, 1, 1, 1, 1, 3);
    t->h = t->g;
    t->h.src = on_host(t->g.src, &t->tx);
    t->h.scale = on_host(t->g.scale, &t->ts);
    t->h.alpha = on_host(t->g.alpha, &t->tf);
    t->h.input_scale_inv = on_host(t->g.input_scale_inv, &t->tf);
    t->h.weight_factor = on_host(t->g.weight_factor, &t->tf);
    t->h.input_factor = on_host(t->g.input_factor, &t->tf);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            *((uint8_t *)t->h.src.data + i * ls.s0 + j * ls.s1) = (uint8_t)(twin_rnd() % 0x7f);
    twin_push(&t->tx);
    twin_push(&t->tf);
}

static void piece_free(tpiece *t)
{
    twin_free(&t->tx);
    twin_free(&t->tq);
    twin_free(&t->ts);
    twin_free(&t->tf);
}

/* The references on the host twins, in order; *bad the first refused. */
static int reference(uint32_t n, tpiece *t, int32_t *bad)
{
    *bad = -1;
    for (uint32_t i = 0; i < n; i++) {
        refit_nvfp4_piece *p = &t[i].h;
        if (p->mode != REFIT_NVFP4_ONLINE) {
            kern_swizzle(p->scale.data, &p->src);
            float a, v = 0.0f, wf, in;
            memcpy(&wf, p->weight_factor.data, 4);
            if (p->input_factor.data)
                memcpy(&in, p->input_factor.data, 4);
            kern_nvfp4_fuse(p->mode == REFIT_NVFP4_CT ? KERN_NVFP4_CT : KERN_NVFP4_MODELOPT, wf,
                            p->input_factor.data ? &in : NULL, &a, &v);
            memcpy(p->alpha.data, &a, 4);
            if (p->input_scale_inv.data)
                memcpy(p->input_scale_inv.data, &v, 4);
            continue;
        }
        int rc = kern_quant_nvfp4(&p->packed, p->scale.data, p->alpha.data, &p->src);
        if (rc) {
            *bad = (int32_t)i;
            return rc;
        }
    }
    return REFIT_OK;
}

/* Reference and kernel on n pieces; every byte of every twin compared. */
static void run_check(uint32_t n, tpiece *t, const char *what, void *stream)
{
    refit_nvfp4_piece *g = malloc(sizeof *g * n);
    assert_non_null(g);
    for (uint32_t i = 0; i < n; i++)
        g[i] = t[i].g;
    int32_t bad_h, bad_d = 99;
    int rh = reference(n, t, &bad_h);
    int rd = kern_quant_nvfp4_cuda(n, g, &bad_d, stream);
    free(g);
    if (rd != rh || (rh && bad_d != bad_h))
        fail_msg("%s: device returned %d (piece %d: %s), the reference %d (piece %d)", what, rd,
                 bad_d, kern_cuda_last_error(), rh, bad_h);
    if (rh)
        return;
    for (uint32_t i = 0; i < n; i++) {
        char w[300];
        snprintf(w, sizeof w, "%s, piece %u", what, i);
        twin_check(&t[i].tx, w); /* the input is untouched */
        twin_check(&t[i].tq, w);
        twin_check(&t[i].ts, w);
        twin_check(&t[i].tf, w);
    }
}

static const char *dt_label(refit_dtype dt)
{
    return dt.bits == 32 ? "f32" : dt.code == REFIT_DTYPE_BFLOAT ? "bf16" : "f16";
}

static const int64_t shapes[][2] = {
    {1, 1}, {7, 13}, {3, 16}, {129, 257}, {131, 32}, {128, 128}, {300, 200}, {0, 5}, {5, 0},
    {2, 2049}, {385, 40}, {64, 33},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* Online pieces one by one: shapes x dtypes x layouts. */
static void test_online_sweep(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[3] = {BF16, F16, F32};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int d = 0; d < 3; d++)
            for (int l = 0; l < 4; l++) {
                tpiece t;
                char what[160];
                piece_online(&t, dts[d], shapes[si][0], shapes[si][1], l, (l + d) % 4,
                             l % 2 ? PAT_RANDOM : PAT_MIXED);
                snprintf(what, sizeof what, "online %s [%lld, %lld], x layout %d, packed layout "
                         "%d", dt_label(dts[d]), (long long)shapes[si][0],
                         (long long)shapes[si][1], l, (l + d) % 4);
                run_check(1, &t, what, NULL);
                piece_free(&t);
            }
}

/* Whole tensors of one kind: zeros (gs 1), subnormals (for f32 the global
 * scale overflows and is clamped to FLT_MAX; E4M3 scales subnormal), the
 * largest magnitudes. */
static void test_edges(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[3] = {BF16, F16, F32};
    enum pat pats[3] = {PAT_ZERO, PAT_SUBNORMAL, PAT_BIG};
    for (int d = 0; d < 3; d++)
        for (int p = 0; p < 3; p++) {
            tpiece t[2];
            char what[120];
            piece_online(&t[0], dts[d], 130, 48, 0, 0, pats[p]);
            piece_online(&t[1], dts[d], 33, 17, 2, 1, pats[p]);
            snprintf(what, sizeof what, "%s, pattern %d", dt_label(dts[d]), p);
            run_check(2, t, what, NULL);
            piece_free(&t[0]);
            piece_free(&t[1]);
        }
}

/* The edges are reached: a subnormal f32 tensor clamps gs to FLT_MAX. */
static void test_global_scale_clamped(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    tpiece t;
    piece_online(&t, F32, 4, 32, 0, 0, PAT_ZERO);
    uint32_t tiny = 0x00000100u; /* 2^-141: 2688 / amax overflows */
    memcpy((char *)t.h.src.data + 4 * 5, &tiny, 4);
    twin_push(&t.tx);
    run_check(1, &t, "subnormal amax", NULL);
    float alpha;
    memcpy(&alpha, t.h.alpha.data, 4);
    assert_true(alpha == 1.0f / 3.40282347e38f);
    piece_free(&t);
}

/* Checkpoint pieces: both conventions, with and without an input factor
 * and input_scale_inv, scales of any strides, ragged tiles. */
static void test_checkpoint(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t sh[][2] = {{1, 1}, {130, 3}, {128, 4}, {300, 17}, {0, 2}, {257, 8}};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        for (int mode = REFIT_NVFP4_MODELOPT; mode <= REFIT_NVFP4_CT; mode++)
            for (int v = 0; v < 3; v++) {
                tpiece t;
                char what[120];
                piece_ckpt(&t, mode, sh[i][0], sh[i][1], (int)(i + v) % 4, v > 0, v == 2);
                snprintf(what, sizeof what, "checkpoint mode %d [%lld, %lld], variant %d", mode,
                         (long long)sh[i][0], (long long)sh[i][1], v);
                run_check(1, &t, what, NULL);
                piece_free(&t);
            }
}

/* More pieces than a launch's batch, both kinds mixed, one call, on a
 * caller's stream. */
static void test_many_pieces(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { N = 47 };
    tpiece *t = calloc(N, sizeof *t);
    assert_non_null(t);
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int i = 0; i < N; i++) {
        if (i % 3 == 1)
            piece_ckpt(&t[i], REFIT_NVFP4_MODELOPT + i % 2, 40 + i, 1 + i % 6, i % 4, i % 2,
                       i % 4 == 1);
        else
            piece_online(&t[i], dts[i % 3], 1 + (i * 37) % 150, 1 + (i * 53) % 200, i % 4,
                         (i / 4) % 4, PAT_MIXED);
    }
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    run_check(N, t, "47 pieces", st);
    CU(cudaStreamDestroy(st));
    for (int i = 0; i < N; i++)
        piece_free(&t[i]);
    free(t);
}

/* The dense path (contiguous F16/BF16 pieces, k a multiple of 16: the
 * kernel's warp units of 64 blocks) beside the general one in one call:
 * next to a transposed piece, a padded-row one, a misaligned one and a
 * ragged one (k 40); dense pieces of exactly one block, of one block
 * short of a unit (63), of a unit and one (65), of two units and one, of
 * one column of blocks (k 16: the row division by 1) and of column pads
 * (k 48: 3 blocks a row, padded to 4), rows not a multiple of 128. */
static void test_dense_beside_general(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const struct {
        int64_t n, k;
        int xl, ql; /* layouts; 0 0 is dense */
    } sh[] = {
        {1, 16, 0, 0},   {40, 48, 2, 0}, {63, 16, 0, 0},  {7, 13, 0, 0}, {1, 1040, 0, 0},
        {33, 80, 1, 0},  {3, 688, 0, 0}, {5, 64, 3, 0},   {130, 48, 0, 0}, {9, 40, 0, 0},
        {129, 256, 0, 0}, {4, 32, 0, 2}, {65, 16, 0, 0},  {6, 32, 0, 3},
    };
    enum { N = sizeof sh / sizeof sh[0] };
    refit_dtype dts[2] = {BF16, F16};
    for (int d = 0; d < 2; d++) {
        tpiece t[N];
        for (int i = 0; i < N; i++)
            piece_online(&t[i], dts[d], sh[i].n, sh[i].k, sh[i].xl, sh[i].ql,
                         i % 2 ? PAT_RANDOM : PAT_MIXED);
        char what[64];
        snprintf(what, sizeof what, "dense beside general, %s", dt_label(dts[d]));
        run_check(N, t, what, NULL);
        for (int i = 0; i < N; i++)
            piece_free(&t[i]);
    }
}

/* Many dense pieces in one call (more than a launch's batch, over many
 * of the emulated kernel's small L2 sets), of both 16-bit dtypes and
 * every pattern, with checkpoint pieces among them. */
static void test_dense_many(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { N = 31 };
    tpiece *t = calloc(N, sizeof *t);
    assert_non_null(t);
    enum pat pats[5] = {PAT_MIXED, PAT_ZERO, PAT_SUBNORMAL, PAT_BIG, PAT_RANDOM};
    for (int i = 0; i < N; i++) {
        if (i % 10 == 9)
            piece_ckpt(&t[i], REFIT_NVFP4_CT, 20 + i, 3, 0, 1, 1);
        else
            piece_online(&t[i], i % 2 ? F16 : BF16, 1 + (i * 29) % 140, 16 * (1 + (i * 7) % 23),
                         0, 0, pats[i % 5]);
    }
    run_check(N, t, "31 dense pieces", NULL);
    for (int i = 0; i < N; i++)
        piece_free(&t[i]);
    free(t);
}

/* A NaN or an infinity in dense pieces (the dense amax pass): the lowest
 * piece holding one is named, whether the other holder is dense or not,
 * and the pieces are left unwritten as the general path leaves them. */
static void test_dense_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[2] = {BF16, F16};
    for (int d = 0; d < 2; d++)
        for (int which = 0; which < 4; which++) {
            tpiece t[5];
            piece_online(&t[0], dts[d], 64, 48, 0, 0, PAT_RANDOM);   /* dense */
            piece_online(&t[1], dts[d], 70, 40, 0, 0, PAT_RANDOM);   /* general (k 40) */
            piece_online(&t[2], dts[d], 130, 1040, 0, 0, PAT_RANDOM); /* dense, 3 units a row */
            piece_online(&t[3], dts[d], 1, 16, 0, 0, PAT_RANDOM);    /* dense, one block */
            piece_online(&t[4], dts[d], 50, 64, 0, 0, PAT_RANDOM);   /* dense */
            /* which 0: a NaN in the last block of piece 2 (the unit's
             * tail) and an infinity in piece 4: piece 2 is named; 1: the
             * NaN in piece 3's only block, and piece 1 (general) holds an
             * infinity: piece 1; 2: only piece 4, its first element; 3:
             * a NaN in piece 2 at element 7987, in its amax pass's
             * eighth load of a warp (16-byte load 998 = 3 * 256 + 7 * 32
             * + 6), an infinity in piece 4 */
            if (which == 3) {
                view_put(&t[2].h.src, 7, 707, __builtin_nanf(""), 0x7fc1, 1);
                view_put(&t[4].h.src, 49, 63, __builtin_inff(), 0, 0);
            } else if (which == 0) {
                view_put(&t[2].h.src, 129, 1039, __builtin_nanf(""), 0x7fc1, 1);
                view_put(&t[4].h.src, 20, 7, __builtin_inff(), 0, 0);
            } else if (which == 1) {
                view_put(&t[3].h.src, 0, 9, __builtin_nanf(""), 0x7fc1, 1);
                view_put(&t[1].h.src, 69, 39, -__builtin_inff(), 0, 0);
            } else {
                view_put(&t[4].h.src, 0, 0, -__builtin_inff(), 0, 0);
            }
            for (int i = 0; i < 5; i++)
                twin_push(&t[i].tx);
            refit_nvfp4_piece g[5] = {t[0].g, t[1].g, t[2].g, t[3].g, t[4].g};
            int32_t bad = 99;
            int want = which == 0 || which == 3 ? 2 : which == 1 ? 1 : 4;
            int rc = kern_quant_nvfp4_cuda(5, g, &bad, NULL);
            if (rc != REFIT_ECORRUPT || bad != want)
                fail_msg("%s, case %d: status %d, piece %d, want %d (%s)", dt_label(dts[d]),
                         which, rc, bad, want, kern_cuda_last_error());
            /* refused pieces are not written (their packed bytes and
             * scales stay the junk they were) */
            int other = which == 1 ? 3 : 4;
            twin_check(&t[want].tq, "the refused piece's packed bytes");
            twin_check(&t[want].ts, "the refused piece's scales");
            twin_check(&t[other].tq, "the other refused piece's packed bytes");
            twin_check(&t[other].ts, "the other refused piece's scales");
            for (int i = 0; i < 5; i++)
                piece_free(&t[i]);
        }
}

/* Sets: online pieces of more than the kernel's L2 set (24 MB) in one
 * call. Too slow for the emulator. */
#ifndef REFIT_GPU_EMU
static void test_sets(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    tpiece t[3];
    piece_online(&t[0], F32, 2048, 4096, 0, 0, PAT_RANDOM);
    piece_online(&t[1], BF16, 4096, 2048, 0, 0, PAT_RANDOM);
    piece_online(&t[2], F32, 1024, 4096, 0, 0, PAT_MIXED);
    run_check(3, t, "three large pieces", NULL);
    for (int i = 0; i < 3; i++)
        piece_free(&t[i]);
}
#endif

/* NaN or infinity: REFIT_ECORRUPT, the lowest piece holding one named. */
static void test_nonfinite(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int d = 0; d < 3; d++)
        for (int which = 0; which < 2; which++) {
            tpiece t[4];
            piece_online(&t[0], dts[d], 64, 48, 0, 0, PAT_RANDOM);
            piece_online(&t[1], dts[d], 130, 40, 1, 0, PAT_RANDOM);
            piece_ckpt(&t[2], REFIT_NVFP4_CT, 20, 3, 0, 1, 1);
            piece_online(&t[3], dts[d], 300, 33, 2, 3, PAT_RANDOM);
            view_put(&t[3].h.src, 250, 32, __builtin_nanf(""), 0x7fc1, dts[d].bits == 16);
            if (which == 0)
                view_put(&t[1].h.src, 129, 3, -__builtin_inff(), 0, 0);
            twin_push(&t[1].tx);
            twin_push(&t[3].tx);
            refit_nvfp4_piece g[4] = {t[0].g, t[1].g, t[2].g, t[3].g};
            int32_t bad = 99;
            int rc = kern_quant_nvfp4_cuda(4, g, &bad, NULL);
            if (rc != REFIT_ECORRUPT || bad != (which == 0 ? 1 : 3))
                fail_msg("%s: status %d, piece %d (%s)", dt_label(dts[d]), rc, bad,
                         kern_cuda_last_error());
            for (int i = 0; i < 4; i++)
                piece_free(&t[i]);
        }
}

/* The scratch words are kept per device between calls (grown, never
 * shrunk): a piece whose amax word held a larger piece's amax in the call
 * before gets its own global scale; after a refusal a clean call
 * succeeds; and a call of more online pieces than the words held grows
 * them. Every byte against the reference. */
static void test_scratch_reuse(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { N = 40 };
    refit_dtype dts[3] = {BF16, F16, F32};
    for (int d = 0; d < 3; d++) {
        tpiece big, small;
        piece_online(&big, dts[d], 32, 64, 0, 0, PAT_RANDOM);
        view_put(&big.h.src, 3, 5, 3.0e4f, 0, 0);
        twin_push(&big.tx);
        run_check(1, &big, "a piece of amax 3e4", NULL);
        piece_online(&small, dts[d], 20, 48, 0, 0, PAT_RANDOM);
        for (int64_t i = 0; i < 20; i++)
            for (int64_t j = 0; j < 48; j++)
                view_put(&small.h.src, i, j, (float)((i * 48 + j) % 13) * 0.01f - 0.06f, 0, 0);
        twin_push(&small.tx);
        run_check(1, &small, "then a piece of amax 0.06", NULL);
        view_put(&small.h.src, 7, 40, __builtin_nanf(""), 0x7fc1, dts[d].bits == 16);
        twin_push(&small.tx);
        run_check(1, &small, "then a NaN", NULL);
        view_put(&small.h.src, 7, 40, 0.05f, 0, 0);
        twin_push(&small.tx);
        run_check(1, &small, "a clean call after a refusal", NULL);
        piece_free(&big);
        piece_free(&small);
    }
    tpiece *t = calloc(N, sizeof *t);
    assert_non_null(t);
    for (int i = 0; i < N; i++)
        piece_online(&t[i], dts[i % 3], 1 + i % 7, 16 + i % 9, 0, 0, PAT_MIXED);
    run_check(N, t, "40 online pieces", NULL);
    run_check(3, t, "then 3 of them", NULL);
    for (int i = 0; i < N; i++)
        piece_free(&t[i]);
    free(t);
}

#ifndef REFIT_GPU_EMU
/* ---- the model through the public API (the paired harness, gpu_pair.h) ---- */

/* A checkpoint tensor: its kind says how its values are made. */
enum ck_kind { CK_PACKED, CK_SCALES, CK_FACTOR, CK_FLOAT };

/* A checkpoint tensor [a, b] (nd 1: [a]) of the given kind. */
static void expect(pair_world *w, const char *module, const char *name, refit_dtype dt, int nd,
                   int64_t a, int64_t b, const char *target, enum ck_kind kind)
{
    pair_expect(w, module, name, dt, nd, (int64_t[]){a, b}, target, 0, -1)->kind = kind;
}

/* A module's runtime tensors for an [n, k] weight (inv: input_scale_inv). */
static void module(pair_world *w, const char *name, const char *params, int64_t n, int64_t k,
                   int inv)
{
    OK(w, refit_model_add_module(w->m, name, "nvfp4", params));
    int64_t blocks = (k + 15) / 16;
    pair_bind(w, name, "weight", U8, 2, (int64_t[]){n, (k + 1) / 2});
    pair_bind(w, name, "weight_scale", E4M3, 2,
              (int64_t[]){kern_swizzle_rows(n), kern_swizzle_cols(blocks)});
    pair_bind(w, name, "alpha", F32, 1, (int64_t[]){1});
    if (inv)
        pair_bind(w, name, "input_scale_inv", F32, 1, (int64_t[]){1});
}

static void checkpoint_module(pair_world *w, const char *name, const char *prefix, int ct,
                              int64_t n, int64_t k, int input)
{
    char b[64];
    module(w, name, NULL, n, k, input);
    snprintf(b, sizeof b, "%s.%s", prefix, ct ? "weight_packed" : "weight");
    expect(w, name, b, U8, 2, n, k / 2, "weight", CK_PACKED);
    snprintf(b, sizeof b, "%s.weight_scale", prefix);
    expect(w, name, b, E4M3, 2, n, k / 16, "weight_scale", CK_SCALES);
    snprintf(b, sizeof b, "%s.%s", prefix, ct ? "weight_global_scale" : "weight_scale_2");
    expect(w, name, b, F32, 1, 1, 0, "alpha", CK_FACTOR);
    if (input) {
        snprintf(b, sizeof b, "%s.%s", prefix, ct ? "input_global_scale" : "input_scale");
        expect(w, name, b, F32, 1, 1, 0, "input_scale_inv", CK_FACTOR);
    }
}

static void online_module(pair_world *w, const char *name, const char *prefix, refit_dtype dt,
                          int64_t n, int64_t k)
{
    char b[64];
    module(w, name, "online: true", n, k, 0);
    snprintf(b, sizeof b, "%s.weight", prefix);
    expect(w, name, b, dt, 2, n, k, "weight", CK_FLOAT);
}

static void build(pair_world *w)
{
    checkpoint_module(w, "l0.down", "l0.down_proj", 0, 200, 96, 1);   /* ModelOpt */
    checkpoint_module(w, "l0.o", "l0.o_proj", 0, 64, 32, 0);          /* weight only */
    checkpoint_module(w, "l0.up", "l0.up_proj", 1, 130, 64, 1);       /* compressed-tensors */
    online_module(w, "l0.gate", "l0.gate_proj", BF16, 300, 136);      /* ragged: 8.5 blocks */
    online_module(w, "l1.gate", "l1.gate_proj", F32, 129, 40);
    online_module(w, "l1.up", "l1.up_proj", F16, 64, 33);             /* odd K */
    online_module(w, "l1.down", "l1.down_proj", BF16, 256, 512);
}

/* Tensor c of version v, contiguous host bytes. Float weights: the
 * harness's (pair_float_bytes; nan_at >= 0: a NaN there). */
static void *ckpt_bytes(const pair_ck *c, int v, int64_t nan_at, size_t *bytes)
{
    if (c->kind == CK_FLOAT)
        return pair_float_bytes(c, v, nan_at, bytes);
    size_t e = c->dtype.bits / 8, n = (size_t)(c->ndim == 2 ? c->shape[0] * c->shape[1] : 1);
    uint64_t seed = pair_seed(c, v);
    char *b = malloc(n * e + 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = twin_mix(seed + i);
        if (c->kind == CK_PACKED) {
            b[i] = (char)(r & 0xff);
            continue;
        }
        if (c->kind == CK_SCALES) {
            b[i] = (char)(((1 + r % 14) << 3) | ((r >> 8) & 7)); /* normal, finite */
            continue;
        }
        float f = 0.001f + (float)(r % 100000) / 7919.0f; /* CK_FACTOR */
        pair_store_float(b, i, c->dtype, f);
    }
    *bytes = n * e;
    return b;
}

/* The harness's defect 1: a NaN at element 37. */
static void *nvfp4_bytes(const pair_ck *c, int v, int defect, size_t *bytes)
{
    return ckpt_bytes(c, v, defect ? 37 : -1, bytes);
}

static const pair_format nvfp4_model = {"REFIT_GPU_NVFP4_ON_HOST", "nvfp4", build, nvfp4_bytes};

/* A NaN in an online weight (each in turn): refused naming module and
 * tensor; with rollback every byte stays; an abort after every post-load
 * restores. */
static void test_model_nan_and_abort(void **state)
{
    int bads[PAIR_MAX_CK], n = 0;
    const pair_world *d = *state; /* NULL without a device: the case skips */
    for (int k = 0; d && k < d->n_ck; k++)
        if (d->ck[k].kind == CK_FLOAT)
            bads[n++] = k;
    pair_check_nan_and_abort(state, bads, n);
}

/* ---- many modules in one loading call ---- */

static void test_model_load_many(void **state)
{
    pair_check_load_many_watched(state, &nvfp4_model);
}

/* A NaN in the first online weight of the call, then in the last. */
static void test_model_load_many_nan(void **state)
{
    const pair_world *d = *state; /* NULL without a device: the case skips */
    int bads[2] = {-1, -1};
    for (int k = 0; d && k < d->n_ck; k++)
        if (d->ck[k].kind == CK_FLOAT) {
            bads[0] = bads[0] < 0 ? k : bads[0];
            bads[1] = k;
        }
    pair_check_load_many_nan(state, &nvfp4_model, bads, bads[0] < 0 ? 0 : 2);
}
#endif /* REFIT_GPU_EMU */

int main(void)
{
    twin_seed(0x6e76f4a1); /* this program's inputs, as before the shared stream */
#ifdef REFIT_GPU_EMU
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_online_sweep),   cmocka_unit_test(test_edges),
        cmocka_unit_test(test_global_scale_clamped), cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_many_pieces),    cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_scratch_reuse),  cmocka_unit_test(test_dense_beside_general),
        cmocka_unit_test(test_dense_many),     cmocka_unit_test(test_dense_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    int on_host_only = pair_use(&nvfp4_model);
    /* the shared model cases: device post-load equals the CPU reference,
     * from every source kind; the same weights twice give the same bytes
     * (alpha rebuilt, never fused twice) and B over A equals a cold start
     * on B, fingerprints too; updates on a caller's stream */
#define MODEL_TESTS                                                                      \
    PAIR_MODEL_CASES(pair_case_reload_equals_cold, pair_setup, pair_teardown),                 \
    cmocka_unit_test_setup_teardown(test_model_nan_and_abort, pair_setup, pair_teardown),     \
    cmocka_unit_test_setup_teardown(test_model_load_many, pair_setup, pair_teardown),         \
    cmocka_unit_test_setup_teardown(test_model_load_many_nan, pair_setup, pair_teardown)
    const struct CMUnitTest model_only[] = {MODEL_TESTS};
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_online_sweep),   cmocka_unit_test(test_edges),
        cmocka_unit_test(test_global_scale_clamped), cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_many_pieces),    cmocka_unit_test(test_sets),
        cmocka_unit_test(test_nonfinite),      cmocka_unit_test(test_scratch_reuse),
        cmocka_unit_test(test_dense_beside_general), cmocka_unit_test(test_dense_many),
        cmocka_unit_test(test_dense_nonfinite), MODEL_TESTS,
    };
    if (on_host_only)
        return cmocka_run_group_tests(model_only, NULL, NULL);
    if (twin_skip_suite_without_device())
        return 0;
    return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
