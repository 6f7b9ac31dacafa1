/* OCP MX block scales and MXFP8 reference kernels; the rules are in
 * quant_mx.h. */
#include <string.h>

#include "kernels/minifloat.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/mxfp8/quant_mx.h"

/* floor(log2(a)) of positive finite magnitude bits a, exact for f32
 * subnormals too (their exponent comes from the leading mantissa bit). */
static int floor_log2_bits(uint32_t a)
{
    int e = (int)(a >> 23);
    if (e > 0)
        return e - 127;
    int msb = 22;
    while (!(a & (1u << msb)))
        msb--;
    return msb - 149;
}

uint8_t kern_mx_scale_e8m0(const float *block, int n, int elem_emax)
{
    uint32_t amax = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a;
        memcpy(&a, &block[i], sizeof a);
        a &= 0x7fffffffu;
        if (a >= 0x7f800000u) /* NaN or infinity: no meaningful scale */
            return 0xffu;
        if (a > amax) /* magnitudes of finite floats order as integers */
            amax = a;
    }
    if (amax == 0)
        return 0;
    int e = floor_log2_bits(amax) - elem_emax;
    if (e < -127)
        e = -127;
    if (e > 127)
        e = 127;
    return (uint8_t)(e + 127);
}

float kern_mx_unscale(float x, uint8_t s)
{
    /* 2^(s-127) is exact in f32 (2^-127 as a subnormal), so the division
     * is one correctly rounded operation, as __fdiv_rn on a GPU */
    return x / kern_e8m0_to_f32(s);
}

int64_t kern_mx_blocks(int64_t k)
{
    return (k + KERN_MX_BLOCK - 1) / KERN_MX_BLOCK;
}

static int check_mx(const refit_view *q, const refit_view *scales, int64_t n, int64_t k)
{
    if (!kern_is_byte_dtype(q->dtype) || !kern_is_byte_dtype(scales->dtype))
        return REFIT_EUNSUPPORTED;
    if (q->ndim != 2 || scales->ndim != 2 || q->shape[0] != n || q->shape[1] != k ||
        scales->shape[0] != n || scales->shape[1] != kern_mx_blocks(k))
        return REFIT_EMISMATCH;
    return REFIT_OK;
}

int kern_quant_mxfp8(const refit_view *q, const refit_view *scales, const refit_view *x)
{
    if (!kern_is_float_dtype(x->dtype))
        return REFIT_EUNSUPPORTED;
    if (x->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    int rc = check_mx(q, scales, n, k);
    if (rc)
        return rc;
    float blk[KERN_MX_BLOCK];
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b * KERN_MX_BLOCK < k; b++) {
            int64_t c0 = b * KERN_MX_BLOCK;
            int len = (int)(k - c0 < KERN_MX_BLOCK ? k - c0 : KERN_MX_BLOCK);
            for (int j = 0; j < len; j++)
                blk[j] = kern_view_f32(x, i, c0 + j);
            uint8_t s = kern_mx_scale_e8m0(blk, len, KERN_MX_EMAX_E4M3);
            *kern_view_byte(scales, i, b) = s;
            if (s == 0xffu)
                return REFIT_ECORRUPT;
            for (int j = 0; j < len; j++)
                *kern_view_byte(q, i, c0 + j) = kern_f32_to_e4m3_sat(kern_mx_unscale(blk[j], s));
        }
    return REFIT_OK;
}

int kern_dequant_mxfp8(float *out, const refit_view *q, const refit_view *scales)
{
    if (q->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = q->shape[0], k = q->shape[1];
    int rc = check_mx(q, scales, n, k);
    if (rc)
        return rc;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++)
            out[i * k + j] = kern_e4m3_to_f32(*kern_view_byte(q, i, j)) *
                             kern_e8m0_to_f32(*kern_view_byte(scales, i, j / KERN_MX_BLOCK));
    return REFIT_OK;
}
