/* The declarations a manifest makes (core/decls.c): its runtime tensors,
 * by module index, kept in refit_model.decls, and the checks model.c
 * makes as the embedder's calls arrive. manifest.c fills them; nothing
 * here calls model.c or manifest.c (tests/layering.sh). */
#ifndef REFIT_CORE_DECLS_H
#define REFIT_CORE_DECLS_H

#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/params.h"
#include "schemas/format_decl.h"
#include "schemas/model_doc.h"

typedef struct decl_rt {
    char *name;
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    ypos at;
} decl_rt;

typedef struct decl_mod {
    decl_rt *rt;
    uint32_t n_rt;
    const char *file;           /* one of manifest_decls.files; NULL: no manifest */
} decl_mod;

struct manifest_decls {
    decl_mod *mods;             /* by module index */
    uint32_t n_mods;
    char **files;
    uint32_t n_files;
};

/* Parameters (keys[i], values[i]) against the format's declaration, the
 * same for a manifest and for refit_model_add_module: REFIT_OK, or
 * REFIT_EINVAL with why and *bad the index at fault (n: a required one is
 * missing). */
int decls_check_params(const fdecl *d, const char *module, const char *const *keys,
                       const char *const *values, size_t n, size_t *bad, char *why, size_t wn);
/* Parameters given through refit_model_add_module against the format's
 * declaration (when its plugin has one), with a manifest's messages. */
int decls_check_module_params(refit_ctx *ctx, const char *module, const refit_format_v2 *fmt,
                              const params *p);
/* Module mi's declarations, NULL when it has none (not from a manifest). */
const decl_mod *decls_of(const refit_model *m, uint32_t mi);
/* REFIT_OK when module mi has no declarations or name is declared with
 * t's dtype and shape; else the error, message set. */
int decls_check_bind(refit_model *m, uint32_t mi, const char *name, const refit_tensor *t);
/* One module's declarations freed and zeroed; all of m's, m->decls NULL. */
void decl_mod_free(decl_mod *dm);
void decls_free(refit_model *m);

#endif
