/* 4-bit kernels against numpy/ml_dtypes: E2M1 packing (every byte), the
 * 128x4 scale swizzle (vLLM's swizzle_blockscale in numpy) over shapes that
 * are and are not whole tiles, INT4 word packing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/minifloat.h"
#include "plugins/int4/quant_int4.h"
#include "plugins/nvfp4/quant_nvfp4.h"
#include "tests/formats/common/f4util.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

static void fp4_every_byte(void **state)
{
    (void)state;
    st_set *s = f4_ref("fp4pack", NULL);
    const uint8_t *bytes = f4_get(s, "bytes")->data;
    const float *lo = f4_get(s, "expect.lo")->data, *hi = f4_get(s, "expect.hi")->data;
    for (int b = 0; b < 256; b++) {
        float l = kern_e2m1_to_f32(kern_fp4_get(&bytes[b], 0));
        float h = kern_e2m1_to_f32(kern_fp4_get(&bytes[b], 1));
        assert_memory_equal(&l, &lo[b], 4);
        assert_memory_equal(&h, &hi[b], 4);
    }
    /* pack/unpack round trip, odd length: the last high nibble is 0 */
    uint8_t codes[7] = {1, 15, 8, 0, 7, 9, 3}, packed[4], back[7];
    memset(packed, 0xff, sizeof packed);
    kern_fp4_pack(packed, codes, 7);
    assert_int_equal(packed[0], 0xf1);
    assert_int_equal(packed[3], 0x03);
    kern_fp4_unpack(back, packed, 7);
    assert_memory_equal(back, codes, 7);
    kern_fp4_set(packed, 6, 0xa);
    assert_int_equal(packed[3], 0x0a);
    st_close(s);
}

static void swizzle_case(int64_t rows, int64_t blocks)
{
    char args[96];
    snprintf(args, sizeof args, "--n %lld --k %lld --seed %lld", (long long)rows,
             (long long)blocks * 16, (long long)(rows * 7 + blocks));
    st_set *s = f4_ref("nvfp4", args);
    const st_tensor *sc = f4_get(s, "W.weight_scale"), *want = f4_get(s, "expect.swizzled");
    int64_t rp = kern_swizzle_rows(rows), cp = kern_swizzle_cols(blocks);
    assert_int_equal(want->nbytes, rp * cp);
    uint8_t *got = malloc((size_t)(rp * cp));
    uint8_t *back = malloc((size_t)(rows * blocks));
    assert_non_null(got);
    assert_non_null(back);
    memset(got, 0xa5, (size_t)(rp * cp));
    refit_view src = q_view(sc);
    kern_swizzle(got, &src);
    assert_memory_equal(got, want->data, want->nbytes);
    refit_view dst = src;
    dst.data = back;
    kern_unswizzle(&dst, got);
    assert_memory_equal(back, sc->data, sc->nbytes);
    free(got);
    free(back);
    st_close(s);
}

static void swizzle_shapes(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {128, 4}, {130, 3}, {256, 8}, {300, 9}, {31, 5}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        swizzle_case(shapes[i][0], shapes[i][1]);
    /* tile (1, 2) of a [256, 12] array starts at byte (1 * 3 + 2) * 512 */
    assert_int_equal(kern_swizzle_offset(128, 8, 12), 5 * 512);
    assert_int_equal(kern_swizzle_offset(33, 1, 4), 1 * 16 + 1 * 4 + 1);
}

static void int4_words(void **state)
{
    (void)state;
    int8_t v[8] = {-8, -1, 0, 7, 3, -3, 1, -7};
    uint32_t w = kern_int4_pack_word(v, 8);
    assert_int_equal(w, 0x195bf870u);
    for (int j = 0; j < 8; j++)
        assert_int_equal(kern_int4_value(w, j), v[j]);
    /* a short word pads with code 0 (value -8), as compressed-tensors does */
    assert_int_equal(kern_int4_pack_word(v + 3, 2), 0x000000bfu);
    assert_int_equal(kern_q4_split_check(12, 8, 2, 64, 0), KERN_Q4_SPLIT_RAGGED);
    assert_int_equal(kern_q4_split_check(12, 8, 2, 64, 192), KERN_Q4_SPLIT_CUT);
    assert_int_equal(kern_q4_split_check(13, 8, 4, 32, 100), KERN_Q4_SPLIT_OK);
    assert_int_equal(kern_q4_split_check(16, 8, 4, 32, 256), KERN_Q4_SPLIT_OK);
    assert_int_equal(kern_q4_split_check(13, 8, 5, 32, 100), KERN_Q4_SPLIT_MISMATCH);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp4_every_byte),
        cmocka_unit_test(swizzle_shapes),
        cmocka_unit_test(int4_words),
    };
    return cmocka_run_group_tests_name("formats-kernels4", tests, NULL, NULL);
}
