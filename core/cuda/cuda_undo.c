/*
 * The CUDA backend's undo (docs/cuda.md): the cached device staging and
 * pinned undo blocks, saves into pinned or device memory (batched rows,
 * or on the save stream beside) and the blocking restores.
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
#include "kernels/copy.h"

/* ---- cached allocations: device staging, pinned undo ---- */

static cudaError_t blk_release(const pool *pl, blk *b)
{
    if (pl->pinned)
        return cudaFreeHost(b->p);
    devg g;
    if (dev_enter(&g, b->device))
        return cudaErrorInvalidDevice;
    cudaError_t e = cudaFree(b->p);
    dev_leave(&g);
    return e;
}

/* Free idle blocks, largest first, until at most cap bytes stay cached. */
static void pool_trim(pool *pl, size_t cap)
{
    while (pl->cached > cap) {
        blk **best = NULL;
        for (blk **pp = &pl->list; *pp; pp = &(*pp)->next)
            if (!(*pp)->busy && (!best || (*pp)->size > (*best)->size))
                best = pp;
        if (!best)
            return;
        blk *b = *best;
        *best = b->next;
        pl->cached -= b->size;
        if (blk_release(pl, b) != cudaSuccess)
            (void)cudaGetLastError();
        free(b);
    }
}

/* A new block; *other_addr: pinned memory whose device address differs
 * (saves then go by cudaMemcpyAsync). Called without the backend's lock,
 * in relaxed capture mode: a thread pinning GBs (core/undo.c's
 * reservation) must neither stall the backend's other callers nor break
 * an engine's CUDA graph capture on another thread (cudaMalloc and
 * cudaHostAlloc are unsafe calls under global capture mode). */
static cudaError_t blk_alloc(const pool *pl, void **p, size_t size, bool *other_addr)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    bool relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    cudaError_t e;
    *other_addr = false;
    if (!pl->pinned) {
        e = cudaMalloc(p, size);
    } else {
        e = cudaHostAlloc(p, size, cudaHostAllocPortable | cudaHostAllocMapped);
        void *d = NULL;
        if (e == cudaSuccess && (cudaHostGetDevicePointer(&d, *p, 0) != cudaSuccess || d != *p)) {
            (void)cudaGetLastError();
            *other_addr = true;
        }
    }
    if (relaxed)
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
    return e;
}

static void *pool_alloc(pool *pl, size_t bytes)
{
    size_t need = ((bytes ? bytes : 1) + 2 * MIB - 1) & ~(2 * MIB - 1);
    int dev = -1;
    lock_raw(); /* an allocation orders nothing: deferred slices stay queued */
    if (!pl->pinned && cudaGetDevice(&dev) != cudaSuccess)
        (void)cudaGetLastError();
    blk *best = NULL;
    for (blk *b = pl->list; b; b = b->next)
        if (!b->busy && b->device == dev && b->size >= need && b->size / 2 <= need &&
            (!best || b->size < best->size))
            best = b;
    void *p = NULL;
    if (best) {
        best->busy = true;
        pl->cached -= best->size;
        p = best->p;
        unlock();
        return p;
    }
    unlock(); /* the allocation itself outside the lock (blk_alloc) */
    blk *b = malloc(sizeof *b);
    bool other_addr = false;
    cudaError_t e = b ? blk_alloc(pl, &p, need, &other_addr) : cudaErrorMemoryAllocation;
    if (b && e == cudaErrorMemoryAllocation) { /* give the cache back, try again */
        (void)cudaGetLastError();
        lock_raw();
        pool_trim(pl, 0);
        unlock();
        e = blk_alloc(pl, &p, need, &other_addr);
    }
    lock_raw();
    if (e != cudaSuccess) {
        cu_fail(e, pl->pinned ? "cudaHostAlloc (undo log)" : "cudaMalloc (staging)");
        free(b);
        p = NULL;
    } else {
        if (other_addr)
            G.host_ptr_is_dev = false;
        *b = (blk){pl->list, p, need, dev, true};
        pl->list = b;
        if (pl->pinned) {
            G.allocs.undo_pinned++;
            G.allocs.undo_pinned_bytes += need;
        } else {
            G.allocs.staging++;
        }
    }
    unlock();
    return p;
}

static void pool_free(pool *pl, void *p, size_t cache_cap)
{
    if (!p)
        return;
    lock();
    for (blk *b = pl->list; b; b = b->next)
        if (b->p == p && b->busy) {
            b->busy = false;
            pl->cached += b->size;
            break;
        }
    pool_trim(pl, cache_cap);
    unlock();
}

void *cuda_staging_alloc(size_t bytes)
{
    return pool_alloc(&G.staging, bytes);
}

void cuda_staging_free(void *p)
{
    pool_free(&G.staging, p, G.cfg.staging_cache);
}

void *cuda_undo_alloc(size_t bytes)
{
    return pool_alloc(&G.undo, bytes);
}

void cuda_undo_free(void *p)
{
    pool_free(&G.undo, p, G.cfg.undo_cache);
}

/* ---- undo: save (async, on stream), restore (blocking) ---- */

/* A save reads only its own region and writes only its fresh undo memory,
 * so it may go before save rows still pending (memcpy_now would flush
 * them and wait for the other table: a host wait per tensor when small
 * and large saves alternate). It still follows every write issued
 * earlier on the stream. */
static int save_now(cq *q, void *dst, const void *src, size_t n)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)q->stream);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync (undo save)");
    G.stats.memcpy_calls++;
    return REFIT_OK;
}

/* The save stream of q, made at its first use. */
static int side_init(cq *q)
{
    if (q->side)
        return REFIT_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&q->side, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&q->fork, cudaEventDisableTiming);
    for (uint32_t i = 0; i < SAVE_EVENTS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&q->save_ev[i], cudaEventDisableTiming);
    if (e == cudaSuccess) {
        G.allocs.side_streams++;
        return REFIT_OK;
    }
    int rc = cu_fail(e, "making the undo save stream");
    if (q->side)
        cudaStreamDestroy(q->side);
    if (q->fork)
        cudaEventDestroy(q->fork);
    for (uint32_t i = 0; i < SAVE_EVENTS; i++)
        if (q->save_ev[i])
            cudaEventDestroy(q->save_ev[i]);
    q->side = NULL;
    q->fork = NULL;
    memset(q->save_ev, 0, sizeof q->save_ev);
    return rc;
}

int backend_cuda_prepare(int dev, void *stream, unsigned what)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return fail(REFIT_EINVAL, "no such device");
    lock();
    devg g;
    cq *q;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&q, stream, dev);
        if (!rc && (what & REFIT_SYS_CUDA_PREPARE_SAVES) && G.cfg.save_side)
            rc = side_init(q);
        for (uint32_t i = 0; !rc && (what & REFIT_SYS_CUDA_PREPARE_RING) &&
                             i < G.cfg.ring_chunks; i++)
            if (!q->ring[i].p)
                rc = chunk_init(q, &q->ring[i]);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* A marker among the deferred slices (of the queue D holds): its stream
 * waits for ev there, after the slices queued before it (earlier tensors)
 * are issued. */
static void defer_marker(cudaEvent_t ev, uint64_t *mark)
{
    static const char none[1];
    if (D.head - D.issued == DEFER_CAP)
        defer_wait_issued(D.head - DEFER_CAP + 1);
    dslice *x = &D.s[D.head % DEFER_CAP];
    *x = (dslice){.dst = (char *)none, .src = none, .pin = (char *)none, .chunk = D.cur,
                  .call = ++D.calls, .wait = ev};
    *mark = D.head + 1;
    __atomic_store_n(&D.head, D.head + 1, __ATOMIC_RELEASE);
    defer_wake();
}

/* A large pinned save on q's save stream: it reads its region once the
 * stream's work before the update's first save is done (no write of the
 * update comes before its region's save), and the stream waits for it
 * before whatever is issued after this call. */
static int side_save(cq *q, void *dst, const void *src, size_t n)
{
    int rc = side_init(q);
    if (rc)
        return rc;
    cudaStream_t st = (cudaStream_t)q->stream;
    cudaError_t e = cudaSuccess;
    if (!q->forked) {
        e = cudaEventRecord(q->fork, st);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(q->side, q->fork, 0);
        if (e != cudaSuccess)
            return cu_fail(e, "ordering the undo save stream");
        q->forked = true;
    }
    uint32_t i = q->save_next++ % SAVE_EVENTS;
    if (q->save_mark[i]) /* its last marker must be issued before it is recorded again */
        defer_wait_issued(q->save_mark[i]);
    q->save_mark[i] = 0;
    e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, q->side);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync (undo save)");
    G.stats.memcpy_calls++;
    if ((e = cudaEventRecord(q->save_ev[i], q->side)) != cudaSuccess)
        return cu_fail(e, "recording an undo save's event");
    if (D.q == q && D.issued < D.head)
        defer_marker(q->save_ev[i], &q->save_mark[i]);
    else if ((e = cudaStreamWaitEvent(st, q->save_ev[i], 0)) != cudaSuccess)
        return cu_fail(e, "waiting for an undo save");
    return REFIT_OK;
}

int cuda_save(void *host_dst, const void *src, size_t n, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    lock_raw(); /* a save precedes its own region's write; slices of other regions stay queued */
    int dev = stream_device(stream);
    devg g;
    cq *q;
    int rc = dev_enter(&g, dev);
    if (!rc) {
        rc = queue_get(&q, stream, dev);
        if (!rc && n < G.cfg.save_min && G.host_ptr_is_dev)
            rc = queue_rows(q, true, (uint64_t)(uintptr_t)host_dst, (uint64_t)(uintptr_t)src, n);
        else if (!rc && G.cfg.save_side)
            rc = side_save(q, host_dst, src, n);
        else if (!rc)
            rc = save_now(q, host_dst, src, n);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

int cuda_restore(void *dst, const void *host_src, size_t n, void *stream)
{
    (void)stream; /* abort has waited for every stream; this one blocks */
    if (n == 0)
        return REFIT_OK;
    lock();
    cudaError_t e = cudaMemcpy(dst, host_src, n, cudaMemcpyDefault);
    int rc = e == cudaSuccess ? REFIT_OK : cu_fail(e, "cudaMemcpy (undo restore)");
    unlock();
    return rc;
}

/* ---- undo in device memory (the context's undo_device_budget) ---- */

void *cuda_undo_dev_alloc(int device, size_t bytes)
{
    void *p = NULL;
    lock_raw(); /* an allocation orders nothing: deferred slices stay queued */
    devg g;
    if (!dev_enter(&g, device)) {
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed; /* see blk_alloc */
        bool relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
        cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
        if (relaxed)
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
        if (e != cudaSuccess) {
            cu_fail(e, "cudaMalloc (undo log in device memory)");
            (void)cudaGetLastError();
            p = NULL;
        } else {
            G.allocs.undo_device++;
            G.allocs.undo_device_bytes += bytes;
        }
        dev_leave(&g);
    }
    unlock();
    return p;
}

void cuda_undo_dev_free(int device, void *p)
{
    if (!p)
        return;
    lock();
    devg g;
    if (!dev_enter(&g, device)) {
        if (cudaFree(p) != cudaSuccess)
            (void)cudaGetLastError();
        dev_leave(&g);
    }
    unlock();
}

/* A device save is rows of the save table (unless save_dev_memcpy_min
 * sends a large one to save_now): a flush launches the saves queued since
 * the last launch as one kernel, ahead of the copy rows that overwrite
 * them, so a dense model's saves are a few launches instead of a
 * cudaMemcpyAsync (and its tail) per tensor. Immediate work (the pageable
 * path's slices, a kernel copy) launches only the pending save rows
 * (launch_saves), without switching tables, so nothing waits per tensor. */
int cuda_save_dev(void *dev_dst, const void *src, size_t n, int device, void *stream)
{
    if (n == 0)
        return REFIT_OK;
    lock_raw(); /* a save precedes its own region's write; slices of other regions stay queued */
    devg g;
    cq *q;
    int rc = dev_enter(&g, device);
    if (!rc) {
        rc = queue_get(&q, stream, device);
        size_t memcpy_min = G.cfg.save_dev_memcpy_min;
        if (!rc && (n < G.cfg.save_min || !memcpy_min || n < memcpy_min))
            rc = queue_rows(q, true, (uint64_t)(uintptr_t)dev_dst, (uint64_t)(uintptr_t)src, n);
        else if (!rc)
            rc = save_now(q, dev_dst, src, n);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

/* Abort has waited for every stream; each restore waits for itself so the
 * next (older) entry lands after it, and abort returns with the bytes in
 * place for any stream of the engine. */
int cuda_restore_dev(void *dst, const void *dev_src, size_t n, int device)
{
    if (n == 0)
        return REFIT_OK;
    lock();
    devg g;
    int rc = dev_enter(&g, device);
    if (!rc) {
        cudaError_t e = cudaMemcpyAsync(dst, dev_src, n, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(0);
        if (e != cudaSuccess)
            rc = cu_fail(e, "cudaMemcpyAsync (undo restore from device memory)");
        dev_leave(&g);
    }
    unlock();
    return rc;
}
