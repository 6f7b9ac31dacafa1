/* The CUDA kernels (kernels/copy.cu, kernels/fingerprint.cu,
 * plugins/fp8/quant_fp8.cu), declared for C callers: the CUDA backend and the
 * GPU tests. Same names as the host references in kernels/copy.h,
 * kernels/fingerprint.h and plugins/fp8/quant_fp8.h with a _cuda suffix, same
 * results bit for bit. Every pointer must be readable by the device (device
 * memory, or mapped pinned host memory); every call is ordered on stream (a
 * cudaStream_t; NULL = the legacy default stream) and returns without
 * waiting, except the fingerprint, which returns a value, and the
 * quantization, which reports non-finite input.
 * Failures return REFIT_ENOMEM or REFIT_EINTERNAL, and
 * kern_cuda_last_error() says what the CUDA runtime reported. */
#ifndef REFIT_CORE_CUDA_KERN_CUDA_H
#define REFIT_CORE_CUDA_KERN_CUDA_H

#include <stdint.h>

#include <refit/format.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One contiguous piece of a batched copy (layout shared with copy.cu). */
typedef struct kern_batch_row {
    uint64_t src;
    uint64_t dst;
    uint64_t bytes;
} kern_batch_row;

/* dst <- src, same shape, any strides, F32/F16/BF16 casts (kern_copy). */
int kern_copy_cuda(const refit_view *dst, const refit_view *src, void *stream);
/* Every element of dst to zero bytes (kern_zero). */
int kern_zero_cuda(const refit_view *dst, void *stream);
/* Every row of a device-readable table, in one kernel launch. Rows must
 * not overlap each other's destinations. */
int kern_copy_batch_cuda(const void *rows, uint32_t n, void *stream);
/* Code path of the batched copy: 0 four 16-byte loads in flight per thread,
 * 1 eight, 2 four with streaming (evict-first) hints, 3 eight streaming;
 * grid: blocks per launch, each taking rows in turn (0: one block a row). */
void kern_copy_batch_variant(int v, int grid);
/* kern_fingerprint_view of a device-readable view; waits for stream. */
int kern_fingerprint_view_cuda(const refit_view *v, uint64_t *out, void *stream);
/* The same fingerprint into the 8 bytes at dst (device-writable, 8-byte
 * aligned, as a little-endian word), ordered on stream; never waits and
 * allocates nothing (a zeroing memset and two launches). */
int kern_fingerprint_to_cuda(const refit_view *v, uint64_t *dst, void *stream);

/* FP8 E4M3 quantization of n pieces (plugins/fp8/quant_fp8.cu), bit for bit
 * kern_quant_fp8 on each: piece i is x[i] (2-D, F32/F16/BF16) into q[i]
 * (2-D, one-byte elements) and its scales scale[i] (2-D F32, the shape
 * kern_fp8_scale_shape gives), any strides; scheme: kern_fp8_scheme.
 * Per-tensor pieces whose scale views start at the same element share one
 * scale, the amax taken over all of them. Every view device-readable.
 * hw: encode with the hardware's cvt.rn.satfinite.e4m3x2.f32 instead of
 * the integer encoder; pass 1 only where kern_fp8_cvt_check_cuda found no
 * difference on this device. Enqueues everything on stream, then waits for
 * the stream once (to report non-finite input). Returns REFIT_OK;
 * REFIT_ECORRUPT with *bad the lowest piece holding a NaN or infinity
 * (outputs partly written; that piece's group keeps its old scale and
 * bytes); REFIT_EUNSUPPORTED / EMISMATCH (dtypes, ranks; *bad the piece);
 * REFIT_EINVAL, ENOMEM, EINTERNAL. */
int kern_quant_fp8_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                        const refit_view *x, int scheme, int hw, int32_t *bad, void *stream);
/* The hardware conversion against kern_f32_to_e4m3_sat on every finite f32
 * (and the byte order of its pairs), on the current device: *mismatches
 * differing inputs, *first the smallest (magnitude bits) or 0xffffffff.
 * Takes a few milliseconds; waits for stream. */
int kern_fp8_cvt_check_cuda(uint64_t *mismatches, uint32_t *first, void *stream);

/* INT4 quantization of n pieces (plugins/int4/quant_int4.cu), bit for bit
 * kern_quant_int4 on each: piece i is x[i] (2-D [n_i, k_i], F32/F16/BF16)
 * into q[i] (I32 [n_i, ceil(k_i/8)], checkpoint layout) and scale[i]
 * ([n_i, ceil(k_i/group)], [n_i, 1] for group 0; F32/F16/BF16), any
 * strides, every view device-readable. One launch for up to 256 pieces;
 * then waits for stream once (to report non-finite input). Returns
 * REFIT_OK; REFIT_ECORRUPT with *bad the lowest piece holding a NaN or
 * infinity or a scale past the scale dtype's range (that group unwritten,
 * the rest written); REFIT_EUNSUPPORTED / EMISMATCH (views; *bad the
 * piece), REFIT_EINVAL (group < 0), ENOMEM, EINTERNAL. */
int kern_quant_int4_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                         const refit_view *x, int64_t group, int32_t *bad, void *stream);

/* OCP MX quantization of n pieces (plugins/mxfp8/quant_mx.cu), bit for bit
 * kern_quant_mxfp8 (elem_bits 8: q[i] [n_i, k_i] E4M3, any strides) or
 * kern_quant_mxfp4 (elem_bits 4: q[i] [n_i, ceil(k_i/2)] packed E2M1,
 * rows contiguous) on each: x[i] 2-D F32/F16/BF16, scales[i] 8-bit
 * [n_i, ceil(k_i/32)], any strides, every view device-readable. hw (MXFP8
 * only): E4M3 by cvt.rn.satfinite.e4m3x2.f32; pass 1 only where
 * kern_fp8_cvt_check_cuda found it equal to the encoder. One launch for up
 * to 184 pieces (evenly spaced pieces of one shape merge into one), then
 * waits for stream once (to report non-finite input). Returns REFIT_OK;
 * REFIT_ECORRUPT with *bad the lowest piece holding a NaN or infinity (its
 * blocks holding one unwritten, the rest written); REFIT_EUNSUPPORTED /
 * EMISMATCH (views; *bad the piece), REFIT_EINVAL, ENOMEM, EINTERNAL. */
int kern_quant_mx_cuda(uint32_t n, const refit_view *q, const refit_view *scales,
                       const refit_view *x, int elem_bits, int hw, int32_t *bad, void *stream);

/* What the last failing call on this thread reported ("" if none). */
const char *kern_cuda_last_error(void);
void kern_cuda_set_error(const char *msg);

#ifdef __cplusplus
}
#endif
#endif
