/* Model manifests (refit_model_load_manifest, core/manifest.c): above the
 * model, whose public calls the loader makes. What a manifest declares and
 * the checks of the embedder's calls against it are core/decls.h. */
#ifndef REFIT_CORE_MANIFEST_H
#define REFIT_CORE_MANIFEST_H

#include <refit/refit.h>

/* REFIT_OK when every declared runtime tensor is bound; else the first
 * missing one is named (seal). */
int manifest_check_bound(refit_model *m);

#endif
