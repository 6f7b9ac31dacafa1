/*
 * The NCCL transport: ncclBroadcast / ncclAllReduce on one stream, the
 * caller's communicator or one made from a unique id (non-blocking init,
 * so creation has a deadline too). Completion is watched through events
 * polled against the deadline together with ncclCommGetAsyncError; no
 * call here blocks the host on the GPU without a deadline (copies to and
 * from the host are asynchronous, into pinned memory).
 *
 * Past a deadline the communicator is aborted (ncclCommAbort), which also
 * stops its kernels. A borrowed communicator is aborted only when the
 * caller allowed it; otherwise the transport is marked stuck and keeps
 * (leaks) the memory its queued collectives may still write.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/ctx.h"
#include "transports/nccl/nccl_shim.h"
#include "transports/nccl/xport.h"
#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#endif

#define NX_EVENTS 32             /* tickets in flight: a few per slot, BKT_MAX_SLOTS slots */
#define NX_SPIN_NS 200000        /* poll without sleeping this long first */

typedef struct nx {
    nccl_api nc;
    cu_api cu;
    ncclComm_t comm;
    bool own_comm, abort_borrowed, stuck;
    CUdevice dev;
    CUcontext cuctx;            /* the device's primary context (retained) */
    bool retained;
    CUstream stream;
    bool own_stream;
    CUevent ev[NX_EVENTS];
    CUevent join;               /* recorded on another stream, waited for by ours */
    uint64_t issued, done;      /* tickets */
    int32_t *ar_dev, *ar_host;  /* the all-reduce's int, on both sides */
} nx;

/* ---- helpers ---- */

typedef struct nx_guard {
    CUcontext prev;
    bool changed;
} nx_guard;

/* Run on the transport's device whatever the calling thread had current. */
static void nx_enter(nx *n, nx_guard *g)
{
    g->changed = false;
    if (n->cu.CtxGetCurrent(&g->prev) != CU_SUCCESS)
        g->prev = NULL;
    if (g->prev != n->cuctx && n->cu.CtxSetCurrent(n->cuctx) == CU_SUCCESS)
        g->changed = true;
}

static void nx_leave(nx *n, const nx_guard *g)
{
    if (g->changed)
        (void)n->cu.CtxSetCurrent(g->prev);
}

/* Poll: spin for the first NX_SPIN_NS (a small bucket's broadcast takes
 * microseconds, and a nanosleep rounds up to the timer slack, ~50 us),
 * then sleep a little longer each time, up to 50 us. *ns starts at 0. */
static void nx_pause(long *ns, double since)
{
    if (*ns == 0 && xport_now() - since < NX_SPIN_NS / 1e9)
        return;
    if (*ns == 0)
        *ns = 2000;
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    if (*ns < 50000)
        *ns *= 2;
}

static int nx_cu(refit_transport *x, CUresult r, const char *what)
{
    nx *n = x->impl;
    if (r == CU_SUCCESS)
        return REFIT_OK;
    return xport_fail(x, REFIT_EIO, "%s: %s (CUDA error %d)", what, cu_errstr(&n->cu, r), r);
}

/* An NCCL result; in progress (non-blocking communicator): poll until it
 * settles or the deadline passes. */
static int nx_nccl(refit_transport *x, ncclResult_t r, const char *what, double deadline)
{
    nx *n = x->impl;
    long ns = 0;
    double t0 = xport_now();
    while (r == ncclInProgress && n->comm) {
        if (xport_now() > deadline)
            return xport_fail(x, REFIT_ETIMEDOUT, "deadline: %s still in progress after the timeout "
                              "(a peer is missing or stalled)", what);
        nx_pause(&ns, t0);
        if (n->nc.CommGetAsyncError(n->comm, &r) != ncclSuccess)
            break;
    }
    if (r == ncclSuccess)
        return REFIT_OK;
    const char *last = n->nc.GetLastError ? n->nc.GetLastError(n->comm) : NULL;
    return xport_fail(x, REFIT_EIO, "%s: %s%s%s", what, nccl_errstr(&n->nc, r),
                      last && *last ? ": " : "", last ? last : "");
}

/* ---- operations ---- */

static int nx_bcast(refit_transport *x, void *buf, size_t bytes, int root, double deadline)
{
    nx *n = x->impl;
    int rc = xport_check(x);
    if (rc)
        return rc;
    nx_guard g;
    nx_enter(n, &g);
    ncclResult_t r = n->nc.Broadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream);
    rc = nx_nccl(x, r, "ncclBroadcast", deadline);
    nx_leave(n, &g);
    return rc;
}

static int nx_to_host(refit_transport *x, void *host, const void *src, size_t n_)
{
    nx *n = x->impl;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.MemcpyDtoHAsync(host, (CUdeviceptr)(uintptr_t)src, n_, n->stream);
    nx_leave(n, &g);
    return nx_cu(x, r, "cuMemcpyDtoHAsync");
}

static int nx_from_host(refit_transport *x, void *dst, const void *host, size_t n_)
{
    nx *n = x->impl;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, host, n_, n->stream);
    nx_leave(n, &g);
    return nx_cu(x, r, "cuMemcpyHtoDAsync");
}

static int nx_mark(refit_transport *x, uint64_t *ticket)
{
    nx *n = x->impl;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.EventRecord(n->ev[(n->issued + 1) % NX_EVENTS], n->stream);
    nx_leave(n, &g);
    if (r == CU_SUCCESS)
        *ticket = ++n->issued;
    return nx_cu(x, r, "cuEventRecord");
}

/* A ticket's event (or, once reused, a later ticket's: work completes in
 * stream order, so waiting for it is only ever longer, never wrong). */
static int nx_wait(refit_transport *x, uint64_t ticket, double deadline)
{
    nx *n = x->impl;
    if (ticket <= n->done)
        return REFIT_OK;
    int rc = xport_check(x);
    nx_guard g;
    nx_enter(n, &g);
    double t0 = xport_now();
    for (long ns = 0; !rc;) {
        CUresult r = n->cu.EventQuery(n->ev[ticket % NX_EVENTS]);
        if (r == CU_SUCCESS) {
            n->done = ticket;
            break;
        }
        ncclResult_t a = ncclSuccess;
        if (r != CU_NOT_READY)
            rc = nx_cu(x, r, "waiting for the transport's stream");
        else if (n->nc.CommGetAsyncError(n->comm, &a) == ncclSuccess && a != ncclSuccess &&
                 a != ncclInProgress)
            rc = nx_nccl(x, a, "NCCL reported an error on the communicator", deadline);
        else if (xport_now() > deadline)
            rc = xport_fail(x, REFIT_ETIMEDOUT, "deadline: %.3g s passed and rank %d's queued "
                            "collective has not completed (a peer is dead or stalled)",
                            xport_now() - t0, x->rank);
        else
            nx_pause(&ns, t0);
    }
    nx_leave(n, &g);
    return rc;
}

/* The event is captured by cuStreamWaitEvent at the call, so one event
 * serves every join: recording it again later changes no earlier wait. */
static int nx_wait_stream(refit_transport *x, void *stream)
{
    nx *n = x->impl;
    if ((CUstream)stream == n->stream)
        return REFIT_OK;
    int rc = xport_check(x);
    if (rc)
        return rc;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.EventRecord(n->join, (CUstream)stream);
    if (r == CU_SUCCESS)
        r = n->cu.StreamWaitEvent(n->stream, n->join, 0);
    nx_leave(n, &g);
    return nx_cu(x, r, "joining the transport's stream to another (cuStreamWaitEvent)");
}

/* A bucket's payload checksum, summed on the device into device memory
 * (the CUDA backend's kernel, on the caller's stream): nothing waits. */
static int nx_fingerprint_to(refit_transport *x, void *dst, const refit_view *v, void *stream)
{
#ifdef REFIT_HAVE_CUDA
    if (!backend_cuda_get())
        return xport_fail(x, REFIT_EUNSUPPORTED, "payload checksum on the device: %s",
                          backend_cuda_unavailable());
    int rc = backend_cuda_fingerprint_to(dst, v, stream);
    return rc ? xport_fail(x, rc, "payload checksum on the device: %s",
                           backend_cuda_last_error())
              : REFIT_OK;
#else
    (void)dst;
    (void)v;
    (void)stream;
    return xport_fail(x, REFIT_EUNSUPPORTED, "payload checksum on the device: this refit was "
                      "built without CUDA (checksum_payload = 0 sends without one)");
#endif
}

static int nx_allreduce_min(refit_transport *x, int32_t *v, double deadline)
{
    nx *n = x->impl;
    int rc = xport_check(x);
    uint64_t t = 0;
    *n->ar_host = *v;
    if (!rc)
        rc = nx_from_host(x, n->ar_dev, n->ar_host, sizeof *v);
    if (!rc) {
        nx_guard g;
        nx_enter(n, &g);
        ncclResult_t r = n->nc.AllReduce(n->ar_dev, n->ar_dev, 1, ncclInt32, ncclMin, n->comm,
                                         n->stream);
        rc = nx_nccl(x, r, "ncclAllReduce", deadline);
        nx_leave(n, &g);
    }
    if (!rc)
        rc = nx_to_host(x, n->ar_host, n->ar_dev, sizeof *v);
    if (!rc)
        rc = nx_mark(x, &t);
    if (!rc)
        rc = nx_wait(x, t, deadline);
    if (!rc)
        *v = *n->ar_host;
    return rc;
}

static void nx_abort(refit_transport *x)
{
    nx *n = x->impl;
    if (!n->comm)
        return;
    if (!n->own_comm && !n->abort_borrowed) {
        n->stuck = true; /* the caller's to abort; what it may still write is kept */
        return;
    }
    nx_guard g;
    nx_enter(n, &g);
    (void)n->nc.CommAbort(n->comm);
    nx_leave(n, &g);
    n->comm = NULL;
}

/* ---- memory ---- */

static int nx_mem_alloc(refit_transport *x, void **out, size_t bytes)
{
    nx *n = x->impl;
    CUdeviceptr p = 0;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.MemAlloc(&p, bytes ? bytes : 1);
    nx_leave(n, &g);
    *out = (void *)(uintptr_t)p;
    return nx_cu(x, r, "cuMemAlloc") ? REFIT_ENOMEM : REFIT_OK;
}

static void nx_mem_free(refit_transport *x, void *p)
{
    nx *n = x->impl;
    if (!p || n->stuck)
        return;
    nx_guard g;
    nx_enter(n, &g);
    (void)n->cu.MemFree((CUdeviceptr)(uintptr_t)p);
    nx_leave(n, &g);
}

static int nx_host_alloc(refit_transport *x, void **out, size_t bytes)
{
    nx *n = x->impl;
    nx_guard g;
    nx_enter(n, &g);
    CUresult r = n->cu.MemHostAlloc(out, bytes ? bytes : 1, CU_MEMHOSTALLOC_PORTABLE);
    nx_leave(n, &g);
    return nx_cu(x, r, "cuMemHostAlloc") ? REFIT_ENOMEM : REFIT_OK;
}

static void nx_host_free(refit_transport *x, void *p)
{
    nx *n = x->impl;
    if (p && !n->stuck)
        (void)n->cu.MemFreeHost(p);
}

/* ---- create, destroy ---- */

/* A communicator refit owns: finalize it (bounded by the timeout), and
 * abort it when that does not complete. */
static void nx_comm_close(refit_transport *x)
{
    nx *n = x->impl;
    if (!n->comm || !n->own_comm)
        return;
    int rc = REFIT_OK;
    if (n->nc.CommFinalize)
        rc = nx_nccl(x, n->nc.CommFinalize(n->comm), "ncclCommFinalize",
                     xport_now() + x->timeout_s);
    if (rc || n->nc.CommDestroy(n->comm) != ncclSuccess)
        (void)n->nc.CommAbort(n->comm);
    n->comm = NULL;
}

static void nx_destroy(refit_transport *x)
{
    nx *n = x->impl;
    if (n && n->cuctx) {
        nx_guard g;
        nx_enter(n, &g);
        if (!x->aborted && n->issued) {
            uint64_t t;
            if (nx_mark(x, &t) || nx_wait(x, t, xport_now() + x->timeout_s))
                xport_abort(x, "closed with work stuck: %s", x->err);
        }
        nx_comm_close(x);
        for (int i = 0; i < NX_EVENTS; i++)
            if (n->ev[i])
                (void)n->cu.EventDestroy(n->ev[i]);
        if (n->join)
            (void)n->cu.EventDestroy(n->join);
        nx_mem_free(x, n->ar_dev);
        nx_host_free(x, n->ar_host);
        if (n->own_stream && n->stream && !n->stuck)
            (void)n->cu.StreamDestroy(n->stream);
        nx_leave(n, &g);
        if (n->retained)
            (void)n->cu.DevicePrimaryCtxRelease(n->dev);
    }
    if (n) {
        nccl_api_close(&n->nc);
        cu_api_close(&n->cu);
    }
    free(n);
    free(x);
}

static const xport_ops nx_ops = {
    .name = "nccl",
    .mem_alloc = nx_mem_alloc,
    .mem_free = nx_mem_free,
    .host_alloc = nx_host_alloc,
    .host_free = nx_host_free,
    .bcast = nx_bcast,
    .to_host = nx_to_host,
    .from_host = nx_from_host,
    .mark = nx_mark,
    .wait_stream = nx_wait_stream,
    .fingerprint_to = nx_fingerprint_to,
    .wait = nx_wait,
    .allreduce_min = nx_allreduce_min,
    .abort = nx_abort,
    .destroy = nx_destroy,
};

/* Non-blocking creation (NCCL >= 2.14) so a missing rank costs a deadline,
 * not a hang; older libraries get the blocking call. */
static int nx_comm_create(refit_transport *x, const refit_nccl_opts *o)
{
    nx *n = x->impl;
    ncclUniqueId id;
    memcpy(id.internal, o->id->bytes, sizeof id.internal);
    double deadline = xport_now() + x->timeout_s;
    n->own_comm = true;
    if (n->nc.CommInitRankConfig) {
        nccl_config_v214 cfg = {sizeof cfg, NCCL_CONFIG_MAGIC, NCCL_VERSION_CODE(2, 14, 0), 0,
                                NCCL_CONFIG_UNSET, NCCL_CONFIG_UNSET, NCCL_CONFIG_UNSET, NULL};
        ncclResult_t r = n->nc.CommInitRankConfig(&n->comm, o->nranks, id, o->rank, &cfg);
        if (r != ncclInvalidArgument || n->comm)
            return nx_nccl(x, r, "ncclCommInitRankConfig", deadline);
    }
    return nx_nccl(x, n->nc.CommInitRank(&n->comm, o->nranks, id, o->rank),
                   "ncclCommInitRank", deadline);
}

/* The caller's communicator: its size and this rank, and its device must
 * be ours. */
static int nx_comm_borrow(refit_transport *x, const refit_nccl_opts *o)
{
    nx *n = x->impl;
    int dev = -1;
    n->comm = o->comm;
    n->abort_borrowed = o->abort_borrowed != 0;
    int rc = nx_nccl(x, n->nc.CommCount(n->comm, &x->nranks), "ncclCommCount", 0);
    if (!rc)
        rc = nx_nccl(x, n->nc.CommUserRank(n->comm, &x->rank), "ncclCommUserRank", 0);
    if (!rc)
        rc = nx_nccl(x, n->nc.CommCuDevice(n->comm, &dev), "ncclCommCuDevice", 0);
    if (!rc && dev != o->device)
        rc = xport_fail(x, REFIT_EINVAL, "the communicator is on CUDA device %d, the options "
                        "say %d", dev, o->device);
    if (rc)
        n->comm = NULL; /* never aborted or destroyed by refit: it is the caller's */
    return rc;
}

/* The transport's own stream, at the device's highest priority where the
 * driver has one: the broadcasts' CTAs are then scheduled ahead of the
 * packing, checksum and scatter kernels queued beside them on other
 * streams (a kernel that fills the device would otherwise hold a
 * broadcast back until its blocks drain). */
static int nx_stream_create(nx *n, refit_transport *x)
{
    int least = 0, greatest = 0;
    if (n->cu.StreamCreateWithPriority && n->cu.CtxGetStreamPriorityRange &&
        n->cu.CtxGetStreamPriorityRange(&least, &greatest) == CU_SUCCESS &&
        n->cu.StreamCreateWithPriority(&n->stream, CU_STREAM_NON_BLOCKING, greatest) ==
            CU_SUCCESS)
        return REFIT_OK;
    n->stream = NULL;
    return nx_cu(x, n->cu.StreamCreate(&n->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

/* Device context, stream, events, the all-reduce buffers. */
static int nx_device(refit_transport *x, const refit_nccl_opts *o)
{
    nx *n = x->impl;
    int rc = nx_cu(x, n->cu.DeviceGet(&n->dev, o->device), "cuDeviceGet");
    if (!rc && !(rc = nx_cu(x, n->cu.DevicePrimaryCtxRetain(&n->cuctx, n->dev),
                            "cuDevicePrimaryCtxRetain")))
        n->retained = true;
    if (rc)
        return rc;
    nx_guard g;
    nx_enter(n, &g);
    n->stream = o->stream;
    if (!n->stream && !(rc = nx_stream_create(n, x)))
        n->own_stream = true;
    for (int i = 0; i < NX_EVENTS && !rc; i++)
        rc = nx_cu(x, n->cu.EventCreate(&n->ev[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (!rc)
        rc = nx_cu(x, n->cu.EventCreate(&n->join, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (!rc)
        rc = nx_mem_alloc(x, (void **)&n->ar_dev, 64);
    if (!rc)
        rc = nx_host_alloc(x, (void **)&n->ar_host, 64);
    nx_leave(n, &g);
    return rc;
}

static int nx_check_opts(refit_ctx *ctx, const refit_nccl_opts *o)
{
    if (!o || o->version != REFIT_NCCL_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "nccl transport: options of unknown version %u",
                         o ? o->version : 0);
    if (o->device < 0 || o->timeout_s < 0 ||
        (!o->comm && (!o->id || o->nranks < 1 || o->rank < 0 || o->rank >= o->nranks)))
        return ctx_error(ctx, REFIT_EINVAL, "nccl transport: device %d, rank %d of %d, %s",
                         o->device, o->rank, o->nranks,
                         o->comm ? "a communicator" : o->id ? "a unique id" : "no unique id");
    if (!backend_for_device((refit_device){REFIT_DEVICE_CUDA, o->device}))
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "nccl transport: no CUDA backend here (refit "
                         "was built without nvcc, or the CUDA runtime sees no device); the "
                         "buckets live in device memory");
    return REFIT_OK;
}

static int nx_open(refit_transport *x, const refit_nccl_opts *o)
{
    nx *n = x->impl;
    char err[1024];
    int rc = nccl_api_open(&n->nc, err, sizeof err);
    if (!rc)
        rc = cu_api_open(&n->cu, err, sizeof err);
    if (rc)
        return xport_fail(x, rc, "%s", err);
    if ((rc = nx_device(x, o)))
        return rc;
    nx_guard g;
    nx_enter(n, &g);
    rc = o->comm ? nx_comm_borrow(x, o) : nx_comm_create(x, o);
    nx_leave(n, &g);
    return rc;
}

int refit_transport_nccl(refit_transport **out, refit_ctx *ctx, const refit_nccl_opts *o)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    int rc = nx_check_opts(ctx, o);
    if (rc)
        return rc;
    refit_transport *x = calloc(1, sizeof *x);
    nx *n = calloc(1, sizeof *n);
    if (!x || !n) {
        free(x);
        free(n);
        return ctx_error(ctx, REFIT_ENOMEM, "nccl transport: out of memory");
    }
    *x = (refit_transport){.ops = &nx_ops, .ctx = ctx, .rank = o->rank, .nranks = o->nranks,
                           .device = {REFIT_DEVICE_CUDA, o->device},
                           .host_device = {REFIT_DEVICE_CUDA_HOST, o->device},
                           .timeout_s = o->timeout_s > 0 ? o->timeout_s : 300, .impl = n};
    if ((rc = nx_open(x, o))) {
        char why[sizeof x->err];
        snprintf(why, sizeof why, "%s", x->err);
        if (n->comm && n->own_comm)
            xport_abort(x, "creation failed");
        nx_destroy(x);
        return ctx_error(ctx, rc, "nccl transport (rank %d of %d, device %d): %s", o->rank,
                         o->nranks, o->device, why);
    }
    x->stream = n->stream;
    /* a deadline must be able to stop a broadcast before it may write a
     * runtime tensor: with a borrowed communicator it cannot abort, the
     * receiver keeps to its own slots */
    x->writes_outside = n->own_comm || n->abort_borrowed;
    *out = x;
    return REFIT_OK;
}

int refit_nccl_probe(refit_ctx *ctx)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    nccl_api a;
    cu_api c;
    char err[1024];
    int rc = nccl_api_open(&a, err, sizeof err);
    if (rc)
        return ctx_error(ctx, rc, "%s", err);
    if ((rc = cu_api_open(&c, err, sizeof err))) {
        nccl_api_close(&a);
        return ctx_error(ctx, rc, "%s", err);
    }
    ctx_error(ctx, REFIT_OK, "%s; CUDA driver %s", a.where, c.where);
    nccl_api_close(&a);
    cu_api_close(&c);
    return REFIT_OK;
}

int refit_nccl_unique_id(refit_ctx *ctx, refit_nccl_id *out)
{
    if (!ctx || !out)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    nccl_api a;
    char err[1024];
    int rc = nccl_api_open(&a, err, sizeof err);
    if (rc)
        return ctx_error(ctx, rc, "%s", err);
    ncclUniqueId id;
    ncclResult_t r = a.GetUniqueId(&id);
    if (r == ncclSuccess)
        memcpy(out->bytes, id.internal, sizeof out->bytes);
    else
        rc = ctx_error(ctx, REFIT_EIO, "ncclGetUniqueId: %s", nccl_errstr(&a, r));
    nccl_api_close(&a);
    return rc;
}
