/* The format SDK's minifloat arithmetic (include/refit/sdk/minifloat.h) on
 * the CPU: the UE4M3 block-scale codec NVFP4's kernels use against E4M3's,
 * across every exponent with the bit patterns around each rounding
 * midpoint; the E2M1 decoder's 16 values; the 16-bit element readers. (The
 * E4M3/E5M2/E8M0/E2M1 encoders themselves are checked against ml_dtypes'
 * tables in tests/quant and tests/formats4.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <refit/sdk/minifloat.h>

/* Every f32 pattern whose low 8 bits are 0, and its neighbours 1 below and
 * above (every grid midpoint of these formats has its low 8 bits 0), of
 * magnitude up to `limit`: fn(a) is called on each. */
static unsigned long long sweep(uint32_t limit, unsigned long long (*fn)(uint32_t))
{
    unsigned long long bad = 0;
    for (uint64_t p = 0; p <= limit; p += 256)
        for (int d = -1; d <= 1; d++) {
            int64_t a = (int64_t)p + d;
            if (a >= 0 && a <= (int64_t)limit)
                bad += fn((uint32_t)a);
        }
    return bad;
}

static unsigned long long ue4m3_differs(uint32_t a)
{
    return refit_mf_ue4m3_sat(a) != refit_mf_f32_to_e4m3_sat(refit_mf_bits_f32(a));
}

static void ue4m3_is_e4m3_of_non_negative_values(void **state)
{
    (void)state;
    /* every finite magnitude, and infinity (saturated to 448) */
    assert_int_equal(sweep(0x7f800000u, ue4m3_differs), 0);
    assert_int_equal(refit_mf_ue4m3_sat(refit_mf_f32_bits(464.0f)), 0x7e); /* past 448's tie */
    assert_int_equal(refit_mf_ue4m3_sat(refit_mf_f32_bits(0x1p-10f)), 0);  /* tie to even 0 */
    assert_int_equal(refit_mf_ue4m3_sat(refit_mf_f32_bits(0x1.8p-10f)), 1);
    for (uint32_t c = 0; c < 0x7f; c++)
        assert_int_equal(refit_mf_f32_bits(refit_mf_ue4m3_to_f32(c)),
                         refit_mf_f32_bits(refit_mf_e4m3_to_f32((uint8_t)c)));
}

static void e2m1_decodes_its_grid(void **state)
{
    (void)state;
    static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint8_t n = 0; n < 16; n++) {
        float want = (n & 8) ? -grid[n & 7] : grid[n & 7];
        assert_int_equal(refit_mf_f32_bits(refit_mf_e2m1_to_f32(n)), refit_mf_f32_bits(want));
        assert_int_equal(refit_mf_f32_to_e2m1(want), n); /* round trip, -0 too */
    }
}

static void sixteen_bit_elements_read_exactly(void **state)
{
    (void)state;
    uint32_t w = 0x3c00u << 16 | 0x4049u; /* F16 1.0 high; BF16 3.140625 low */
    assert_true(refit_mf_pair_to_f32(w, 1, REFIT_MF_F16) == 1.0f);
    assert_true(refit_mf_pair_to_f32(w, 0, REFIT_MF_BF16) == 3.140625f);
    assert_true(refit_mf_half_to_f32(0x0001u, REFIT_MF_F16) == 0x1p-24f);
    assert_int_equal(refit_mf_f32_to_bf16(refit_mf_bf16_to_f32(0x7f81u)), 0x7fc1u); /* quiet */
    assert_int_equal(refit_mf_f32_to_f16(65520.0f), 0x7c00u);
    assert_int_equal(refit_mf_f32_to_f16(65519.0f), 0x7bffu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ue4m3_is_e4m3_of_non_negative_values),
        cmocka_unit_test(e2m1_decodes_its_grid),
        cmocka_unit_test(sixteen_bit_elements_read_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
