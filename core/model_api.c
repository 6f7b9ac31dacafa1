/* The model's life cycle as the API sees it, above the layers txn -> plan
 * -> model: seal builds the plan; destroy ends an open update, then frees
 * what each layer keeps on the model, top down. model.c holds the
 * registration and calls neither layer above it. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "core/ctx.h"
#include "core/formats_builtin.h"
#include "core/load.h"
#include "core/decls.h"
#include "core/delta_master.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/txn.h"
#include "core/txn_journal.h"
#include "core/undo.h"
#include "core/undo_source.h"

/* The undo log's memory for a full update with rollback, allocated from
 * now on a thread of its own, so that the first update allocates none
 * (docs/core.md "Undo log"; refit_seal_opts.undo_reserve = 0, or
 * REFIT_UNDO_RESERVE=0 for a seal without options: in the first update).
 * A reservation that cannot start costs nothing but that. Said
 * as a warning from 1 GiB on: it doubles a big model's memory. */
static void seal_reserve_undo(refit_model *m)
{
    if (m->n_runtime == 0)
        return;
    undo_span *sp = malloc(sizeof *sp * m->n_runtime);
    if (!sp)
        return;
    uint32_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_runtime; i++)
        if (m->runtime[i].be) {
            sp[n++] = (undo_span){m->runtime[i].be, m->runtime[i].sig.device.device_id,
                                  m->runtime[i].span_bytes};
            bytes += m->runtime[i].span_bytes;
        }
    int rc = undo_pool_reserve(&m->undo_pool, sp, n, m->ctx->undo_device_budget, 1);
    free(sp);
    void *host = m->ctx->host.host;
    if (rc)
        m->ctx->host.log(host, 1, "undo log: cannot reserve its memory at seal (%s); the first "
                         "update with rollback allocates it", refit_strerror(rc));
    else
        m->ctx->host.log(host, bytes >= ((uint64_t)1 << 30) ? 1 : 2, "undo log: reserving %llu bytes for updates with rollback "
                         "(device memory within undo_device_budget %llu, the rest host memory, "
                         "pinned on a GPU; refit_seal_opts.undo_reserve = 0: none)",
                         (unsigned long long)bytes,
                         (unsigned long long)m->ctx->undo_device_budget);
}

int refit_sys_undo_held(refit_model *m, int wait, uint64_t *device_bytes, uint64_t *host_bytes)
{
    if (!m || !device_bytes || !host_bytes)
        return REFIT_EINVAL;
    if (m->txn)
        return REFIT_ESTATE; /* its log holds chunks out of the pool */
    if (wait)
        undo_pool_settle(m->undo_pool);
    undo_pool_stats st;
    undo_pool_stats_get(m->undo_pool, &st);
    if (st.reserving)
        return REFIT_ESTATE;
    *device_bytes = st.bytes[UNDO_DEVICE];
    *host_bytes = st.bytes[UNDO_HOST];
    return REFIT_OK;
}

int refit_model_seal(refit_model *m)
{
    return refit_model_seal_with(m, NULL);
}

int refit_model_seal_with(refit_model *m, const refit_seal_opts *opts)
{
    if (!m)
        return REFIT_EINVAL;
    ctx_clear_error(m->ctx);
    refit_seal_opts o = REFIT_SEAL_OPTS_INIT;
    if (opts) {
        if (opts->version < 1 || opts->version > REFIT_SEAL_OPTS_VERSION)
            return ctx_error(m->ctx, REFIT_EINVAL, "invalid version %u on refit_seal_opts",
                             (unsigned)opts->version);
        if (opts->undo_reserve != 0 && opts->undo_reserve != 1)
            return ctx_error(m->ctx, REFIT_EINVAL, "refit_seal_opts.undo_reserve is %d, "
                             "not 0 or 1", opts->undo_reserve);
        o = *opts;
    } else {    /* the environment's override of the default */
        const char *env = getenv("REFIT_UNDO_RESERVE");
        if (env && !strcmp(env, "0"))
            o.undo_reserve = 0;
    }
    if (m->sealed)
        return ctx_error(m->ctx, REFIT_ESTATE, "the model is already sealed");
    int rc = manifest_check_bound(m);
    if (rc)
        return rc;
    rc = plan_build(m);
    if (!rc)
        rc = formats_check_plan(m);
    if (rc) {
        model_free_plan(m);
        return rc;
    }
    m->sealed = true;
    m->n_empty = m->n_modules;
    txj_seal(m);
    if (o.undo_reserve)
        seal_reserve_undo(m);
    return REFIT_OK;
}

void refit_model_destroy(refit_model *m)
{
    if (!m)
        return;
    if (m->txn)
        refit_abort(m->txn);
    load_model_release(m);   /* source sets, load_many's marks */
    txn_model_release(m);    /* the update scratch */
    model_free_plan(m);      /* the formats' module state first: release may read params */
    undo_pool_free(&m->undo_pool);
    master_free(m);
    undo_sources_drop(m, NULL); /* files held open, snapshot mappings */
    decls_free(m);
    model_free(m);
}
