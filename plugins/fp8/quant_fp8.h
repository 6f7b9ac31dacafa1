/* FP8 (E4M3) weight quantization with F32 scales, and the 2-D view access
 * that the quantization kernels (quant_fp8, quant_int8, quant_mx) share.
 * The CUDA versions keep these names with a _cuda suffix and must give the
 * same bytes.
 *
 * Schemes (x is a 2-D [n, k] F32/F16/BF16 weight, read as F32):
 *   per-tensor   one scale for the whole matrix, scale[0]
 *   per-channel  one scale per row, scale[i] (a [n] or [n, 1] tensor)
 *   block-128    one scale per 128x128 tile, scale[i/128][j/128], a
 *                [ceil(n/128), ceil(k/128)] tensor; edge tiles are ragged
 * For each group: amax = max |x| over the group (F32),
 *   scale = amax / 448   (one F32 division, round to nearest even)
 *   scale = 1.0f         when that gives 0 (amax == 0, or amax so small
 *                        that amax / 448 underflows): any positive scale
 *                        encodes zeros as zeros, and 1 dequantizes exactly
 *   q     = e4m3_sat(x / scale)   (F32 division, not a multiplication by
 *                        1/scale: x / scale is correctly rounded, x * (1 /
 *                        scale) is not, and CPU and CUDA must agree; CUDA
 *                        uses __fdiv_rn)
 * That is KERN_FP8_DIVIDE. KERN_FP8_RECIPROCAL is the arithmetic of vLLM's
 * dynamic FP8 kernels (scaled_fp8_quant), for an engine that cold-starts
 * with them: the same scale, then
 *   inv   = 1.0f / scale             (F32, rounded once; CUDA __frcp_rn)
 *   q     = e4m3_rn(fmaxf(-448, fminf(x * inv, 448)))   (the product
 *                        rounded to F32, then clamped as vLLM clamps: a NaN
 *                        product, 0 * inf where the scale is so small that
 *                        its reciprocal overflows, gives +448)
 * Dequantization: e4m3_to_f32(q) * scale. A NaN or infinite input has no
 * meaningful scale: the quantizers refuse it with REFIT_ECORRUPT. For the
 * serialized block scheme the scale tensor is `weight_scale_inv` in
 * DeepSeek-style checkpoints: despite its name a multiplier, as here. */
#ifndef REFIT_KERNELS_QUANT_FP8_H
#define REFIT_KERNELS_QUANT_FP8_H

#include <stdint.h>

#include <refit/format.h>

#define KERN_FP8_E4M3_MAX 448.0f
#define KERN_FP8_BLOCK 128

typedef enum kern_fp8_scheme {
    KERN_FP8_PER_TENSOR = 0,
    KERN_FP8_PER_CHANNEL = 1,
    KERN_FP8_BLOCK128 = 2,
} kern_fp8_scheme;

/* ---- 2-D view access shared by the quantization kernels ---- */

/* 1 for F32, F16, BF16 (the dtypes quantizers read). */
int kern_is_float_dtype(refit_dtype d);
/* 1 for one-byte elements (E4M3, E5M2, E8M0, U8, I8). */
int kern_is_byte_dtype(refit_dtype d);
/* Element (i, j) of a 2-D F32/F16/BF16 view, as F32. */
float kern_view_f32(const refit_view *v, int64_t i, int64_t j);
/* Address of element (i, j) of a 2-D view of one-byte elements. */
uint8_t *kern_view_byte(const refit_view *v, int64_t i, int64_t j);
/* Address of element (i, j) of a 2-D F32 view. */
float *kern_view_f32_ptr(const refit_view *v, int64_t i, int64_t j);

/* ---- FP8 ---- */

/* How a value is divided by its group's scale (see above). */
typedef enum kern_fp8_arith {
    KERN_FP8_DIVIDE = 0,     /* e4m3_sat(x / scale): correctly rounded */
    KERN_FP8_RECIPROCAL = 1, /* vLLM's: x * (1.0f / scale), clamped */
} kern_fp8_arith;

/* amax / 448, or 1.0f when that is 0 (see above). amax must be finite. */
float kern_fp8_scale(float amax);

/* Shape of the scale tensor of a scheme for an [n, k] weight. */
void kern_fp8_scale_shape(kern_fp8_scheme s, int64_t n, int64_t k, int64_t out[2]);

/* Quantize x into q (2-D [n, k], one-byte elements, any strides) and its
 * scales (2-D F32 view of kern_fp8_scale_shape; per-tensor [1, 1], a
 * per-channel [n] tensor is passed as [n, 1]). Returns REFIT_OK,
 * REFIT_EMISMATCH (shapes), REFIT_EUNSUPPORTED (dtypes) or REFIT_ECORRUPT
 * (NaN/Inf input; outputs partly written). */
int kern_quant_fp8(const refit_view *q, const refit_view *scale, const refit_view *x,
                   kern_fp8_scheme scheme);
/* kern_quant_fp8 with the arithmetic a (kern_quant_fp8 is KERN_FP8_DIVIDE);
 * REFIT_EINVAL for an unknown a. */
int kern_quant_fp8_arith(const refit_view *q, const refit_view *scale, const refit_view *x,
                         kern_fp8_scheme scheme, kern_fp8_arith a);
/* The E4M3 byte of x in a group of scale s, inv = 1.0f / s (read by
 * KERN_FP8_RECIPROCAL only), in arithmetic a. */
uint8_t kern_fp8_encode(float x, float s, float inv, kern_fp8_arith a);

/* Max |x| over rows [r0, r1) and columns [c0, c1) of a 2-D float view;
 * -1.0f when a NaN or infinity is among them. */
float kern_amax_f32(const refit_view *x, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

/* q <- e4m3_sat(x / scale) over rows [r0, r1) and columns [c0, c1). */
void kern_fp8_encode_tile(const refit_view *q, const refit_view *x, float scale,
                          int64_t r0, int64_t r1, int64_t c0, int64_t c1);
/* The same in arithmetic a. */
void kern_fp8_encode_tile_arith(const refit_view *q, const refit_view *x, float scale,
                                kern_fp8_arith a, int64_t r0, int64_t r1, int64_t c0,
                                int64_t c1);

/* Does a slice of n elements along one dim agree with a slice of `blocks`
 * scale blocks of bs elements along the same dim? whole: 1 when n is the
 * whole (unsharded) extent, -1 when it is known to be a shard of a larger
 * one, 0 when unknown. Sound when every rank checks: with the core's
 * split rule (sizes differ by at most one), equal n == blocks * bs on
 * every rank gives equal offsets, so no boundary cuts a block. */
typedef enum kern_split {
    KERN_SPLIT_OK = 0,
    KERN_SPLIT_CUT = 1,      /* a shard boundary cuts a block */
    KERN_SPLIT_RAGGED = 2,   /* a ragged last block or a cut: needs whole */
    KERN_SPLIT_MISMATCH = 3, /* the scale does not fit the weight */
} kern_split;
kern_split kern_block_split(int64_t n, int64_t blocks, int64_t bs, int whole);

/* out [n, k] row-major F32 <- dequantized q with its scales (as above). */
int kern_dequant_fp8(float *out, const refit_view *q, const refit_view *scale,
                     kern_fp8_scheme scheme);

#endif
