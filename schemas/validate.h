/* Validate a YAML file as a format declaration or a model manifest: the
 * schema first, then the checks across nodes. What `refitctl validate`
 * runs, and what the plugin loader and refit_model_load_manifest() run
 * before they trust a file. Messages are "file:line:column: what". */
#ifndef REFIT_SCHEMAS_VALIDATE_H
#define REFIT_SCHEMAS_VALIDATE_H

#include "schemas/ydoc.h"

typedef enum schema_kind {
    SCHEMA_KIND_UNKNOWN = 0,    /* as input: tell from the content */
    SCHEMA_KIND_FORMAT = 1,     /* schemas/format.schema.yaml */
    SCHEMA_KIND_MODEL = 2,      /* schemas/model.schema.yaml */
} schema_kind;

const char *schema_kind_name(schema_kind k);

/* Which kind a document is: its `kind:` key, else `modules:` (a model) or
 * `checkpoint:`/`abi:` (a format). SCHEMA_KIND_UNKNOWN when it cannot tell. */
schema_kind schema_detect(ydoc *doc);

/* Validate path as kind (UNKNOWN: detect). *found (may be NULL) gets the
 * kind used. REFIT_OK when valid; REFIT_ECORRUPT with diagnostics;
 * REFIT_EIO (unreadable, diagnostic says why); REFIT_ENOMEM. */
int schema_validate_file(const char *path, schema_kind kind, schema_kind *found, sdiags *d);

#endif
