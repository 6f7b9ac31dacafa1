/* What every transport shares: deadlines, messages, abort, the journal
 * events of transport failures, the vote encoding, the public handle. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/ctx.h"
#include "transports/nccl/xport.h"
#include "journal/journal.h"

double xport_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int xport_fail(refit_transport *x, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, sizeof x->err, fmt, ap);
    va_end(ap);
    return status;
}

void xport_abort(refit_transport *x, const char *fmt, ...)
{
    if (x->aborted)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof x->why, fmt, ap);
    va_end(ap);
    x->aborted = true;
    x->ops->abort(x);
}

int xport_check(refit_transport *x)
{
    if (!x->aborted)
        return REFIT_OK;
    return xport_fail(x, REFIT_EIO, "the %s transport was aborted earlier (%s); open a new one",
                      x->ops->name, x->why);
}

void xport_journal(refit_ctx *ctx, int64_t update_id, const char *kind, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!ctx || !ctx->journal)
        return;
    /* best effort: the update's own row is written by the core; an event
     * lost here is noted as a gap, never an error of the update */
    if (journal_event(ctx->journal, update_id, ctx->worker_id, kind, "%s", msg))
        journal_note_gap(ctx->journal, "a transport event");
}

#define VOTE_RANK_BITS 20

int32_t group_vote_encode(int status, int rank)
{
    if (status > 0 || status < -2047)
        status = REFIT_EINTERNAL;
    if (status == REFIT_OK)
        return 0;
    return (int32_t)(status * (1 << VOTE_RANK_BITS) + rank);
}

void group_vote_decode(int32_t v, int *status, int *rank)
{
    if (v >= 0) {
        *status = REFIT_OK;
        *rank = -1;
        return;
    }
    int32_t m = 1 << VOTE_RANK_BITS;
    int32_t r = ((v % m) + m) % m;
    *rank = r;
    *status = (v - r) / m;
}

int refit_transport_rank(const refit_transport *x)
{
    return x ? x->rank : -1;
}

int refit_transport_nranks(const refit_transport *x)
{
    return x ? x->nranks : 0;
}

int refit_transport_aborted(const refit_transport *x)
{
    return x && x->aborted;
}

void refit_transport_close(refit_transport *x)
{
    if (x)
        x->ops->destroy(x);
}

int xport_view(const refit_tensor *t, refit_view *v)
{
    if (!t || t->ndim < 0 || t->ndim > REFIT_MAX_DIMS || (t->ndim && !t->shape))
        return REFIT_EINVAL;
    memset(v, 0, sizeof *v);
    v->data = t->data ? (char *)t->data + t->byte_offset : NULL;
    v->device = t->device;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    int64_t stride = 1, numel = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] < 0)
            return REFIT_EINVAL;
        v->shape[i] = t->shape[i];
        v->strides[i] = t->strides ? t->strides[i] : stride;
        stride *= t->shape[i] > 0 ? t->shape[i] : 1;
        numel *= t->shape[i];
    }
    return !v->data && numel > 0 ? REFIT_EINVAL : REFIT_OK;
}

bool xport_view_contiguous(const refit_view *v)
{
    int64_t stride = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != stride)
            return false;
        stride *= v->shape[i];
    }
    return true;
}

int group_vote(refit_transport *x, int local_status, double deadline, refit_group_result *res)
{
    res->local_status = local_status;
    int32_t v = group_vote_encode(local_status, x->rank);
    int rc = xport_check(x);
    if (!rc)
        rc = x->ops->allreduce_min(x, &v, deadline);
    if (rc) {
        res->vote_taken = 0;
        res->decision = local_status ? local_status : REFIT_EIO;
        res->failed_rank = -1;
        xport_abort(x, "the commit vote failed: %s", x->err);
        return REFIT_EIO;
    }
    res->vote_taken = 1;
    group_vote_decode(v, &res->decision, &res->failed_rank);
    return REFIT_OK;
}
