/* A format's declaration (<name>.yaml beside refit-fmt-<name>.so), read
 * into structs the plugin loader cross-checks plan() against. */
#ifndef REFIT_SCHEMAS_FORMAT_DECL_H
#define REFIT_SCHEMAS_FORMAT_DECL_H

#include <refit/format.h>

#include "schemas/ydoc.h"

/* Route bit of a refit_route in a role's set. */
#define FDECL_ROUTE_BIT(r) (1u << (unsigned)(r))

typedef struct fdecl_ckpt_role {
    const char *role;
    const char *match;          /* fnmatch() glob over checkpoint names */
    refit_dtype *dtypes;
    size_t n_dtypes;
    uint32_t routes;            /* FDECL_ROUTE_BIT set */
    const char *target;         /* runtime role, or NULL */
    ypos at;
} fdecl_ckpt_role;

typedef struct fdecl_rt_role {
    const char *role;
    const char *match;
    refit_dtype *dtypes;
    size_t n_dtypes;
    ypos at;
} fdecl_rt_role;

typedef struct fdecl_kernel {
    const char *name;
    int idempotent;
    ypos at;
} fdecl_kernel;

typedef struct fdecl_param {
    const char *name;
    const char *type;           /* bool, int, string, enum */
    const char *def;            /* default, or NULL */
    const char **values;        /* enum */
    size_t n_values;
    int required;
    ypos at;
} fdecl_param;

typedef struct fdecl {
    yarena arena;
    const char *file;
    const char *name;
    int64_t abi;
    fdecl_param *params;
    size_t n_params;
    fdecl_ckpt_role *ckpt;
    size_t n_ckpt;
    fdecl_rt_role *rt;
    size_t n_rt;
    fdecl_kernel *kernels;
    size_t n_kernels;
    uint32_t all_routes;        /* union of every role's routes */
    int non_idempotent;         /* some kernel is not idempotent */
} fdecl;

/* Read, validate (schema and the checks across nodes) and build. REFIT_OK;
 * REFIT_EIO, REFIT_ECORRUPT with diagnostics; REFIT_ENOMEM. */
int fdecl_load_file(fdecl **out, const char *path, sdiags *d);
/* Build from a document that passed the format schema. */
int fdecl_from_doc(fdecl **out, ydoc *doc, sdiags *d);
void fdecl_free(fdecl *f);

/* The role a checkpoint tensor plays: the first whose glob matches name
 * and whose dtypes hold dt. NULL when none. */
const fdecl_ckpt_role *fdecl_ckpt_role_for(const fdecl *f, const char *name, refit_dtype dt);
/* The same for a runtime tensor. */
const fdecl_rt_role *fdecl_rt_role_for(const fdecl *f, const char *name, refit_dtype dt);
const fdecl_param *fdecl_param_find(const fdecl *f, const char *name);
/* NULL when value suits p's type, else why not (static text). */
const char *fdecl_param_check(const fdecl_param *p, const char *value);
/* "DIRECT", "VIEW", "STAGED"; "NONE" otherwise. */
const char *fdecl_route_name(uint32_t route);
/* "DIRECT|STAGED" of a route set, into buf. */
const char *fdecl_routes_text(uint32_t routes, char *buf, size_t n);

#endif
