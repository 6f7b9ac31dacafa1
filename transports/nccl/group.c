/*
 * Cross-rank commit. On every worker rank:
 *
 *   prepare (refit_finalize_prepare: every check; a failing check aborts
 *   this rank's txn at once)  ->  all-reduce(min) of the statuses  ->
 *   all OK: refit_commit (cannot fail)  |  else: refit_abort
 *
 * No rank exposes the new version (READY at the new label) before every
 * rank has prepared: commit happens only after the vote, and the vote
 * completes only when every rank has voted. The one window left is the
 * classic one of any atomic commit: a rank whose wait for the vote expires
 * in the instant the all-reduce completes aborts while the others commit;
 * it reports REFIT_EIO and journals that the outcome is unknown, and an
 * operator replays it (refit_replay) or reloads it.
 */
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"
#include "transports/nccl/xport.h"

static int worker_status(refit_ctx *ctx)
{
    return refit_worker_health(ctx) == REFIT_HEALTH_POISONED ? REFIT_EPOISONED : REFIT_OK;
}

static const char *after_abort(int ws)
{
    return ws == REFIT_EPOISONED ? "worker POISONED" : "bytes rolled back";
}

/* Prepare, or abort at once what cannot commit. why: the local failure. */
static int group_prepare(refit_ctx *ctx, refit_txn *txn, int local, bool *prepared, char *why,
                         size_t n)
{
    *prepared = false;
    if (local) {
        /* the caller's reason, kept before abort clears the message */
        snprintf(why, n, "%s", ctx->errmsg[0] ? ctx->errmsg : refit_strerror(local));
        if (txn)
            (void)refit_abort(txn);
        return local;
    }
    if (!txn)
        local = ctx_error(ctx, REFIT_EINVAL, "group finalize: no transaction");
    else
        local = refit_finalize_prepare(txn); /* a failing check aborts the txn */
    if (local)
        snprintf(why, n, "%s", ctx->errmsg);
    *prepared = local == REFIT_OK;
    return local;
}

static int group_vote_failed(refit_transport *x, refit_txn *txn, bool prepared, int64_t jid,
                             refit_group_result *res)
{
    refit_ctx *ctx = x->ctx;
    char err[sizeof x->err];
    snprintf(err, sizeof err, "%s", x->err);
    if (prepared)
        (void)refit_abort(txn);
    res->worker_status = worker_status(ctx);
    xport_journal(ctx, jid, "transport", "commit vote failed: %s; update aborted on this rank "
                  "(%s); if another rank saw the vote complete it may have committed",
                  err, after_abort(res->worker_status));
    return ctx_error(ctx, REFIT_EIO, "group finalize: the commit vote failed: %s; update "
                     "aborted on this rank, %s; the transport is aborted", err,
                     after_abort(res->worker_status));
}

int refit_group_finalize(refit_transport *x, refit_txn *txn, int local, refit_group_result *out)
{
    refit_group_result res = {.decision = REFIT_EIO, .failed_rank = -1};
    if (!x) {
        if (txn)
            (void)refit_abort(txn);
        return REFIT_EINVAL;
    }
    refit_ctx *ctx = x->ctx;
    int64_t jid = txn ? refit_txn_journal_id(txn) : 0;
    char why[REFIT_ERRMSG_SIZE] = "";
    bool prepared;
    local = group_prepare(ctx, txn, local, &prepared, why, sizeof why);
    int rc;
    if (group_vote(x, local, xport_now() + x->timeout_s, &res)) {
        rc = group_vote_failed(x, txn, prepared, jid, &res);
    } else if (res.decision == REFIT_OK) {
        rc = refit_commit(txn); /* only reached when this rank prepared */
        res.worker_status = REFIT_OK;
    } else {
        if (prepared)
            (void)refit_abort(txn);
        res.worker_status = worker_status(ctx);
        xport_journal(ctx, jid, "group", "rank %d of %d voted %s: update aborted on every "
                      "rank; here %s", res.failed_rank, x->nranks,
                      refit_status_name(res.decision), after_abort(res.worker_status));
        rc = local ? ctx_error(ctx, local, "%s; the group aborted (worst vote: rank %d, %s)",
                               why, res.failed_rank, refit_status_name(res.decision))
                   : ctx_error(ctx, res.decision, "group finalize: rank %d of %d voted %s; "
                               "update aborted on this rank too, %s", res.failed_rank,
                               x->nranks, refit_status_name(res.decision),
                               after_abort(res.worker_status));
    }
    if (out)
        *out = res;
    return rc;
}
