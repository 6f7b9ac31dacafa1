/* The descriptor checks of a delivery: the one place that decides whether
 * a source tensor fits its route (dims, dtype, device, extents, data).
 * Every loading path runs them (refit_load, refit_load_part,
 * refit_load_many, a source set when built or re-pointed, the NCCL
 * receiver's claims), so a rule added here holds for all of them. Nothing
 * here reads or changes a transaction. */
#include <stdio.h>
#include <string.h>

#include "core/ctx.h"
#include "core/desc_check.h"
#include "core/load.h"

#include "kernels/copy.h"

static int resolve_route(refit_model *m, const char *name, uint32_t ri, delivery *d)
{
    if (ri == NAMES_NONE)
        return ctx_error(m->ctx, REFIT_EUNEXPECTED, "load %s: no module of worker %s expects "
                         "this tensor; nothing written", name, m->ctx->worker_id);
    const route *r = &m->routes[ri];
    uint32_t gi = (r->flags & ROUTE_ALIAS) ? r->tie : ri;
    d->name = name;
    d->name_ri = ri;
    d->ri = gi;
    d->r = &m->routes[gi];
    return REFIT_OK;
}

int load_resolve(refit_model *m, const char *name, delivery *d)
{
    return resolve_route(m, name, names_find(&m->route_names, name), d);
}

int load_resolve_next(refit_model *m, const char *name, uint32_t *hint, delivery *d)
{
    uint32_t ri = *hint; /* route names are unique: equal to it is it */
    if (ri >= m->n_routes || strcmp(m->routes[ri].name, name))
        ri = names_find(&m->route_names, name);
    *hint = ri + 1;
    return resolve_route(m, name, ri, d);
}

/* src as a view; dims and dtype against the route r of the name delivered
 * (a tied name declares those of its primary). */
static int src_view(refit_model *m, const route *r, const refit_tensor *src, refit_view *v,
                    bool described)
{
    const backend *be = m->runtime[r->target].be;
    char why[256];
    desc_expect want = {r->spec.ndim, r->spec.dtype, described, 0};
    int rc = desc_check(src, &want, NULL, why, sizeof why);
    if (rc)
        return ctx_error(m->ctx, rc, "load %s (module %s): %s", r->name,
                         m->modules[r->module].name, why);
    if (!be->can_read(src->device))
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load %s: the %s backend of its target "
                         "cannot read a source on device type %d", r->name, be->name,
                         src->device.device_type);
    /* only the first ndim entries of the view are read: fill just those */
    v->data = src->data ? (char *)src->data + src->byte_offset : NULL;
    v->device = src->device;
    v->dtype = src->dtype;
    v->ndim = src->ndim;
    int64_t stride = 1; /* desc_check: neither overflows */
    for (int i = src->ndim - 1; i >= 0; i--) {
        v->shape[i] = src->shape[i];
        v->strides[i] = src->strides ? src->strides[i] : stride;
        stride *= src->shape[i] > 0 ? src->shape[i] : 1;
    }
    return REFIT_OK;
}

/* Extents against the (primary) route, and the rows of this rank covered. */
static int check_shape(refit_model *m, delivery *d, bool whole)
{
    const route *r = d->r;
    int sd = r->split_dim;
    for (int i = 0; i < r->spec.ndim; i++) {
        if (i == sd && !whole)
            continue;
        if (d->src.shape[i] != r->spec.shape[i])
            return ctx_error(m->ctx, REFIT_EMISMATCH,
                             "load %s (module %s): extent %lld on dim %d, expected %lld",
                             r->name, m->modules[r->module].name, (long long)d->src.shape[i],
                             i, (long long)r->spec.shape[i]);
    }
    d->off = whole ? 0 : d->off;
    d->len = sd >= 0 ? d->src.shape[sd] : 1;
    if (!whole) {
        if (sd < 0)
            return ctx_error(m->ctx, REFIT_EINVAL, "load %s: a scalar cannot be delivered in "
                             "parts", r->name);
        int64_t S = r->spec.shape[sd], end;
        if (d->off < 0 || d->len > S || d->off > S - d->len) {
            char rows[48]; /* the offset is the caller's: its end may overflow */
            if (__builtin_add_overflow(d->off, d->len, &end))
                snprintf(rows, sizeof rows, "%lld + %lld", (long long)d->off, (long long)d->len);
            else
                snprintf(rows, sizeof rows, "%lld", (long long)end);
            return ctx_error(m->ctx, REFIT_EMISMATCH, "load %s (module %s): part rows [%lld, "
                             "%s) outside [0, %lld) of dim %d", r->name,
                             m->modules[r->module].name, (long long)d->off, rows,
                             (long long)S, sd);
        }
    }
    d->a = d->off > r->lo ? d->off : r->lo;
    d->b = d->off + d->len < r->hi ? d->off + d->len : r->hi;
    if (sd < 0) {
        d->a = 0;
        d->b = 1;
    }
    return REFIT_OK;
}

int load_check(refit_model *m, delivery *d, const refit_tensor *src, bool whole,
               bool described)
{
    int rc = src_view(m, &m->routes[d->name_ri], src, &d->src, described);
    return rc ? rc : check_shape(m, d, whole);
}
