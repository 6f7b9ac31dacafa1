/* The core's CUDA kernels (kernels/copy.cu, kernels/fingerprint.cu),
 * declared for C callers: the CUDA backend and the GPU tests. Same names
 * as the host references in kernels/copy.h and kernels/fingerprint.h with
 * a _cuda suffix, same results bit for bit (formats' kernels are their
 * plugins': plugins/<fmt>/). Every pointer must be readable by the device (device
 * memory, or mapped pinned host memory); every call is ordered on stream (a
 * cudaStream_t; NULL = the legacy default stream) and returns without
 * waiting, except the fingerprint, which returns a value.
 * Failures return REFIT_ENOMEM or REFIT_EINTERNAL, and
 * kern_cuda_last_error() says what the CUDA runtime reported. */
#ifndef REFIT_CORE_CUDA_KERN_CUDA_H
#define REFIT_CORE_CUDA_KERN_CUDA_H

#include <stdint.h>

#include <refit/format.h>

#include "kernels/scatter.h"

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

/* The scatter of kernels/scatter.h (kernels/scatter.cu), every pointer of
 * s device-readable; with s->counts, vstart[i] (device-readable) is the
 * index of run i's first value. Bit for bit kern_scatter_host. */
int kern_scatter_cuda(const kern_scatter *s, const int64_t *vstart, void *stream);

/* What the last failing call on this thread reported ("" if none). */
const char *kern_cuda_last_error(void);
void kern_cuda_set_error(const char *msg);

#ifdef __cplusplus
}
#endif
#endif
