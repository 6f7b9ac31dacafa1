/* Replay: re-run a failed update from its journal record and durable source. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "core/ctx.h"
#include "core/delta_file.h"
#include "core/model.h"
#include "core/txn.h"
#include "core/txn_journal.h"

/* What replay needs of the update row, copied out of the callback. */
typedef struct replay_row {
    char state[32];
    char *version, *uri, *digest;
    int rollback;
    char *delta_base, *delta_version; /* a delta file's (replay_delta) */
} replay_row;

static int copy_row(void *user, const journal_update_row *r)
{
    replay_row *out = user;
    snprintf(out->state, sizeof out->state, "%s", r->state ? r->state : "?");
    out->version = xstrdup(r->version);
    out->uri = xstrdup(r->source_uri);
    out->digest = xstrdup(r->source_digest);
    out->rollback = r->rollback;
    return 0;
}

typedef struct replay_set {
    refit_model *m;
    uint8_t *send;              /* per module */
} replay_set;

static int mark_module(void *user, const journal_module_row *r)
{
    replay_set *rs = user;
    uint32_t mi = model_find_module(rs->m, r->name);
    if (mi != NAMES_NONE)
        rs->send[mi] = 1;
    return 0;
}

/* Only what this model expects: a source may hold more (another expert-
 * parallel rank's experts, tensors an update made with strict=False
 * skipped), which the update it replays did not load either. A missing
 * or wrong tensor still fails, at load or at finalize's completeness check. */
static int filter_module(void *user, const char *name)
{
    replay_set *rs = user;
    uint32_t ri = names_find(&rs->m->route_names, name);
    return ri != NAMES_NONE && rs->send[rs->m->routes[ri].module];
}

static int replayable(refit_ctx *ctx, int64_t id, const replay_row *row)
{
    static const char *ok[] = {"failed", "aborted", "rolled_back", "interrupted"};
    bool found = false;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        found |= !strcmp(row->state, ok[i]);
    if (!found)
        return ctx_error(ctx, REFIT_ESTATE, "replay: update %lld is %s; only failed, aborted, "
                         "rolled_back or interrupted updates are replayed", (long long)id,
                         row->state);
    if (!row->uri || strncmp(row->uri, "file://", 7))
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "replay: update %lld came from %s, which is "
                         "not durable; it cannot be replayed", (long long)id,
                         row->uri ? row->uri : "an unrecorded source");
    /* without either, whatever the path holds now would be committed under
     * the failed update's label */
    if (!row->digest || !*row->digest)
        return ctx_error(ctx, REFIT_ESTATE, "replay: update %lld recorded %s with neither a "
                         "digest nor a file identity: the files there now cannot be shown to "
                         "be the ones it read; refusing (replay it as a new update instead)",
                         (long long)id, row->uri);
    return REFIT_OK;
}

/* Open the recorded source and check it still holds the recorded bytes. */
static int replay_source(refit_ctx *ctx, int64_t id, const replay_row *row, refit_source **src,
                         char digest[REFIT_SOURCE_ID_SIZE])
{
    int rc = refit_source_open(src, ctx, row->uri + 7);
    if (rc)
        return rc;
    /* the journal holds a SHA-256 or, from a caller that did not read the
     * bytes, the files' identity (refit_source_identity): compare alike */
    int by_id = row->digest && !strncmp(row->digest, REFIT_SOURCE_ID_PREFIX,
                                        sizeof REFIT_SOURCE_ID_PREFIX - 1);
    if ((rc = by_id ? refit_source_identity(*src, digest) : refit_source_digest(*src, digest)))
        return rc;
    if (strcmp(row->digest, digest))
        return ctx_error(ctx, REFIT_ECORRUPT, "replay: the source of update %lld changed: %s "
                         "now has %s %s, the journal recorded %s%s", (long long)id, row->uri,
                         by_id ? "identity" : "digest", digest, row->digest,
                         by_id ? " (a file was rewritten, touched or replaced since)" : "");
    return REFIT_OK;
}

/* Re-run it from its checkpoint: the modules rs sends. */
static int replay_whole(refit_model *m, int64_t id, const refit_replay_opts *o,
                        const replay_row *row, refit_source *src, replay_set *rs,
                        const char *digest)
{
    refit_ctx *ctx = m->ctx;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = row->version;
    uo.source_uri = row->uri;
    uo.source_digest = digest;
    uo.rollback = o->rollback;
    /* what the journal shows complete is not sent again: a delta */
    for (uint32_t i = 0; i < m->n_modules; i++)
        uo.partial |= !rs->send[i];
    refit_txn *t = NULL;
    int rc = txn_begin(&t, m, &uo, id);
    if (!rc && (rc = refit_load_source_filtered(t, src, filter_module, rs, NULL, NULL, NULL))) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, ctx->errmsg, sizeof why);
        refit_abort(t);
        ctx_error(ctx, rc, "replay of update %lld: %s", (long long)id, why);
    } else if (!rc) {
        rc = refit_finalize(t);
    }
    return rc;
}

/* A delta update replays whole from its delta file, against the base the
 * file names: begin refuses it unless every module holds that base again
 * (a rolled-back failure leaves them there; a poisoned one does not). What
 * the file patches is what changed. */
static int replay_delta(refit_model *m, int64_t id, const refit_replay_opts *o,
                        const replay_row *row, const char *digest)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = row->version;
    uo.source_uri = row->uri;
    uo.source_digest = digest;
    uo.rollback = o->rollback;
    uo.base_version = row->delta_base;
    uo.others_unchanged = 1;
    refit_txn *t = NULL;
    int rc = txn_begin(&t, m, &uo, id);
    if (rc)
        return rc;
    if ((rc = refit_load_delta_file(t, row->uri + 7, NULL))) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, m->ctx->errmsg, sizeof why);
        refit_abort(t);
        return ctx_error(m->ctx, rc, "replay of update %lld: %s", (long long)id, why);
    }
    return refit_finalize(t);
}

static int replay_run(refit_model *m, int64_t id, const refit_replay_opts *o, replay_row *row)
{
    refit_ctx *ctx = m->ctx;
    int rc = journal_update_get(ctx->journal, id, copy_row, row);
    if (rc)
        return ctx_error(ctx, rc, "replay: update %lld: %s", (long long)id,
                         rc == REFIT_ENOTFOUND ? "no such update in the journal"
                                               : journal_errmsg(ctx->journal));
    if ((rc = replayable(ctx, id, row)))
        return rc;
    char why[REFIT_ERRMSG_SIZE];
    if (delta_file_versions(row->uri + 7, &row->delta_base, &row->delta_version, why,
                            sizeof why) == REFIT_OK &&
        strcmp(row->delta_version, row->version))
        return ctx_error(ctx, REFIT_ECORRUPT, "replay: update %lld made version '%s', its "
                         "delta file %s makes '%s'", (long long)id, row->version, row->uri,
                         row->delta_version);
    replay_set rs = {m, calloc(m->n_modules + 1, 1)};
    if (!rs.send)
        return ctx_error(ctx, REFIT_ENOMEM, "replay: out of memory");
    for (uint32_t i = 0; i < m->n_modules; i++)
        rs.send[i] = o->full || m->modules[i].state != MODULE_CLEAN;
    if (!o->full && (rc = journal_modules_list(ctx->journal, id, 1, mark_module, &rs))) {
        free(rs.send);
        return ctx_error(ctx, rc, "replay: reading modules of update %lld: %s", (long long)id,
                         journal_errmsg(ctx->journal));
    }
    refit_source *src = NULL;
    char digest[REFIT_SOURCE_ID_SIZE];
    rc = replay_source(ctx, id, row, &src, digest);
    if (!rc && row->delta_base)
        rc = replay_delta(m, id, o, row, digest);
    else if (!rc)
        rc = replay_whole(m, id, o, row, src, &rs, digest);
    refit_source_close(src);
    free(rs.send);
    return rc;
}

int refit_replay(refit_model *m, int64_t update_id, const refit_replay_opts *opts)
{
    refit_replay_opts defaults = REFIT_REPLAY_OPTS_INIT;
    if (!m)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (!opts)
        opts = &defaults;
    if (opts->version != REFIT_REPLAY_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "replay: options of unknown version %u", opts->version);
    if (!m->sealed || m->txn)
        return ctx_error(ctx, REFIT_ESTATE, "replay: %s", !m->sealed ? "the model is not sealed"
                                                                     : "an update is open");
    txj_open(ctx);
    if (!ctx->journal)
        return ctx_error(ctx, REFIT_EJOURNAL, "replay needs a journal: %s",
                         ctx->journal_path ? ctx->journal_err : "none configured");
    replay_row row = {{0}, NULL, NULL, NULL, 0, NULL, NULL};
    int rc = replay_run(m, update_id, opts, &row);
    free(row.version);
    free(row.uri);
    free(row.digest);
    free(row.delta_base);
    free(row.delta_version);
    return rc;
}
