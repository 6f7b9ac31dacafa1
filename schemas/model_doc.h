/* A model manifest (schemas/model.schema.yaml), validated and expanded
 * (repeat groups unrolled, ${var} substituted) into plain structs that
 * refit_model_load_manifest() turns into API calls. Every item keeps the
 * position it came from, so later refusals still say file:line:column. */
#ifndef REFIT_SCHEMAS_MODEL_DOC_H
#define REFIT_SCHEMAS_MODEL_DOC_H

#include <refit/refit.h>

#include "schemas/ydoc.h"

/* Most modules plus checkpoint entries one manifest may expand to (a
 * 100k-tensor model needs about 200k), and most repeat iterations, empty
 * ones included (two nested repeats multiply). */
#define MDOC_MAX_ITEMS (1u << 20)
#define MDOC_MAX_STEPS (1u << 22)

typedef struct mdoc_rt {
    const char *name;
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    ypos at;
} mdoc_rt;

typedef struct mdoc_ck {
    const char *name;
    const char *target;         /* NULL: the module's only runtime tensor */
    const char *tie;            /* tied name, or NULL */
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    int32_t shard_dim, shard_count; /* count 1: not sharded */
    int32_t shard_rank;         /* -1: the context's rank */
    int64_t pad_to;             /* 0: none */
    int64_t expert;             /* -1: none */
    int64_t dst_offset[REFIT_MAX_DIMS];
    ypos at, shard_at;
    const char *iter;           /* "l=2" when expanded from a repeat, or NULL */
} mdoc_ck;

typedef struct mdoc_param {
    const char *key, *value;
    ypos at;
} mdoc_param;

typedef struct mdoc_mod {
    const char *name;
    const char *format;
    mdoc_param *params;
    size_t n_params;
    mdoc_rt *rt;
    size_t n_rt, cap_rt;
    mdoc_ck *ck;
    size_t n_ck, cap_ck;
    ypos at, format_at;
    const char *iter;
} mdoc_mod;

typedef struct mdoc {
    yarena arena;
    const char *file;
    const char *name;           /* the manifest's label, or NULL */
    mdoc_mod *mods;
    size_t n_mods, cap_mods;
    size_t n_ck;                /* checkpoint entries over all modules */
} mdoc;

/* Read, validate (schema, then the checks across nodes) and expand.
 * REFIT_OK; REFIT_EIO, REFIT_ECORRUPT with diagnostics; REFIT_ENOMEM. */
int mdoc_load_file(mdoc **out, const char *path, sdiags *d);
/* Build from a document that passed the model schema. */
int mdoc_from_doc(mdoc **out, ydoc *doc, sdiags *d);
void mdoc_free(mdoc *m);

/* The runtime tensor a checkpoint entry lands in, or NULL. */
const mdoc_rt *mdoc_target(const mdoc_mod *mod, const mdoc_ck *ck);

#endif
