/* Masters of online modules: patches into runtimes quantized at post-load.
 *
 * A module whose format quantizes its runtime from whole checkpoint
 * tensors (STAGED routes, a post-load step) cannot take a patch in place:
 * a changed element moves its group's scale, and the other elements of
 * the group are not in the runtime any more. So refit keeps, within
 * refit_options.delta_master_budget, a master of each such tensor (this
 * rank's slice, in the checkpoint's dtype, on the staging device), copied
 * from the staged bytes after every post-load (master_keep). A patch
 * writes the master, then rebuilds the runtime of what it touched
 * (master_requantize): the row bands of the touched groups, each one plan
 * and post-load of a module holding only that band
 * (REFIT_GROUP_ROW_SLICES), or, when a scale spans the tensor, the whole
 * post-load unit. The format's own post-load does the arithmetic, so the
 * bytes are those of a full reload of the patched checkpoint.
 *
 * Life of a master: made by the first full load within the budget;
 * current (valid) from the commit that wrote it; each update's writes
 * are saved in its undo log first, so an abort puts the old bytes back
 * and it stays current; an abort that cannot restore, or a snapshot
 * restore of the module, leaves it stale until the next full load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/delta_master.h"
#include "core/ctx.h"
#include "core/host_services.h"
#include "kernels/copy.h"

typedef struct delta_master {
    void *data;                 /* this rank's slice, row-major; NULL: none */
    size_t bytes;
    const backend *be;
    int device;
    bool valid;                 /* what the committed runtime was built from */
    bool written;               /* by the open update */
    bool valid_before;          /* valid when the open update first wrote it */
    bool forgotten;             /* the open update wrote its runtime from
                                   elsewhere: stale whatever happens */
    /* a row band's module, kept while the model lives: a device post-load's
     * status word names it at finalize */
    refit_fmt_module sub;
    void *sub_ckpt;             /* its one checkpoint element */
    void *sub_rt;               /* its runtime elements (REFIT_GROUP_RUNTIME_ROWS) */
} delta_master;

struct master_table {
    delta_master *r;            /* per route */
    uint32_t n_routes;
    uint8_t *unit_patched;      /* per unit: patched by the open update */
    uint32_t n_units;
    uint64_t used;              /* bytes of masters, within the budget */
};

static struct master_table *table(refit_model *m)
{
    if (m->masters)
        return m->masters;
    struct master_table *mt = calloc(1, sizeof *mt);
    if (!mt)
        return NULL;
    mt->r = calloc(m->n_routes ? m->n_routes : 1, sizeof *mt->r);
    mt->unit_patched = calloc(m->n_units ? m->n_units : 1, 1);
    if (!mt->r || !mt->unit_patched) {
        free(mt->r);
        free(mt->unit_patched);
        free(mt);
        return NULL;
    }
    mt->n_routes = m->n_routes;
    mt->n_units = m->n_units;
    m->masters = mt;
    return mt;
}

static delta_master *master_of(const refit_model *m, uint32_t ri)
{
    return m->masters && ri < m->masters->n_routes ? &m->masters->r[ri] : NULL;
}

static refit_fmt_ckpt *ckpt_of(const refit_model *m, const route *r)
{
    return refit_ckpt(&m->modules[r->module].fm, r->fm_index);
}

void master_free(refit_model *m)
{
    struct master_table *mt = m->masters;
    if (!mt)
        return;
    for (uint32_t i = 0; i < mt->n_routes; i++) {
        delta_master *dm = &mt->r[i];
        if (dm->data)
            dm->be->staging_free(dm->data);
        free(dm->sub_ckpt);
        free(dm->sub_rt);
    }
    free(mt->r);
    free(mt->unit_patched);
    free(mt);
    m->masters = NULL;
}

/* The extent of view v in bytes: its first byte and the count. */
static size_t view_span(const refit_view *v, char **first)
{
    size_t e = kern_dtype_size(v->dtype);
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < v->ndim; i++) {
        int64_t reach = (v->shape[i] - 1) * v->strides[i];
        if (reach < 0)
            lo += reach;
        else
            hi += reach;
    }
    *first = (char *)v->data + lo * (int64_t)e;
    return (size_t)(hi - lo + 1) * e;
}

/* The open update writes dm: remember what it was; save the bytes of
 * piece (the whole master when NULL) while they are current. */
static int master_touch(refit_txn *t, const delivery *d, delta_master *dm,
                        const refit_view *piece)
{
    if (!dm->written) {
        dm->written = true;
        dm->valid_before = dm->valid;
    }
    if (!dm->valid_before)
        return REFIT_OK; /* nothing current to put back */
    char *first = dm->data;
    size_t n = piece ? view_span(piece, &first) : dm->bytes;
    char what[160];
    snprintf(what, sizeof what, "the master of %s", d->r->name);
    return txn_save_bytes(t, d, dm->be, dm->device, first, n, what);
}

refit_view master_view(const refit_model *m, const delivery *d)
{
    const delta_master *dm = master_of(m, d->ri);
    refit_view v = d->r->staged_shape;
    v.data = dm ? dm->data : NULL;
    return v;
}

/* ---- kept current by every post-load ---- */

static int keep_one(refit_txn *t, struct master_table *mt, uint32_t ri, const refit_fmt_ckpt *c,
                    void *stream)
{
    refit_model *m = txn_model(t);
    route *r = &m->routes[ri];
    delta_master *dm = &mt->r[ri];
    if (!dm->data) {
        if (mt->used + r->staged_bytes > m->ctx->delta_master_budget)
            return REFIT_OK; /* no room: a patch of it is refused, saying so */
        const backend *be = m->runtime[r->target].be;
        if (!(dm->data = be->staging_alloc(r->staged_bytes)))
            return REFIT_OK; /* as above */
        dm->bytes = r->staged_bytes;
        dm->be = be;
        dm->device = r->staged_shape.device.device_id;
        mt->used += dm->bytes;
    }
    delivery d = {.name = r->name, .name_ri = ri, .r = r, .ri = ri, .stream = stream};
    refit_view dst = master_view(m, &d);
    int rc = master_touch(t, &d, dm, NULL);
    if (!rc)
        rc = txn_stream_used(t, dm->be, stream);
    if (!rc && (rc = dm->be->copy(&dst, &c->staged, stream)))
        return txn_load_fail(t, ctx_error(m->ctx, rc, "module %s: copying %s into its master "
                                          "failed: %s%s%s", m->modules[r->module].name,
                                          r->name, refit_strerror(rc),
                                          dm->be->last_error()[0] ? ": " : "",
                                          dm->be->last_error()));
    return rc;
}

int master_keep(refit_txn *t, uint32_t u, void *stream)
{
    refit_model *m = txn_model(t);
    if (!m->ctx->delta_master_budget)
        return REFIT_OK;
    struct master_table *mt = table(m);
    if (!mt)
        return REFIT_OK; /* no memory for the table: no masters, patches refused */
    const stage_unit *su = &m->units[u];
    const module *mod = &m->modules[su->module];
    const backend *be = NULL;
    for (uint32_t i = su->first; i < su->first + su->n_primary; i++) {
        uint32_t ri = mod->primary[i];
        const refit_fmt_ckpt *c = refit_ckpt(&mod->fm, i);
        if (m->routes[ri].kind != REFIT_ROUTE_STAGED || !(c->group.flags & REFIT_GROUP_DECLARED))
            continue;
        int rc = keep_one(t, mt, ri, c, stream);
        if (rc)
            return rc;
        be = mt->r[ri].data ? mt->r[ri].be : be;
    }
    /* a batching backend starts the copies now: the staged bytes may be
     * the caller's, read before the loading call returns */
    return be && be->flush ? be->flush(stream) : REFIT_OK;
}

void master_txn_end(refit_model *m, bool committed, bool restored)
{
    struct master_table *mt = m->masters;
    if (!mt)
        return;
    for (uint32_t i = 0; i < mt->n_routes; i++) {
        delta_master *dm = &mt->r[i];
        if (dm->forgotten)
            dm->valid = false;
        else if (dm->written)
            dm->valid = committed || (restored && dm->valid_before);
        dm->written = dm->forgotten = false;
    }
    memset(mt->unit_patched, 0, mt->n_units);
}

void master_units_clear(refit_model *m)
{
    if (m->masters)
        memset(m->masters->unit_patched, 0, m->masters->n_units);
}

void master_forget(refit_model *m, uint32_t mi)
{
    const module *mod = &m->modules[mi];
    for (uint32_t i = 0; i < mod->n_primary; i++) {
        delta_master *dm = master_of(m, mod->primary[i]);
        if (dm)
            dm->forgotten = true;
    }
}

bool master_unit_patched(const refit_model *m, uint32_t u)
{
    return m->masters && u < m->masters->n_units && m->masters->unit_patched[u];
}

bool master_module_settled(const refit_txn *t, uint32_t mi)
{
    const refit_model *m = txn_model(t);
    const module *mod = &m->modules[mi];
    bool patched = false;
    for (uint32_t u = mod->unit0; u < mod->unit0 + mod->n_units; u++) {
        uint32_t done = txn_unit_complete(t, u);
        if (master_unit_patched(m, u))
            patched = true;
        else if (done && done != m->units[u].n_primary)
            return false; /* a unit partly delivered whole */
    }
    return patched;
}

/* ---- a patch ---- */

bool master_whole_unit(const refit_model *m, const delivery *d)
{
    const refit_fmt_ckpt *c = ckpt_of(m, d->r);
    return (c->group.flags & REFIT_GROUP_WHOLE) || !(c->group.flags & REFIT_GROUP_ROW_SLICES) ||
           c->group.rows < 1 || c->ndim != 2 || d->r->spec.ndim != 2;
}

/* Module mod's bytes a master of it would take (this rank's slices). */
static uint64_t module_master_bytes(const refit_model *m, const module *mod)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < mod->n_primary; i++) {
        const route *r = &m->routes[mod->primary[i]];
        if (r->kind == REFIT_ROUTE_STAGED)
            n += r->staged_bytes;
    }
    return n;
}

/* Is the master of route ri current? The message when not. */
static int master_current(refit_txn *t, const delivery *d, uint32_t ri)
{
    refit_model *m = txn_model(t);
    const module *mod = &m->modules[d->r->module];
    const delta_master *dm = master_of(m, ri);
    const char *name = m->routes[ri].name;
    if (!dm || !dm->data)
        return ctx_error(m->ctx, REFIT_EBUDGET, "load_delta %s (module %s): refit keeps no "
                         "master of %s to patch: refit_options.delta_master_budget (%llu "
                         "bytes, %llu taken) ran out before it, or the module was not loaded "
                         "whole since the model was sealed; the module needs %llu bytes; "
                         "raise the budget and load the module whole once, or deliver the "
                         "tensor whole (refit_load); nothing written", d->name, mod->name,
                         name, (unsigned long long)m->ctx->delta_master_budget,
                         (unsigned long long)(m->masters ? m->masters->used : 0),
                         (unsigned long long)module_master_bytes(m, mod));
    if (!dm->valid)
        return ctx_error(m->ctx, REFIT_ESTATE, "load_delta %s (module %s): the master of %s is "
                         "stale (the module was restored from a snapshot, or an update was "
                         "aborted without putting its bytes back, since its last full load); "
                         "load the module whole once; nothing written", d->name, mod->name,
                         name);
    return REFIT_OK;
}

int master_admit(refit_txn *t, const delivery *d)
{
    refit_model *m = txn_model(t);
    const route *r = d->r;
    const module *mod = &m->modules[r->module];
    const refit_fmt_ckpt *c = ckpt_of(m, r);
    if (!(c->group.flags & REFIT_GROUP_DECLARED))
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load_delta %s (module %s): format %s "
                         "builds this module's runtime tensors from whole checkpoint tensors "
                         "in a post-load step (online quantization) and declares no "
                         "quantization group for them (refit_fmt_ckpt.group), so a patch "
                         "cannot be applied; deliver the tensor whole (refit_load); nothing "
                         "written", d->name, mod->name, mod->fmt->name);
    if (!m->ctx->delta_master_budget)
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load_delta %s (module %s): format %s "
                         "quantizes this module online (a post-load step) from whole "
                         "checkpoint tensors, and refit keeps no master of them to patch: "
                         "refit_options.delta_master_budget is 0; give it at least %llu bytes "
                         "(this rank's slices of the module's online tensors) and load the "
                         "module whole once, or deliver the tensor whole (refit_load); "
                         "nothing written", d->name, mod->name, mod->fmt->name,
                         (unsigned long long)module_master_bytes(m, mod));
    uint32_t u = r->unit;
    if (!master_unit_patched(m, u) && (txn_unit_complete(t, u) || txn_unit_has_staging(t, u)))
        return ctx_error(m->ctx, REFIT_ESTATE, "load_delta %s (module %s): tensors of its "
                         "post-load unit arrived whole earlier in update '%s'; deliver the "
                         "unit's tensors all whole or all as patches; nothing written",
                         d->name, mod->name, txn_version_label(t));
    if (!master_whole_unit(m, d))
        return master_current(t, d, d->ri);
    const stage_unit *su = &m->units[u];
    for (uint32_t i = su->first; i < su->first + su->n_primary; i++) {
        uint32_t ri = mod->primary[i];
        if (m->routes[ri].kind != REFIT_ROUTE_STAGED)
            continue;
        int rc = master_current(t, d, ri);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

int master_write(refit_txn *t, const delivery *d, const refit_view *dst,
                 const refit_view *src)
{
    refit_model *m = txn_model(t);
    delta_master *dm = master_of(m, d->ri);
    m->masters->unit_patched[d->r->unit] = 1;
    int rc = master_touch(t, d, dm, dst);
    if (!rc)
        rc = txn_stream_used(t, dm->be, d->stream);
    if (!rc && (rc = dm->be->copy(dst, src, d->stream)))
        return txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s (module %s): copy into "
                                          "its master failed: %s%s%s", d->name,
                                          m->modules[d->r->module].name, refit_strerror(rc),
                                          dm->be->last_error()[0] ? ": " : "",
                                          dm->be->last_error()));
    return rc;
}

bool master_holds_whole(const delivery *d)
{
    const route *r = d->r;
    return r->split_dim < 0 || (r->lo == 0 && r->hi == r->spec.shape[r->split_dim]);
}

static int run_by_vpos(const void *a, const void *b)
{
    const delta_run *x = a, *y = b;
    return x->vpos < y->vpos ? -1 : x->vpos > y->vpos;
}

int master_scatter(refit_txn *t, const delivery *d, const delta_run *runs, size_t n,
                   const refit_view *values)
{
    refit_model *m = txn_model(t);
    delta_master *dm = master_of(m, d->ri);
    m->masters->unit_patched[d->r->unit] = 1;
    if (!dm->written) {
        dm->written = true;
        dm->valid_before = dm->valid;
    }
    /* the scatter takes the values in order: the runs in the order of their
     * values (the caller's), each its checkpoint offset */
    delta_run *byv = malloc((n ? n : 1) * sizeof *byv);
    int64_t *off = malloc((n ? n : 1) * 2 * sizeof *off);
    if (!byv || !off) {
        free(byv);
        free(off);
        return txn_load_fail(t, ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory",
                                          d->name));
    }
    memcpy(byv, runs, n * sizeof *byv);
    qsort(byv, n, sizeof *byv, run_by_vpos);
    int64_t *counts = off + n, elements = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = byv[i].start;
        counts[i] = byv[i].count;
        elements += byv[i].count;
    }
    backend_scatter sc = {
        .dst = dm->data, .dst_device = d->r->staged_shape.device,
        .dst_dtype = d->r->staged_shape.dtype, .off = off, .counts = counts, .n = n,
        .run_stride = 1, .elements = elements, .values = values->data,
        .values_dtype = values->dtype, .values_device = values->device,
        .values_stride = values->strides[0],
    };
    char what[160];
    snprintf(what, sizeof what, "the master of %s", d->r->name);
    /* (the backend reads off and counts before it returns: they are ours) */
    int rc;
    if (dm->valid_before) /* the old elements saved in the same pass */
        rc = txn_scatter_bytes(t, d, dm->be, dm->device, &sc, what);
    else if (!(rc = txn_stream_used(t, dm->be, d->stream)) &&
             (rc = dm->be->scatter(&sc, d->stream)))
        rc = txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s: the scatter into %s "
                                        "failed: %s", d->name, what, refit_strerror(rc)));
    free(byv);
    free(off);
    return rc;
}

/* ---- the rebuild ---- */

static void narrow_rows(refit_view *v, int64_t a, int64_t rows)
{
    v->data = (char *)v->data + a * v->strides[0] * (int64_t)kern_dtype_size(v->dtype);
    v->shape[0] = rows;
}

/* A post-load of fm (unit or band) failed: the update fails, the message
 * the format's, with where. Bad data found on a device is reported at
 * finalize instead (the status word). */
static int rebuild_failed(refit_txn *t, const delivery *d, const char *what, int rc)
{
    refit_model *m = txn_model(t);
    char why[REFIT_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", m->ctx->errmsg[0] ? m->ctx->errmsg : refit_strerror(rc));
    return txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s (module %s): rebuilding %s "
                                      "by format %s failed: %s; update '%s' failed: abort it "
                                      "(the patch is undone with it)", d->name,
                                      m->modules[d->r->module].name, what,
                                      m->modules[d->r->module].fmt->name, why,
                                      txn_version_label(t)));
}

/* Point the staged views of unit u's STAGED tensors at their masters
 * (set) or at nothing. */
static void unit_staged(refit_model *m, uint32_t u, bool set)
{
    const stage_unit *su = &m->units[u];
    module *mod = &m->modules[su->module];
    for (uint32_t i = su->first; i < su->first + su->n_primary; i++) {
        uint32_t ri = mod->primary[i];
        route *r = &m->routes[ri];
        if (r->kind != REFIT_ROUTE_STAGED)
            continue;
        refit_fmt_ckpt *c = refit_ckpt(&mod->fm, i);
        c->staged = r->staged_shape;
        c->staged.data = set ? m->masters->r[ri].data : NULL;
    }
}

int master_requantize_unit(refit_txn *t, const delivery *d)
{
    refit_model *m = txn_model(t);
    uint32_t u = d->r->unit;
    const stage_unit *su = &m->units[u];
    const module *mod = &m->modules[su->module];
    const refit_fmt_module *fm = su->fm;
    /* what the post-load may write: the unit's runtime views */
    for (uint32_t k = 0; k < mod->n_runtime; k++) {
        int rc = txn_save_span(t, d, mod->runtime[k], &refit_runtime(fm, k)->view);
        if (rc)
            return rc;
    }
    const backend *be = m->masters->r[d->ri].be;
    int rc = be->flush ? be->flush(d->stream) : REFIT_OK; /* the patch lands first */
    if (rc)
        return txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s: patch copies failed: %s",
                                          d->name, refit_strerror(rc)));
    unit_staged(m, u, true);
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    host_services_enter(ctx, fm);
    rc = mod->fmt->post_load(&ctx->host, fm, d->stream);
    host_services_leave(ctx);
    unit_staged(m, u, false);
    return rc ? rebuild_failed(t, d, su->expert >= 0 ? "its expert's slice" : "the module", rc)
              : REFIT_OK;
}

/* The module of rows [a, b) of d's tensor alone, in dm->sub. */
static int band_module(refit_model *m, const delivery *d, delta_master *dm, int64_t a,
                       int64_t b)
{
    const route *r = d->r;
    const refit_fmt_module *ufm = m->units[r->unit].fm;
    const refit_fmt_ckpt *c = ckpt_of(m, r);
    bool rt_rows = (c->group.flags & REFIT_GROUP_RUNTIME_ROWS) != 0;
    if (!dm->sub_ckpt && !(dm->sub_ckpt = malloc(ufm->ckpt_stride)))
        return REFIT_ENOMEM;
    if (rt_rows && !dm->sub_rt &&
        !(dm->sub_rt = malloc((size_t)ufm->runtime_stride * (ufm->n_runtime ? ufm->n_runtime : 1))))
        return REFIT_ENOMEM;
    refit_fmt_module *sub = &dm->sub;
    memset(sub, 0, sizeof *sub);
    sub->name = ufm->name;
    sub->params = ufm->params;
    sub->n_ckpt = 1;
    sub->ckpt_stride = ufm->ckpt_stride;
    sub->ckpt = dm->sub_ckpt;
    sub->n_runtime = ufm->n_runtime;
    sub->runtime_stride = ufm->runtime_stride;
    sub->runtime = ufm->runtime;
    refit_fmt_ckpt *sc = sub->ckpt;
    memcpy(sc, c, ufm->ckpt_stride);
    sc->route = 0;
    sc->flags = 0;
    memset(&sc->group, 0, sizeof sc->group);
    sc->shape[0] = b - a;
    sc->staged = master_view(m, d);
    narrow_rows(&sc->staged, a, b - a);
    if (sc->place.ndim > 0 && sc->place.data)
        narrow_rows(&sc->place, a, b - a);
    if (r->split_dim == 0) {
        sc->slice_lo = c->slice_lo + a;
        sc->slice_hi = sc->slice_lo + (b - a);
    }
    if (rt_rows) {
        memcpy(dm->sub_rt, ufm->runtime, (size_t)ufm->runtime_stride * ufm->n_runtime);
        sub->runtime = dm->sub_rt;
        for (uint32_t k = 0; k < sub->n_runtime; k++) {
            refit_view *v = &refit_runtime(sub, k)->view;
            if (v->ndim > 0)
                narrow_rows(v, a, b - a);
        }
    }
    return REFIT_OK;
}

/* What the band's post-load writes, saved: with RUNTIME_ROWS the band of
 * every runtime tensor; else the band of the target where the tensor
 * lands, and the module's other runtime tensors (scales) whole. */
static int band_save(refit_txn *t, const delivery *d, const delta_master *dm)
{
    refit_model *m = txn_model(t);
    const module *mod = &m->modules[d->r->module];
    const refit_fmt_module *sub = &dm->sub;
    const refit_fmt_ckpt *sc = sub->ckpt;
    bool rt_rows = (ckpt_of(m, d->r)->group.flags & REFIT_GROUP_RUNTIME_ROWS) != 0;
    for (uint32_t k = 0; k < mod->n_runtime; k++) {
        uint32_t ti = mod->runtime[k];
        int rc;
        if (rt_rows)
            rc = txn_save_span(t, d, ti, &refit_runtime(sub, k)->view);
        else if (ti == d->r->target && sc->place.ndim > 0 && sc->place.data)
            rc = txn_save_span(t, d, ti, &sc->place);
        else
            rc = txn_save_whole(t, d, ti);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* Plan and post-load rows [a, b) of d's tensor alone. */
static int rebuild_band(refit_txn *t, const delivery *d, int64_t a, int64_t b)
{
    refit_model *m = txn_model(t);
    delta_master *dm = master_of(m, d->ri);
    const module *mod = &m->modules[d->r->module];
    char what[96];
    snprintf(what, sizeof what, "rows [%lld, %lld)", (long long)a, (long long)b);
    int rc = band_module(m, d, dm, a, b);
    if (rc)
        return txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s: out of memory", d->name));
    if ((rc = band_save(t, d, dm)))
        return rc;
    refit_ctx *ctx = m->ctx;
    refit_fmt_module *sub = &dm->sub;
    ctx_clear_error(ctx);
    host_services_enter(ctx, sub);
    rc = mod->fmt->plan(&ctx->host, sub);
    if (!rc && (refit_ckpt(sub, 0)->route != REFIT_ROUTE_STAGED ||
                !(sub->flags & REFIT_MODULE_POST_LOAD)))
        rc = ctx_error(ctx, REFIT_EFORMAT, "format %s planned a band of rows unlike the whole "
                       "tensor (it declares REFIT_GROUP_ROW_SLICES)", mod->fmt->name);
    if (!rc)
        rc = mod->fmt->post_load(&ctx->host, sub, d->stream);
    if (mod->fmt->release && sub->state)
        mod->fmt->release(&ctx->host, sub);
    sub->state = NULL;
    host_services_leave(ctx);
    return rc ? rebuild_failed(t, d, what, rc) : REFIT_OK;
}

int master_requantize(refit_txn *t, const delivery *d, const delta_run *runs, size_t n)
{
    refit_model *m = txn_model(t);
    const route *r = d->r;
    int64_t g = ckpt_of(m, r)->group.rows, rows = r->staged_shape.shape[0];
    int64_t cols = r->spec.shape[1], lo = r->split_dim == 0 ? r->lo : 0;
    int64_t hi = r->split_dim == 0 ? r->hi : rows, groups = (rows + g - 1) / g;
    uint8_t *mark = calloc(groups ? (size_t)groups : 1, 1);
    if (!mark)
        return txn_load_fail(t, ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory",
                                          d->name));
    /* the groups whose rows hold a changed element of this rank's slice */
    for (size_t i = 0; i < n && cols > 0; i++) {
        int64_t first = runs[i].start / cols, last = (runs[i].start + runs[i].count - 1) / cols;
        first = first > lo ? first : lo;
        last = last < hi - 1 ? last : hi - 1;
        for (int64_t k = first - lo; first <= last && k <= last - lo; k += g - (k % g))
            mark[k / g] = 1;
    }
    const backend *be = master_of(m, d->ri)->be;
    int rc = be->flush ? be->flush(d->stream) : REFIT_OK; /* the patch lands first */
    if (rc)
        rc = txn_load_fail(t, ctx_error(m->ctx, rc, "load_delta %s: patch copies failed: %s",
                                        d->name, refit_strerror(rc)));
    /* one plan and post-load per run of touched groups */
    for (int64_t a = 0, b; a < groups && !rc; a = b) {
        if (!mark[a]) {
            b = a + 1;
            continue;
        }
        for (b = a + 1; b < groups && mark[b];)
            b++;
        rc = rebuild_band(t, d, a * g, b * g < rows ? b * g : rows);
    }
    free(mark);
    return rc;
}
