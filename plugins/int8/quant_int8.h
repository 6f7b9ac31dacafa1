/* INT8 symmetric weight quantization with F32 scales (W8A8 weights in the
 * compressed-tensors convention), per tensor or per output channel. The
 * CUDA versions keep these names with a _cuda suffix.
 *
 * For each group (the whole [n, k] matrix, or one row):
 *   amax  = max |x| (F32)
 *   scale = amax / 127.5      one F32 division: compressed-tensors divides
 *                             amax by half the range 127 - (-128)
 *   scale = 1.0f              when that is 0 (amax 0 or underflow); where
 *                             compressed-tensors clamps the scale to F32 eps
 *                             this differs only for amax < 1.6e-5
 *   q     = clamp(rne(x / scale), -128, 127)   x / scale an F32 division,
 *                             rounded half to even (rintf), as torch.round
 * so amax itself lands on 127.5 -> 128 -> 127. Dequantization: q * scale.
 * NaN/Inf inputs are refused (REFIT_ECORRUPT). */
#ifndef REFIT_KERNELS_QUANT_INT8_H
#define REFIT_KERNELS_QUANT_INT8_H

#include <stdint.h>

#include <refit/format.h>

/* amax / 127.5, or 1.0f when that is 0. amax must be finite. */
float kern_int8_scale(float amax);
/* clamp(rne(x / scale), -128, 127). */
int8_t kern_int8_encode(float x, float scale);

/* Quantize x (2-D [n, k] F32/F16/BF16, any strides) into q (2-D [n, k]
 * I8 or U8 storage) and scale (2-D F32 [1, 1] per tensor, [n, 1] per
 * channel). Returns REFIT_OK, REFIT_EMISMATCH, REFIT_EUNSUPPORTED or
 * REFIT_ECORRUPT (NaN/Inf input; outputs partly written). */
int kern_quant_int8(const refit_view *q, const refit_view *scale, const refit_view *x,
                    int per_channel);

/* out [n, k] row-major F32 <- q * scale. */
int kern_dequant_int8(float *out, const refit_view *q, const refit_view *scale,
                      int per_channel);

#endif
