/* Strided copy and zero kernels (kernels/copy.h) against a naive loop that
 * visits every element by its multi-index. Each case copies into two
 * identical junk-filled allocations (kernel and naive) and compares the
 * whole allocations, so bytes the copy must not touch are checked too. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "kernels/copy.h"
#include "testutil.h"

#define I64 ((refit_dtype){REFIT_DTYPE_INT, 64, 1})

typedef struct buf {
    char *p;
    size_t bytes;
} buf;

static buf buf_new(size_t bytes, uint64_t seed)
{
    buf b = {malloc(bytes ? bytes : 1), bytes};
    assert_non_null(b.p);
    tt_rng r = {seed};
    for (size_t i = 0; i < bytes; i++)
        b.p[i] = (char)tt_rand(&r);
    return b;
}

static buf buf_dup(const buf *a)
{
    buf b = {malloc(a->bytes ? a->bytes : 1), a->bytes};
    assert_non_null(b.p);
    memcpy(b.p, a->p, a->bytes);
    return b;
}

static refit_view mkview(const buf *b, refit_dtype dt, int nd, const int64_t *shape,
                         const int64_t *strides, int64_t first)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = b->p + first * (int64_t)(dt.bits / 8);
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = dt;
    v.ndim = nd;
    for (int i = 0; i < nd; i++) {
        v.shape[i] = shape[i];
        v.strides[i] = strides[i];
    }
    return v;
}

static float load_float(refit_dtype dt, const char *p)
{
    uint16_t h;
    float f;
    if (dt.bits == 32) {
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return dt.code == REFIT_DTYPE_BFLOAT ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
}

static void store_float(refit_dtype dt, char *p, float f)
{
    if (dt.bits == 32) {
        memcpy(p, &f, 4);
        return;
    }
    uint16_t h = dt.code == REFIT_DTYPE_BFLOAT ? kern_f32_to_bf16(f) : kern_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Element pointer of a view at a row-major logical index. */
static char *elem(const refit_view *v, int64_t i)
{
    int64_t off = 0;
    for (int d = v->ndim - 1; d >= 0; d--) {
        int64_t x = i % v->shape[d];
        i /= v->shape[d];
        off += x * v->strides[d];
    }
    return (char *)v->data + off * (int64_t)(v->dtype.bits / 8);
}

static int64_t numel(const refit_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

static void naive_copy(const refit_view *dst, const refit_view *src)
{
    int64_t n = numel(dst);
    size_t e = dst->dtype.bits / 8;
    int same = !memcmp(&dst->dtype, &src->dtype, sizeof dst->dtype);
    for (int64_t i = 0; i < n; i++) {
        if (same)
            memcpy(elem(dst, i), elem(src, i), e);
        else
            store_float(dst->dtype, elem(dst, i), load_float(src->dtype, elem(src, i)));
    }
}

static void naive_zero(const refit_view *dst)
{
    int64_t n = numel(dst);
    for (int64_t i = 0; i < n; i++)
        memset(elem(dst, i), 0, dst->dtype.bits / 8);
}

/* Copy src (in sb) into a dst geometry of db, kernel vs naive. */
static void check_copy(const buf *sb, const refit_view *src, const buf *db, refit_view dst_tmpl)
{
    buf k = buf_dup(db), n = buf_dup(db);
    refit_view dk = dst_tmpl, dn = dst_tmpl;
    dk.data = k.p + ((char *)dst_tmpl.data - db->p);
    dn.data = n.p + ((char *)dst_tmpl.data - db->p);
    char *before = malloc(sb->bytes ? sb->bytes : 1);
    assert_non_null(before);
    memcpy(before, sb->p, sb->bytes);
    int rc = kern_copy(&dk, src);
    naive_copy(&dn, src);
    int same = rc == REFIT_OK && !memcmp(k.p, n.p, db->bytes);
    int src_kept = !memcmp(before, sb->p, sb->bytes);
    free(before);
    free(k.p);
    free(n.p);
    assert_int_equal(rc, REFIT_OK);
    assert_true(src_kept);
    assert_true(same);
}

static void test_contiguous(void **state)
{
    (void)state;
    buf s = buf_new(5 * 7 * 4, 1), d = buf_new(5 * 7 * 4, 2);
    refit_view src = mkview(&s, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(7, 1), 0);
    refit_view dst = mkview(&d, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(7, 1), 0);
    check_copy(&s, &src, &d, dst);
    assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
    assert_memory_equal(d.p, s.p, s.bytes);
    free(s.p);
    free(d.p);
}

static void test_transposed_src_and_dst(void **state)
{
    (void)state;
    /* src: a [7, 5] row-major buffer read as its transpose [5, 7] */
    buf s = buf_new(7 * 5 * 4, 3), d = buf_new(5 * 7 * 4, 4);
    refit_view src = mkview(&s, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(1, 5), 0);
    refit_view dst = mkview(&d, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(7, 1), 0);
    check_copy(&s, &src, &d, dst);
    /* explicit spot check: dst[i][j] == src_buf[j][i] */
    assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 7; j++)
            assert_memory_equal(d.p + (i * 7 + j) * 4, s.p + (j * 5 + i) * 4, 4);
    /* and a transposed destination */
    refit_view src2 = mkview(&s, REFIT_F32, 2, TT_SHAPE(7, 5), TT_SHAPE(5, 1), 0);
    refit_view dst2 = mkview(&d, REFIT_F32, 2, TT_SHAPE(7, 5), TT_SHAPE(1, 7), 0);
    check_copy(&s, &src2, &d, dst2);
    free(s.p);
    free(d.p);
}

static void test_noncontiguous_rows_keep_gaps(void **state)
{
    (void)state;
    /* dst rows 10 apart (3 junk elements after each), src rows 9 apart */
    buf s = buf_new(5 * 9 * 4, 5), d = buf_new(5 * 10 * 4, 6);
    refit_view src = mkview(&s, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(9, 1), 1);
    refit_view dst = mkview(&d, REFIT_F32, 2, TT_SHAPE(5, 7), TT_SHAPE(10, 1), 2);
    check_copy(&s, &src, &d, dst);
    buf keep = buf_dup(&d);
    assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
    for (int i = 0; i < 50; i++) {
        int row = i / 10, col = i % 10 - 2;
        if (row < 5 && col >= 0 && col < 7)
            assert_memory_equal(d.p + i * 4, s.p + (1 + row * 9 + col) * 4, 4);
        else
            assert_memory_equal(d.p + i * 4, keep.p + i * 4, 4); /* gap untouched */
    }
    free(keep.p);
    free(s.p);
    free(d.p);
}

static void test_size_zero_dims_write_nothing(void **state)
{
    (void)state;
    buf s = buf_new(64, 7), d = buf_new(64, 8), keep = buf_dup(&d);
    refit_view src = mkview(&s, REFIT_F32, 3, TT_SHAPE(3, 0, 4), TT_SHAPE(4, 4, 1), 0);
    refit_view dst = mkview(&d, REFIT_F32, 3, TT_SHAPE(3, 0, 4), TT_SHAPE(4, 4, 1), 0);
    assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
    assert_int_equal(kern_zero(&dst), REFIT_OK);
    assert_memory_equal(d.p, keep.p, 64);
    refit_view src1 = mkview(&s, REFIT_BF16, 1, TT_SHAPE(0), TT_SHAPE(1), 0);
    refit_view dst1 = mkview(&d, REFIT_F32, 1, TT_SHAPE(0), TT_SHAPE(1), 0);
    assert_int_equal(kern_copy(&dst1, &src1), REFIT_OK);
    assert_memory_equal(d.p, keep.p, 64);
    free(s.p);
    free(d.p);
    free(keep.p);
}

static void test_size_one_dims_any_stride(void **state)
{
    (void)state;
    /* strides of size-1 dims are meaningless and may be anything */
    buf s = buf_new(40 * 4, 9), d = buf_new(40 * 4, 10);
    refit_view src = mkview(&s, REFIT_F32, 4, TT_SHAPE(1, 5, 1, 3), TT_SHAPE(999, 3, -77, 1), 0);
    refit_view dst = mkview(&d, REFIT_F32, 4, TT_SHAPE(1, 5, 1, 3), TT_SHAPE(0, 6, 12345, 2), 1);
    check_copy(&s, &src, &d, dst);
    /* a scalar (ndim 0) and an all-ones shape */
    refit_view s0 = mkview(&s, REFIT_F32, 0, NULL, NULL, 3);
    refit_view d0 = mkview(&d, REFIT_F32, 0, NULL, NULL, 5);
    check_copy(&s, &s0, &d, d0);
    refit_view s1 = mkview(&s, REFIT_F16, 3, TT_SHAPE(1, 1, 1), TT_SHAPE(7, 8, 9), 4);
    refit_view d1 = mkview(&d, REFIT_F32, 3, TT_SHAPE(1, 1, 1), TT_SHAPE(1, 1, 1), 6);
    check_copy(&s, &s1, &d, d1);
    free(s.p);
    free(d.p);
}

static void test_casts_in_strided_copies(void **state)
{
    (void)state;
    const refit_dtype fl[3] = {REFIT_F32, REFIT_F16, REFIT_BF16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            /* src: transposed [6, 4] out of a [4, 6] buffer; dst rows padded */
            buf s = buf_new(4 * 6 * 4, 11 + a), d = buf_new(6 * 5 * 4 + 8, 21 + b);
            /* keep the source finite so NaN payloads do not decide anything */
            for (int i = 0; i < 24; i++)
                store_float(fl[a], s.p + i * (fl[a].bits / 8), tt_value(a * 10 + b, i) * 1000);
            refit_view src = mkview(&s, fl[a], 2, TT_SHAPE(6, 4), TT_SHAPE(1, 6), 0);
            refit_view dst = mkview(&d, fl[b], 2, TT_SHAPE(6, 4), TT_SHAPE(5, 1), 1);
            check_copy(&s, &src, &d, dst);
            assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
            /* the value of every element as the cast defines it */
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 4; j++) {
                    float v = load_float(fl[a], s.p + (j * 6 + i) * (fl[a].bits / 8));
                    char want[4];
                    store_float(fl[b], want, v);
                    assert_memory_equal(d.p + (1 + i * 5 + j) * (fl[b].bits / 8), want,
                                        fl[b].bits / 8);
                }
            free(s.p);
            free(d.p);
        }
}

static void test_zero_strided_views(void **state)
{
    (void)state;
    /* every other column of [6, 8], then a transposed block */
    buf d = buf_new(6 * 8 * 4, 30), n = buf_dup(&d);
    refit_view v = mkview(&d, REFIT_F32, 2, TT_SHAPE(6, 4), TT_SHAPE(8, 2), 1);
    refit_view vn = v;
    vn.data = n.p + 4;
    assert_int_equal(kern_zero(&v), REFIT_OK);
    naive_zero(&vn);
    assert_memory_equal(d.p, n.p, d.bytes);
    int zeros = 0;
    for (int i = 0; i < 48; i++) {
        uint32_t x;
        memcpy(&x, d.p + i * 4, 4);
        zeros += x == 0;
    }
    assert_true(zeros >= 24);
    refit_view t = mkview(&d, REFIT_BF16, 2, TT_SHAPE(3, 5), TT_SHAPE(1, 16), 2);
    refit_view tn = t;
    tn.data = n.p + 4;
    assert_int_equal(kern_zero(&t), REFIT_OK);
    naive_zero(&tn);
    assert_memory_equal(d.p, n.p, d.bytes);
    /* contiguous rows inside a padded tensor */
    refit_view r = mkview(&d, REFIT_F32, 2, TT_SHAPE(2, 3), TT_SHAPE(8, 1), 17);
    refit_view rn = r;
    rn.data = n.p + 17 * 4;
    assert_int_equal(kern_zero(&r), REFIT_OK);
    naive_zero(&rn);
    assert_memory_equal(d.p, n.p, d.bytes);
    free(d.p);
    free(n.p);
}

/* Random geometries: permuted dims, padded rows, offsets, four element sizes. */
static void test_random_geometries(void **state)
{
    (void)state;
    const refit_dtype dts[] = {REFIT_U8, REFIT_BF16, REFIT_F16, REFIT_F32, I64};
    tt_rng r = {0xc09};
    for (int it = 0; it < 400; it++) {
        int nd = 1 + (int)tt_randn(&r, 5);
        int64_t shape[8], ss[8], ds[8];
        for (int i = 0; i < nd; i++)
            shape[i] = (int64_t)tt_randn(&r, 5) + (it % 7 ? 1 : 0);
        refit_dtype sdt = dts[tt_randn(&r, 5)], ddt = sdt;
        int fl_s = sdt.code != REFIT_DTYPE_UINT && !(sdt.code == REFIT_DTYPE_INT);
        if (fl_s && tt_randn(&r, 2)) /* a cast between float types */
            ddt = dts[1 + tt_randn(&r, 3)];
        /* strides: a random dim order, with random padding per level */
        int64_t sizes[2];
        int64_t *strides[2] = {ss, ds};
        for (int side = 0; side < 2; side++) {
            int perm[8];
            for (int i = 0; i < nd; i++)
                perm[i] = i;
            for (int i = nd - 1; i > 0; i--) {
                int j = (int)tt_randn(&r, (uint64_t)i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            int64_t s = 1 + (int64_t)tt_randn(&r, 2);
            for (int k = nd - 1; k >= 0; k--) {
                strides[side][perm[k]] = s;
                s *= (shape[perm[k]] > 0 ? shape[perm[k]] : 1) + (int64_t)tt_randn(&r, 2);
            }
            sizes[side] = s + 3;
        }
        buf sb = buf_new((size_t)sizes[0] * (sdt.bits / 8), it), db =
            buf_new((size_t)sizes[1] * (ddt.bits / 8), ~(uint64_t)it);
        if (!kern_dtype_eq(sdt, ddt)) /* finite sources for casts */
            for (int64_t i = 0; i < sizes[0]; i++)
                store_float(sdt, sb.p + i * (sdt.bits / 8), tt_value(it, i));
        refit_view src = mkview(&sb, sdt, nd, shape, ss, 1);
        refit_view dst = mkview(&db, ddt, nd, shape, ds, 2);
        check_copy(&sb, &src, &db, dst);
        /* zero the same geometry */
        buf zn = buf_dup(&db);
        refit_view zk = dst, zv = dst;
        zv.data = zn.p + 2 * (ddt.bits / 8);
        assert_int_equal(kern_zero(&zk), REFIT_OK);
        naive_zero(&zv);
        int same = !memcmp(db.p, zn.p, db.bytes);
        free(zn.p);
        free(sb.p);
        free(db.p);
        assert_true(same);
    }
}

static void test_negative_strides(void **state)
{
    (void)state;
    /* a flipped source: rows read bottom-up, columns right to left */
    buf s = buf_new(4 * 6 * 4, 40), d = buf_new(4 * 6 * 4, 41);
    refit_view src = mkview(&s, REFIT_F32, 2, TT_SHAPE(4, 6), TT_SHAPE(-6, -1), 23);
    refit_view dst = mkview(&d, REFIT_F32, 2, TT_SHAPE(4, 6), TT_SHAPE(6, 1), 0);
    check_copy(&s, &src, &d, dst);
    assert_int_equal(kern_copy(&dst, &src), REFIT_OK);
    for (int i = 0; i < 24; i++)
        assert_memory_equal(d.p + i * 4, s.p + (23 - i) * 4, 4);
    free(s.p);
    free(d.p);
}

static void test_copy_refusals_write_nothing(void **state)
{
    (void)state;
    buf s = buf_new(64, 50), d = buf_new(64, 51), keep = buf_dup(&d);
    refit_view src = mkview(&s, REFIT_F32, 2, TT_SHAPE(2, 3), TT_SHAPE(3, 1), 0);
    refit_view dst = mkview(&d, REFIT_F32, 2, TT_SHAPE(3, 2), TT_SHAPE(2, 1), 0);
    assert_int_equal(kern_copy(&dst, &src), REFIT_EMISMATCH);
    refit_view dst1 = mkview(&d, REFIT_F32, 1, TT_SHAPE(6), TT_SHAPE(1), 0);
    assert_int_equal(kern_copy(&dst1, &src), REFIT_EMISMATCH);
    refit_view srci = mkview(&s, REFIT_I32, 2, TT_SHAPE(2, 3), TT_SHAPE(3, 1), 0);
    refit_view dstf = mkview(&d, REFIT_F32, 2, TT_SHAPE(2, 3), TT_SHAPE(3, 1), 0);
    assert_int_equal(kern_copy(&dstf, &srci), REFIT_EUNSUPPORTED);
    refit_view dsti8 = mkview(&d, REFIT_I8, 2, TT_SHAPE(2, 3), TT_SHAPE(3, 1), 0);
    assert_int_equal(kern_copy(&dsti8, &srci), REFIT_EUNSUPPORTED);
    assert_memory_equal(d.p, keep.p, 64);
    refit_view f4 = dstf;
    f4.dtype = (refit_dtype){REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1};
    assert_int_equal(kern_zero(&f4), REFIT_EUNSUPPORTED);
    assert_memory_equal(d.p, keep.p, 64);
    free(s.p);
    free(d.p);
    free(keep.p);
}

static void test_dtype_helpers(void **state)
{
    (void)state;
    assert_int_equal(kern_dtype_size(REFIT_F32), 4);
    assert_int_equal(kern_dtype_size(REFIT_BF16), 2);
    assert_int_equal(kern_dtype_size(REFIT_U8), 1);
    assert_int_equal(kern_dtype_size(I64), 8);
    assert_int_equal(kern_dtype_size((refit_dtype){REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1}), 0);
    assert_int_equal(kern_dtype_size((refit_dtype){REFIT_DTYPE_FLOAT, 32, 2}), 0);
    assert_true(kern_can_cast(REFIT_F32, REFIT_BF16));
    assert_true(kern_can_cast(REFIT_BF16, REFIT_F16));
    assert_true(kern_can_cast(REFIT_I32, REFIT_I32));
    assert_false(kern_can_cast(REFIT_F32, REFIT_I32));
    assert_false(kern_can_cast(REFIT_I8, REFIT_U8));
    assert_true(kern_dtype_eq(REFIT_F16, REFIT_F16));
    assert_false(kern_dtype_eq(REFIT_F16, REFIT_BF16));
    refit_view v;
    memset(&v, 0, sizeof v);
    v.ndim = 3;
    v.shape[0] = 2;
    v.shape[1] = 3;
    v.shape[2] = 4;
    assert_int_equal(kern_view_numel(&v), 24);
    v.shape[1] = 0;
    assert_int_equal(kern_view_numel(&v), 0);
    v.ndim = 0;
    assert_int_equal(kern_view_numel(&v), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous),
        cmocka_unit_test(test_transposed_src_and_dst),
        cmocka_unit_test(test_noncontiguous_rows_keep_gaps),
        cmocka_unit_test(test_size_zero_dims_write_nothing),
        cmocka_unit_test(test_size_one_dims_any_stride),
        cmocka_unit_test(test_casts_in_strided_copies),
        cmocka_unit_test(test_zero_strided_views),
        cmocka_unit_test(test_random_geometries),
        cmocka_unit_test(test_negative_strides),
        cmocka_unit_test(test_copy_refusals_write_nothing),
        cmocka_unit_test(test_dtype_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
