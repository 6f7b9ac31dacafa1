/* INT8 symmetric quantization reference kernels; the arithmetic is
 * defined in quant_int8.h. */
#include <math.h>

#include "plugins/fp8/quant_fp8.h"
#include "plugins/int8/quant_int8.h"

float kern_int8_scale(float amax)
{
    float s = amax / 127.5f;
    return s > 0.0f ? s : 1.0f;
}

int8_t kern_int8_encode(float x, float scale)
{
    float r = rintf(x / scale); /* the default rounding mode: half to even */
    if (r > 127.0f)
        return 127;
    if (r < -128.0f)
        return -128;
    return (int8_t)r;
}

static int check_int8(const refit_view *q, const refit_view *scale, int64_t n, int64_t k,
                      int per_channel)
{
    if (q->dtype.bits != 8 || (q->dtype.code != REFIT_DTYPE_INT &&
                               q->dtype.code != REFIT_DTYPE_UINT) ||
        scale->dtype.code != REFIT_DTYPE_FLOAT || scale->dtype.bits != 32)
        return REFIT_EUNSUPPORTED;
    if (q->ndim != 2 || scale->ndim != 2 || q->shape[0] != n || q->shape[1] != k ||
        scale->shape[0] != (per_channel ? n : 1) || scale->shape[1] != 1)
        return REFIT_EMISMATCH;
    return REFIT_OK;
}

int kern_quant_int8(const refit_view *q, const refit_view *scale, const refit_view *x,
                    int per_channel)
{
    if (!kern_is_float_dtype(x->dtype))
        return REFIT_EUNSUPPORTED;
    if (x->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    int rc = check_int8(q, scale, n, k, per_channel);
    if (rc)
        return rc;
    /* one group per scale: all rows, or row g; walking the scales writes
     * every one of them, even for an empty matrix */
    int64_t groups = per_channel ? n : 1;
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = per_channel ? g : 0, r1 = per_channel ? g + 1 : n;
        float amax = kern_amax_f32(x, r0, r1, 0, k);
        if (amax < 0.0f)
            return REFIT_ECORRUPT;
        float s = kern_int8_scale(amax);
        *kern_view_f32_ptr(scale, g, 0) = s;
        for (int64_t i = r0; i < r1; i++)
            for (int64_t j = 0; j < k; j++)
                *(int8_t *)kern_view_byte(q, i, j) = kern_int8_encode(kern_view_f32(x, i, j), s);
    }
    return REFIT_OK;
}

int kern_dequant_int8(float *out, const refit_view *q, const refit_view *scale,
                      int per_channel)
{
    if (q->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = q->shape[0], k = q->shape[1];
    int rc = check_int8(q, scale, n, k, per_channel);
    if (rc)
        return rc;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++)
            out[i * k + j] = (float)*(const int8_t *)kern_view_byte(q, i, j) *
                             *kern_view_f32_ptr(scale, per_channel ? i : 0, 0);
    return REFIT_OK;
}
