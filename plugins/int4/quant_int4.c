/* INT4 pack-quantized reference kernels (see quant_int4.h). Everything goes
 * through view strides so that the same code reads a checkpoint tensor and
 * the checkpoint-layout view a format lays over its runtime storage. */
#include <string.h>

#include "kernels/cast.h"
#include "kernels/copy.h"
#include "plugins/int4/quant_int4.h"

unsigned kern_int4_code(uint32_t word, int j)
{
    return (word >> (4 * j)) & 0xfu;
}

int kern_int4_value(uint32_t word, int j)
{
    return (int)kern_int4_code(word, j) - 8;
}

uint32_t kern_int4_pack_word(const int8_t *v, int n)
{
    uint32_t w = 0;
    for (int j = 0; j < n && j < KERN_INT4_PER_WORD; j++)
        w |= (uint32_t)((v[j] + 8) & 0xf) << (4 * j);
    return w;
}

static const char *elem_ptr(const refit_view *v, int64_t i, int64_t j)
{
    int64_t off = i * v->strides[0] + (v->ndim > 1 ? j * v->strides[1] : 0);
    return (const char *)v->data + off * (int64_t)kern_dtype_size(v->dtype);
}

float kern_q4_load_f32(const refit_view *v, int64_t i, int64_t j)
{
    const char *p = elem_ptr(v, i, j);
    if (v->dtype.code == REFIT_DTYPE_FLOAT && v->dtype.bits == 32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (v->dtype.bits == 16) {
        uint16_t h;
        memcpy(&h, p, 2);
        return v->dtype.code == REFIT_DTYPE_BFLOAT ? kern_bf16_to_f32(h) : kern_f16_to_f32(h);
    }
    if (v->dtype.code == REFIT_DTYPE_INT && v->dtype.bits == 32) {
        int32_t x;
        memcpy(&x, p, 4);
        return (float)x;
    }
    if (v->dtype.code == REFIT_DTYPE_INT && v->dtype.bits == 64) {
        int64_t x;
        memcpy(&x, p, 8);
        return (float)x;
    }
    return 0.0f;
}

uint32_t kern_q4_load_u32(const refit_view *v, int64_t i, int64_t j)
{
    uint32_t w;
    memcpy(&w, elem_ptr(v, i, j), 4);
    return w;
}

refit_view kern_q4_transposed_view(void *data, refit_device dev, refit_dtype dt,
                                   int64_t rows, int64_t cols, int64_t row_pitch)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.device = dev;
    v.dtype = dt;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.strides[0] = 1;
    v.strides[1] = row_pitch;
    return v;
}

static int shape_is(const refit_view *v, int64_t a, int64_t b)
{
    return v->ndim == 2 && v->shape[0] == a && v->shape[1] == b;
}

int kern_int4_dequant(const kern_int4_src *s, float *out)
{
    int64_t words = (s->k + 7) / 8;
    int64_t groups = s->group > 0 ? (s->k + s->group - 1) / s->group : 1;
    int asym = s->zp.ndim != 0;
    if (!shape_is(&s->packed, s->n, words) || !shape_is(&s->scale, s->n, groups) ||
        (asym && !shape_is(&s->zp, (s->n + 7) / 8, groups)))
        return REFIT_EMISMATCH;
    for (int64_t i = 0; i < s->n; i++) {
        for (int64_t j = 0; j < s->k; j++) {
            int64_t g = s->group > 0 ? j / s->group : 0;
            int q = kern_int4_value(kern_q4_load_u32(&s->packed, i, j / 8), (int)(j % 8));
            int z = asym ? kern_int4_value(kern_q4_load_u32(&s->zp, i / 8, g), (int)(i % 8)) : 0;
            out[i * s->k + j] = (float)(q - z) * kern_q4_load_f32(&s->scale, i, g);
        }
    }
    return REFIT_OK;
}

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

kern_q4_split kern_q4_split_check(int64_t units, int64_t per, int64_t blocks, int64_t bs,
                                  int64_t full)
{
    if (units < 0 || blocks < 0 || per <= 0 || bs <= 0 || units > INT64_MAX / per ||
        blocks > INT64_MAX / bs)
        return KERN_Q4_SPLIT_MISMATCH; /* extents no tensor can have */
    int64_t have = units * per, cover = blocks * bs;
    if (full > 0) {
        if (units == cdiv(full, per)) /* the whole extent: a ragged tail is fine */
            return blocks == cdiv(full, bs) ? KERN_Q4_SPLIT_OK : KERN_Q4_SPLIT_MISMATCH;
        if (units > cdiv(full, per) || blocks > cdiv(full, bs))
            return KERN_Q4_SPLIT_MISMATCH;
        /* a shard: only an extent made of whole blocks splits cleanly */
        if (full % bs || full % per)
            return KERN_Q4_SPLIT_CUT;
        return have == cover ? KERN_Q4_SPLIT_OK : KERN_Q4_SPLIT_CUT;
    }
    if (have == cover)
        return KERN_Q4_SPLIT_OK;
    /* both could end in a ragged tail of one real extent, or a shard cut */
    if ((blocks - 1) * bs < have && (units - 1) * per < cover)
        return KERN_Q4_SPLIT_RAGGED;
    return KERN_Q4_SPLIT_CUT;
}

/* ---- online quantization (the arithmetic is quant_int4.h's) ---- */

int kern_int4_float_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && d.bits == 32)
        return 0;
    if (d.code == REFIT_DTYPE_FLOAT && d.bits == 16)
        return 1;
    if (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16)
        return 2;
    return -1;
}

int kern_quant_int4_check(const refit_view *q, const refit_view *scale, const refit_view *x,
                          int64_t group)
{
    if (kern_int4_float_kind(x->dtype) < 0 || kern_int4_float_kind(scale->dtype) < 0 ||
        q->dtype.bits != 32 || q->dtype.lanes != 1 ||
        (q->dtype.code != REFIT_DTYPE_INT && q->dtype.code != REFIT_DTYPE_UINT))
        return REFIT_EUNSUPPORTED;
    if (x->ndim != 2 || q->ndim != 2 || scale->ndim != 2 || group < 0 || x->shape[0] < 0 ||
        x->shape[1] < 0)
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    int64_t groups = group > 0 ? cdiv(k, group) : 1;
    if (!shape_is(q, n, cdiv(k, 8)) || !shape_is(scale, n, groups))
        return REFIT_EMISMATCH;
    return REFIT_OK;
}

static char *elem_mut(const refit_view *v, int64_t i, int64_t j)
{
    return (char *)elem_ptr(v, i, j);
}

/* Scales of row i (groups of g_len columns; one group for k = 0 per
 * channel): REFIT_ECORRUPT at a non-finite group or a scale overflow. */
static int quant_row_scales(const refit_view *scale, const refit_view *x, int64_t i,
                            int64_t groups, int64_t g_len, int kind)
{
    int64_t k = x->shape[1];
    for (int64_t g = 0; g < groups; g++) {
        uint32_t m = 0;
        int64_t c0 = g * g_len, c1 = c0 + g_len < k ? c0 + g_len : k;
        for (int64_t j = c0; j < c1; j++) {
            uint32_t a = refit_mf_f32_bits(kern_q4_load_f32(x, i, j)) & 0x7fffffffu;
            m = a > m ? a : m;
        }
        if (m >= 0x7f800000u)
            return REFIT_ECORRUPT;
        uint32_t b = kern_int4_scale_bits(refit_mf_bits_f32(m), kind);
        if (b == KERN_INT4_SCALE_OVERFLOW)
            return REFIT_ECORRUPT;
        char *p = elem_mut(scale, i, g);
        if (kind == 0) {
            memcpy(p, &b, 4);
        } else {
            uint16_t h = (uint16_t)b;
            memcpy(p, &h, 2);
        }
    }
    return REFIT_OK;
}

int kern_quant_int4(const refit_view *q, const refit_view *scale, const refit_view *x,
                    int64_t group)
{
    int rc = kern_quant_int4_check(q, scale, x, group);
    if (rc)
        return rc;
    int64_t n = x->shape[0], k = x->shape[1], words = cdiv(k, 8);
    int64_t g_len = group > 0 ? group : (k > 0 ? k : 1);
    int64_t groups = group > 0 ? cdiv(k, group) : 1;
    int kind = kern_int4_float_kind(scale->dtype);
    for (int64_t i = 0; i < n; i++) {
        if ((rc = quant_row_scales(scale, x, i, groups, g_len, kind)))
            return rc;
        int64_t g_at = -1;
        float s = 1.0f;
        for (int64_t w = 0; w < words; w++) {
            uint32_t word = 0;
            for (int e = 0; e < KERN_INT4_PER_WORD && 8 * w + e < k; e++) {
                int64_t j = 8 * w + e;
                if (j / g_len != g_at) { /* the stored scale, read back */
                    g_at = j / g_len;
                    s = kern_q4_load_f32(scale, i, g_at);
                }
                word |= kern_int4_encode(kern_q4_load_f32(x, i, j), s) << (4 * e);
            }
            memcpy(elem_mut(q, i, w), &word, 4);
        }
    }
    return REFIT_OK;
}
