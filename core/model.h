/* The model (model.c): modules, runtime and side tensors, routes, and
 * what each module holds. The bottom of the txn -> plan -> model layers:
 * it calls neither. */
#ifndef REFIT_CORE_MODEL_H
#define REFIT_CORE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/backend.h"
#include "core/names.h"
#include "core/params.h"

/* A registered tensor (runtime or side) and its signature. */
typedef struct signature {
    void *data;
    refit_device device;
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS];
    int64_t strides[REFIT_MAX_DIMS];  /* filled in even when NULL (row-major) */
    uint64_t byte_offset;
} signature;

typedef struct tensor_reg {
    char *name;                 /* module-local (runtime) or global (side) */
    uint32_t module;            /* owning module; UINT32_MAX for side tensors */
    const refit_tensor *desc;   /* borrowed from the engine */
    signature sig;              /* recorded at seal */
    refit_view view;            /* the whole tensor, from sig */
    char *span;                 /* lowest byte the tensor touches */
    size_t span_bytes;          /* bytes from span to the highest, inclusive */
    const backend *be;
    bool via_view;              /* a VIEW route writes it: the format covers it */
} tensor_reg;

typedef enum route_flag {
    ROUTE_CAST = 1u << 0,       /* DIRECT copy casts */
    ROUTE_ALIAS = 1u << 1,      /* tied: another name of route tie */
    ROUTE_HAS_PAD = 1u << 2,    /* pad view is zeroed when complete */
    ROUTE_TIED = 1u << 3,       /* a primary that other names are tied to */
} route_flag;

/* One checkpoint tensor: where it goes, built at seal. */
typedef struct route {
    char *name;
    char *target_name;          /* as given, or NULL */
    char *tie_name;             /* as given, or NULL */
    uint32_t module;
    uint32_t target;            /* runtime tensor index (model-wide) */
    uint32_t tie;               /* primary route of an alias */
    uint32_t fm_index;          /* index in the module's fm.ckpt (primaries) */
    uint32_t kind;              /* refit_route */
    uint32_t flags;             /* route_flag */
    refit_ckpt_spec spec;       /* as declared (strings not owned) */
    int32_t split_dim;          /* dim partial deliveries split along */
    int64_t lo, hi;             /* this rank's rows of split_dim, checkpoint coords */
    int64_t len;                /* this rank's rows including pad rows */
    refit_view dst;             /* DIRECT: rows [lo, hi) in the target */
    refit_view pad;             /* pad rows in the target (ROUTE_HAS_PAD) */
    refit_view staged_shape;    /* STAGED: shape/dtype of the staged slice */
    size_t staged_bytes;
    size_t staged_offset;       /* in its unit's staging block */
    uint32_t unit;              /* staging unit (model-wide index) */
    uint64_t bytes;             /* bytes of the full checkpoint tensor */
} route;

typedef enum module_state {
    MODULE_EMPTY = 0,           /* never loaded */
    MODULE_CLEAN = 1,           /* holds a committed version */
    MODULE_DIRTY = 2,           /* written by an update that was not rolled back */
} module_state;

typedef struct module {
    char *name;
    const refit_format_v2 *fmt;
    params params;
    uint32_t *runtime;          /* model-wide runtime indexes */
    uint32_t n_runtime, cap_runtime;
    uint32_t *routes;           /* route indexes, declaration order */
    uint32_t n_routes, cap_routes;
    uint32_t n_primary;         /* routes that count for completeness */
    uint32_t *primary;          /* route index of each fm.ckpt[i] */
    refit_fmt_module fm;        /* the format's view, built at seal */
    size_t staged_bytes;        /* staging of all its units together */
    uint32_t unit0, n_units;    /* its staging units: units[unit0 ..] */
    uint64_t expected_bytes;    /* checkpoint bytes of its primary tensors */
    module_state state;
    struct mod_version *version; /* of the commit that last delivered it, or NULL */
} module;

/* What is staged and post-loaded at once: a whole module, or, when its
 * format sets REFIT_MODULE_EXPERT_SLICES, the slice of one expert (the
 * checkpoint tensors placed at that expert, the runtime tensors narrowed
 * to it on dim 0). Built at seal (plan.c). */
typedef struct stage_unit {
    uint32_t module;
    int64_t expert;             /* -1: the whole module */
    uint32_t first, n_primary;  /* its routes: module primary[first ..] */
    size_t staged_bytes;        /* its staging block */
    refit_fmt_module *fm;       /* what post_load gets: the module's fm, or slice
                                   (set once every unit is built) */
    refit_fmt_module slice;     /* an expert's (expert >= 0): runtime narrowed */
} stage_unit;

struct refit_txn;

struct refit_model {
    refit_ctx *ctx;
    bool sealed;
    module *modules;
    uint32_t n_modules, cap_modules;
    tensor_reg *runtime;
    uint32_t n_runtime, cap_runtime;
    tensor_reg *side;
    uint32_t n_side, cap_side;
    route *routes;
    uint32_t n_routes, cap_routes;
    stage_unit *units;          /* built at seal: every module's, in module order */
    uint32_t n_units;
    size_t staging_need;        /* the largest unit's staging (seal checks the budget) */
    names module_names;
    names side_names;
    names route_names;
    uint32_t n_empty, n_dirty;  /* modules in those states */
    struct mod_version *version;/* label of the last commit that delivered a module */
    uint32_t n_behind;          /* modules not at that label (partial updates) */
    char *version_text;         /* "label (partial: K of N modules)" when n_behind */
    int64_t version_update;     /* journal id of the commit of m->version (0: none) */
    struct refit_txn *txn;      /* open transaction, or NULL */
    struct txn_scratch *scratch;/* per-route/module arrays reused by every txn */
    void *journal_modules;      /* journal_module_info[n_modules], built at seal */
    struct undo_pool *undo_pool;  /* undo memory kept between updates (core/undo.c) */
    struct undo_source *undo_sources; /* what holds the committed version (undo_source.c) */
    struct manifest_decls *decls;/* runtime tensors declared by manifests (manifest.c) */
    int64_t journal_plan;       /* module list recorded at seal, or 0 */
    struct load_marks *load_marks; /* refit_load_many's per-route marks (load_many.c) */
    struct master_table *masters; /* checkpoint copies of online modules (delta_master.c) */
    struct refit_source_set *sets; /* source sets built on the model (load_set.c) */
    refit_model_stats stats;
};

/* Free the registration (modules, tensors, routes, versions) and m; the
 * layers above freed what they keep first (refit_model_destroy). */
void model_free(refit_model *m);
/* The worker's version for messages and the journal (refit_worker_version
 * without the health check), or NULL when nothing was committed. */
const char *model_version_text(const refit_model *m);
/* Health derived from the model's state. */
refit_health model_health(const refit_model *m);
/* Lookups by name; UINT32_MAX when absent. */
uint32_t model_find_module(const refit_model *m, const char *name);
uint32_t model_find_runtime(const refit_model *m, const module *mod, const char *name);
/* Content fingerprint of a module's runtime tensors (stream-synchronous). */
int module_fingerprint(refit_model *m, const module *mod, uint64_t *out);

#endif
