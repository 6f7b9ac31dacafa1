/* Prepared source sets: names resolved to routes and descriptors checked
 * once, at build (and again when re-pointed), so that loading the set is
 * the table loop of load_many.c over deliveries made ready.
 *
 * A set belongs to one model and is on its list: refit_model_destroy
 * detaches every set (set->m = NULL), so a set kept past its model is
 * refused, not followed into freed memory. A model never changes its
 * plan once sealed, so the model itself is the set's generation. */
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/load.h"

struct refit_source_set {
    refit_model *m;             /* NULL once the model is destroyed */
    refit_source_set *next;     /* the model's sets */
    refit_source_set **prev;    /* what points at this one */
    size_t n;
    char *names;                /* every name, NUL-separated */
    refit_tensor *srcs;         /* copies; shape and strides in dims */
    int64_t *dims;
    delivery *rows;             /* load_check'ed against the model */
    bool staged;                /* some row goes to a STAGED route */
};

size_t refit_source_set_count(const refit_source_set *set)
{
    return set ? set->n : 0;
}

static void set_unlink(refit_source_set *set)
{
    if (!set->prev)
        return;
    *set->prev = set->next;
    if (set->next)
        set->next->prev = set->prev;
    set->next = NULL;
    set->prev = NULL;
}

void refit_source_set_destroy(refit_source_set *set)
{
    if (!set)
        return;
    set_unlink(set);
    free(set->names);
    free(set->srcs);
    free(set->dims);
    free(set->rows);
    free(set);
}

void load_model_release(refit_model *m)
{
    while (m->sets) {
        refit_source_set *set = m->sets;
        set_unlink(set);
        set->m = NULL;
    }
    load_marks_free(m);
}

/* Check rows [0, n) of srcs into rows (names as the set holds them); a
 * message names the first row refused. */
static int check_rows(refit_model *m, const char *what, size_t n, const char *names,
                      const refit_tensor *srcs, delivery *rows)
{
    const char *name = names;
    uint32_t hint = 0;
    for (size_t i = 0; i < n; i++, name += strlen(name) + 1) {
        delivery *d = &rows[i];
        int rc = load_resolve_next(m, name, &hint, d);
        if (!rc) {
            d->off = 0;
            d->stream = NULL;
            rc = load_check(m, d, &srcs[i], true, false);
        }
        if (rc) {
            char why[REFIT_ERRMSG_SIZE];
            memcpy(why, m->ctx->errmsg, sizeof why);
            return ctx_error(m->ctx, rc, "%s: row %zu (%s): %s", what, i, name, why);
        }
    }
    return REFIT_OK;
}

/* Copy the descriptors (their shape and strides into one array). */
static int copy_srcs(refit_source_set *set, const refit_tensor *srcs)
{
    size_t nd = 0;
    for (size_t i = 0; i < set->n; i++)
        nd += 2 * (size_t)srcs[i].ndim; /* ndim checked against a route: 0..MAX_DIMS */
    set->srcs = malloc(set->n * sizeof *set->srcs);
    set->dims = malloc((nd ? nd : 1) * sizeof *set->dims);
    if (!set->srcs || !set->dims)
        return REFIT_ENOMEM;
    int64_t *p = set->dims;
    for (size_t i = 0; i < set->n; i++) {
        const refit_tensor *s = &srcs[i];
        refit_tensor *c = &set->srcs[i];
        *c = *s;
        c->shape = p;
        memcpy(p, s->shape, (size_t)s->ndim * sizeof *p);
        p += s->ndim;
        c->strides = NULL;
        if (s->strides) {
            c->strides = p;
            memcpy(p, s->strides, (size_t)s->ndim * sizeof *p);
            p += s->ndim;
        }
    }
    return REFIT_OK;
}

/* The names, once each, into one block. */
static int copy_names(refit_model *m, refit_source_set *set, const char *const *names)
{
    size_t len = 0;
    for (size_t i = 0; i < set->n; i++) {
        if (!names[i])
            return ctx_error(m->ctx, REFIT_EINVAL, "source set: row %zu: checkpoint name is "
                             "NULL", i);
        len += strlen(names[i]) + 1;
    }
    if (!(set->names = malloc(len ? len : 1)))
        return ctx_error(m->ctx, REFIT_ENOMEM, "source set: out of memory");
    char *p = set->names;
    for (size_t i = 0; i < set->n; i++) {
        size_t k = strlen(names[i]) + 1;
        memcpy(p, names[i], k);
        p += k;
    }
    return REFIT_OK;
}

/* A name twice in the set (by route: the same name resolves to one). */
static int check_unique(refit_model *m, const refit_source_set *set)
{
    uint32_t *row = calloc((size_t)m->n_routes + 1, sizeof *row);
    if (!row)
        return ctx_error(m->ctx, REFIT_ENOMEM, "source set: out of memory");
    int rc = REFIT_OK;
    for (size_t i = 0; i < set->n && !rc; i++) {
        uint32_t ri = set->rows[i].name_ri;
        if (row[ri])
            rc = ctx_error(m->ctx, REFIT_EDUPLICATE, "source set: row %zu (%s): the same "
                           "name as row %u", i, set->rows[i].name, row[ri] - 1);
        row[ri] = (uint32_t)i + 1;
    }
    free(row);
    return rc;
}

int refit_source_set_create(refit_source_set **out, refit_model *m, size_t n,
                            const char *const *names, const refit_tensor *srcs)
{
    if (!out || !m)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(m->ctx);
    if (!m->sealed)
        return ctx_error(m->ctx, REFIT_ESTATE, "source set: the model is not sealed");
    if (n && (!names || !srcs))
        return ctx_error(m->ctx, REFIT_EINVAL, "source set: %zu rows but no %s", n,
                         names ? "sources" : "names");
    if (n >= UINT32_MAX)
        return ctx_error(m->ctx, REFIT_EINVAL, "source set: %zu rows; at most %u", n,
                         UINT32_MAX - 1);
    refit_source_set *set = calloc(1, sizeof *set);
    if (!set)
        return ctx_error(m->ctx, REFIT_ENOMEM, "source set: out of memory");
    set->n = n;
    int rc = copy_names(m, set, names);
    if (!rc && !(set->rows = malloc((n ? n : 1) * sizeof *set->rows)))
        rc = ctx_error(m->ctx, REFIT_ENOMEM, "source set: out of memory");
    if (!rc)
        rc = check_rows(m, "source set", n, set->names, srcs, set->rows);
    if (!rc)
        rc = check_unique(m, set);
    if (!rc && copy_srcs(set, srcs))
        rc = ctx_error(m->ctx, REFIT_ENOMEM, "source set: out of memory");
    if (!rc) { /* the names the rows carry: the set's own copies */
        const char *name = set->names;
        for (size_t i = 0; i < n; i++, name += strlen(name) + 1) {
            set->rows[i].name = name;
            set->staged |= set->rows[i].r->kind == REFIT_ROUTE_STAGED;
        }
    }
    if (rc) {
        refit_source_set_destroy(set);
        return rc;
    }
    set->m = m;
    set->next = m->sets;
    if (m->sets)
        m->sets->prev = &set->next;
    set->prev = &m->sets;
    m->sets = set;
    *out = set;
    return REFIT_OK;
}

int refit_source_set_repoint(refit_source_set *set, size_t n, void *const *data)
{
    if (!set)
        return REFIT_EINVAL;
    refit_model *m = set->m;
    if (!m)
        return REFIT_ESTATE;
    ctx_clear_error(m->ctx);
    if (n != set->n || (n && !data))
        return ctx_error(m->ctx, REFIT_EINVAL, "source set repoint: %zu pointers for a set of "
                         "%zu rows", data ? n : 0, set->n);
    refit_tensor *srcs = malloc((n ? n : 1) * sizeof *srcs);
    delivery *rows = malloc((n ? n : 1) * sizeof *rows);
    int rc = srcs && rows ? REFIT_OK
                          : ctx_error(m->ctx, REFIT_ENOMEM, "source set repoint: out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        srcs[i] = set->srcs[i];
        srcs[i].data = data[i];
    }
    if (!rc)
        rc = check_rows(m, "source set repoint", n, set->names, srcs, rows);
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            set->srcs[i].data = data[i];
            rows[i].name = set->rows[i].name;
        }
        free(set->rows);
        set->rows = rows;
        rows = NULL;
    }
    free(srcs);
    free(rows);
    return rc;
}

int refit_load_set(refit_txn *t, refit_source_set *set, void *stream)
{
    if (!t)
        return REFIT_EINVAL;
    refit_model *m = txn_model(t);
    ctx_clear_error(m->ctx);
    if (!set)
        return ctx_error(m->ctx, REFIT_EINVAL, "refit_load_set: the source set is NULL");
    if (set->m != m)
        return ctx_error(m->ctx, REFIT_ESTATE, "refit_load_set: the source set is stale: %s; "
                         "build it again on this model (nothing written)",
                         set->m ? "it was built for another model" : "its model was destroyed");
    load_table tab = {set->n, NULL, NULL, set->rows, !set->staged};
    return load_table_run(t, &tab, stream, "refit_load_set");
}
