/* Small-float codecs and the FP8 / INT8 / MXFP8 quantization kernels,
 * checked bit for bit against ml_dtypes and numpy (gen_minifloat_ref.py,
 * quant_ref.py): every bit pattern of E4M3, E5M2, E8M0 and E2M1 decoded;
 * encoders over every representable value, its neighbours and midpoints,
 * specials and random sweeps; quantizers over ragged shapes with zero
 * rows, zero tiles, subnormals and saturating values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/minifloat.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/int8/quant_int8.h"
#include "plugins/mxfp8/quant_mx.h"
#include "tests/formats/common/qutil.h"
#include "tests/common/pyref.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- codecs ---- */

typedef float (*dec_fn)(uint8_t);
typedef uint8_t (*enc_fn)(float);

static void decode_all(void **state)
{
    (void)state;
    st_set *s = q_ref("gen_minifloat_ref.py", "--random 16");
    static const struct { const char *name; dec_fn f; int n; } t[] = {
        {"dec.e4m3", kern_e4m3_to_f32, 256}, {"dec.e5m2", kern_e5m2_to_f32, 256},
        {"dec.e8m0", kern_e8m0_to_f32, 256}, {"dec.e2m1", kern_e2m1_to_f32, 16}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const st_tensor *want = q_get(s, t[i].name);
        assert_int_equal(want->shape[0], t[i].n);
        const uint32_t *w = want->data;
        for (int c = 0; c < t[i].n; c++)
            if (bits(t[i].f((uint8_t)c)) != w[c])
                fail_msg("%s: code 0x%02x: want f32 0x%08x, got 0x%08x", t[i].name, c, w[c],
                         bits(t[i].f((uint8_t)c)));
    }
    /* E2M1 reads the low nibble only */
    for (int c = 0; c < 256; c++)
        assert_int_equal(bits(kern_e2m1_to_f32((uint8_t)c)), bits(kern_e2m1_to_f32(c & 0xf)));
    st_close(s);
}

static const struct { const char *name; enc_fn f; } encoders[] = {
    {"enc.e4m3", kern_f32_to_e4m3}, {"enc.e4m3_sat", kern_f32_to_e4m3_sat},
    {"enc.e5m2", kern_f32_to_e5m2}, {"enc.e5m2_sat", kern_f32_to_e5m2_sat},
    {"enc.e8m0", kern_f32_to_e8m0}, {"enc.e2m1", kern_f32_to_e2m1}};

/* Every encoder against the reference on every input of s's enc.x (only
 * the tables s has: --subnormals writes no _sat tables). */
static void encode_against(st_set *s, int64_t min_inputs)
{
    const st_tensor *x = q_get(s, "enc.x");
    const uint32_t *xb = x->data;
    int64_t n = x->shape[0];
    assert_true(n >= min_inputs);
    for (size_t i = 0; i < sizeof encoders / sizeof encoders[0]; i++) {
        const st_tensor *want = st_find(s, encoders[i].name);
        if (!want)
            continue;
        assert_int_equal(want->shape[0], n);
        const uint8_t *w = want->data;
        for (int64_t j = 0; j < n; j++) {
            uint8_t got = encoders[i].f(from_bits(xb[j]));
            if (got != w[j])
                fail_msg("%s: f32 0x%08x (%.9g): want 0x%02x, got 0x%02x", encoders[i].name,
                         xb[j], from_bits(xb[j]), w[j], got);
        }
    }
}

static void encode_all(void **state)
{
    (void)state;
    st_set *s = q_ref("gen_minifloat_ref.py", "--random 262144 --seed 7");
    encode_against(s, 1000000);
    st_close(s);
}

/* Every f32 subnormal of either sign and the smallest normals: where E8M0's
 * nearest power (2^-127 or 2^-126) and the minifloats' subnormal units are
 * decided. */
static void encode_subnormals(void **state)
{
    (void)state;
    st_set *s = q_ref("gen_minifloat_ref.py", "--subnormals");
    encode_against(s, 2 * (0x00800000 + 64));
    assert_int_equal(kern_f32_to_e8m0(from_bits(0x00400001u)), 0x00); /* 2^-127 + 2^-149 */
    assert_int_equal(kern_f32_to_e8m0(from_bits(0x005fffffu)), 0x00);
    assert_int_equal(kern_f32_to_e8m0(from_bits(0x00600000u)), 0x01); /* the tie goes up */
    assert_int_equal(kern_f32_to_e8m0(from_bits(0x00000001u)), 0x00); /* no smaller code */
    st_close(s);
}

/* The documented edges, by hand, so that a reader sees the rules. */
static void codec_edges(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(kern_f32_to_e4m3(464.0f), 0x7e);      /* tie rounds to even: 448 */
    assert_int_equal(kern_f32_to_e4m3(465.0f), 0x7f);      /* past it: NaN */
    assert_int_equal(kern_f32_to_e4m3_sat(1e30f), 0x7e);
    assert_int_equal(kern_f32_to_e4m3_sat(-INFINITY), 0xfe);
    assert_int_equal(kern_f32_to_e4m3_sat(NAN), 0x7f);
    assert_int_equal(kern_f32_to_e4m3(0x1p-10f), 0x00);     /* half the smallest: even, 0 */
    assert_int_equal(kern_f32_to_e4m3(0x1.8p-9f), 0x02);    /* 1.5 units: even, 2 */
    assert_int_equal(kern_f32_to_e5m2(INFINITY), 0x7c);
    assert_int_equal(kern_f32_to_e5m2(61440.0f), 0x7c);     /* tie past 57344: inf */
    assert_int_equal(kern_f32_to_e5m2_sat(INFINITY), 0x7b);
    assert_int_equal(kern_f32_to_e8m0(1.5f), 128);          /* ties go up */
    assert_int_equal(kern_f32_to_e8m0(0x1.7ffffep0f), 127);
    assert_int_equal(kern_f32_to_e8m0(0.0f), 0xff);         /* no zero, no sign */
    assert_int_equal(kern_f32_to_e8m0(-1.0f), 0xff);
    assert_int_equal(kern_f32_to_e8m0(0x1p-127f), 0x00);
    assert_int_equal(kern_f32_to_e2m1(0.25f), 0x0);         /* tie to even: 0 */
    assert_int_equal(kern_f32_to_e2m1(5.0f), 0x6);          /* tie between 4 and 6: 4 */
    assert_int_equal(kern_f32_to_e2m1(-100.0f), 0xf);
    assert_int_equal(kern_f32_to_e2m1(NAN), 0x8);           /* as ml_dtypes */
    assert_true(isnan(kern_e8m0_to_f32(0xff)));
    assert_true(kern_e8m0_to_f32(0) == 0x1p-127f);
}

/* ---- MX scale selection ---- */

static void mx_scale_rule(void **state)
{
    (void)state;
    float b[KERN_MX_BLOCK] = {0};
    assert_int_equal(kern_mx_scale_e8m0(b, KERN_MX_BLOCK, KERN_MX_EMAX_E4M3), 0); /* zeros */
    assert_int_equal(kern_mx_scale_e8m0(b, 0, KERN_MX_EMAX_E4M3), 0);
    b[5] = -448.0f; /* floor(log2 448) = 8: X = 1 */
    assert_int_equal(kern_mx_scale_e8m0(b, KERN_MX_BLOCK, KERN_MX_EMAX_E4M3), 127);
    b[6] = 511.0f;  /* still 2^8: 511 / 1 saturates to 448 */
    assert_int_equal(kern_mx_scale_e8m0(b, KERN_MX_BLOCK, KERN_MX_EMAX_E4M3), 127);
    b[7] = 512.0f;
    assert_int_equal(kern_mx_scale_e8m0(b, KERN_MX_BLOCK, KERN_MX_EMAX_E4M3), 128);
    assert_int_equal(kern_mx_scale_e8m0(b, KERN_MX_BLOCK, KERN_MX_EMAX_E2M1), 134);
    float t[2] = {0x1p-149f, 0x1.8p-140f}; /* subnormal amax: exact floor(log2) = -140 */
    assert_int_equal(kern_mx_scale_e8m0(t, 2, KERN_MX_EMAX_E4M3), 0); /* clamped at -127 */
    t[1] = 0x1p-100f;
    assert_int_equal(kern_mx_scale_e8m0(t, 2, KERN_MX_EMAX_E2M1), 127 - 102);
    t[0] = 0x1p127f;
    assert_int_equal(kern_mx_scale_e8m0(t, 2, 0), 254);
    t[0] = NAN;
    assert_int_equal(kern_mx_scale_e8m0(t, 2, KERN_MX_EMAX_E4M3), 0xff);
    t[0] = -INFINITY;
    assert_int_equal(kern_mx_scale_e8m0(t, 2, KERN_MX_EMAX_E4M3), 0xff);
    assert_true(kern_mx_unscale(1.0f, 0) == 0x1p127f);
    assert_true(kern_mx_unscale(3.0f, 130) == 0.375f);
}

static void fp8_scale_rule(void **state)
{
    (void)state;
    assert_true(kern_fp8_scale(448.0f) == 1.0f);
    assert_true(kern_fp8_scale(0.0f) == 1.0f);          /* amax 0: scale 1 */
    assert_true(kern_fp8_scale(0x1p-149f) == 1.0f);     /* underflow to 0: scale 1 */
    assert_true(kern_fp8_scale(1.0f) == 1.0f / 448.0f);
    assert_true(kern_int8_scale(0.0f) == 1.0f);
    assert_true(kern_int8_scale(127.5f) == 1.0f);
    assert_int_equal(kern_int8_encode(127.5f, 1.0f), 127); /* 128 clamps */
    assert_int_equal(kern_int8_encode(-128.4f, 1.0f), -128);
    assert_int_equal(kern_int8_encode(2.5f, 1.0f), 2);     /* half to even */
    assert_int_equal(kern_int8_encode(-3.5f, 1.0f), -4);
    /* block splits */
    assert_int_equal(kern_block_split(256, 2, 128, 0), KERN_SPLIT_OK);
    assert_int_equal(kern_block_split(300, 3, 128, 1), KERN_SPLIT_OK);
    assert_int_equal(kern_block_split(300, 3, 128, 0), KERN_SPLIT_RAGGED);
    assert_int_equal(kern_block_split(150, 2, 128, -1), KERN_SPLIT_CUT);
    assert_int_equal(kern_block_split(300, 2, 128, 0), KERN_SPLIT_MISMATCH);
    assert_int_equal(kern_block_split(300, 2, 128, 1), KERN_SPLIT_MISMATCH);
}

/* ---- quantizers against quant_ref.py ---- */

static const char *const fp8_schemes[3] = {"per_tensor", "per_channel", "block128"};

/* Quantize the set's x with every kernel and compare with the reference. */
static void check_all_kernels(const st_set *s)
{
    refit_view x = q_view(q_get(s, "t.x"));
    int64_t n = x.shape[0], k = x.shape[1];
    size_t nk = (size_t)(n * k);
    uint8_t *q = malloc(nk ? nk : 1);
    float *sc = malloc(sizeof(float) * (size_t)(n * kern_mx_blocks(k) + n + 1));
    assert_non_null(q);
    assert_non_null(sc);
    char name[64];
    for (int m = 0; m < 3; m++) {
        int64_t ss[2];
        kern_fp8_scale_shape((kern_fp8_scheme)m, n, k, ss);
        refit_view qv = q_buf_view(q, (refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1}, n, k);
        refit_view sv = q_buf_view(sc, REFIT_F32, ss[0], ss[1]);
        assert_int_equal(kern_quant_fp8(&qv, &sv, &x, (kern_fp8_scheme)m), REFIT_OK);
        snprintf(name, sizeof name, "t.fp8.%s.q", fp8_schemes[m]);
        q_assert_bytes(q_get(s, name)->data, q, nk, name);
        snprintf(name, sizeof name, "t.fp8.%s.s", fp8_schemes[m]);
        q_assert_bytes(q_get(s, name)->data, sc, sizeof(float) * (size_t)(ss[0] * ss[1]), name);
    }
    for (int pc = 0; pc < 2; pc++) {
        refit_view qv = q_buf_view(q, REFIT_I8, n, k), sv = q_buf_view(sc, REFIT_F32,
                                                                        pc ? n : 1, 1);
        assert_int_equal(kern_quant_int8(&qv, &sv, &x, pc), REFIT_OK);
        snprintf(name, sizeof name, "t.int8.%s.q", fp8_schemes[pc]);
        q_assert_bytes(q_get(s, name)->data, q, nk, name);
        snprintf(name, sizeof name, "t.int8.%s.s", fp8_schemes[pc]);
        q_assert_bytes(q_get(s, name)->data, sc, sizeof(float) * (size_t)(pc ? n : 1), name);
    }
    uint8_t *ms = (uint8_t *)sc;
    refit_view qv = q_buf_view(q, REFIT_U8, n, k);
    refit_view mv = q_buf_view(ms, (refit_dtype){REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1}, n,
                               kern_mx_blocks(k));
    assert_int_equal(kern_quant_mxfp8(&qv, &mv, &x), REFIT_OK);
    q_assert_bytes(q_get(s, "t.mxfp8.q")->data, q, nk, "t.mxfp8.q");
    q_assert_bytes(q_get(s, "t.mxfp8.s")->data, ms, (size_t)(n * kern_mx_blocks(k)), "t.mxfp8.s");
    free(q);
    free(sc);
}

static void quant_bf16_ragged(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 300 --k 330 --dtype bf16 --specials --seed 11");
    check_all_kernels(s);
    st_close(s);
}

static void quant_f16_f32_shapes(void **state)
{
    (void)state;
    static const char *const args[] = {
        "--n 128 --k 256 --dtype f16 --specials --seed 2",
        "--n 129 --k 127 --dtype f32 --specials --seed 3",
        "--n 1 --k 1 --dtype f32",
        "--n 5 --k 33 --dtype bf16 --specials",
        "--n 257 --k 31 --dtype f32 --seed 5",
    };
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        st_set *s = q_ref("quant_ref.py", args[i]);
        check_all_kernels(s);
        st_close(s);
    }
}

/* A transposed (strided) input and output give the same bytes. */
static void quant_strided(void **state)
{
    (void)state;
    st_set *s = q_ref("quant_ref.py", "--n 130 --k 140 --dtype f32 --seed 9");
    const st_tensor *t = q_get(s, "t.x");
    int64_t n = t->shape[0], k = t->shape[1];
    float *xt = malloc(sizeof(float) * (size_t)(n * k));
    uint8_t *qt = malloc((size_t)(n * k)), *q = malloc((size_t)(n * k));
    float sc[4];
    assert_non_null(xt);
    assert_non_null(qt);
    assert_non_null(q);
    const float *x = t->data;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++)
            xt[j * n + i] = x[i * k + j];
    refit_view xv = q_buf_view(xt, REFIT_F32, n, k);
    xv.strides[0] = 1;
    xv.strides[1] = n;
    refit_view qv = q_buf_view(qt, (refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1}, n, k);
    qv.strides[0] = 1;
    qv.strides[1] = n;
    refit_view sv = q_buf_view(sc, REFIT_F32, 2, 2);
    assert_int_equal(kern_quant_fp8(&qv, &sv, &xv, KERN_FP8_BLOCK128), REFIT_OK);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++)
            q[i * k + j] = qt[j * n + i];
    q_assert_bytes(q_get(s, "t.fp8.block128.q")->data, q, (size_t)(n * k), "strided q");
    q_assert_bytes(q_get(s, "t.fp8.block128.s")->data, sc, sizeof sc, "strided scales");
    free(xt);
    free(qt);
    free(q);
    st_close(s);
}

/* NaN/Inf refused; shapes and dtypes checked; dequantization inverts. */
static void quant_refusals_and_dequant(void **state)
{
    (void)state;
    float x[4 * 64], out[4 * 64], sc[4 * 2];
    uint8_t q[4 * 64];
    for (int i = 0; i < 4 * 64; i++)
        x[i] = (float)(i % 17) - 8.0f;
    refit_view xv = q_buf_view(x, REFIT_F32, 4, 64);
    refit_view qv = q_buf_view(q, (refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1}, 4, 64);
    refit_view sv = q_buf_view(sc, REFIT_F32, 4, 1);
    assert_int_equal(kern_quant_fp8(&qv, &sv, &xv, KERN_FP8_PER_CHANNEL), REFIT_OK);
    assert_int_equal(kern_dequant_fp8(out, &qv, &sv, KERN_FP8_PER_CHANNEL), REFIT_OK);
    for (int i = 0; i < 4 * 64; i++) /* integers up to 8 round-trip within 1/16 relative */
        assert_true(fabsf(out[i] - x[i]) <= fabsf(x[i]) / 16.0f);
    refit_view bad = sv;
    bad.shape[0] = 3;
    assert_int_equal(kern_quant_fp8(&qv, &bad, &xv, KERN_FP8_PER_CHANNEL), REFIT_EMISMATCH);
    refit_view i32 = xv;
    i32.dtype = REFIT_I32;
    assert_int_equal(kern_quant_fp8(&qv, &sv, &i32, KERN_FP8_PER_CHANNEL), REFIT_EUNSUPPORTED);
    x[70] = NAN;
    assert_int_equal(kern_quant_fp8(&qv, &sv, &xv, KERN_FP8_PER_CHANNEL), REFIT_ECORRUPT);
    refit_view iq = q_buf_view(q, REFIT_I8, 4, 64);
    assert_int_equal(kern_quant_int8(&iq, &sv, &xv, 1), REFIT_ECORRUPT);
    refit_view ms = q_buf_view(sc, REFIT_U8, 4, 2);
    assert_int_equal(kern_quant_mxfp8(&qv, &ms, &xv), REFIT_ECORRUPT);
    x[70] = INFINITY;
    assert_int_equal(kern_quant_mxfp8(&qv, &ms, &xv), REFIT_ECORRUPT);
    x[70] = 1.0f;
    assert_int_equal(kern_quant_mxfp8(&qv, &ms, &xv), REFIT_OK);
    assert_int_equal(kern_dequant_mxfp8(out, &qv, &ms), REFIT_OK);
    for (int i = 0; i < 4 * 64; i++)
        assert_true(fabsf(out[i] - x[i]) <= fabsf(x[i]) / 16.0f);
    assert_int_equal(kern_quant_int8(&iq, &sv, &xv, 1), REFIT_OK);
    assert_int_equal(kern_dequant_int8(out, &iq, &sv, 1), REFIT_OK);
    for (int i = 0; i < 4 * 64; i++) /* within half a step */
        assert_true(fabsf(out[i] - x[i]) <= sc[i / 64] * 0.5f);
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decode_all),
        cmocka_unit_test(encode_all),
        cmocka_unit_test(encode_subnormals),
        cmocka_unit_test(codec_edges),
        cmocka_unit_test(mx_scale_rule),
        cmocka_unit_test(fp8_scale_rule),
        cmocka_unit_test(quant_bf16_ragged),
        cmocka_unit_test(quant_f16_f32_shapes),
        cmocka_unit_test(quant_strided),
        cmocka_unit_test(quant_refusals_and_dequant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
