/* The format registry (formats_builtin.c): the plugins found on the search
 * path, registered at refit_open and unloaded at refit_close, and the
 * checks of refit_format_register. */
#ifndef REFIT_CORE_FORMATS_BUILTIN_H
#define REFIT_CORE_FORMATS_BUILTIN_H

#include <stddef.h>

#include <refit/format.h>
#include <refit/refit.h>

/* Find the format plugins on the search path and register them; only
 * REFIT_ENOMEM fails (refusals are logged and kept for messages). */
int formats_register_builtin(refit_ctx *ctx);
/* dlclose the plugins (refit_close, after the model is destroyed). */
void formats_unload(refit_ctx *ctx);
/* "dir (origin), ..." of the plugin search path, for messages. */
void formats_describe_path(const refit_ctx *ctx, char *buf, size_t n);
/* After plan_build: every plugin module's plan against its declaration. */
int formats_check_plan(refit_model *m);

#endif
