/* NVFP4 host reference kernels, and the E2M1 packing shared with MXFP4.
 *
 * Packing: two E2M1 codes per byte along the row, element 2i in the low
 * nibble of byte i, element 2i+1 in the high nibble. A row of odd length
 * ends in a byte whose high nibble is 0.
 *
 * Block scales: one scale per KERN_NVFP4_BLOCK (16) elements of a row,
 * E4M3 for NVFP4 (E8M0 per 32 for MXFP4). Dequantization of element j of
 * row i: e2m1(q) * scale[i][j / block] * mul / div, in f32 and in that
 * order (mul/div carry the per-tensor factor: ModelOpt's weight_scale_2 is
 * a multiplier, compressed-tensors' weight_global_scale a divisor).
 *
 * Swizzled scales: the 128x4 tile layout that CUTLASS block-scaled GEMMs
 * (and FlashInfer/vLLM, which pad and permute for them) read. The [R, C]
 * scale matrix is padded with zeros to [Rp, Cp] = [ceil(R/128)*128,
 * ceil(C/4)*4] and laid out as the row-major array
 *   [Rp/128][Cp/4][32][4][4]  indexed by  [r/128][c/4][r%32][(r%128)/32][c%4]
 * i.e. each 128x4 tile is 512 contiguous bytes in which the four 32-row
 * slices are interleaved column-block by column-block. */
#ifndef REFIT_KERNELS_QUANT_NVFP4_H
#define REFIT_KERNELS_QUANT_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

#define KERN_NVFP4_BLOCK 16
#define KERN_SWIZZLE_ROWS 128
#define KERN_SWIZZLE_COLS 4

/* E2M1 code (0..15) of element j of a packed row. */
uint8_t kern_fp4_get(const uint8_t *row, int64_t j);
/* Set element j of a packed row to code (low 4 bits used). */
void kern_fp4_set(uint8_t *row, int64_t j, uint8_t code);
/* Pack n codes into ceil(n/2) bytes (a trailing high nibble is 0). */
void kern_fp4_pack(uint8_t *dst, const uint8_t *codes, int64_t n);
/* Unpack n codes from ceil(n/2) bytes. */
void kern_fp4_unpack(uint8_t *codes, const uint8_t *src, int64_t n);

/* Padded extents of the swizzled layout. */
int64_t kern_swizzle_rows(int64_t rows);
int64_t kern_swizzle_cols(int64_t cols);
/* Byte offset of scale (r, c) in the swizzled array of padded width cols_p. */
int64_t kern_swizzle_offset(int64_t r, int64_t c, int64_t cols_p);
/* dst (contiguous, kern_swizzle_rows(R) * kern_swizzle_cols(C) bytes) <-
 * the swizzled, zero-padded form of src, a [R, C] view of 8-bit elements
 * with any strides. Every byte of dst is written. */
void kern_swizzle(uint8_t *dst, const refit_view *src);
/* dst, a [R, C] view of 8-bit elements, <- the scales held in the swizzled
 * array src of padded width kern_swizzle_cols(C). */
void kern_unswizzle(const refit_view *dst, const uint8_t *src);

/* Scale codecs for kern_fp4_dequant. */
typedef enum kern_fp4_scale {
    KERN_FP4_SCALE_E4M3 = 0,
    KERN_FP4_SCALE_E8M0 = 1,
} kern_fp4_scale;

/* A block-scaled FP4 matrix in checkpoint layout (any strides). */
typedef struct kern_fp4_src {
    refit_view packed;   /* 8-bit [n, ceil(k/2)] */
    refit_view scale;    /* 8-bit [n, ceil(k/block)] */
    int64_t n, k, block;
    kern_fp4_scale scale_kind;
    float mul, div;      /* per-tensor factor: * mul / div */
} kern_fp4_src;

/* out[i * k + j] = dequantized element (i, j). REFIT_EMISMATCH when the
 * views' shapes do not fit. */
int kern_fp4_dequant(const kern_fp4_src *s, float *out);

/* ---- online quantization (compressed-tensors NVFP4, round to nearest) ----
 *
 * x is a 2-D [n, k] F32/F16/BF16 weight, read as F32 (exact). Every step
 * is one F32 operation rounded to nearest even, in this order (the order
 * of compressed-tensors' generate_gparam, calculate_qparams and
 * _quantize; the CUDA kernel uses __fdiv_rn/__fmul_rn for the same bits):
 *   amax = max |x| over the tensor
 *   gs   = 2688 / amax        (448 * 6: the global scale, a divisor);
 *                             1 when amax == 0, FLT_MAX when it overflows
 *   per block of 16 along a row (a ragged last block has its own scale):
 *   s    = gs * (bmax / 6)    bmax = max |x| over the block
 *   code = e4m3_sat(s), and 0x20 (0.125) when that is zero, as
 *          compressed-tensors replaces a zero E4M3 scale
 *   div  = e4m3(code) / gs
 *   q    = e2m1(x / div)      round to nearest even, saturating to +-6; a
 *                             negative value that rounds to zero keeps its
 *                             sign (0x8), as ml_dtypes and the hardware
 *                             conversion do
 * The runtime factor is alpha = 1 / gs (compressed-tensors without an
 * input scale). Dequantization: e2m1(q) * e4m3(code) / gs
 * (kern_fp4_dequant with div = gs). */
#define KERN_NVFP4_GLOBAL_MAX 2688.0f
#define KERN_NVFP4_ZERO_SCALE 0x20 /* E4M3 0.125 */

/* gs for a finite amax >= 0 (see above). */
float kern_nvfp4_global_scale(float amax);
/* The E4M3 code of a block with max |x| = bmax. */
uint8_t kern_nvfp4_block_scale(float bmax, float gs);
/* q of element x in a block whose divisor is div = e4m3(code) / gs. */
uint8_t kern_nvfp4_encode(float x, float div);

/* Quantize x (2-D [n, k] F32/F16/BF16, any strides) into packed (2-D
 * [n, ceil(k/2)] 8-bit, any strides; an odd k leaves the last byte's high
 * nibble 0), the swizzled block scales (contiguous, kern_swizzle_rows(n) *
 * kern_swizzle_cols(ceil(k/16)) bytes, pad zero) and *alpha = 1 / gs.
 * Every byte of packed and swizzled is written. Returns REFIT_OK,
 * REFIT_EMISMATCH (shapes), REFIT_EUNSUPPORTED (dtypes) or REFIT_ECORRUPT (a
 * NaN or infinity in x: nothing written). */
int kern_quant_nvfp4(const refit_view *packed, uint8_t *swizzled, float *alpha,
                     const refit_view *x);

/* ---- checkpoint factors ---- */

typedef enum kern_nvfp4_conv {
    KERN_NVFP4_MODELOPT = 0, /* weight_scale_2 multiplies, input_scale multiplies */
    KERN_NVFP4_CT = 1,       /* weight_global_scale divides, input_global_scale divides */
} kern_nvfp4_conv;

/* alpha and input_scale_inv from a checkpoint's weight factor wf and input
 * factor in (NULL when absent), with the engines' operations in their
 * order: ModelOpt alpha = in * wf, inv = 1 / in; compressed-tensors alpha =
 * 1 / (in * wf), inv = in; without in, alpha is wf or 1 / wf (and *inv is
 * left alone). */
void kern_nvfp4_fuse(kern_nvfp4_conv conv, float wf, const float *in, float *alpha, float *inv);

#endif
