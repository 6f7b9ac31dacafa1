/*
 * The CUDA backend's copies (docs/cuda.md; backend_cuda.c lists the data
 * paths): copy() picks a path per piece; flush, sync, zero, fingerprint.
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

/* ---- views ---- */

/* 1 when v's elements are one contiguous run (row-major, no gaps). */
static bool view_contiguous(const refit_view *v)
{
    int64_t expect = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != expect)
            return false;
        expect *= v->shape[i];
    }
    return true;
}

/* The device address of pinned host memory, or NULL when p is not pinned
 * (then it is treated as pageable). */
static void *pinned_dev(const void *p)
{
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, (void *)p, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return d;
}

/* ---- copy ---- */

static int check_pair(const refit_view *dst, const refit_view *src)
{
    char m[160];
    if (dst->device.device_type != REFIT_DEVICE_CUDA) {
        snprintf(m, sizeof m, "destination on device type %d is not device memory",
                 dst->device.device_type);
        return fail(REFIT_EUNSUPPORTED, m);
    }
    if (dst->ndim != src->ndim)
        return fail(REFIT_EMISMATCH, "copy between views of different ranks");
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i])
            return fail(REFIT_EMISMATCH, "copy between views of different shapes");
    if (!kern_can_cast(dst->dtype, src->dtype)) {
        snprintf(m, sizeof m, "no copy from %s to %s", refit_dtype_name(src->dtype),
                 refit_dtype_name(dst->dtype));
        return fail(REFIT_EUNSUPPORTED, m);
    }
    return REFIT_OK;
}

int memcpy_now(cq *q, void *dst, const void *src, size_t n)
{
    int rc = before_immediate(q);
    if (rc)
        return rc;
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)q->stream);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaMemcpyAsync");
    G.stats.memcpy_calls++;
    return REFIT_OK;
}

int kernel_now(cq *q, const refit_view *dst, const refit_view *src)
{
    int rc = before_immediate(q);
    if (!rc && (rc = kern_copy_cuda(dst, src, q->stream)))
        return kern_fail(rc);
    G.stats.kernel_copies++;
    return rc;
}

/* src is readable by the device at sdev (device memory or mapped pinned). */
static int copy_direct(cq *q, const refit_view *dst, const refit_view *src, void *sdev)
{
    if (!kern_dtype_eq(dst->dtype, src->dtype) || !view_contiguous(dst) ||
        !view_contiguous(src)) {
        refit_view s = *src;
        s.data = sdev;
        return kernel_now(q, dst, &s);
    }
    size_t bytes = (size_t)kern_view_numel(dst) * kern_dtype_size(dst->dtype);
    bool host = src->device.device_type != REFIT_DEVICE_CUDA;
    if (!host && src->device.device_id != dst->device.device_id) {
        int rc = before_immediate(q);
        cudaError_t e = rc ? cudaSuccess
                           : cudaMemcpyPeerAsync(dst->data, dst->device.device_id, src->data,
                                                 src->device.device_id, bytes,
                                                 (cudaStream_t)q->stream);
        if (e != cudaSuccess)
            return cu_fail(e, "cudaMemcpyPeerAsync");
        G.stats.memcpy_calls += !rc;
        return rc;
    }
    if (host ? bytes >= G.cfg.h2d_min : G.cfg.d2d_memcpy_min && bytes >= G.cfg.d2d_memcpy_min)
        return memcpy_now(q, dst->data, host ? src->data : sdev, bytes);
    return queue_rows(q, false, (uint64_t)(uintptr_t)dst->data, (uint64_t)(uintptr_t)sdev,
                      bytes);
}

/* A contiguous pageable piece: through the ring, pipelined chunk by chunk
 * (the host fills chunk k+1 while the copy engine drains chunk k). */
static int pageable_contig(cq *q, char *dst, const char *src, size_t bytes)
{
    size_t most = G.cfg.ring_chunk_bytes - 16;
    for (size_t off = 0; off < bytes;) {
        size_t piece = bytes - off < most ? bytes - off : most;
        pchunk *c;
        char *p;
        int rc = ring_take(q, piece, (uint64_t)(uintptr_t)(dst + off), &c, &p);
        if (rc)
            return rc;
        uint64_t t0 = now_ns();
        par_memcpy(p, src + off, piece);
        G.stats.host_copy_ns += now_ns() - t0;
        G.stats.pageable_bytes += piece;
        if (piece >= G.cfg.h2d_min) {
            rc = memcpy_now(q, dst + off, p, piece);
            if (!rc)
                rc = chunk_mark(c, (cudaStream_t)q->stream);
        } else {
            c->in_table = true; /* before the rows: queue_rows may flush */
            rc = queue_rows(q, false, (uint64_t)(uintptr_t)(dst + off),
                            (uint64_t)(uintptr_t)(c->dev + (p - c->p)), piece);
        }
        if (rc)
            return rc;
        off += piece;
    }
    return REFIT_OK;
}

/* One tile of a strided or cast pageable copy: gathered into a pinned
 * chunk on the host, then copied (and cast) from there on the device. */
static int pageable_tile(cq *q, const refit_view *dst, const refit_view *src)
{
    size_t bytes = (size_t)kern_view_numel(src) * kern_dtype_size(src->dtype);
    pchunk *c;
    char *p;
    int rc = ring_take(q, bytes, 0, &c, &p);
    if (rc)
        return rc;
    refit_view ph = *src;
    ph.data = p;
    ph.device = (refit_device){REFIT_DEVICE_CPU, 0};
    int64_t s = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        ph.strides[i] = s;
        s *= src->shape[i];
    }
    if (view_contiguous(src))
        par_memcpy(p, src->data, bytes);
    else if ((rc = kern_copy(&ph, src)))
        return fail(rc, "gathering a pageable tile");
    G.stats.pageable_bytes += bytes;
    ph.data = c->dev + (p - c->p);
    ph.device = (refit_device){REFIT_DEVICE_CUDA_HOST, 0};
    rc = kernel_now(q, dst, &ph);
    return rc ? rc : chunk_mark(c, (cudaStream_t)q->stream);
}

/* A sub-view: dims [k, nd) of v at outer index idx[0..k) and rows
 * [j, j + rows) of dim k. */
static refit_view sub_view(const refit_view *v, const int64_t *idx, int k, int64_t j,
                           int64_t rows)
{
    refit_view t = *v;
    int64_t off = j * v->strides[k];
    for (int i = 0; i < k; i++)
        off += idx[i] * v->strides[i];
    t.data = (char *)v->data + off * (int64_t)kern_dtype_size(v->dtype);
    t.ndim = v->ndim - k;
    for (int i = k; i < v->ndim; i++) {
        t.shape[i - k] = v->shape[i];
        t.strides[i - k] = v->strides[i];
    }
    t.shape[0] = rows;
    return t;
}

/* Split a strided/cast pageable copy into tiles that fit a chunk: whole
 * inner dims, blocks of rows of the first dim that fits. */
static int pageable_tiles(cq *q, const refit_view *dst, const refit_view *src)
{
    int nd = dst->ndim;
    if (nd == 0)
        return pageable_tile(q, dst, src);
    size_t se = kern_dtype_size(src->dtype), cap = G.cfg.ring_chunk_bytes - 16;
    int k = 0;
    int64_t inner = kern_view_numel(src) / src->shape[0];
    while ((size_t)inner * se > cap) { /* k < nd - 1 here: one element fits */
        k++;
        inner /= src->shape[k];
    }
    int64_t rows = (int64_t)(cap / ((size_t)inner * se));
    int64_t idx[REFIT_MAX_DIMS] = {0};
    for (;;) {
        for (int64_t j = 0; j < dst->shape[k]; j += rows) {
            int64_t r = dst->shape[k] - j < rows ? dst->shape[k] - j : rows;
            refit_view dt = sub_view(dst, idx, k, j, r), st = sub_view(src, idx, k, j, r);
            int rc = pageable_tile(q, &dt, &st);
            if (rc)
                return rc;
        }
        int i = k - 1;
        for (; i >= 0; i--) {
            if (++idx[i] < dst->shape[i])
                break;
            idx[i] = 0;
        }
        if (i < 0)
            return REFIT_OK;
    }
}

static int copy_pageable(cq *q, const refit_view *dst, const refit_view *src)
{
    if (kern_dtype_eq(dst->dtype, src->dtype) && view_contiguous(dst) && view_contiguous(src))
        return pageable_contig(q, dst->data, src->data,
                               (size_t)kern_view_numel(dst) * kern_dtype_size(dst->dtype));
    return pageable_tiles(q, dst, src);
}

int cuda_copy(const refit_view *dst, const refit_view *src, void *stream)
{
    int rc = check_pair(dst, src);
    if (rc || kern_view_numel(dst) == 0)
        return rc;
    lock_raw(); /* a deferrable copy must not settle the slices before it */
    devg g;
    cq *q;
    rc = dev_enter(&g, dst->device.device_id);
    if (!rc) {
        rc = queue_get(&q, stream, dst->device.device_id);
        if (!rc) {
            void *sdev = NULL;
            if (src->device.device_type == REFIT_DEVICE_CUDA)
                sdev = src->data;
            else if (src->device.device_type == REFIT_DEVICE_CUDA_HOST)
                sdev = pinned_dev(src->data); /* NULL: not pinned after all */
            /* a contiguous pageable piece inside a hold joins the ring; a
             * cast one, or one into a strided destination (a transposed
             * runtime view), too when it fits one slice of one chunk:
             * the copy kernel writes it from the chunk when it is issued */
            bool ring = !sdev && D.held && D.hold == stream && (!D.q || D.q == q) &&
                        view_contiguous(src) && src->dtype.bits % 8 == 0;
            bool flat = view_contiguous(dst);
            bool same = kern_dtype_eq(dst->dtype, src->dtype);
            size_t sbytes = (size_t)kern_view_numel(src) * kern_dtype_size(src->dtype);
            bool piece = sbytes <= G.cfg.defer_slice && sbytes + 64 <= G.cfg.ring_chunk_bytes;
            if (ring && flat && same)
                rc = defer_queue(q, dst->data, src->data, sbytes, NULL, NULL);
            else if (ring && piece)
                rc = defer_queue(q, dst->data, src->data, sbytes,
                                 (refit_dtype[2]){src->dtype, dst->dtype}, flat ? NULL : dst);
            else {
                defer_settle_all();
                rc = sdev ? copy_direct(q, dst, src, sdev) : copy_pageable(q, dst, src);
            }
        }
        dev_leave(&g);
    }
    unlock();
    return rc;
}

int cuda_can_read(refit_device src)
{
    return src.device_type == REFIT_DEVICE_CUDA || src.device_type == REFIT_DEVICE_CUDA_HOST ||
           src.device_type == REFIT_DEVICE_CPU;
}

/* ---- flush, sync ---- */

/* Flush (and with wait, synchronize) every queue on stream. */
static int streams_drain(void *stream, bool wait)
{
    int first = REFIT_OK;
    bool any = false;
    lock();
    for (int i = 0; i < G.nq; i++) {
        cq *q = G.q[i];
        if (q->stream != stream)
            continue;
        any = true;
        devg g;
        int rc = dev_enter(&g, q->device);
        if (!rc) {
            rc = queue_flush(q);
            cudaError_t e = wait ? cudaStreamSynchronize((cudaStream_t)stream) : cudaSuccess;
            if (wait) {
                q->launched = 0;
                q->forked = false; /* the stream waited for every save */
            }
            if (!rc && e != cudaSuccess)
                rc = cu_fail(e, "cudaStreamSynchronize");
            dev_leave(&g);
        }
        if (rc && !first)
            first = rc;
    }
    if (!any && wait) {
        cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
        if (e != cudaSuccess)
            first = cu_fail(e, "cudaStreamSynchronize");
    }
    if (G.defer_err && !first)
        first = G.defer_err;
    G.defer_err = 0;
    unlock();
    return first;
}

int cuda_flush(void *stream)
{
    return streams_drain(stream, false);
}

int cuda_sync(void *stream)
{
    return streams_drain(stream, true);
}

/* ---- zero, fingerprint ---- */

int cuda_zero(const refit_view *dst, void *stream)
{
    if (dst->device.device_type != REFIT_DEVICE_CUDA)
        return fail(REFIT_EUNSUPPORTED, "zero: destination is not device memory");
    if (kern_view_numel(dst) == 0)
        return REFIT_OK;
    lock();
    devg g;
    cq *q;
    int rc = dev_enter(&g, dst->device.device_id);
    if (!rc) {
        rc = queue_get(&q, stream, dst->device.device_id);
        if (!rc)
            rc = before_immediate(q);
        if (!rc && (rc = kern_zero_cuda(dst, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}

int cuda_fingerprint(const refit_view *v, uint64_t *out, void *stream)
{
    lock();
    devg g;
    int rc = dev_enter(&g, v->device.device_id);
    if (!rc) {
        for (int i = 0; i < G.nq && !rc; i++)
            if (G.q[i]->stream == stream && G.q[i]->device == v->device.device_id)
                rc = queue_flush(G.q[i]); /* queued copies land first */
        if (!rc && (rc = kern_fingerprint_view_cuda(v, out, stream)))
            rc = kern_fail(rc);
        dev_leave(&g);
    }
    unlock();
    return rc;
}
