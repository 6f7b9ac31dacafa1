/* The in-process loopback transport: the ranks are threads of one process,
 * a broadcast is a queued message every other rank copies out, the
 * all-reduce a generation counter. It behaves as NCCL does where the tests
 * look: collectives match by call order, a peer that stops answering
 * leaves the others waiting until their deadline, and an abort is local
 * to the rank that calls it. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/ctx.h"
#include "transports/nccl/xport.h"
#include "kernels/copy.h"
#include "kernels/fingerprint.h"

#define LB_DEPTH 4              /* messages a root may run ahead of its slowest receiver */

typedef struct lb_msg {
    struct lb_msg *next;
    uint64_t seq;               /* the per-rank broadcast index it answers */
    int root;
    size_t bytes, ready;        /* ready < bytes: its sender died mid-buffer */
    int taken;                  /* receivers that copied it */
    uint8_t data[];
} lb_msg;

struct refit_loopback {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nranks;
    lb_msg *head;
    uint32_t depth;
    uint64_t *calls;            /* per rank: broadcasts made */
    uint64_t *kill_after;       /* per rank: bytes it still sends before dying */
    struct {                    /* one corrupt byte (xport_loopback_corrupt) */
        int rank;
        uint64_t seq, at;
        uint8_t mask;
    } corrupt;
    bool *dead;
    struct {                    /* a fingerprint that fails (xport_loopback_fail_fingerprint) */
        int rank;
        uint64_t left;
    } fail_fp;
    uint64_t ar_gen;
    int ar_count;
    int32_t ar_acc, ar_result;
};

typedef struct lb_end {
    refit_loopback *g;
    uint64_t tickets;
    bool aborted;               /* under g->mu: waits of this rank end at once */
} lb_end;

int refit_loopback_create(refit_loopback **out, int nranks)
{
    if (!out || nranks < 1 || nranks > (1 << 20))
        return REFIT_EINVAL;
    *out = NULL;
    refit_loopback *g = calloc(1, sizeof *g);
    if (!g)
        return REFIT_ENOMEM;
    g->nranks = nranks;
    g->calls = calloc((size_t)nranks, sizeof *g->calls);
    g->kill_after = malloc((size_t)nranks * sizeof *g->kill_after);
    g->dead = calloc((size_t)nranks, sizeof *g->dead);
    pthread_condattr_t ca;
    int ok = g->calls && g->kill_after && g->dead && !pthread_condattr_init(&ca);
    if (ok) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        ok = !pthread_cond_init(&g->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (!ok || pthread_mutex_init(&g->mu, NULL)) {
        if (ok)
            pthread_cond_destroy(&g->cv);
        free(g->calls);
        free(g->kill_after);
        free(g->dead);
        free(g);
        return REFIT_ENOMEM;
    }
    for (int i = 0; i < nranks; i++)
        g->kill_after[i] = UINT64_MAX;
    g->corrupt.rank = -1;
    g->fail_fp.rank = -1;
    *out = g;
    return REFIT_OK;
}

void refit_loopback_destroy(refit_loopback *g)
{
    if (!g)
        return;
    for (lb_msg *m = g->head; m;) {
        lb_msg *next = m->next;
        free(m);
        m = next;
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->calls);
    free(g->kill_after);
    free(g->dead);
    free(g);
}

void xport_loopback_kill_after(refit_loopback *g, int rank, uint64_t after_bytes)
{
    pthread_mutex_lock(&g->mu);
    g->kill_after[rank] = after_bytes;
    pthread_mutex_unlock(&g->mu);
}

void xport_loopback_corrupt(refit_loopback *g, int rank, uint64_t seq, uint64_t at, uint8_t mask)
{
    pthread_mutex_lock(&g->mu);
    g->corrupt.rank = rank;
    g->corrupt.seq = seq;
    g->corrupt.at = at;
    g->corrupt.mask = mask;
    pthread_mutex_unlock(&g->mu);
}

void xport_loopback_fail_fingerprint(refit_loopback *g, int rank, uint64_t nth)
{
    pthread_mutex_lock(&g->mu);
    g->fail_fp.rank = rank;
    g->fail_fp.left = nth;
    pthread_mutex_unlock(&g->mu);
}

/* Wait on the group's condition until woken or deadline (g->mu held).
 * 1 when the deadline passed. */
static int lb_sleep(refit_loopback *g, double deadline)
{
    double left = deadline - xport_now();
    if (left <= 0)
        return 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec / 1e9 + left;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    return pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT && xport_now() >= deadline;
}

static int lb_gone(refit_transport *x, lb_end *e)
{
    if (e->aborted)
        return xport_fail(x, REFIT_EIO, "the loopback endpoint of rank %d was aborted", x->rank);
    if (e->g->dead[x->rank])
        return xport_fail(x, REFIT_EIO, "rank %d is dead (simulated)", x->rank);
    return REFIT_OK;
}

/* Root: queue the message (a killed root queues part of it and dies). */
static int lb_post(refit_transport *x, lb_end *e, const void *buf, size_t bytes, double deadline)
{
    refit_loopback *g = e->g;
    int rc;
    while (!(rc = lb_gone(x, e)) && g->depth >= LB_DEPTH)
        if (lb_sleep(g, deadline))
            return xport_fail(x, REFIT_ETIMEDOUT, "deadline: rank %d's receivers took no broadcast "
                              "for the whole timeout", x->rank);
    if (rc)
        return rc;
    lb_msg *m = malloc(sizeof *m + (bytes ? bytes : 1));
    if (!m)
        return xport_fail(x, REFIT_ENOMEM, "loopback broadcast of %zu bytes: out of memory",
                          bytes);
    *m = (lb_msg){NULL, g->calls[x->rank]++, x->rank, bytes, bytes, 0};
    uint64_t *left = &g->kill_after[x->rank];
    if (*left != UINT64_MAX && *left < bytes) {
        m->ready = (size_t)*left;
        g->dead[x->rank] = true;
    } else if (*left != UINT64_MAX) {
        *left -= bytes;
    }
    memcpy(m->data, buf, m->ready);
    if (g->corrupt.rank == x->rank && g->corrupt.seq == m->seq && g->corrupt.at < m->ready)
        m->data[g->corrupt.at] ^= g->corrupt.mask;
    lb_msg **pp = &g->head;
    while (*pp)
        pp = &(*pp)->next;
    *pp = m;
    g->depth++;
    pthread_cond_broadcast(&g->cv);
    return g->dead[x->rank] ? lb_gone(x, e) : REFIT_OK;
}

static lb_msg *lb_find(refit_loopback *g, uint64_t seq, lb_msg ***link)
{
    for (lb_msg **pp = &g->head; *pp; pp = &(*pp)->next)
        if ((*pp)->seq == seq) {
            *link = pp;
            return *pp;
        }
    return NULL;
}

/* Receiver: copy the message that answers this rank's broadcast call. */
static int lb_take(refit_transport *x, lb_end *e, void *buf, size_t bytes, int root,
                   double deadline)
{
    refit_loopback *g = e->g;
    uint64_t seq = g->calls[x->rank]++;
    lb_msg **link = NULL, *m = NULL;
    int rc;
    while (!(rc = lb_gone(x, e)) && (!(m = lb_find(g, seq, &link)) || m->ready < m->bytes))
        if (lb_sleep(g, deadline))
            return xport_fail(x, REFIT_ETIMEDOUT, "deadline: broadcast #%llu from rank %d %s",
                              (unsigned long long)seq, root,
                              m ? "stopped part-way (its sender stopped)" : "never came");
    if (rc)
        return rc;
    if (m->root != root || m->bytes != bytes)
        return xport_fail(x, REFIT_EIO, "broadcast #%llu: rank %d sent %zu bytes, rank %d "
                          "expected %zu bytes from rank %d", (unsigned long long)seq, m->root,
                          m->bytes, x->rank, bytes, root);
    memcpy(buf, m->data, bytes);
    if (++m->taken == g->nranks - 1) {
        *link = m->next;
        free(m);
        g->depth--;
        pthread_cond_broadcast(&g->cv);
    }
    return REFIT_OK;
}

static int lb_bcast(refit_transport *x, void *buf, size_t bytes, int root, double deadline)
{
    lb_end *e = x->impl;
    if (root < 0 || root >= x->nranks)
        return xport_fail(x, REFIT_EINVAL, "broadcast root %d of %d ranks", root, x->nranks);
    if (x->nranks == 1)
        return REFIT_OK;
    pthread_mutex_lock(&e->g->mu);
    int rc = root == x->rank ? lb_post(x, e, buf, bytes, deadline)
                             : lb_take(x, e, buf, bytes, root, deadline);
    pthread_mutex_unlock(&e->g->mu);
    return rc;
}

static int lb_allreduce_min(refit_transport *x, int32_t *v, double deadline)
{
    lb_end *e = x->impl;
    refit_loopback *g = e->g;
    pthread_mutex_lock(&g->mu);
    int rc = lb_gone(x, e);
    if (!rc) {
        uint64_t gen = g->ar_gen;
        g->ar_acc = g->ar_count == 0 || *v < g->ar_acc ? *v : g->ar_acc;
        if (++g->ar_count == g->nranks) {
            g->ar_result = g->ar_acc;
            g->ar_count = 0;
            g->ar_gen++;
            pthread_cond_broadcast(&g->cv);
        }
        while (!rc && g->ar_gen == gen && !(rc = lb_gone(x, e)))
            if (lb_sleep(g, deadline))
                rc = xport_fail(x, REFIT_ETIMEDOUT, "deadline: %d of %d ranks joined the all-reduce",
                                g->ar_count, g->nranks);
        if (!rc)
            *v = g->ar_result;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static int lb_mem_alloc(refit_transport *x, void **out, size_t bytes)
{
    (void)x;
    size_t n = (bytes + 255) & ~(size_t)255;
    *out = aligned_alloc(256, n ? n : 256);
    return *out ? REFIT_OK : REFIT_ENOMEM;
}

static void lb_mem_free(refit_transport *x, void *p)
{
    (void)x;
    free(p);
}

static int lb_to_host(refit_transport *x, void *host, const void *src, size_t n)
{
    (void)x;
    memcpy(host, src, n);
    return REFIT_OK;
}

static int lb_from_host(refit_transport *x, void *dst, const void *host, size_t n)
{
    (void)x;
    memcpy(dst, host, n);
    return REFIT_OK;
}

/* The packing copies ran at their call (host backend): sum them now. */
static int lb_fingerprint_to(refit_transport *x, void *dst, const refit_view *v, void *stream)
{
    (void)stream;
    lb_end *e = x->impl;
    pthread_mutex_lock(&e->g->mu);
    bool fail = e->g->fail_fp.rank == x->rank && e->g->fail_fp.left && !--e->g->fail_fp.left;
    pthread_mutex_unlock(&e->g->mu);
    if (fail)
        return xport_fail(x, REFIT_EIO, "fingerprint of %lld elements failed (simulated)",
                          (long long)kern_view_numel(v));
    uint64_t h = kern_fingerprint_view(v);
    uint8_t *p = dst;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(h >> (8 * i));
    return REFIT_OK;
}

static int lb_wait_stream(refit_transport *x, void *stream)
{
    (void)x;
    (void)stream;
    return REFIT_OK;
}

static int lb_mark(refit_transport *x, uint64_t *ticket)
{
    lb_end *e = x->impl;
    *ticket = ++e->tickets;
    return REFIT_OK;
}

/* Everything ran at the call: only an abort is left to report. */
static int lb_wait(refit_transport *x, uint64_t ticket, double deadline)
{
    (void)ticket;
    (void)deadline;
    lb_end *e = x->impl;
    pthread_mutex_lock(&e->g->mu);
    int rc = lb_gone(x, e);
    pthread_mutex_unlock(&e->g->mu);
    return rc;
}

static void lb_abort(refit_transport *x)
{
    lb_end *e = x->impl;
    pthread_mutex_lock(&e->g->mu);
    e->aborted = true;
    pthread_cond_broadcast(&e->g->cv);
    pthread_mutex_unlock(&e->g->mu);
}

static void lb_destroy(refit_transport *x)
{
    free(x->impl);
    free(x);
}

static const xport_ops lb_ops = {
    .name = "loopback",
    .mem_alloc = lb_mem_alloc,
    .mem_free = lb_mem_free,
    .host_alloc = lb_mem_alloc,
    .host_free = lb_mem_free,
    .bcast = lb_bcast,
    .to_host = lb_to_host,
    .from_host = lb_from_host,
    .mark = lb_mark,
    .wait_stream = lb_wait_stream,
    .fingerprint_to = lb_fingerprint_to,
    .wait = lb_wait,
    .allreduce_min = lb_allreduce_min,
    .abort = lb_abort,
    .destroy = lb_destroy,
};

int refit_transport_loopback(refit_transport **out, refit_ctx *ctx, refit_loopback *g, int rank,
                             double timeout_s)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (!g || rank < 0 || rank >= g->nranks || timeout_s < 0)
        return ctx_error(ctx, REFIT_EINVAL, "loopback transport: rank %d of %d, timeout %g",
                         rank, g ? g->nranks : 0, timeout_s);
    refit_transport *x = calloc(1, sizeof *x);
    lb_end *e = calloc(1, sizeof *e);
    if (!x || !e) {
        free(x);
        free(e);
        return ctx_error(ctx, REFIT_ENOMEM, "loopback transport: out of memory");
    }
    e->g = g;
    *x = (refit_transport){.ops = &lb_ops, .ctx = ctx, .rank = rank, .nranks = g->nranks,
                           .device = {REFIT_DEVICE_CPU, 0},
                           .host_device = {REFIT_DEVICE_CPU, 0},
                           .timeout_s = timeout_s > 0 ? timeout_s : 300,
                           .writes_outside = true, .impl = e};
    *out = x;
    return REFIT_OK;
}
