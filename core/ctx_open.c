/* refit_open and refit_close: the one unit that wires a context to what
 * it holds, above the units it wires. Open reads the options (ctx.c),
 * fills the host table (host_services.c), registers the plugin formats
 * (formats_builtin.c) and opens the journal (txn_journal.c); close
 * undoes each, the model first (model_api.c). No core unit calls it. */
#include <stddef.h>

#include "core/ctx.h"
#include "core/formats_builtin.h"
#include "core/host_services.h"
#include "core/txn_journal.h"

int refit_open(refit_ctx **out, const refit_options *opt)
{
    if (!out)
        return REFIT_EINVAL;
    refit_ctx *ctx;
    int rc = ctx_new(opt, &ctx);
    *out = NULL;
    if (rc != REFIT_OK)
        return rc;
    host_services_init(ctx); /* the one place the host table is filled */
    if ((rc = formats_register_builtin(ctx)) != REFIT_OK) {
        refit_close(ctx);
        return rc;
    }
    txj_open(ctx); /* a failure is kept for begin to report */
    *out = ctx;
    return REFIT_OK;
}

void refit_close(refit_ctx *ctx)
{
    if (!ctx)
        return;
    refit_model_destroy(ctx->model);
    formats_unload(ctx); /* after the model: its modules may call release */
    host_services_free(ctx);
    txj_close(ctx);
    ctx_free(ctx);
}
