/* FP8 (E4M3) quantization reference kernels; the scheme and its edge cases
 * are defined in quant_fp8.h. */
#include <math.h>
#include <string.h>

#include "kernels/cast.h"
#include "kernels/minifloat.h"
#include "plugins/fp8/quant_fp8.h"

int kern_is_float_dtype(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

int kern_is_byte_dtype(refit_dtype d)
{
    return d.lanes == 1 && d.bits == 8 &&
           (d.code == REFIT_DTYPE_FLOAT8_E4M3FN || d.code == REFIT_DTYPE_FLOAT8_E5M2 ||
            d.code == REFIT_DTYPE_FLOAT8_E8M0FNU || d.code == REFIT_DTYPE_UINT ||
            d.code == REFIT_DTYPE_INT);
}

static const char *elem(const refit_view *v, int64_t i, int64_t j, size_t size)
{
    return (const char *)v->data + (i * v->strides[0] + j * v->strides[1]) * (int64_t)size;
}

float kern_view_f32(const refit_view *v, int64_t i, int64_t j)
{
    if (v->dtype.bits == 32) {
        float f;
        memcpy(&f, elem(v, i, j, 4), 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, elem(v, i, j, 2), 2);
    return v->dtype.code == REFIT_DTYPE_BFLOAT ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
}

uint8_t *kern_view_byte(const refit_view *v, int64_t i, int64_t j)
{
    return (uint8_t *)elem(v, i, j, 1);
}

float *kern_view_f32_ptr(const refit_view *v, int64_t i, int64_t j)
{
    return (float *)elem(v, i, j, 4);
}

float kern_fp8_scale(float amax)
{
    float s = amax / KERN_FP8_E4M3_MAX;
    return s > 0.0f ? s : 1.0f;
}

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

void kern_fp8_scale_shape(kern_fp8_scheme s, int64_t n, int64_t k, int64_t out[2])
{
    out[0] = s == KERN_FP8_PER_TENSOR ? 1 : s == KERN_FP8_PER_CHANNEL ? n : cdiv(n, KERN_FP8_BLOCK);
    out[1] = s == KERN_FP8_BLOCK128 ? cdiv(k, KERN_FP8_BLOCK) : 1;
}

kern_split kern_block_split(int64_t n, int64_t blocks, int64_t bs, int whole)
{
    int64_t need = cdiv(n, bs);
    if (whole > 0)
        return blocks == need ? KERN_SPLIT_OK : KERN_SPLIT_MISMATCH;
    if (n == blocks * bs)
        return KERN_SPLIT_OK;
    if (whole < 0)
        return KERN_SPLIT_CUT;
    return blocks == need ? KERN_SPLIT_RAGGED : KERN_SPLIT_MISMATCH;
}

float kern_amax_f32(const refit_view *x, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    float amax = 0.0f;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1; j++) {
            float a = fabsf(kern_view_f32(x, i, j));
            if (!(a <= 3.40282347e38f)) /* NaN or infinity */
                return -1.0f;
            if (a > amax)
                amax = a;
        }
    return amax;
}

uint8_t kern_fp8_encode(float x, float s, float inv, kern_fp8_arith a)
{
    if (a == KERN_FP8_DIVIDE)
        return kern_f32_to_e4m3_sat(x / s);
    /* fminf/fmaxf return the number where the other operand is NaN, as
     * CUDA's fmin/fmax do in vLLM's scaled_fp8_conversion */
    return kern_f32_to_e4m3_sat(fmaxf(-KERN_FP8_E4M3_MAX, fminf(x * inv, KERN_FP8_E4M3_MAX)));
}

void kern_fp8_encode_tile_arith(const refit_view *q, const refit_view *x, float scale,
                                kern_fp8_arith a, int64_t r0, int64_t r1, int64_t c0,
                                int64_t c1)
{
    float inv = 1.0f / scale;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1; j++)
            *kern_view_byte(q, i, j) = kern_fp8_encode(kern_view_f32(x, i, j), scale, inv, a);
}

void kern_fp8_encode_tile(const refit_view *q, const refit_view *x, float scale,
                          int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
    kern_fp8_encode_tile_arith(q, x, scale, KERN_FP8_DIVIDE, r0, r1, c0, c1);
}

/* Shapes and dtypes of a quantize/dequantize call. */
static int check_fp8(const refit_view *q, const refit_view *scale, int64_t n, int64_t k,
                     kern_fp8_scheme scheme)
{
    int64_t ss[2];
    kern_fp8_scale_shape(scheme, n, k, ss);
    if (!kern_is_byte_dtype(q->dtype) || scale->dtype.code != REFIT_DTYPE_FLOAT ||
        scale->dtype.bits != 32)
        return REFIT_EUNSUPPORTED;
    if (q->ndim != 2 || scale->ndim != 2 || q->shape[0] != n || q->shape[1] != k ||
        scale->shape[0] != ss[0] || scale->shape[1] != ss[1])
        return REFIT_EMISMATCH;
    return REFIT_OK;
}

int kern_quant_fp8(const refit_view *q, const refit_view *scale, const refit_view *x,
                   kern_fp8_scheme scheme)
{
    return kern_quant_fp8_arith(q, scale, x, scheme, KERN_FP8_DIVIDE);
}

int kern_quant_fp8_arith(const refit_view *q, const refit_view *scale, const refit_view *x,
                         kern_fp8_scheme scheme, kern_fp8_arith a)
{
    if (a != KERN_FP8_DIVIDE && a != KERN_FP8_RECIPROCAL)
        return REFIT_EINVAL;
    if (!kern_is_float_dtype(x->dtype))
        return REFIT_EUNSUPPORTED;
    if (x->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    int rc = check_fp8(q, scale, n, k, scheme);
    if (rc)
        return rc;
    /* one scale per cell of the scale grid; its tile is the whole matrix,
     * one row, or 128x128 (ragged at the edges). Walking the grid rather
     * than the data writes every scale, even of an empty matrix. */
    int64_t ss[2];
    kern_fp8_scale_shape(scheme, n, k, ss);
    int64_t th = scheme == KERN_FP8_PER_TENSOR ? n : scheme == KERN_FP8_PER_CHANNEL ? 1
                                                                                   : KERN_FP8_BLOCK;
    int64_t tw = scheme == KERN_FP8_BLOCK128 ? KERN_FP8_BLOCK : k;
    for (int64_t bi = 0; bi < ss[0]; bi++) {
        int64_t r0 = bi * th, r1 = r0 + th < n ? r0 + th : n;
        for (int64_t bj = 0; bj < ss[1]; bj++) {
            int64_t c0 = bj * tw, c1 = c0 + tw < k ? c0 + tw : k;
            float amax = kern_amax_f32(x, r0, r1, c0, c1);
            if (amax < 0.0f)
                return REFIT_ECORRUPT;
            float s = kern_fp8_scale(amax);
            *kern_view_f32_ptr(scale, bi, bj) = s;
            kern_fp8_encode_tile_arith(q, x, s, a, r0, r1, c0, c1);
        }
    }
    return REFIT_OK;
}

int kern_dequant_fp8(float *out, const refit_view *q, const refit_view *scale,
                     kern_fp8_scheme scheme)
{
    if (q->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = q->shape[0], k = q->shape[1];
    int rc = check_fp8(q, scale, n, k, scheme);
    if (rc)
        return rc;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            int64_t si = scheme == KERN_FP8_PER_TENSOR ? 0
                         : scheme == KERN_FP8_PER_CHANNEL ? i : i / KERN_FP8_BLOCK;
            int64_t sj = scheme == KERN_FP8_BLOCK128 ? j / KERN_FP8_BLOCK : 0;
            out[i * k + j] = kern_e4m3_to_f32(*kern_view_byte(q, i, j)) *
                             *kern_view_f32_ptr(scale, si, sj);
        }
    return REFIT_OK;
}
