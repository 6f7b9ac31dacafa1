/* MXFP4 quantization (see quant_mxfp4.h): the block scale comes from the
 * shared MX rule, each element is x / X correctly rounded, then encoded to
 * E2M1 saturating with round-to-nearest-even. */
#include <string.h>

#include "kernels/copy.h"
#include "kernels/minifloat.h"
#include "plugins/int4/quant_int4.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"
#include "plugins/nvfp4/quant_nvfp4.h"

static int is_float(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

static int check(const refit_view *q, const refit_view *scales, const refit_view *x)
{
    if (!is_float(x->dtype) || kern_dtype_size(q->dtype) != 1 ||
        kern_dtype_size(scales->dtype) != 1)
        return REFIT_EUNSUPPORTED;
    if (x->ndim != 2 || q->ndim != 2 || scales->ndim != 2)
        return REFIT_EMISMATCH;
    int64_t n = x->shape[0], k = x->shape[1];
    if (q->shape[0] != n || q->shape[1] != (k + 1) / 2 || scales->shape[0] != n ||
        scales->shape[1] != kern_mx_blocks(k) || (q->shape[1] > 1 && q->strides[1] != 1))
        return REFIT_EMISMATCH;
    return REFIT_OK;
}

/* One row: blocks of 32 (the last may be short). */
static int quant_row(uint8_t *qrow, const refit_view *scales, const refit_view *x, int64_t i)
{
    int64_t k = x->shape[1];
    float buf[KERN_MX_BLOCK];
    memset(qrow, 0, (size_t)((k + 1) / 2));
    for (int64_t b = 0; b < kern_mx_blocks(k); b++) {
        int64_t j0 = b * KERN_MX_BLOCK;
        int n = (int)(k - j0 < KERN_MX_BLOCK ? k - j0 : KERN_MX_BLOCK);
        for (int t = 0; t < n; t++)
            buf[t] = kern_q4_load_f32(x, i, j0 + t);
        uint8_t s = kern_mx_scale_e8m0(buf, n, KERN_MX_EMAX_E2M1);
        if (s == 0xff)
            return REFIT_ECORRUPT;
        uint8_t *sp = (uint8_t *)scales->data + i * scales->strides[0] + b * scales->strides[1];
        *sp = s;
        for (int t = 0; t < n; t++)
            kern_fp4_set(qrow, j0 + t, kern_f32_to_e2m1(kern_mx_unscale(buf[t], s)));
    }
    return REFIT_OK;
}

int kern_quant_mxfp4(const refit_view *q, const refit_view *scales, const refit_view *x)
{
    int rc = check(q, scales, x);
    for (int64_t i = 0; !rc && i < x->shape[0]; i++)
        rc = quant_row((uint8_t *)q->data + i * q->strides[0], scales, x, i);
    return rc;
}
