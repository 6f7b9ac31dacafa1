/* The CUDA kernels (core/cuda/kern_cuda.h) against the host references
 * (kernels/copy.h, kernels/fingerprint.h), bit for bit, on shapes that are
 * not multiples of any block size, with strided and permuted views, every
 * F32/F16/BF16 cast (on random bit patterns: NaNs, infinities, subnormals),
 * and the batched copy on rows of every alignment. Each case runs the host
 * kernel on a junk-filled host allocation and the CUDA kernel on a device
 * copy of the same junk, then compares the whole allocations, so bytes a
 * kernel must not touch are checked too. Skipped without a CUDA device. */
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
#include "kernels/copy.h"
#include "kernels/fingerprint.h"

#define I8 ((refit_dtype){REFIT_DTYPE_INT, 8, 1})
#define I32 ((refit_dtype){REFIT_DTYPE_INT, 32, 1})
#define I64 ((refit_dtype){REFIT_DTYPE_INT, 64, 1})
#define U4 ((refit_dtype){REFIT_DTYPE_UINT, 4, 1})

/* Elements an allocation needs for a view with these strides (>= 0). */
static size_t span_elems(int nd, const int64_t *shape, const int64_t *strides, int64_t first)
{
    int64_t hi = first;
    for (int i = 0; i < nd; i++)
        hi += (shape[i] - 1) * strides[i];
    return (size_t)hi + 1;
}

static void row_major(int nd, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* Strides of a layout: 0 row-major, 1 padded rows, 2 dims reversed
 * (a transpose), 3 every other element. */
static void nd_layout(int kind, int nd, const int64_t *shape, int64_t *st, int64_t *first)
{
    int64_t ext[REFIT_MAX_DIMS];
    memcpy(ext, shape, sizeof(int64_t) * (size_t)nd);
    *first = kind ? 3 : 0;
    if (kind == 1 && nd > 0)
        ext[nd - 1] += 5;
    if (kind == 2) {
        int64_t s = 1;
        for (int i = 0; i < nd; i++) {
            st[i] = s;
            s *= shape[i];
        }
        return;
    }
    row_major(nd, ext, st);
    if (kind == 3)
        for (int i = 0; i < nd; i++)
            st[i] *= 2;
}

static void one_copy(refit_dtype ddt, refit_dtype sdt, int nd, const int64_t *shape,
                     int dkind, int skind)
{
    int64_t ds[REFIT_MAX_DIMS], ss[REFIT_MAX_DIMS], dfirst, sfirst;
    nd_layout(dkind, nd, shape, ds, &dfirst);
    nd_layout(skind, nd, shape, ss, &sfirst);
    size_t de = ddt.bits / 8, se = sdt.bits / 8;
    twin d = twin_new(span_elems(nd, shape, ds, dfirst) * de);
    twin s = twin_new(span_elems(nd, shape, ss, sfirst) * se);
    refit_view hd = vw_nd(d.h, ddt, nd, shape, ds, dfirst);
    refit_view hs = vw_nd(s.h, sdt, nd, shape, ss, sfirst);
    refit_view gd = vw_nd(d.d, ddt, nd, shape, ds, dfirst);
    refit_view gs = vw_nd(s.d, sdt, nd, shape, ss, sfirst);
    assert_int_equal(kern_copy(&hd, &hs), REFIT_OK);
    int rc = kern_copy_cuda(&gd, &gs, NULL);
    if (rc)
        fail_msg("kern_copy_cuda: %s", kern_cuda_last_error());
    CU(cudaStreamSynchronize(NULL));
    char what[160];
    snprintf(what, sizeof what, "copy %s <- %s, %d dims (dst layout %d, src layout %d)",
             refit_dtype_name(ddt), refit_dtype_name(sdt), nd, dkind, skind);
    twin_check(&d, what);
    twin_check(&s, what); /* the source is untouched */
    twin_free(&d);
    twin_free(&s);
}

static const int64_t shapes[][4] = {
    {1, 1, 0, 0}, {1, 257, 0, 0}, {2, 7, 13, 0}, {3, 3, 5, 17}, {3, 33, 1, 65},
    {1, 1000003, 0, 0}, {2, 129, 1031, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void test_copy_casts(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype fl[3] = {F32, F16, BF16};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int lay = 0; lay < 4; lay++)
                    one_copy(fl[a], fl[b], (int)shapes[si][0], &shapes[si][1], lay,
                             (lay + a + b) % 4);
}

static void test_copy_same_dtype_strided(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[] = {I8, BF16, I32, I64, F32};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
            for (int lay = 0; lay < 16; lay++)
                one_copy(dts[k], dts[k], (int)shapes[si][0], &shapes[si][1], lay / 4, lay % 4);
}

static void test_copy_refusals(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    int64_t a[2] = {2, 3}, b[2] = {3, 2}, st[2] = {3, 1}, st2[2] = {2, 1};
    char *p;
    CU(cudaMalloc((void **)&p, 64));
    refit_view d = vw_nd(p, F32, 2, a, st, 0), s = vw_nd(p + 32, F32, 2, b, st2, 0);
    assert_int_equal(kern_copy_cuda(&d, &s, NULL), REFIT_EMISMATCH);
    s = vw_nd(p + 32, I8, 2, a, st, 0);
    assert_int_equal(kern_copy_cuda(&d, &s, NULL), REFIT_EUNSUPPORTED);
    cudaFree(p);
}

static void test_zero(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[] = {I8, BF16, F32, I64};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
            for (int lay = 0; lay < 4; lay++) {
                int nd = (int)shapes[si][0];
                const int64_t *shape = &shapes[si][1];
                int64_t st[REFIT_MAX_DIMS], first;
                nd_layout(lay, nd, shape, st, &first);
                twin d = twin_new(span_elems(nd, shape, st, first) * (dts[k].bits / 8));
                refit_view hv = vw_nd(d.h, dts[k], nd, shape, st, first);
                refit_view gv = vw_nd(d.d, dts[k], nd, shape, st, first);
                assert_int_equal(kern_zero(&hv), REFIT_OK);
                assert_int_equal(kern_zero_cuda(&gv, NULL), REFIT_OK);
                CU(cudaStreamSynchronize(NULL));
                twin_check(&d, "zero");
                twin_free(&d);
            }
}

static void one_fp(refit_dtype dt, int nd, const int64_t *shape, int lay)
{
    int64_t st[REFIT_MAX_DIMS], first;
    nd_layout(lay, nd, shape, st, &first);
    size_t e = dt.bits / 8;
    twin t = twin_new(span_elems(nd, shape, st, first) * e);
    refit_view hv = vw_nd(t.h, dt, nd, shape, st, first);
    refit_view gv = vw_nd(t.d, dt, nd, shape, st, first);
    uint64_t want = kern_fingerprint_view(&hv), got = 0;
    int rc = kern_fingerprint_view_cuda(&gv, &got, NULL);
    if (rc)
        fail_msg("kern_fingerprint_view_cuda: %s", kern_cuda_last_error());
    if (got != want)
        fail_msg("fingerprint of %s, %d dims, layout %d: device %016llx, host %016llx",
                 refit_dtype_name(dt), nd, lay, (unsigned long long)got,
                 (unsigned long long)want);
    twin_free(&t);
}

static void test_fingerprint(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[] = {I8, BF16, F32, I64};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
            for (int lay = 0; lay < 4; lay++)
                one_fp(dts[k], (int)shapes[si][0], &shapes[si][1], lay);
    /* odd byte counts, unaligned starts, an empty view, 4-bit elements */
    for (int64_t n = 0; n < 40; n++)
        for (int64_t off = 0; off < 3; off++) {
            int64_t shape[1] = {n}, st[1] = {1};
            twin t = twin_new((size_t)(n + off + 1));
            refit_view hv = vw_nd(t.h, I8, 1, shape, st, off);
            refit_view gv = vw_nd(t.d, I8, 1, shape, st, off);
            uint64_t got = 0;
            assert_int_equal(kern_fingerprint_view_cuda(&gv, &got, NULL), REFIT_OK);
            assert_true(got == kern_fingerprint_view(&hv));
            hv.dtype = gv.dtype = U4;
            assert_int_equal(kern_fingerprint_view_cuda(&gv, &got, NULL), REFIT_OK);
            assert_true(got == kern_fingerprint_view(&hv));
            twin_free(&t);
        }
}

/* Rows of every size class and relative alignment, into disjoint places. */
static void test_batch(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    enum { ROWS = 3000 };
    size_t sizes[ROWS], total = 0;
    for (int i = 0; i < ROWS; i++) {
        uint64_t r = twin_rnd();
        sizes[i] = i % 100 == 0 ? 200000 + r % 300000 : i % 7 == 0 ? r % 5000 : r % 300;
        total += sizes[i] + 64;
    }
    twin s = twin_new(total), d = twin_new(total);
    kern_batch_row *rows = malloc(ROWS * sizeof *rows);
    assert_non_null(rows);
    size_t so = 0, dof = 0;
    for (int i = 0; i < ROWS; i++) {
        size_t sa = twin_rnd() % 32, da = twin_rnd() % 32;
        rows[i] = (kern_batch_row){(uint64_t)(uintptr_t)(s.d + so + sa),
                                   (uint64_t)(uintptr_t)(d.d + dof + da), sizes[i]};
        memcpy(d.h + dof + da, s.h + so + sa, sizes[i]);
        so += sizes[i] + 32;
        dof += sizes[i] + 32;
    }
    kern_batch_row *drows;
    CU(cudaMalloc((void **)&drows, ROWS * sizeof *rows));
    CU(cudaMemcpy(drows, rows, ROWS * sizeof *rows, cudaMemcpyHostToDevice));
    assert_int_equal(kern_copy_batch_cuda(drows, ROWS, NULL), REFIT_OK);
    CU(cudaStreamSynchronize(NULL));
    twin_check(&d, "batched copy");
    cudaFree(drows);
    free(rows);
    twin_free(&s);
    twin_free(&d);
}

/* kern_fingerprint_to_cuda and backend_cuda_fingerprint_to: the value the
 * host's kern_fingerprint_view gives, written as one word into device
 * memory on a stream, with no wait: byte counts that are not multiples of
 * 8, unaligned starts, an empty view, strided views; the words around the
 * destination untouched; a misaligned destination refused; through the
 * backend, ordered after copies it still holds queued on that stream. */
static void test_fingerprint_to(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    static const int64_t sizes[] = {0, 1, 7, 9, 13, 255, 4097, 1000003, (1 << 24) + 5};
    enum { NS = sizeof sizes / sizeof sizes[0], NW = 3 * NS + 2 };
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint64_t *dout, out[NW], want[NW];
    CU(cudaMalloc((void **)&dout, sizeof out));
    CU(cudaMemset(dout, 0xa5, sizeof out));
    memset(want, 0xa5, sizeof want);
    twin t[NS];
    for (int i = 0; i < NS; i++) {
        t[i] = twin_new((size_t)sizes[i] + 3);
        for (int64_t off = 0; off < 3; off++) {
            int64_t shape[1] = {sizes[i]}, str[1] = {1};
            refit_view hv = vw_nd(t[i].h, I8, 1, shape, str, off);
            refit_view gv = vw_nd(t[i].d, I8, 1, shape, str, off);
            /* every third word left alone: a write of more than 8 bytes shows */
            int w = 1 + 3 * i + (int)off;
            want[w] = kern_fingerprint_view(&hv);
            if (off == 1)
                assert_int_equal(backend_cuda_fingerprint_to(dout + w, &gv, st), REFIT_OK);
            else if (kern_fingerprint_to_cuda(&gv, dout + w, st))
                fail_msg("kern_fingerprint_to_cuda: %s", kern_cuda_last_error());
        }
    }
    /* strided BF16 (a transpose of a 129 x 1031 view, odd byte count per row) */
    int64_t shape2[2] = {129, 1031}, st2[2], first2;
    nd_layout(2, 2, shape2, st2, &first2);
    twin tb = twin_new(span_elems(2, shape2, st2, first2) * 2);
    refit_view hb = vw_nd(tb.h, BF16, 2, shape2, st2, first2);
    refit_view gb = vw_nd(tb.d, BF16, 2, shape2, st2, first2);
    want[0] = kern_fingerprint_view(&hb);
    assert_int_equal(backend_cuda_fingerprint_to(dout, &gb, st), REFIT_OK);
    CU(cudaStreamSynchronize(st));
    CU(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    for (int w = 0; w < NW; w++)
        if (out[w] != want[w])
            fail_msg("word %d: device %016llx, host %016llx", w, (unsigned long long)out[w],
                     (unsigned long long)want[w]);
    /* a destination that is not 8-byte aligned */
    refit_view g0 = vw_nd(t[3].d, I8, 1, &sizes[3], (const int64_t[]){1}, 0);
    assert_int_equal(kern_fingerprint_to_cuda(&g0, (uint64_t *)((char *)dout + 4), st),
                     REFIT_EINVAL);
    /* through the backend, after a small copy it batches on st: the
     * fingerprint reads the copied bytes (1001 of them) */
    int64_t n = 1001, one[1] = {1};
    refit_view src = vw_nd(t[6].d, I8, 1, &n, one, 0), dst = vw_nd(t[7].d, I8, 1, &n, one, 1);
    assert_int_equal(backend_cuda.copy(&dst, &src, st), REFIT_OK);
    refit_view hsrc = vw_nd(t[6].h, I8, 1, &n, one, 0);
    assert_int_equal(backend_cuda_fingerprint_to(dout + 1, &dst, st), REFIT_OK);
    assert_int_equal(backend_cuda.sync(st), REFIT_OK);
    CU(cudaMemcpy(out, dout, 16, cudaMemcpyDeviceToHost));
    assert_true(out[1] == kern_fingerprint_view(&hsrc));
    for (int i = 0; i < NS; i++)
        twin_free(&t[i]);
    twin_free(&tb);
    cudaFree(dout);
    CU(cudaStreamDestroy(st));
}

int main(void)
{
    twin_seed(0x1234567); /* this program's inputs, as before the shared stream */
    if (twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_casts),
        cmocka_unit_test(test_copy_same_dtype_strided),
        cmocka_unit_test(test_copy_refusals),
        cmocka_unit_test(test_zero),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_fingerprint_to),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
