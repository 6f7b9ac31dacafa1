/* Float casts (kernels/cast.h). The references are computed here from the
 * IEEE definitions with double arithmetic: a 16-bit pattern's value from
 * its fields, and "round to nearest, ties to even" as an exhaustive search
 * over every finite candidate pattern. Doubles hold every f32, f16 and
 * bf16 value exactly, and the distance from a float to its two nearest
 * candidates is exact, so ties are seen as ties. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cast.h"
#include "testutil.h"

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Value of a finite, non-negative f16 magnitude pattern (0 .. 0x7bff). */
static double ref_f16(uint16_t h)
{
    unsigned e = (h >> 10) & 31u, m = h & 0x3ffu;
    return e == 0 ? ldexp(m, -24) : ldexp(1024 + m, (int)e - 25);
}

/* Same for bf16 (0 .. 0x7f7f). */
static double ref_bf16(uint16_t b)
{
    unsigned e = (b >> 7) & 255u, m = b & 0x7fu;
    return e == 0 ? ldexp(m, -133) : ldexp(128 + m, (int)e - 134);
}

#define F16_MAX_FINITE 0x7bffu
#define BF16_MAX_FINITE 0x7f7fu

/* Tables of candidate values, filled once. */
static double f16_val[F16_MAX_FINITE + 1];
static double bf16_val[BF16_MAX_FINITE + 1];

static int tables_setup(void **state)
{
    (void)state;
    for (unsigned k = 0; k <= F16_MAX_FINITE; k++)
        f16_val[k] = ref_f16((uint16_t)k);
    for (unsigned k = 0; k <= BF16_MAX_FINITE; k++)
        bf16_val[k] = ref_bf16((uint16_t)k);
    return 0;
}

/* Nearest candidate to |a| by exhaustive search, ties to the even pattern;
 * the overflow bound is the midpoint between the largest finite value and
 * the next power of two (where an unbounded exponent would put it). */
static uint16_t ref_round(float f, const double *val, unsigned max_finite, double overflow,
                          uint16_t inf)
{
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000u : 0;
    if (a >= overflow)
        return sign | inf;
    unsigned best = 0;
    double bd = INFINITY;
    for (unsigned k = 0; k <= max_finite; k++) {
        double d = fabs(a - val[k]);
        if (d < bd || (d == bd && (k & 1u) == 0 && (best & 1u) == 1)) {
            bd = d;
            best = k;
        }
    }
    return sign | (uint16_t)best;
}

static uint16_t ref_f32_to_f16(float f)
{
    return ref_round(f, f16_val, F16_MAX_FINITE, 65520.0, 0x7c00u);
}

static uint16_t ref_f32_to_bf16(float f)
{
    /* largest finite 255 * 2^120, next power 256 * 2^120: halfway 511 * 2^119 */
    return ref_round(f, bf16_val, BF16_MAX_FINITE, ldexp(511, 119), 0x7f80u);
}

static int is_f16_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static int is_bf16_nan(uint16_t b)
{
    return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

/* ---- decode, exhaustive ---- */

static void test_f16_to_f32_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kern_f16_to_f32((uint16_t)h);
        int neg = (h & 0x8000u) != 0;
        uint16_t mag = h & 0x7fffu;
        if (is_f16_nan((uint16_t)h)) {
            assert_true(isnan(f));
        } else if (mag == 0x7c00u) {
            assert_true(isinf(f));
        } else {
            double want = ref_f16(mag);
            if ((double)fabsf(f) != want)
                fail_msg("f16 %#06x -> %a, want %a", h, (double)f, want);
        }
        assert_int_equal(signbit(f) != 0, neg);
    }
}

static void test_f16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = kern_f32_to_f16(kern_f16_to_f32((uint16_t)h));
        if (is_f16_nan((uint16_t)h)) {
            assert_true(is_f16_nan(back));
            assert_int_equal(back & 0x8000u, h & 0x8000u);
        } else if (back != h) {
            fail_msg("f16 %#06x -> f32 -> %#06x", h, back);
        }
    }
}

static void test_bf16_decode_and_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = kern_bf16_to_f32((uint16_t)b);
        uint16_t mag = b & 0x7fffu;
        if (is_bf16_nan((uint16_t)b)) {
            assert_true(isnan(f));
        } else if (mag == 0x7f80u) {
            assert_true(isinf(f));
        } else if ((double)fabsf(f) != ref_bf16(mag)) {
            fail_msg("bf16 %#06x -> %a, want %a", b, (double)f, ref_bf16(mag));
        }
        assert_int_equal(signbit(f) != 0, (b & 0x8000u) != 0);
        uint16_t back = kern_f32_to_bf16(f);
        if (is_bf16_nan((uint16_t)b))
            assert_true(is_bf16_nan(back));
        else if (back != b)
            fail_msg("bf16 %#06x -> f32 -> %#06x", b, back);
    }
}

/* ---- ties: every midpoint between neighbours, exhaustively ---- */

static void check_midpoints(const double *val, unsigned max_finite, uint16_t inf,
                            uint16_t (*cast)(float), const char *what)
{
    for (unsigned k = 0; k <= max_finite; k++) {
        double lo = val[k];
        double hi = k < max_finite ? val[k + 1] : 2 * val[k] - val[k - 1];
        unsigned khi = k < max_finite ? k + 1 : inf; /* the pattern after the last is inf */
        double mid = (lo + hi) / 2;
        float fm = (float)mid;
        assert_true((double)fm == mid); /* representable: the test is a real tie */
        uint16_t want = (k & 1u) ? (uint16_t)khi : (uint16_t)k;
        uint16_t got = cast(fm);
        if (got != want)
            fail_msg("%s: tie %a between %#x and %#x -> %#x, want %#x", what, mid, k, khi, got,
                     want);
        got = cast(-fm);
        if (got != (0x8000u | want))
            fail_msg("%s: tie -%a -> %#x, want %#x", what, mid, got, 0x8000u | want);
        /* one f32 ulp either side breaks the tie */
        if (cast(nextafterf(fm, INFINITY)) != khi)
            fail_msg("%s: just above tie %a -> %#x, want %#x", what, mid,
                     cast(nextafterf(fm, INFINITY)), khi);
        if (cast(nextafterf(fm, 0.0f)) != k)
            fail_msg("%s: just below tie %a -> %#x, want %#x", what, mid,
                     cast(nextafterf(fm, 0.0f)), k);
    }
}

static void test_f32_to_f16_ties_to_even_exhaustive(void **state)
{
    (void)state;
    check_midpoints(f16_val, F16_MAX_FINITE, 0x7c00u, kern_f32_to_f16, "f32->f16");
}

static void test_f32_to_bf16_ties_to_even_exhaustive(void **state)
{
    (void)state;
    check_midpoints(bf16_val, BF16_MAX_FINITE, 0x7f80u, kern_f32_to_bf16, "f32->bf16");
}

/* ---- random floats against the exhaustive search ---- */

static void test_f32_to_f16_random_vs_search(void **state)
{
    (void)state;
    tt_rng r = {0xf16};
    for (int i = 0; i < 1500; i++) {
        uint32_t u = (uint32_t)tt_rand(&r);
        if (i < 1200) /* mostly exponents where f16 has something to say */
            u = (u & 0x807fffffu) | ((uint32_t)(98 + tt_randn(&r, 48)) << 23);
        float f = float_of(u);
        uint16_t got = kern_f32_to_f16(f);
        if (isnan(f)) {
            assert_true(is_f16_nan(got));
            continue;
        }
        uint16_t want = ref_f32_to_f16(f);
        if (got != want)
            fail_msg("f32 %#010x (%a) -> f16 %#06x, want %#06x", u, (double)f, got, want);
    }
}

static void test_f32_to_bf16_random_vs_search(void **state)
{
    (void)state;
    tt_rng r = {0xbf16};
    for (int i = 0; i < 1500; i++) {
        uint32_t u = (uint32_t)tt_rand(&r);
        if (i % 3 == 0) /* low bits exactly at or around the halfway point */
            u = (u & 0xffff0000u) | (0x8000u + (uint32_t)tt_randn(&r, 3) - 1u);
        float f = float_of(u);
        uint16_t got = kern_f32_to_bf16(f);
        if (isnan(f)) {
            assert_true(is_bf16_nan(got));
            continue;
        }
        uint16_t want = ref_f32_to_bf16(f);
        if (got != want)
            fail_msg("f32 %#010x (%a) -> bf16 %#06x, want %#06x", u, (double)f, got, want);
    }
}

/* ---- named edge cases ---- */

static void test_f16_overflow_and_specials(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(kern_f32_to_f16(-65520.0f), 0xfc00);
    assert_int_equal(kern_f32_to_f16(65519.99f), 0x7bff); /* 65504 */
    assert_int_equal(kern_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(kern_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(kern_f32_to_f16(FLT_MAX), 0x7c00);
    assert_int_equal(kern_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(kern_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(kern_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(kern_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(kern_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(kern_f32_to_f16(-2.0f), 0xc000);
    /* NaNs stay NaN, signalling ones too (truncating the payload would
     * make 0x7f800001 an infinity) */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7f801fffu, 0xffc00000u, 0xff800001u,
                             0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = kern_f32_to_f16(float_of(nans[i]));
        assert_true(is_f16_nan(h));
        assert_int_equal(h & 0x8000u, (nans[i] >> 16) & 0x8000u);
    }
}

static void test_f16_subnormals(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_f16(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
    assert_int_equal(kern_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie with 0: even */
    assert_int_equal(kern_f32_to_f16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    assert_int_equal(kern_f32_to_f16(-ldexpf(1, -25)), 0x8000);
    assert_int_equal(kern_f32_to_f16(ldexpf(3, -25)), 0x0002);  /* 1.5 ulp: tie -> 2 */
    assert_int_equal(kern_f32_to_f16(ldexpf(5, -25)), 0x0002);  /* 2.5 ulp: tie -> 2 */
    assert_int_equal(kern_f32_to_f16(ldexpf(1, -30)), 0x0000);
    assert_int_equal(kern_f32_to_f16(FLT_MIN), 0x0000);
    assert_int_equal(kern_f32_to_f16(float_of(1)), 0x0000);     /* f32 subnormal */
    assert_int_equal(kern_f32_to_f16(ldexpf(1023, -24)), 0x03ff);  /* largest subnormal */
    assert_int_equal(kern_f32_to_f16(ldexpf(2047, -25)), 0x0400);  /* tie -> min normal */
    assert_int_equal(kern_f32_to_f16(ldexpf(1, -14)), 0x0400);
    assert_true(kern_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(kern_f16_to_f32(0x03ff) == ldexpf(1023, -24));
    assert_true(kern_f16_to_f32(0x8001) == -ldexpf(1, -24));
}

static void test_bf16_overflow_subnormals_specials(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(kern_f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(kern_f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f); /* just below the tie */
    assert_int_equal(kern_f32_to_bf16(float_of(0x7f7f8000u)), 0x7f80); /* tie: even is inf */
    assert_int_equal(kern_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(kern_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(kern_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kern_f32_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(kern_f32_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie, even above */
    assert_int_equal(kern_f32_to_bf16(float_of(0x3f808001u)), 0x3f81);
    /* f32 subnormals become bf16 subnormals */
    assert_int_equal(kern_f32_to_bf16(float_of(0x00000001u)), 0x0000);
    assert_int_equal(kern_f32_to_bf16(float_of(0x00008000u)), 0x0000); /* tie with 0 */
    assert_int_equal(kern_f32_to_bf16(float_of(0x00008001u)), 0x0001);
    assert_int_equal(kern_f32_to_bf16(float_of(0x00018000u)), 0x0002); /* tie -> 2 */
    assert_int_equal(kern_f32_to_bf16(float_of(0x007fffffu)), 0x0080); /* rounds up to normal */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t b = kern_f32_to_bf16(float_of(nans[i]));
        assert_true(is_bf16_nan(b));
        assert_int_equal(b & 0x8000u, (nans[i] >> 16) & 0x8000u);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_exhaustive),
        cmocka_unit_test(test_f16_roundtrip_exhaustive),
        cmocka_unit_test(test_bf16_decode_and_roundtrip_exhaustive),
        cmocka_unit_test(test_f32_to_f16_ties_to_even_exhaustive),
        cmocka_unit_test(test_f32_to_bf16_ties_to_even_exhaustive),
        cmocka_unit_test(test_f32_to_f16_random_vs_search),
        cmocka_unit_test(test_f32_to_bf16_random_vs_search),
        cmocka_unit_test(test_f16_overflow_and_specials),
        cmocka_unit_test(test_f16_subnormals),
        cmocka_unit_test(test_bf16_overflow_subnormals_specials),
    };
    return cmocka_run_group_tests(tests, tables_setup, NULL);
}
