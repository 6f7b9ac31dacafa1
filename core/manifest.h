/* Model manifests (refit_model_load_manifest) and the runtime tensors they
 * declare: refit_module_bind_runtime checks a bound descriptor against its
 * declaration, and seal refuses a declared tensor that was never bound. */
#ifndef REFIT_CORE_MANIFEST_H
#define REFIT_CORE_MANIFEST_H

#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/params.h"

/* REFIT_OK when module mi has no declarations (not from a manifest) or
 * name is declared with t's dtype and shape; else the error, message set. */
int manifest_check_bind(refit_model *m, uint32_t mi, const char *name, const refit_tensor *t);
/* REFIT_OK when every declared runtime tensor is bound; else the first
 * missing one is named. */
int manifest_check_bound(refit_model *m);
void manifest_decls_free(refit_model *m);
/* Parameters given through refit_model_add_module against the format's
 * declaration (when its plugin has one), with a manifest's messages. */
int manifest_check_params(refit_ctx *ctx, const char *module, const refit_format_v2 *fmt,
                          const params *p);

#endif
