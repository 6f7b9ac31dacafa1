/* Content fingerprints (kernels/fingerprint.h) and the model-level
 * fingerprint calls built on them. */
#include <stdlib.h>
#include <string.h>

#include "kernels/fingerprint.h"
#include "testutil.h"

static uint64_t fp_bytes(const void *p, size_t n)
{
    kern_fp fp;
    kern_fp_init(&fp);
    kern_fp_update(&fp, p, n);
    return kern_fp_final(&fp);
}

static unsigned char *random_bytes(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n ? n : 1);
    assert_non_null(p);
    tt_rng r = {seed};
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)tt_rand(&r);
    return p;
}

static void test_equal_contents_equal_fingerprints(void **state)
{
    (void)state;
    for (size_t n = 0; n < 70; n++) {
        unsigned char *a = random_bytes(n, n), *b = malloc(n + 16);
        assert_non_null(b);
        memcpy(b + 3, a, n); /* same bytes at another, unaligned address */
        assert_true(fp_bytes(a, n) == fp_bytes(b + 3, n));
        free(a);
        free(b);
    }
}

static void test_one_bit_flip_changes_fingerprint(void **state)
{
    (void)state;
    size_t n = 257;
    unsigned char *a = random_bytes(n, 99);
    uint64_t base = fp_bytes(a, n);
    for (size_t i = 0; i < n; i++)
        for (int bit = 0; bit < 8; bit++) {
            a[i] ^= (unsigned char)(1u << bit);
            uint64_t f = fp_bytes(a, n);
            a[i] ^= (unsigned char)(1u << bit);
            if (f == base)
                fail_msg("flipping bit %d of byte %zu leaves the fingerprint", bit, i);
        }
    assert_true(fp_bytes(a, n) == base);
    free(a);
}

static void test_length_and_order_matter(void **state)
{
    (void)state;
    unsigned char z[16] = {0};
    /* all-zero strings of different lengths differ (trailing zero padding
     * of the last word must not hide the length) */
    for (size_t i = 0; i < 16; i++)
        for (size_t j = i + 1; j < 16; j++)
            assert_true(fp_bytes(z, i) != fp_bytes(z, j));
    /* swapping two words changes it (the sum is position-keyed) */
    uint64_t w[2] = {0x1111111111111111ull, 0x2222222222222222ull};
    uint64_t s[2] = {w[1], w[0]};
    assert_true(fp_bytes(w, 16) != fp_bytes(s, 16));
    /* combine is order dependent */
    assert_true(kern_fp_combine(kern_fp_combine(0, 1), 2) !=
                kern_fp_combine(kern_fp_combine(0, 2), 1));
}

static void test_split_updates_equal_one_update(void **state)
{
    (void)state;
    size_t n = 1000;
    unsigned char *a = random_bytes(n, 7);
    uint64_t whole = fp_bytes(a, n);
    tt_rng r = {0x51};
    for (int it = 0; it < 300; it++) {
        kern_fp fp;
        kern_fp_init(&fp);
        size_t off = 0;
        while (off < n) {
            size_t k = (size_t)tt_randn(&r, it % 3 == 0 ? 4 : 40); /* zero-size pieces too */
            if (k > n - off)
                k = n - off;
            kern_fp_update(&fp, a + off, k);
            off += k;
        }
        assert_true(kern_fp_final(&fp) == whole);
    }
    /* final does not consume: calling it twice gives the same value */
    kern_fp fp;
    kern_fp_init(&fp);
    kern_fp_update(&fp, a, 13);
    uint64_t f1 = kern_fp_final(&fp);
    assert_true(kern_fp_final(&fp) == f1);
    kern_fp_update(&fp, a + 13, n - 13);
    assert_true(kern_fp_final(&fp) == whole);
    free(a);
}

static void test_strided_view_equals_contiguous_copy(void **state)
{
    (void)state;
    /* a [6, 5] f32 view, transposed out of a padded buffer */
    tt_tensor *base = tt_new_strided(REFIT_F32, 2, TT_SHAPE(6, 5), TT_SHAPE(1, 8), 5 * 8 + 2, 1);
    tt_tensor *copy = tt_new(REFIT_F32, 2, TT_SHAPE(6, 5));
    tt_fill(base, 123);
    for (int64_t i = 0; i < 30; i++)
        tt_set_flat(copy, i, tt_get_flat(base, i));
    refit_view vb = tt_view(base), vc = tt_view(copy);
    uint64_t fb = kern_fingerprint_view(&vb), fc = kern_fingerprint_view(&vc);
    assert_true(fb == fc);
    assert_true(fc == fp_bytes(copy->buf, copy->bytes));
    /* the padding in between does not count */
    memset(base->buf, 0x3c, sizeof(float)); /* before the first element */
    assert_true(kern_fingerprint_view(&vb) == fc);
    /* one element changed in the view does */
    int64_t idx[2] = {4, 3};
    tt_set(base, idx, 1.0 + tt_get(base, idx));
    assert_true(kern_fingerprint_view(&vb) != fc);
    /* 16-bit, non-unit inner stride */
    tt_tensor *h = tt_new_strided(REFIT_BF16, 2, TT_SHAPE(3, 4), TT_SHAPE(12, 3), 40, 0);
    tt_tensor *hc = tt_new(REFIT_BF16, 2, TT_SHAPE(3, 4));
    tt_fill(h, 5);
    for (int64_t i = 0; i < 12; i++)
        tt_set_flat(hc, i, tt_get_flat(h, i));
    refit_view vh = tt_view(h), vhc = tt_view(hc);
    assert_true(kern_fingerprint_view(&vh) == kern_fingerprint_view(&vhc));
    tt_free(base);
    tt_free(copy);
    tt_free(h);
    tt_free(hc);
}

static void test_runtime_fingerprint_api(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tt_tensor *a = tw_runtime(w, "m", "a", REFIT_F32, 2, TT_SHAPE(3, 4));
    tt_tensor *b = tw_runtime(w, "m", "b", REFIT_F32, 2, TT_SHAPE(3, 4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(3, 4));
    s.target = "a";
    assert_int_equal(tw_expect(w, "m", "A", &s), REFIT_OK);
    s.target = "b";
    assert_int_equal(tw_expect(w, "m", "B", &s), REFIT_OK);
    uint64_t fa = 0;
    /* before seal: refused */
    assert_int_equal(refit_runtime_fingerprint(w->m, "m", "a", &fa), REFIT_ESTATE);
    assert_int_equal(refit_model_fingerprint(w->m, &fa), REFIT_ESTATE);
    tw_seal(w);
    tt_fill(a, 1);
    memcpy(b->buf, a->buf, a->bytes);
    uint64_t fb = 0;
    assert_int_equal(refit_runtime_fingerprint(w->m, "m", "a", &fa), REFIT_OK);
    assert_int_equal(refit_runtime_fingerprint(w->m, "m", "b", &fb), REFIT_OK);
    assert_true(fa == fb);
    refit_view va = tt_view(a);
    assert_true(fa == kern_fingerprint_view(&va));
    uint64_t m1 = tw_fp(w);
    ((float *)b->buf)[11] += 1.0f;
    assert_int_equal(refit_runtime_fingerprint(w->m, "m", "b", &fb), REFIT_OK);
    assert_true(fa != fb);
    assert_true(tw_fp(w) != m1);
    assert_int_equal(refit_runtime_fingerprint(w->m, "m", "zz", &fb), REFIT_ENOTFOUND);
    tw_assert_msg(w, "zz", "m");
    assert_int_equal(refit_runtime_fingerprint(w->m, "nomod", "a", &fb), REFIT_ENOTFOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_contents_equal_fingerprints),
        cmocka_unit_test(test_one_bit_flip_changes_fingerprint),
        cmocka_unit_test(test_length_and_order_matter),
        cmocka_unit_test(test_split_updates_equal_one_update),
        cmocka_unit_test(test_strided_view_equals_contiguous_copy),
        cmocka_unit_test_setup_teardown(test_runtime_fingerprint_api, tw_setup, tw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
