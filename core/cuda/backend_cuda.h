/* The CUDA backend: device memory, the caller's stream. Built where nvcc
 * exists (REFIT_HAVE_CUDA), used where a device exists. docs/cuda.md
 * describes the data paths, the memory it holds and its tunables. */
#ifndef REFIT_CORE_CUDA_BACKEND_CUDA_H
#define REFIT_CORE_CUDA_BACKEND_CUDA_H

#include <refit/sys/cuda.h>
#include "core/backend.h"

extern const backend backend_cuda;

/* &backend_cuda when the CUDA runtime finds a device in this process,
 * else NULL (backend_cuda_unavailable() says why). Probes once. */
const backend *backend_cuda_get(void);
/* Why no device can be used ("" when one can). */
const char *backend_cuda_unavailable(void);
/* Devices the runtime sees (0 when none or no driver). */
int backend_cuda_device_count(void);
/* What the last failing CUDA backend call on this thread reported. */
const char *backend_cuda_last_error(void);

/* Run launch(arg, stream) on device dev (made current), ordered on stream
 * after whatever copy() and save() queued there, under the backend's lock:
 * how the GPU service (core/cuda/gpu_service.c) reaches the device. launch returns a refit status; a failure's CUDA message is
 * backend_cuda_last_error(). Never synchronizes unless launch does. */
int backend_cuda_run(int dev, void *stream, int (*launch)(void *arg, void *stream), void *arg);

/* Make now what the first work on (stream, device dev) would: its queue
 * (pinned tables, events), with REFIT_SYS_CUDA_PREPARE_SAVES its save
 * stream, with REFIT_SYS_CUDA_PREPARE_RING every pinned ring chunk
 * (refit_sys_cuda_prepare). */
int backend_cuda_prepare(int dev, void *stream, unsigned what);

/* Counters since the process started, for tests and benchmarks: the
 * struct refit/sys/cuda.h publishes (refit_sys_cuda_stats_get). */
typedef refit_sys_cuda_stats backend_cuda_stats;
void backend_cuda_stats_get(backend_cuda_stats *out);

/* What the backend allocated since the process started, for tests that
 * ask which update paid for memory (counts of calls; bytes where said). */
typedef struct backend_cuda_allocs {
    uint64_t undo_pinned, undo_pinned_bytes; /* cudaHostAlloc for the undo log */
    uint64_t undo_device, undo_device_bytes; /* cudaMalloc for the undo log */
    uint64_t staging;           /* cudaMalloc for staging blocks */
    uint64_t queues;            /* (stream, device) queues: their pinned tables, events */
    uint64_t ring_chunks;       /* pinned chunks of a queue's ring (pageable sources) */
    uint64_t side_streams;      /* save streams with their events */
} backend_cuda_allocs;
void backend_cuda_allocs_get(backend_cuda_allocs *out);

/* kern_fingerprint_to_cuda on the device of v (CUDA memory), ordered on
 * stream after whatever copy() and save() queued there: the fingerprint of
 * v lands in the 8 bytes at dst (device memory of that device, or mapped
 * pinned memory; 8-byte aligned). Never waits: the NCCL transport stamps a
 * bucket's payload checksum on the device before its broadcast, and a
 * receiver sums each bucket for one comparison at the end. */
int backend_cuda_fingerprint_to(void *dst, const refit_view *v, void *stream);

#endif
