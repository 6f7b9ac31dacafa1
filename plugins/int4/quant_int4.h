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

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <refit/format.h>
#include <refit/sdk/minifloat.h>

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

/* ---- online quantization: round-to-nearest, symmetric, per group ----
 *
 * The compressed-tensors convention for symmetric INT4 (calculate_qparams
 * and _quantize of its quantization code), per row i and group g of
 * `group` columns (group 0: the whole row), everything in f32:
 *
 *   amax  = max |x| over the group (0 counts: min <= 0 <= max)
 *   scale = amax / 7.5 (bit range 15 / 2), correctly rounded, then rounded
 *           (to nearest even) to the scale tensor's dtype; a scale that is
 *           0 there becomes that dtype's machine epsilon (f32 2^-23, f16
 *           2^-10, bf16 2^-7), so no division by zero
 *   q     = round_half_even(clamp(x / scale, -8, 7)), x / scale correctly
 *           rounded, scale the stored value
 *
 * and w = q * scale is what an engine dequantizes. The codes are packed as
 * the checkpoint packs them (q + 8, 8 per word along K, low nibble first,
 * a ragged last word padded with code 0). The two functions below hold
 * this arithmetic for the CPU reference and the CUDA kernel alike
 * (plugins/int4/quant_int4.cu), so the two give the same bits. */
/* Scale dtypes, as kinds: 0 f32, 1 f16, 2 bf16. */
#define KERN_INT4_SCALE_OVERFLOW 0xffffffffu

/* The stored scale's bits (low 16 bits for f16/bf16) of a group whose
 * amax is `amax` (finite, >= 0), or KERN_INT4_SCALE_OVERFLOW when it is
 * past the dtype's range (f16: amax > ~491k). */
REFIT_HD uint32_t kern_int4_scale_bits(float amax, int kind)
{
    float s = amax / 7.5f;
    uint32_t b;
    if (kind == 1) {
        b = refit_mf_bits_f32_to_f16(refit_mf_f32_bits(s));
        if ((b & 0x7fffu) >= 0x7c00u)
            return KERN_INT4_SCALE_OVERFLOW;
        return (b & 0x7fffu) ? b : 0x1400u; /* 2^-10 */
    }
    if (kind == 2) {
        b = refit_mf_bits_f32_to_bf16(refit_mf_f32_bits(s));
        if ((b & 0x7fffu) >= 0x7f80u)
            return KERN_INT4_SCALE_OVERFLOW;
        return (b & 0x7fffu) ? b : 0x3c00u; /* 2^-7 */
    }
    b = refit_mf_f32_bits(s);
    return (b & 0x7fffffffu) ? b : 0x34000000u; /* 2^-23 */
}

/* The stored scale as f32. */
REFIT_HD float kern_int4_scale_value(uint32_t bits, int kind)
{
    uint32_t f = kind == 1 ? refit_mf_bits_f16_to_f32((uint16_t)bits)
                 : kind == 2 ? refit_mf_bits_bf16_to_f32((uint16_t)bits) : bits;
    return refit_mf_bits_f32(f);
}

/* The 4-bit code (q + 8, 0..15) of x under scale s (finite, > 0). */
REFIT_HD uint32_t kern_int4_encode(float x, float s)
{
    float v = x / s;
    v = v < -8.0f ? -8.0f : v > 7.0f ? 7.0f : v;
    return (uint32_t)((int)rintf(v) + 8);
}

/* Quantize x (2-D [n, k], F32/F16/BF16, any strides) into q, an I32 view
 * [n, ceil(k/8)] in checkpoint layout (any strides: the gptq layout's
 * transposed words, or the u8 layout's byte rows seen as words), and its
 * scales into scale ([n, ceil(k/group)], or [n, 1] for group 0; F32/F16/
 * BF16, any strides). Row by row: every scale of the row, then its words
 * (reading the row's stored scales back). Returns REFIT_OK;
 * REFIT_ECORRUPT when a group holds a NaN or infinity or its scale
 * overflows the scale dtype (rows before it written); REFIT_EMISMATCH
 * (shapes, group < 0); REFIT_EUNSUPPORTED (dtypes). */
int kern_quant_int4(const refit_view *q, const refit_view *scale, const refit_view *x,
                    int64_t group);
/* The checks kern_quant_int4 makes before writing anything (same
 * returns), for the host services that hand the views to a device. */
int kern_quant_int4_check(const refit_view *q, const refit_view *scale, const refit_view *x,
                          int64_t group);
/* 0 f32, 1 f16, 2 bf16; -1 for any other dtype. */
int kern_int4_float_kind(refit_dtype d);

#endif
