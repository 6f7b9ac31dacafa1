/*
 * The CUDA backend: moves checkpoint bytes into device memory on the
 * caller's stream, inside a PyTorch (or any CUDA) process.
 *
 * Data paths of copy(dst, src, stream), dst always device memory:
 *
 *   src on the device, contiguous, same dtype   -> a row of the batch table
 *                                                  (peer device: cudaMemcpyPeerAsync)
 *   src pinned, contiguous, >= h2d_min bytes    -> cudaMemcpyAsync (copy engine)
 *   src pinned, contiguous, smaller             -> a row of the batch table
 *   src device or pinned, strided or cast       -> the strided-copy kernel
 *   src pageable (CPU)                          -> memcpy into a pinned chunk of
 *                                                  the stream's ring (worker threads
 *                                                  for large pieces), then as pinned
 *   src pageable, contiguous, cast, <= a slice  -> the same, converted from the
 *                                                  ring by the copy kernel (deferred:
 *                                                  a BF16 scale does not stall the ring)
 *
 * Batched rows (src, dst, bytes) collect in a pinned table per stream and go
 * out as ONE kernel launch at flush (or when the table fills): the table is
 * copied to the device and the kernel copies every row, one block a row.
 * Each stream has two pinned tables used in turn, so a flush never rewrites
 * a table whose upload may still be in flight.
 *
 * Undo saves into device memory (the context's budget), of any size, and
 * saves into pinned memory smaller than save_min are rows of a separate
 * save table whose pending rows launch before the copy rows of the same
 * flush; larger pinned saves are one cudaMemcpyAsync each, issued at once
 * on the queue's save stream beside it (save_side), so the PCIe link
 * carries a save to the host while the copy of the tensor before it comes
 * in: the save stream first waits for the stream's work before the
 * update's first save, and the stream waits for each save's event before
 * anything issued after it (a marker among the deferred slices, when
 * slices of earlier tensors still wait to be issued).
 * Any copy the backend issues at once (memcpy, kernel, memset) first
 * launches the pending save rows (launch_saves: no table switch, no wait),
 * so a save always reads the bytes before the txn's first write to them.
 *
 * Contract (backend.h): a pageable src is consumed before copy() returns; a
 * device or pinned src must stay valid until the stream's flush + sync
 * (refit_finalize / refit_abort). Nothing here synchronizes the device:
 * only sync() waits, for one stream, and a host wait on an event happens
 * only when a pinned chunk or table is reused.
 *
 * Memory held: per stream a device table and two pinned tables
 * (2 x 2 x table_rows x 24 bytes), and, once a pageable source is seen,
 * ring_chunks x ring_chunk_bytes of pinned memory (on the device's NUMA
 * node when placed, cuda_ring.c). Device staging blocks and
 * pinned undo chunks are kept for reuse up to staging_cache / undo_cache
 * bytes; beyond that they are freed. Staging in use is bounded by the
 * context's staging budget (the transaction checks it before allocating).
 *
 * The backend table has no context argument, so its state is one
 * process-wide object guarded by one mutex (the only global mutable state
 * in librefit; see docs/cuda.md).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "core/cuda/backend_cuda_internal.h"
#include "core/cuda/kern_cuda.h"
#include "core/cuda/ring_trace.h"
#include "core/cuda/scatter.h"
#include "kernels/copy.h"

size_t env_size(const char *name, size_t def, size_t unit, size_t lo, size_t hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || x > hi / unit || x * unit < lo)
        return def;
    return (size_t)x * unit;
}

static void cfg_load(cuda_cfg *c)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* MEASURED.md (16-core H200 VM): page cache -> pinned peaks at 12
     * threads (29-34 GB/s; 8: 26-29, 15: 24-37) */
    size_t def_threads = ncpu >= 14 ? 12 : ncpu > 2 ? (size_t)(ncpu > 9 ? 8 : ncpu - 1) : 1;
    c->table_rows = (uint32_t)env_size("REFIT_CUDA_TABLE_ROWS", 65536, 1, 64, 1u << 22);
    c->row_max = env_size("REFIT_CUDA_ROW_KB", 64 * KIB, KIB, 4 * KIB, 64 * MIB);
    c->h2d_min = env_size("REFIT_CUDA_H2D_MIN_KB", 64 * KIB, KIB, 0, SIZE_MAX / 2);
    /* a device piece this large goes to cudaMemcpyAsync, the driver's D2D copy
     * (~7% faster than the batch kernel: 1.40 against 1.51 ms for 3 GB), which
     * costs a gap of ~3 us a call: worth it from ~75 MB (docs/cuda.md) */
    c->d2d_memcpy_min = env_size("REFIT_CUDA_D2D_MEMCPY_MIN_KB", D2D_MEMCPY_MIN, KIB, 0,
                                 SIZE_MAX / 2);
    c->save_min = env_size("REFIT_CUDA_SAVE_MIN_KB", 64 * KIB, KIB, 0, SIZE_MAX / 2);
    c->save_dev_memcpy_min = env_size("REFIT_CUDA_SAVE_DEV_MEMCPY_MIN_KB", D2D_MEMCPY_MIN,
                                      KIB, 0, SIZE_MAX / 2);
    c->save_side = (int)env_size("REFIT_CUDA_SAVE_SIDE", 1, 1, 0, 1);
    c->ring_chunks = (uint32_t)env_size("REFIT_CUDA_RING_CHUNKS", 8, 1, 2, MAX_RING);
    c->ring_chunk_bytes = env_size("REFIT_CUDA_RING_CHUNK_MB", 16 * MIB, MIB, MIB, 4096 * MIB);
    c->staging_cache = env_size("REFIT_CUDA_STAGING_CACHE_MB", 1024 * MIB, MIB, 0, SIZE_MAX / 2);
    c->undo_cache = env_size("REFIT_CUDA_UNDO_CACHE_MB", 0, MIB, 0, SIZE_MAX / 2);
    c->threads = (int)env_size("REFIT_CUDA_COPY_THREADS", def_threads, 1, 0, 64);
    c->populate = (int)env_size("REFIT_CUDA_POPULATE", 1, 1, 0, 1);
    c->batch_variant = (int)env_size("REFIT_CUDA_BATCH_VARIANT", 1, 1, 0, 3);
    c->batch_grid = (int)env_size("REFIT_CUDA_BATCH_GRID", 0, 1, 0, 1 << 20);
    c->table_upload = (int)env_size("REFIT_CUDA_TABLE_UPLOAD", 0, 1, 0, 1);
    c->flush_bytes = env_size("REFIT_CUDA_FLUSH_MB", 64 * MIB, MIB, MIB, SIZE_MAX / 2);
    c->flush_growth = env_size("REFIT_CUDA_FLUSH_GROWTH", 2, 1, 1, 16);
    c->nt_stores = (int)env_size("REFIT_CUDA_NT_STORES", 0, 1, 0, 1);
    c->defer = (int)env_size("REFIT_CUDA_DEFER", 1, 1, 0, 1);
    c->defer_slice = env_size("REFIT_CUDA_DEFER_SLICE_KB", 2 * MIB, KIB, 64 * KIB, 64 * MIB);
    c->time_dma = (int)env_size("REFIT_CUDA_TIME_DMA", 0, 1, 0, 1);
    c->drain_poll = (int)env_size("REFIT_CUDA_DRAIN_POLL", 1, 1, 0, 1);
    c->caller_copies = (int)env_size("REFIT_CUDA_CALLER_COPIES", 0, 1, 0, 1);
    kern_copy_batch_variant(c->batch_variant, c->batch_grid);
    ring_trace_init();
    c->row_max &= ~(size_t)15; /* rows keep their pointers' alignment */
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- errors ---- */

static _Thread_local char last_error[512];

const char *backend_cuda_last_error(void)
{
    return last_error;
}

int cu_fail(cudaError_t e, const char *what)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s: %s (%s)", what,
             cudaGetErrorString(e), cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

/* A kernel wrapper failed: keep its message. */
int kern_fail(int rc)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s", kern_cuda_last_error());
    return rc;
}

int fail(int rc, const char *what)
{
    snprintf(last_error, sizeof last_error, "CUDA backend: %s", what);
    return rc;
}

/* ---- process-wide state (its types: backend_cuda_internal.h) ---- */

struct cuda_state G = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER,
                       .undo = {.pinned = true}};

static void probe(void)
{
    cfg_load(&G.cfg);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(G.why, sizeof G.why, "the CUDA runtime found no usable device: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError();
        return;
    }
    if (n == 0) {
        snprintf(G.why, sizeof G.why, "the CUDA runtime found no device");
        return;
    }
    int uva = 0, reg = 0;
    if (cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&reg, cudaDevAttrCanUseHostPointerForRegisteredMem, 0) !=
            cudaSuccess)
        (void)cudaGetLastError();
    G.host_ptr_is_dev = uva != 0;
    G.ndev = n;
}

const backend *backend_cuda_get(void)
{
    pthread_once(&G.once, probe);
    return G.ndev > 0 ? &backend_cuda : NULL;
}

const char *backend_cuda_unavailable(void)
{
    pthread_once(&G.once, probe);
    return G.why;
}

int backend_cuda_device_count(void)
{
    pthread_once(&G.once, probe);
    return G.ndev;
}

void backend_cuda_allocs_get(backend_cuda_allocs *out)
{
    pthread_mutex_lock(&G.mu);
    *out = G.allocs;
    pthread_mutex_unlock(&G.mu);
}

void backend_cuda_stats_get(backend_cuda_stats *out)
{
    pthread_mutex_lock(&G.mu);
    dma_timing_resolve();
    *out = G.stats;
    out->queues = (uint64_t)G.nq;
    pthread_mutex_unlock(&G.mu);
}

void lock_raw(void)
{
    pthread_once(&G.once, probe);
    pthread_mutex_lock(&G.mu);
}

/* Every entry point but a deferrable copy: deferred slices go out first,
 * so the caller's stream order holds. */
void lock(void)
{
    lock_raw();
    defer_settle_all();
}

void unlock(void)
{
    pthread_mutex_unlock(&G.mu);
}

int dev_enter(devg *g, int dev)
{
    g->changed = false;
    cudaError_t e = cudaGetDevice(&g->prev);
    if (e == cudaSuccess && g->prev != dev) {
        e = cudaSetDevice(dev);
        g->changed = e == cudaSuccess;
    }
    return e == cudaSuccess ? REFIT_OK : cu_fail(e, "selecting the device");
}

void dev_leave(const devg *g)
{
    if (g->changed)
        (void)cudaSetDevice(g->prev);
}

/* ---- the GPU service's device work ---- */

/* Device work of the GPU service (core/cuda/gpu_service.c) on device dev,
 * ordered on stream after the staged copies and undo saves queued there. */
int backend_cuda_run(int dev, void *stream, int (*launch)(void *arg, void *stream), void *arg)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return fail(REFIT_EINVAL, "no such device");
    lock();
    devg g;
    cq *qq;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&qq, stream, dev);
        if (!rc)
            rc = queue_flush(qq);
        if (!rc && (rc = launch(arg, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

const backend backend_cuda = {
    .name = "cuda",
    .can_read = cuda_can_read,
    .copy = cuda_copy,
    .flush = cuda_flush,
    .zero = cuda_zero,
    .fingerprint = cuda_fingerprint,
    .staging_alloc = cuda_staging_alloc,
    .staging_free = cuda_staging_free,
    .undo_alloc = cuda_undo_alloc,
    .undo_free = cuda_undo_free,
    .save = cuda_save,
    .restore = cuda_restore,
    .sync = cuda_sync,
    .last_error = backend_cuda_last_error,
    .hold_host_sources = cuda_hold_host_sources,
    .undo_dev_alloc = cuda_undo_dev_alloc,
    .undo_dev_free = cuda_undo_dev_free,
    .save_dev = cuda_save_dev,
    .restore_dev = cuda_restore_dev,
    .scatter = backend_cuda_scatter,
};

/* ---- fingerprint into device memory (the NCCL transport's checksums) ---- */

typedef struct fp_to_arg {
    const refit_view *v;
    void *dst;
} fp_to_arg;

static int fp_to_launch(void *arg, void *stream)
{
    const fp_to_arg *a = arg;
    return kern_fingerprint_to_cuda(a->v, a->dst, stream);
}

int backend_cuda_fingerprint_to(void *dst, const refit_view *v, void *stream)
{
    if (v->device.device_type != REFIT_DEVICE_CUDA)
        return fail(REFIT_EUNSUPPORTED, "fingerprint_to: the view is not device memory");
    fp_to_arg a = {v, dst};
    return backend_cuda_run(v->device.device_id, stream, fp_to_launch, &a);
}
