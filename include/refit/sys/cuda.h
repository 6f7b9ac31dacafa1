/* refit/sys: the CUDA backend seen from a bench (docs/abi.md: exported
 * and versioned like the API, but a counter may change meaning or go away
 * in a minor release, said in the release notes). In a build without CUDA
 * every function is there and says so: the counters stay zero, a run is
 * REFIT_EUNSUPPORTED. */
#ifndef REFIT_SYS_CUDA_H
#define REFIT_SYS_CUDA_H

#include <stdint.h>

#include <refit/refit.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend's counters since the process started. */
typedef struct refit_sys_cuda_stats {
    uint64_t batch_launches;    /* kernel launches of batched rows */
    uint64_t batch_rows;        /* rows they carried */
    uint64_t memcpy_calls;      /* cudaMemcpyAsync / Peer issued for copies and saves */
    uint64_t kernel_copies;     /* strided or cast copies */
    uint64_t pageable_bytes;    /* bytes staged through the pinned ring */
    uint64_t ring_waits;        /* times a pinned chunk was waited for */
    uint64_t host_copy_ns;      /* spent copying pageable sources into pinned chunks */
    uint64_t prefault_ns;       /* of which prefaulting their pages */
    uint64_t ring_wait_ns;      /* spent waiting for a pinned chunk to drain */
    uint64_t queues;            /* (stream, device) pairs work was queued on */
    /* appended 2026-12-02: ring_wait_ns split, and the ring's copy-engine time */
    uint64_t ring_fill_wait_ns; /* of ring_wait_ns: waiting for a chunk's slices to be filled */
    uint64_t ring_drain_ns;     /* of ring_wait_ns: waiting for a chunk's H2D copies to end */
    uint64_t ring_dma_ns;       /* GPU time of the ring's H2D copies (REFIT_CUDA_TIME_DMA=1,
                                 * else 0): each timed by an event pair on its stream */
    uint64_t ring_dma_bytes;    /* bytes those timed copies moved */
} refit_sys_cuda_stats;

/* *out = the counters now (all zero without CUDA). */
REFIT_API void refit_sys_cuda_stats_get(refit_sys_cuda_stats *out);

/* launch(arg, stream) on device dev (made current), ordered on stream (a
 * cudaStream_t; NULL the legacy default stream) after what the backend
 * queued there, under the backend's lock: how the GPU service runs a
 * format's kernel, so a bench times a kernel the way a reload runs it.
 * launch returns a refit status. REFIT_EINVAL for no such device,
 * REFIT_EUNSUPPORTED without CUDA; on a failure
 * refit_sys_cuda_last_error() says what the backend saw. */
REFIT_API int refit_sys_cuda_run(int dev, void *stream, int (*launch)(void *arg, void *stream),
                                 void *arg);

/* Allocate now what the first update on stream (a cudaStream_t; NULL the
 * legacy default stream) and device dev would otherwise allocate inside
 * it: the stream's queue (two pinned tables of 2 x table_rows x 24 bytes,
 * events) always; with REFIT_SYS_CUDA_PREPARE_SAVES the save stream of
 * host undo saves and its events; with REFIT_SYS_CUDA_PREPARE_RING the
 * ring's ring_chunks x ring_chunk_bytes of pinned memory (128 MiB by
 * default) that pageable sources (files) are copied through. An engine
 * calls it once at startup, after seal, for the stream it loads on; held
 * for the process, as the first update would hold them (docs/cuda.md
 * "Memory held"). REFIT_EINVAL for no such device, REFIT_EUNSUPPORTED
 * without CUDA, else a CUDA failure (refit_sys_cuda_last_error). */
#define REFIT_SYS_CUDA_PREPARE_SAVES 1u
#define REFIT_SYS_CUDA_PREPARE_RING 2u
REFIT_API int refit_sys_cuda_prepare(int dev, void *stream, unsigned what);

/* What the last failing CUDA backend call on this thread reported ("" if
 * none; "built without CUDA" in such a build). Never NULL. */
REFIT_API const char *refit_sys_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
