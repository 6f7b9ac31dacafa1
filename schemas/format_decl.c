/* Format declarations: build from a schema-checked document, then the
 * checks one node cannot make (format.schema.yaml says which). */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "schemas/format_decl.h"
#include "schemas/schema.h"
#include "schemas/schema_data.h"

typedef struct fbuild {
    fdecl *f;
    ydoc *doc;
    sdiags *d;
    int status;
} fbuild;

static void fb_error(fbuild *b, ypos at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fb_error(fbuild *b, ypos at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sdiags_vadd(b->d, b->doc->file, at, fmt, ap);
    va_end(ap);
    if (b->status == REFIT_OK)
        b->status = REFIT_ECORRUPT;
}

static const char *fb_str(fbuild *b, const yaml_node_t *map, const char *key)
{
    const char *s = ydoc_str(ydoc_get(b->doc, map, key));
    if (!s)
        return NULL;
    char *p = yarena_strdup(&b->f->arena, s);
    if (!p)
        b->status = REFIT_ENOMEM;
    return p;
}

static size_t seq_len(const yaml_node_t *n)
{
    return n && n->type == YAML_SEQUENCE_NODE
               ? (size_t)(n->data.sequence.items.top - n->data.sequence.items.start)
               : 0;
}

static yaml_node_t *seq_at(fbuild *b, const yaml_node_t *n, size_t i)
{
    return ydoc_node(b->doc, n->data.sequence.items.start[i]);
}

static void *fb_array(fbuild *b, size_t n, size_t es)
{
    if (n && es > SIZE_MAX / n) {
        b->status = REFIT_ENOMEM;
        return NULL;
    }
    void *p = yarena_alloc(&b->f->arena, n * es + 1);
    if (!p)
        b->status = REFIT_ENOMEM;
    return p;
}

static refit_dtype *fb_dtypes(fbuild *b, const yaml_node_t *list, size_t *n)
{
    *n = seq_len(list);
    refit_dtype *dt = fb_array(b, *n, sizeof *dt);
    for (size_t i = 0; dt && i < *n; i++)
        ydoc_dtype(ydoc_str(seq_at(b, list, i)), &dt[i]); /* the schema checked the names */
    return dt;
}

static uint32_t route_bit(const char *s)
{
    if (!strcmp(s, "DIRECT"))
        return FDECL_ROUTE_BIT(REFIT_ROUTE_DIRECT);
    if (!strcmp(s, "VIEW"))
        return FDECL_ROUTE_BIT(REFIT_ROUTE_VIEW);
    return FDECL_ROUTE_BIT(REFIT_ROUTE_STAGED);
}

static uint32_t fb_routes(fbuild *b, const yaml_node_t *n)
{
    if (n->type == YAML_SCALAR_NODE)
        return route_bit(ydoc_str(n));
    uint32_t r = 0;
    for (size_t i = 0; i < seq_len(n); i++)
        r |= route_bit(ydoc_str(seq_at(b, n, i)));
    return r;
}

/* Roles named twice in one list are ambiguous: refuse the second. */
static void fb_unique(fbuild *b, const char *what, const char *name, ypos at,
                      const char *const *prev, const ypos *prev_at, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (prev[i] && name && !strcmp(prev[i], name))
            fb_error(b, at, "%s '%s' is declared twice (first at line %u, column %u)", what, name,
                     prev_at[i].line, prev_at[i].col);
}

static void fb_ckpt(fbuild *b, const yaml_node_t *list)
{
    fdecl *f = b->f;
    f->n_ckpt = seq_len(list);
    f->ckpt = fb_array(b, f->n_ckpt, sizeof *f->ckpt);
    for (size_t i = 0; f->ckpt && i < f->n_ckpt && b->status != REFIT_ENOMEM; i++) {
        yaml_node_t *n = seq_at(b, list, i);
        fdecl_ckpt_role *r = &f->ckpt[i];
        r->at = ydoc_pos(n);
        r->role = fb_str(b, n, "role");
        r->match = fb_str(b, n, "match");
        if (!r->match)
            r->match = "*";
        r->target = fb_str(b, n, "target");
        r->dtypes = fb_dtypes(b, ydoc_get(b->doc, n, "dtypes"), &r->n_dtypes);
        r->routes = fb_routes(b, ydoc_get(b->doc, n, "route"));
        f->all_routes |= r->routes;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(f->ckpt[j].role, r->role))
                fb_error(b, ydoc_pos(ydoc_get(b->doc, n, "role")),
                         "checkpoint role '%s' is declared twice (first at line %u, column %u)",
                         r->role, f->ckpt[j].at.line, f->ckpt[j].at.col);
    }
}

static void fb_runtime(fbuild *b, const yaml_node_t *list)
{
    fdecl *f = b->f;
    f->n_rt = seq_len(list);
    f->rt = fb_array(b, f->n_rt, sizeof *f->rt);
    for (size_t i = 0; f->rt && i < f->n_rt && b->status != REFIT_ENOMEM; i++) {
        yaml_node_t *n = seq_at(b, list, i);
        fdecl_rt_role *r = &f->rt[i];
        r->at = ydoc_pos(n);
        r->role = fb_str(b, n, "role");
        r->match = fb_str(b, n, "match");
        if (!r->match)
            r->match = "*";
        r->dtypes = fb_dtypes(b, ydoc_get(b->doc, n, "dtypes"), &r->n_dtypes);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(f->rt[j].role, r->role))
                fb_error(b, ydoc_pos(ydoc_get(b->doc, n, "role")),
                         "runtime role '%s' is declared twice (first at line %u, column %u)",
                         r->role, f->rt[j].at.line, f->rt[j].at.col);
    }
}

static int has_ckpt_role(const fdecl *f, const char *role)
{
    for (size_t i = 0; i < f->n_ckpt; i++)
        if (!strcmp(f->ckpt[i].role, role))
            return 1;
    return 0;
}

static int has_rt_role(const fdecl *f, const char *role)
{
    for (size_t i = 0; i < f->n_rt; i++)
        if (!strcmp(f->rt[i].role, role))
            return 1;
    return 0;
}

/* reads/writes of a kernel must name declared roles. */
static void fb_kernel_refs(fbuild *b, const yaml_node_t *k, const char *key, int ckpt)
{
    const yaml_node_t *list = ydoc_get(b->doc, k, key);
    for (size_t i = 0; i < seq_len(list); i++) {
        yaml_node_t *n = seq_at(b, list, i);
        const char *role = ydoc_str(n);
        if (role && !(ckpt ? has_ckpt_role(b->f, role) : has_rt_role(b->f, role)))
            fb_error(b, ydoc_pos(n), "post-load kernel %s '%s', which is not a declared %s role",
                     ckpt ? "reads" : "writes", role, ckpt ? "checkpoint" : "runtime");
    }
}

static void fb_kernels(fbuild *b, const yaml_node_t *list)
{
    fdecl *f = b->f;
    f->n_kernels = seq_len(list);
    f->kernels = fb_array(b, f->n_kernels, sizeof *f->kernels);
    const char **names = fb_array(b, f->n_kernels, sizeof *names);
    ypos *ats = fb_array(b, f->n_kernels, sizeof *ats);
    for (size_t i = 0; f->kernels && names && ats && i < f->n_kernels; i++) {
        yaml_node_t *n = seq_at(b, list, i);
        fdecl_kernel *k = &f->kernels[i];
        k->at = ydoc_pos(n);
        k->name = fb_str(b, n, "kernel");
        ydoc_bool(ydoc_get(b->doc, n, "idempotent"), &k->idempotent);
        f->non_idempotent |= !k->idempotent;
        fb_unique(b, "post-load kernel", k->name, ydoc_pos(ydoc_get(b->doc, n, "kernel")), names,
                  ats, i);
        names[i] = k->name;
        ats[i] = ydoc_pos(ydoc_get(b->doc, n, "kernel"));
        fb_kernel_refs(b, n, "reads", 1);
        fb_kernel_refs(b, n, "writes", 0);
    }
}

static void fb_param_values(fbuild *b, fdecl_param *p, const yaml_node_t *n)
{
    const yaml_node_t *vals = ydoc_get(b->doc, n, "values");
    p->n_values = seq_len(vals);
    p->values = fb_array(b, p->n_values, sizeof *p->values);
    for (size_t i = 0; p->values && i < p->n_values; i++) {
        p->values[i] = yarena_strdup(&b->f->arena, ydoc_str(seq_at(b, vals, i)));
        if (!p->values[i])
            b->status = REFIT_ENOMEM;
    }
    if (!strcmp(p->type, "enum") && !vals)
        fb_error(b, p->at, "parameter '%s' is an enum: it needs 'values'", p->name);
    if (strcmp(p->type, "enum") && vals)
        fb_error(b, ydoc_pos(vals), "parameter '%s': 'values' is only for type enum", p->name);
}

static void fb_params(fbuild *b, const yaml_node_t *map)
{
    fdecl *f = b->f;
    if (!map)
        return;
    f->n_params = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
    f->params = fb_array(b, f->n_params, sizeof *f->params);
    for (size_t i = 0; f->params && i < f->n_params && b->status != REFIT_ENOMEM; i++) {
        yaml_node_pair_t *pr = &map->data.mapping.pairs.start[i];
        yaml_node_t *n = ydoc_node(b->doc, pr->value);
        fdecl_param *p = &f->params[i];
        p->at = ydoc_pos(ydoc_node(b->doc, pr->key));
        p->name = yarena_strdup(&f->arena, ydoc_str(ydoc_node(b->doc, pr->key)));
        p->type = fb_str(b, n, "type");
        p->def = fb_str(b, n, "default");
        ydoc_bool(ydoc_get(b->doc, n, "required"), &p->required);
        if (!p->name || !p->type) {
            b->status = REFIT_ENOMEM;
            return;
        }
        fb_param_values(b, p, n);
        const char *why = p->def ? fdecl_param_check(p, p->def) : NULL;
        if (why)
            fb_error(b, ydoc_pos(ydoc_get(b->doc, n, "default")),
                     "default of parameter '%s': %s", p->name, why);
    }
}

/* A STAGED route needs a kernel to turn staging into runtime bytes, and a
 * role's target must be a runtime role. */
static void fb_cross(fbuild *b, const yaml_node_t *ckpt_list)
{
    fdecl *f = b->f;
    for (size_t i = 0; i < f->n_ckpt; i++) {
        yaml_node_t *n = seq_at(b, ckpt_list, i);
        if ((f->ckpt[i].routes & FDECL_ROUTE_BIT(REFIT_ROUTE_STAGED)) && f->n_kernels == 0)
            fb_error(b, ydoc_pos(ydoc_get(b->doc, n, "route")),
                     "checkpoint role '%s' may be STAGED, but no post-load kernel is declared "
                     "to build runtime tensors from staging", f->ckpt[i].role);
        if (f->ckpt[i].target && !has_rt_role(f, f->ckpt[i].target))
            fb_error(b, ydoc_pos(ydoc_get(b->doc, n, "target")),
                     "target '%s' is not a declared runtime role", f->ckpt[i].target);
    }
}

int fdecl_from_doc(fdecl **out, ydoc *doc, sdiags *d)
{
    *out = NULL;
    fdecl *f = calloc(1, sizeof *f);
    if (!f)
        return REFIT_ENOMEM;
    fbuild b = {.f = f, .doc = doc, .d = d, .status = REFIT_OK};
    yaml_node_t *root = ydoc_root(doc);
    f->file = yarena_strdup(&f->arena, doc->file);
    f->name = fb_str(&b, root, "name");
    ydoc_int(ydoc_get(doc, root, "abi"), &f->abi);
    yaml_node_t *ckpt = ydoc_get(doc, root, "checkpoint");
    fb_params(&b, ydoc_get(doc, root, "params"));
    fb_ckpt(&b, ckpt);
    fb_runtime(&b, ydoc_get(doc, root, "runtime"));
    fb_kernels(&b, ydoc_get(doc, root, "post_load"));
    if (b.status != REFIT_ENOMEM)
        fb_cross(&b, ckpt);
    if (!f->file || !f->name)
        b.status = REFIT_ENOMEM;
    if (b.status) {
        fdecl_free(f);
        return b.status;
    }
    *out = f;
    return REFIT_OK;
}

int fdecl_load_file(fdecl **out, const char *path, sdiags *d)
{
    *out = NULL;
    ydoc doc;
    schema s;
    int rc = ydoc_load_file(&doc, path, d);
    if (rc) {
        ydoc_free(&doc);
        return rc;
    }
    rc = schema_load(&s, "schemas/format.schema.yaml", schema_text_format,
                     schema_text_format_len, d);
    if (!rc) {
        rc = schema_check(&s, &doc, d);
        schema_free(&s);
    }
    if (!rc)
        rc = fdecl_from_doc(out, &doc, d);
    ydoc_free(&doc);
    return rc;
}

void fdecl_free(fdecl *f)
{
    if (!f)
        return;
    yarena_free(&f->arena);
    free(f);
}

static int has_dtype(const refit_dtype *dts, size_t n, refit_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        if (dts[i].code == dt.code && dts[i].bits == dt.bits && dts[i].lanes == dt.lanes)
            return 1;
    return 0;
}

const fdecl_ckpt_role *fdecl_ckpt_role_for(const fdecl *f, const char *name, refit_dtype dt)
{
    for (size_t i = 0; i < f->n_ckpt; i++)
        if (fnmatch(f->ckpt[i].match, name, 0) == 0 &&
            has_dtype(f->ckpt[i].dtypes, f->ckpt[i].n_dtypes, dt))
            return &f->ckpt[i];
    return NULL;
}

const fdecl_rt_role *fdecl_rt_role_for(const fdecl *f, const char *name, refit_dtype dt)
{
    for (size_t i = 0; i < f->n_rt; i++)
        if (fnmatch(f->rt[i].match, name, 0) == 0 &&
            has_dtype(f->rt[i].dtypes, f->rt[i].n_dtypes, dt))
            return &f->rt[i];
    return NULL;
}

const fdecl_param *fdecl_param_find(const fdecl *f, const char *name)
{
    for (size_t i = 0; i < f->n_params; i++)
        if (!strcmp(f->params[i].name, name))
            return &f->params[i];
    return NULL;
}

const char *fdecl_param_check(const fdecl_param *p, const char *v)
{
    int64_t iv;
    if (!strcmp(p->type, "bool")) {
        static const char *const ok[] = {"true", "false", "yes", "no", "on", "off", "1", "0"};
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            if (!strcasecmp(v, ok[i]))
                return NULL;
        return "expected true or false";
    }
    if (!strcmp(p->type, "int"))
        return ydoc_parse_int(v, &iv) ? NULL : "expected an integer";
    if (!strcmp(p->type, "enum")) {
        for (size_t i = 0; i < p->n_values; i++)
            if (!strcmp(p->values[i], v))
                return NULL;
        return "not one of the declared values";
    }
    return NULL;
}

const char *fdecl_route_name(uint32_t route)
{
    switch (route) {
    case REFIT_ROUTE_DIRECT:
        return "DIRECT";
    case REFIT_ROUTE_VIEW:
        return "VIEW";
    case REFIT_ROUTE_STAGED:
        return "STAGED";
    default:
        return "NONE";
    }
}

const char *fdecl_routes_text(uint32_t routes, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t r = REFIT_ROUTE_DIRECT; r <= REFIT_ROUTE_STAGED; r++)
        if ((routes & FDECL_ROUTE_BIT(r)) && used < n)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? "|" : "",
                                     fdecl_route_name(r));
    if (!used)
        snprintf(buf, n, "none");
    return buf;
}
