/* Scatter: elements of a tensor take values at listed offsets, one by one
 * or in runs, the old bytes of each written element optionally gathered
 * first in the same pass (the undo log's save of a patch). The host
 * reference here; the CUDA one is kern_scatter_cuda (core/cuda/kern_cuda.h,
 * kernels/scatter.cu), bit for bit the same. */
#ifndef REFIT_KERNELS_SCATTER_H
#define REFIT_KERNELS_SCATTER_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Offsets count elements of dst_dtype from dst; no element is written
 * twice. Without counts, element off[i] takes value i (off[i] < 0: value i
 * is skipped, another rank's). With counts, run i is counts[i] elements
 * from off[i], run_stride elements apart, taking the next counts[i] values
 * (off[i] < 0: those values are skipped). With old, the bytes each written
 * element held land there first, in the values' order (a skipped value's
 * slot is left as it was). Values are cast as kern_copy casts. */
typedef struct kern_scatter {
    char *dst;
    refit_device dst_device;
    refit_dtype dst_dtype;
    const int64_t *off;         /* n offsets (run starts) */
    const int64_t *counts;      /* n run lengths; NULL: one element each */
    size_t n;
    int64_t run_stride;         /* elements between a run's elements (>= 1) */
    int64_t elements;           /* values: n, or the sum of counts */
    const void *values;         /* `elements` of values_dtype */
    refit_dtype values_dtype;
    refit_device values_device;
    int64_t values_stride;      /* elements between consecutive values (>= 1) */
    void *old;                  /* NULL, or elements * size of dst_dtype bytes */
    int old_on_device;          /* (backends) old is device undo memory, else host */
    int arrays_held;            /* (backends) off and counts stay valid until the
                                   stream is synchronized (the undo log's copy):
                                   a device may read them after the call returns */
} kern_scatter;

/* The scatter on host memory. REFIT_OK, or REFIT_EUNSUPPORTED when the
 * dtypes have no cast (kern_can_cast). */
int kern_scatter_host(const kern_scatter *s);

#ifdef __cplusplus
}
#endif
#endif
