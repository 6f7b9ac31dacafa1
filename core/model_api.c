/* The model's life cycle as the API sees it, above the layers txn -> plan
 * -> model: seal builds the plan; destroy ends an open update, then frees
 * what each layer keeps on the model, top down. model.c holds the
 * registration and calls neither layer above it. */
#include <stdbool.h>

#include "core/ctx.h"
#include "core/formats_builtin.h"
#include "core/load.h"
#include "core/decls.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/txn.h"
#include "core/txn_journal.h"
#include "core/undo.h"

int refit_model_seal(refit_model *m)
{
    if (!m)
        return REFIT_EINVAL;
    ctx_clear_error(m->ctx);
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
    decls_free(m);
    model_free(m);
}
