/* The context's own helpers (core/ctx.h): its message and its format
 * registry. A leaf: every unit calls it, it calls nothing of the core's.
 * The public entry points that wire a context are in ctx.c. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"

int ctx_verror(refit_ctx *ctx, int status, const char *fmt, va_list ap)
{
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    return status;
}

int ctx_error(refit_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_verror(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

const refit_format_v2 *ctx_find_format(const refit_ctx *ctx, const char *name)
{
    for (uint32_t i = 0; i < ctx->n_formats; i++)
        if (!strcmp(ctx->formats[i]->name, name))
            return ctx->formats[i];
    return NULL;
}
