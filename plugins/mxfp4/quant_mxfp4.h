/* MXFP4 (OCP MX v1.0): E2M1 elements, packed two per byte along K (low
 * nibble first, plugins/nvfp4/quant_nvfp4.h), one E8M0 scale per 32 elements of
 * a row, chosen by the shared MX rule of plugins/mxfp8/quant_mx.h with
 * elem_emax 2 (so amax / X lies in [4, 8) and elements saturate to +-6).
 * Dequantization is kern_fp4_dequant with KERN_FP4_SCALE_E8M0, block 32.
 * The CUDA version keeps the name with a _cuda suffix. */
#ifndef REFIT_KERNELS_QUANT_MXFP4_H
#define REFIT_KERNELS_QUANT_MXFP4_H

#include <refit/format.h>

/* x: 2-D [n, k] F32/F16/BF16 view, any strides. q: 2-D [n, ceil(k/2)]
 * 8-bit view whose rows are contiguous bytes (stride 1 along K); an odd k
 * leaves the last byte's high nibble 0. scales: 2-D [n, ceil(k/32)] 8-bit
 * view (E8M0 or U8), any strides; a ragged last block has its own scale.
 * Every byte of q's rows and of scales is written. Returns REFIT_OK,
 * REFIT_EMISMATCH (shapes, strides), REFIT_EUNSUPPORTED (dtypes) or
 * REFIT_ECORRUPT (a NaN or infinite input; outputs partly written). */
int kern_quant_mxfp4(const refit_view *q, const refit_view *scales, const refit_view *x);

#endif
