/* INT4 "pack-quantized" (compressed-tensors) host reference kernels.
 *
 * Packing: 8 signed 4-bit values per int32 word along the packed dim,
 * element j of a word in bits [4j, 4j + 4) (low nibble first), each stored
 * as value + 8 (a code in 0..15). A packed dim whose extent is not a
 * multiple of 8 ends in a word padded with code 0. Weights are packed
 * along K ([N, ceil(K/8)]), asymmetric zero points along N
 * ([ceil(N/8), G]). Dequantization: w = (q - zp) * scale, in f32, where zp
 * is 0 for symmetric checkpoints and scale/zp are per group of `group`
 * columns (group 0: one per row).
 *
 * Also the small shared helpers of the 4-bit formats: reading one element
 * of a strided float view as f32. */
#ifndef REFIT_KERNELS_QUANT_INT4_H
#define REFIT_KERNELS_QUANT_INT4_H

#include <stdint.h>

#include <refit/format.h>

#define KERN_INT4_PER_WORD 8

/* Code (0..15) and signed value (-8..7) of element j (0..7) of a word. */
unsigned kern_int4_code(uint32_t word, int j);
int kern_int4_value(uint32_t word, int j);
/* A word from n (<= 8) signed values in -8..7; the rest padded with code 0. */
uint32_t kern_int4_pack_word(const int8_t *v, int n);

/* Element idx of a 2-D view as f32: F32/F16/BF16 (scales) or I32/I64
 * (shape tensors). Reads through strides; no bounds checks. */
float kern_q4_load_f32(const refit_view *v, int64_t i, int64_t j);
/* One int32 word of a 2-D I32 view, through its strides. */
uint32_t kern_q4_load_u32(const refit_view *v, int64_t i, int64_t j);

/* A checkpoint-layout [rows, cols] view over storage that holds the same
 * elements transposed, as a row-major [cols, rows] tensor of the view's
 * dtype starting at data: element (i, j) lives at data[j * rows + i]. */
refit_view kern_q4_transposed_view(void *data, refit_device dev, refit_dtype dt,
                                   int64_t rows, int64_t cols, int64_t row_pitch);

/* Shard geometry shared by the 4-bit formats: does a slice of `units`
 * packed units of `per` elements (int32 words of 8, bytes of 2, blocks of
 * 32) along a dim agree with a slice of `blocks` scale blocks of `bs`
 * elements along the same dim? full is the unsharded extent in elements
 * when the module declares it, else 0. Sound when every rank checks: with
 * the core's split rule, equal element counts on every rank of an extent
 * that is a whole number of units and blocks give equal offsets. */
typedef enum kern_q4_split {
    KERN_Q4_SPLIT_OK = 0,
    KERN_Q4_SPLIT_CUT = 1,       /* a shard boundary cuts a block (or a unit) */
    KERN_Q4_SPLIT_RAGGED = 2,    /* not a whole number of blocks: needs full */
    KERN_Q4_SPLIT_MISMATCH = 3,  /* the slices disagree with full */
} kern_q4_split;
kern_q4_split kern_q4_split_check(int64_t units, int64_t per, int64_t blocks, int64_t bs,
                                  int64_t full);

/* A quantized INT4 matrix seen in checkpoint layout (any strides). */
typedef struct kern_int4_src {
    refit_view packed;   /* I32 [n, ceil(k/8)] */
    refit_view scale;    /* F32/F16/BF16 [n, G] */
    refit_view zp;       /* I32 [ceil(n/8), G]; ndim 0 = symmetric */
    int64_t n, k;
    int64_t group;       /* columns per scale; 0 = one scale per row */
} kern_int4_src;

/* out[i * k + j] = dequantized element (i, j). Returns REFIT_OK, or
 * REFIT_EMISMATCH when the views' shapes do not fit n, k and group. */
int kern_int4_dequant(const kern_int4_src *s, float *out);

#endif
