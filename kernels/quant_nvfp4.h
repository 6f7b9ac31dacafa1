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

#endif
