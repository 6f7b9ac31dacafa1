/* OCP Microscaling (MX v1.0) blocks: KERN_MX_BLOCK (32) consecutive
 * elements of a row (along K) share one E8M0 scale X = 2^(s - 127).
 * Shared by MXFP8 (E4M3 elements, here) and MXFP4 (E2M1 elements, packed
 * by plugins/nvfp4/quant_nvfp4.h). The CUDA versions keep these names with a
 * _cuda suffix.
 *
 * Scale selection, the MX spec's rule (section 6.3; also the microxcaling
 * reference and torchao's default FLOOR mode):
 *     s = clamp(floor(log2(amax)) - elem_emax, -127, 127) + 127
 * amax is the largest |x| of the block, elem_emax the exponent of the
 * element format's largest normal (E4M3: 8, E5M2: 15, E2M1: 2). Because of
 * the floor, amax / X lies in [2^elem_emax, 2^(elem_emax + 1)), which may
 * pass the element's largest value (448 for E4M3, 6 for E2M1): elements
 * are encoded saturating. At the edges:
 *   - amax == 0 (all zeros, or n == 0): s = 0 (X = 2^-127), the clamp's
 *     value; zeros encode to zeros under any scale.
 *   - an f32 subnormal amax: floor(log2) is taken exactly from the bits.
 *   - a NaN or infinite element: s = 0xff, E8M0's NaN. The quantizers
 *     below refuse such blocks (REFIT_ECORRUPT) rather than store them.
 * Elements: q = encode_sat(x / X), where x / X is one correctly rounded
 * operation (kern_mx_unscale), exact except for f32-subnormal results,
 * which are far below any element's smallest subnormal. */
#ifndef REFIT_KERNELS_QUANT_MX_H
#define REFIT_KERNELS_QUANT_MX_H

#include <stdint.h>

#include <refit/format.h>

#define KERN_MX_BLOCK 32

/* exponent of the largest normal of each element format */
#define KERN_MX_EMAX_E4M3 8
#define KERN_MX_EMAX_E5M2 15
#define KERN_MX_EMAX_E2M1 2

/* E8M0 scale of the n values at block (n >= 0; n < KERN_MX_BLOCK for the
 * ragged last block of a row). */
uint8_t kern_mx_scale_e8m0(const float *block, int n, int elem_emax);

/* x / 2^(s - 127), correctly rounded. s must not be 0xff. */
float kern_mx_unscale(float x, uint8_t s);

/* Number of scale blocks of a row of k elements: ceil(k / 32). */
int64_t kern_mx_blocks(int64_t k);

/* MXFP8 quantization. x: 2-D [n, k] F32/F16/BF16 view, any strides.
 * q: 2-D [n, k] view of 8-bit elements (E4M3, U8 or I8 storage), any
 * strides. scales: 2-D [n, ceil(k/32)] 8-bit view (E8M0 or U8). A ragged
 * last block of a row has its own scale. Returns REFIT_OK,
 * REFIT_EMISMATCH (shapes), REFIT_EUNSUPPORTED (dtypes) or REFIT_ECORRUPT
 * (a NaN or infinite input; outputs are then partly written). */
int kern_quant_mxfp8(const refit_view *q, const refit_view *scales, const refit_view *x);

/* MXFP8 back to F32: out [n, k] row-major, from views as above. Returns
 * REFIT_OK or REFIT_EMISMATCH. */
int kern_dequant_mxfp8(float *out, const refit_view *q, const refit_view *scales);

#endif
