/* E2M1 packing, the 128x4 scale swizzle, block-scaled FP4 dequantization,
 * online NVFP4 quantization and the checkpoint factors (see quant_nvfp4.h). */
#include <float.h>
#include <string.h>

#include "kernels/copy.h"
#include "kernels/minifloat.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/nvfp4/quant_nvfp4.h"

uint8_t kern_fp4_get(const uint8_t *row, int64_t j)
{
    uint8_t b = row[j / 2];
    return (uint8_t)((j & 1) ? b >> 4 : b & 0xf);
}

void kern_fp4_set(uint8_t *row, int64_t j, uint8_t code)
{
    uint8_t *b = &row[j / 2];
    code &= 0xf;
    *b = (uint8_t)((j & 1) ? (*b & 0x0f) | (code << 4) : (*b & 0xf0) | code);
}

void kern_fp4_pack(uint8_t *dst, const uint8_t *codes, int64_t n)
{
    for (int64_t i = 0; i < n / 2; i++)
        dst[i] = (uint8_t)((codes[2 * i] & 0xf) | (codes[2 * i + 1] & 0xf) << 4);
    if (n & 1)
        dst[n / 2] = codes[n - 1] & 0xf;
}

void kern_fp4_unpack(uint8_t *codes, const uint8_t *src, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        codes[j] = kern_fp4_get(src, j);
}

int64_t kern_swizzle_rows(int64_t rows)
{
    return (rows + KERN_SWIZZLE_ROWS - 1) / KERN_SWIZZLE_ROWS * KERN_SWIZZLE_ROWS;
}

int64_t kern_swizzle_cols(int64_t cols)
{
    return (cols + KERN_SWIZZLE_COLS - 1) / KERN_SWIZZLE_COLS * KERN_SWIZZLE_COLS;
}

int64_t kern_swizzle_offset(int64_t r, int64_t c, int64_t cols_p)
{
    int64_t tile = (r / 128) * (cols_p / 4) + c / 4;
    return tile * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

static uint8_t *byte_at(const refit_view *v, int64_t i, int64_t j)
{
    return (uint8_t *)v->data + i * v->strides[0] + j * v->strides[1];
}

void kern_swizzle(uint8_t *dst, const refit_view *src)
{
    int64_t rows = src->shape[0], cols = src->shape[1];
    int64_t rp = kern_swizzle_rows(rows), cp = kern_swizzle_cols(cols);
    /* pad bytes are written too: the whole array is rebuilt every time */
    memset(dst, 0, (size_t)(rp * cp));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[kern_swizzle_offset(r, c, cp)] = *byte_at(src, r, c);
}

void kern_unswizzle(const refit_view *dst, const uint8_t *src)
{
    int64_t cp = kern_swizzle_cols(dst->shape[1]);
    for (int64_t r = 0; r < dst->shape[0]; r++)
        for (int64_t c = 0; c < dst->shape[1]; c++)
            *byte_at(dst, r, c) = src[kern_swizzle_offset(r, c, cp)];
}

static int fits(const refit_view *v, int64_t a, int64_t b)
{
    return v->ndim == 2 && v->shape[0] == a && v->shape[1] == b &&
           kern_dtype_size(v->dtype) == 1;
}

int kern_fp4_dequant(const kern_fp4_src *s, float *out)
{
    int64_t blocks = (s->k + s->block - 1) / s->block;
    if (s->block <= 0 || !fits(&s->packed, s->n, (s->k + 1) / 2) ||
        !fits(&s->scale, s->n, blocks))
        return REFIT_EMISMATCH;
    for (int64_t i = 0; i < s->n; i++) {
        for (int64_t j = 0; j < s->k; j++) {
            uint8_t byte = *byte_at(&s->packed, i, j / 2);
            uint8_t code = (uint8_t)((j & 1) ? byte >> 4 : byte & 0xf);
            uint8_t sc = *byte_at(&s->scale, i, j / s->block);
            float scale = s->scale_kind == KERN_FP4_SCALE_E8M0 ? kern_e8m0_to_f32(sc)
                                                               : kern_e4m3_to_f32(sc);
            float x = kern_e2m1_to_f32(code) * scale;
            out[i * s->k + j] = x * s->mul / s->div;
        }
    }
    return REFIT_OK;
}

/* ---- online quantization ---- */

float kern_nvfp4_global_scale(float amax)
{
    if (amax == 0.0f)
        return 1.0f; /* any positive factor encodes zeros as zeros */
    float gs = KERN_NVFP4_GLOBAL_MAX / amax;
    return gs > FLT_MAX ? FLT_MAX : gs; /* an amax below 2688 / FLT_MAX */
}

uint8_t kern_nvfp4_block_scale(float bmax, float gs)
{
    float per = bmax / 6.0f;
    uint8_t code = kern_f32_to_e4m3_sat(gs * per);
    return code ? code : KERN_NVFP4_ZERO_SCALE;
}

uint8_t kern_nvfp4_encode(float x, float div)
{
    return kern_f32_to_e2m1(x / div);
}

static int quant_shapes_ok(const refit_view *packed, const refit_view *x)
{
    return x->ndim == 2 && packed->ndim == 2 && packed->shape[0] == x->shape[0] &&
           packed->shape[1] == (x->shape[1] + 1) / 2 && x->shape[0] >= 0 && x->shape[1] >= 0;
}

/* Row i, columns [c0, c0 + w) (w <= 16, c0 even): one block. */
static void quant_block(const refit_view *packed, uint8_t *swizzled, int64_t cp,
                        const refit_view *x, float gs, int64_t i, int64_t c0, int64_t w)
{
    float v[KERN_NVFP4_BLOCK], bmax = 0.0f;
    for (int64_t j = 0; j < w; j++) {
        v[j] = kern_view_f32(x, i, c0 + j);
        float a = v[j] < 0.0f ? -v[j] : v[j];
        bmax = a > bmax ? a : bmax;
    }
    uint8_t code = kern_nvfp4_block_scale(bmax, gs);
    swizzled[kern_swizzle_offset(i, c0 / KERN_NVFP4_BLOCK, cp)] = code;
    float div = kern_e4m3_to_f32(code) / gs;
    for (int64_t j = 0; j < w; j += 2) {
        uint8_t lo = kern_nvfp4_encode(v[j], div);
        uint8_t hi = j + 1 < w ? kern_nvfp4_encode(v[j + 1], div) : 0;
        *byte_at(packed, i, (c0 + j) / 2) = (uint8_t)(lo | hi << 4);
    }
}

int kern_quant_nvfp4(const refit_view *packed, uint8_t *swizzled, float *alpha,
                     const refit_view *x)
{
    if (!kern_is_float_dtype(x->dtype) || kern_dtype_size(packed->dtype) != 1)
        return REFIT_EUNSUPPORTED;
    if (!quant_shapes_ok(packed, x))
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    float amax = kern_amax_f32(x, 0, n, 0, k);
    if (amax < 0.0f)
        return REFIT_ECORRUPT;
    float gs = kern_nvfp4_global_scale(amax);
    int64_t blocks = (k + KERN_NVFP4_BLOCK - 1) / KERN_NVFP4_BLOCK;
    int64_t cp = kern_swizzle_cols(blocks);
    memset(swizzled, 0, (size_t)(kern_swizzle_rows(n) * cp));
    for (int64_t i = 0; i < n; i++)
        for (int64_t c0 = 0; c0 < k; c0 += KERN_NVFP4_BLOCK)
            quant_block(packed, swizzled, cp, x, gs, i, c0,
                        k - c0 < KERN_NVFP4_BLOCK ? k - c0 : KERN_NVFP4_BLOCK);
    *alpha = 1.0f / gs;
    return REFIT_OK;
}

/* ---- checkpoint factors ---- */

void kern_nvfp4_fuse(kern_nvfp4_conv conv, float wf, const float *in, float *alpha, float *inv)
{
    if (conv == KERN_NVFP4_CT) {
        *alpha = in ? 1.0f / (*in * wf) : 1.0f / wf;
        if (in)
            *inv = *in;
    } else {
        *alpha = in ? *in * wf : wf;
        if (in)
            *inv = 1.0f / *in;
    }
}
