/* The CUDA backend's scatter (backend.h .scatter; kernels/scatter.h). */
#ifndef REFIT_CORE_CUDA_SCATTER_H
#define REFIT_CORE_CUDA_SCATTER_H

#include "core/backend.h"

/* s on the device of s->dst, ordered on stream after the copies and
 * saves the backend queued there (backend_cuda_run), one kernel launch.
 * Values the device can read (device memory, mapped pinned memory) and
 * offsets and counts the undo log holds (s->arrays_held, its pinned
 * chunks) are read in place; other offsets and counts (the caller's, read
 * before this returns), pageable values, and values on another device are
 * staged first in stream-ordered device memory (cudaMallocAsync, freed on
 * the stream after the kernel), the pageable ones packed into one copy.
 * Never waits. */
int backend_cuda_scatter(const backend_scatter *s, void *stream);

#endif
