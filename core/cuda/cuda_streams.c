/*
 * The CUDA backend's queues (docs/cuda.md): one per (stream, device), with
 * its two pinned batch tables, its save stream and events; rows queue into
 * the current table and go out as one kernel launch at flush.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "core/cuda/backend_cuda.h"
#include "core/cuda/backend_cuda_internal.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/copy.h"

/* ---- queues: per (stream, device) ---- */

void chunk_release(pchunk *c)
{
    if (c->mapped) {
        cudaHostUnregister(c->p);
        munmap(c->p, c->mapped);
    } else {
        cudaFreeHost(c->p);
    }
    c->p = NULL;
    c->mapped = 0;
}

static void queue_free(cq *q)
{
    if (q->side) {
        cudaStreamDestroy(q->side);
        cudaEventDestroy(q->fork);
        for (uint32_t i = 0; i < SAVE_EVENTS; i++)
            if (q->save_ev[i])
                cudaEventDestroy(q->save_ev[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (q->tb[i].rows)
            cudaFreeHost(q->tb[i].rows);
        if (q->tb[i].done)
            cudaEventDestroy(q->tb[i].done);
    }
    if (q->dev_rows)
        cudaFree(q->dev_rows);
    for (uint32_t i = 0; i < MAX_RING; i++) {
        if (q->ring[i].p)
            chunk_release(&q->ring[i]);
        if (q->ring[i].ev)
            cudaEventDestroy(q->ring[i].ev);
    }
    free(q);
}

static int queue_new(cq **out, void *stream, int device)
{
    size_t bytes = (size_t)G.cfg.table_rows * 2 * sizeof(kern_batch_row);
    cq *q = calloc(1, sizeof *q);
    if (!q)
        return fail(REFIT_ENOMEM, "out of memory for a stream queue");
    q->stream = stream;
    q->device = device;
    cudaError_t e = G.cfg.table_upload ? cudaMalloc((void **)&q->dev_rows, bytes) : cudaSuccess;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        e = cudaHostAlloc((void **)&q->tb[i].rows, bytes,
                          cudaHostAllocPortable | cudaHostAllocMapped);
        if (e == cudaSuccess)
            e = cudaHostGetDevicePointer((void **)&q->tb[i].dev, q->tb[i].rows, 0);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&q->tb[i].done, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        queue_free(q);
        return cu_fail(e, "allocating the batch tables of a stream");
    }
    G.allocs.queues++;
    *out = q;
    return REFIT_OK;
}

/* The queue of (stream, device), created on first use (G.mu held). */
int queue_get(cq **out, void *stream, int device)
{
    for (int i = 0; i < G.nq; i++)
        if (G.q[i]->stream == stream && G.q[i]->device == device) {
            *out = G.q[i];
            return REFIT_OK;
        }
    if (G.nq == MAX_QUEUES)
        return fail(REFIT_EBUDGET, "more than 64 (stream, device) pairs used");
    int rc = queue_new(out, stream, device);
    if (!rc)
        G.q[G.nq++] = *out;
    return rc;
}

/* The device a save or restore on stream works for: the device of a queue
 * already on that stream, else the current one. */
int stream_device(void *stream)
{
    for (int i = 0; i < G.nq; i++)
        if (G.q[i]->stream == stream)
            return G.q[i]->device;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        (void)cudaGetLastError();
    return dev;
}

/* Launch the save rows of the current table not launched yet, as one
 * kernel, without switching tables: rows appended later go past them, so
 * nothing rewrites what this launch reads. The caller has made q's device
 * current. */
int launch_saves(cq *q)
{
    table *t = &q->tb[q->cur];
    uint32_t from = t->save_launched, n = t->n_save - from;
    if (n == 0)
        return REFIT_OK;
    t->save_launched = t->n_save; /* a failed launch is reported once, not retried */
    cudaStream_t st = (cudaStream_t)q->stream;
    const kern_batch_row *rows = t->dev + from;
    if (G.cfg.table_upload) {
        rows = q->dev_rows + from;
        cudaError_t e = cudaMemcpyAsync(q->dev_rows + from, t->rows + from, n * sizeof *t->rows,
                                        cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return cu_fail(e, "uploading a batch table");
    }
    int rc = kern_copy_batch_cuda(rows, n, st);
    if (rc)
        return kern_fail(rc);
    G.stats.batch_launches++;
    G.stats.batch_rows += n;
    return REFIT_OK;
}

/* Launch what the current table holds: saves first (those not launched
 * yet), then copies. The kernels read the rows straight from the pinned
 * table (or, with table_upload, from a device copy of it). The caller has
 * made q's device current. */
int queue_flush(cq *q)
{
    table *t = &q->tb[q->cur];
    if (t->n_save == 0 && t->n_copy == 0)
        return REFIT_OK;
    cudaStream_t st = (cudaStream_t)q->stream;
    uint32_t cap = G.cfg.table_rows, n_copy = t->n_copy;
    int rc = launch_saves(q);
    t->n_save = t->save_launched = t->n_copy = 0; /* a failure is reported once */
    q->launched += t->copy_bytes;
    t->copy_bytes = 0;
    if (rc)
        return rc;
    const kern_batch_row *rows = t->dev;
    cudaError_t e = cudaSuccess;
    if (G.cfg.table_upload) {
        rows = q->dev_rows;
        if (n_copy)
            e = cudaMemcpyAsync(q->dev_rows + cap, t->rows + cap, n_copy * sizeof *t->rows,
                                cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return cu_fail(e, "uploading a batch table");
    }
    rc = kern_copy_batch_cuda(rows + cap, n_copy, st);
    if (rc)
        return kern_fail(rc);
    if ((e = cudaEventRecord(t->done, st)) != cudaSuccess)
        return cu_fail(e, "recording a batch table's event");
    t->recorded = true;
    G.stats.batch_launches += n_copy > 0;
    G.stats.batch_rows += n_copy;
    for (uint32_t i = 0; i < G.cfg.ring_chunks; i++) {
        pchunk *c = &q->ring[i];
        if (!c->in_table)
            continue;
        if ((e = cudaEventRecord(c->ev, st)) != cudaSuccess)
            return cu_fail(e, "recording a pinned chunk's event");
        c->in_table = false;
        c->recorded = true;
    }
    /* the other table is next: the kernels that read it must be done */
    q->cur ^= 1;
    table *n = &q->tb[q->cur];
    if (n->recorded && (e = cudaEventSynchronize(n->done)) != cudaSuccess)
        return cu_fail(e, "waiting for a batch table");
    n->recorded = false;
    return REFIT_OK;
}

/* Work issued now (not batched) must come after pending saves: they go
 * out as one launch, the copy rows stay queued and the table stays. */
int before_immediate(cq *q)
{
    return launch_saves(q);
}

/* Append rows for a contiguous piece, split at row_max. */
int queue_rows(cq *q, bool save, uint64_t dst, uint64_t src, uint64_t bytes)
{
    uint32_t cap = G.cfg.table_rows;
    for (uint64_t off = 0; off < bytes; off += G.cfg.row_max) {
        table *t = &q->tb[q->cur];
        uint32_t *n = save ? &t->n_save : &t->n_copy;
        if (*n == cap) {
            int rc = queue_flush(q);
            if (rc)
                return rc;
            t = &q->tb[q->cur];
            n = save ? &t->n_save : &t->n_copy;
        }
        uint64_t len = bytes - off < G.cfg.row_max ? bytes - off : G.cfg.row_max;
        t->rows[(save ? 0 : cap) + (*n)++] = (kern_batch_row){src + off, dst + off, len};
        if (!save && (t->copy_bytes += len) >= G.cfg.flush_bytes &&
            t->copy_bytes >= q->launched * G.cfg.flush_growth) {
            /* the device starts on the first flush_bytes while the host goes
             * on routing; each launch after that is flush_growth times as
             * large as all before it, so launches stay few (each one's tail
             * leaves SMs idle) and each fills the device */
            int rc = queue_flush(q);
            if (rc)
                return rc;
        }
    }
    return REFIT_OK;
}
