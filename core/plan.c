/* The plan, built once at seal: every checkpoint tensor gets a route (its
 * rows for this rank, its place in the target, its pad rows), every module
 * is planned by its format, and every runtime and side tensor's signature is
 * recorded. Nothing is written; a refusal leaves the model unsealed. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/plan.h"
#include "core/desc_check.h"
#include "core/util.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/host_services.h"
#include "core/plugin_loader.h"
#include "kernels/copy.h"

/* ---- signatures ---- */

static void row_major(int64_t *strides, const int64_t *shape, int ndim)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int signature_take(signature *sig, const refit_tensor *t)
{
    memset(sig, 0, sizeof *sig);
    sig->data = t->data;
    sig->device = t->device;
    sig->dtype = t->dtype;
    sig->ndim = t->ndim;
    sig->byte_offset = t->byte_offset;
    /* read again at every begin: the engine may have changed it since */
    if (desc_check(t, NULL, NULL, NULL, 0))
        return REFIT_EINVAL;
    for (int i = 0; i < t->ndim; i++)
        sig->shape[i] = t->shape[i];
    if (t->strides)
        for (int i = 0; i < t->ndim; i++)
            sig->strides[i] = t->strides[i];
    else
        row_major(sig->strides, sig->shape, sig->ndim);
    return REFIT_OK;
}

void view_from_signature(refit_view *v, const signature *sig)
{
    memset(v, 0, sizeof *v);
    v->data = (char *)sig->data + sig->byte_offset;
    v->device = sig->device;
    v->dtype = sig->dtype;
    v->ndim = sig->ndim;
    memcpy(v->shape, sig->shape, sizeof v->shape);
    memcpy(v->strides, sig->strides, sizeof v->strides);
}

/* Rows [from, from + rows) of dim of v. */
static void narrow_view(refit_view *v, int dim, int64_t from, int64_t rows)
{
    v->data = (char *)v->data + from * v->strides[dim] * (int64_t)kern_dtype_size(v->dtype);
    v->shape[dim] = rows;
}

/* Lowest byte and extent of the memory a tensor touches (undo log span). */
static int reg_span(refit_model *m, tensor_reg *r, const char *what)
{
    const refit_view *v = &r->view;
    int64_t numel = kern_view_numel(v);
    r->span = v->data;
    r->span_bytes = 0;
    if (numel == 0)
        return REFIT_OK;
    size_t e = kern_dtype_size(v->dtype);
    if (e == 0) { /* sub-byte: whole bytes of a row-major tensor only */
        int64_t rm[REFIT_MAX_DIMS];
        row_major(rm, v->shape, v->ndim);
        if (memcmp(rm, v->strides, sizeof(int64_t) * (size_t)v->ndim))
            return ctx_error(m->ctx, REFIT_EUNSUPPORTED,
                             "%s %s: %u-bit elements must be row-major", what, r->name,
                             v->dtype.bits);
        r->span_bytes = tensor_dtype_bytes(v->dtype, numel);
        return REFIT_OK;
    }
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < v->ndim; i++) {
        int64_t reach = (v->shape[i] - 1) * v->strides[i];
        if (reach < 0)
            lo += reach;
        else
            hi += reach;
    }
    r->span = (char *)v->data + lo * (int64_t)e;
    r->span_bytes = (size_t)(hi - lo + 1) * e;
    return REFIT_OK;
}

static int take_reg(refit_model *m, tensor_reg *r, const char *what, bool written)
{
    char why[512];
    int rc = written ? desc_check_written(r->desc, why, sizeof why) /* no aliasing */
                     : desc_check(r->desc, NULL, NULL, why, sizeof why);
    if (rc || (rc = signature_take(&r->sig, r->desc)))
        return ctx_error(m->ctx, rc, "%s %s: invalid descriptor: %s", what, r->name, why);
    view_from_signature(&r->view, &r->sig);
    r->be = backend_for_device(r->sig.device);
    if (!r->be)
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED,
                         "%s %s: no backend for device type %d in this build", what, r->name,
                         r->sig.device.device_type);
    if (!r->view.data && kern_view_numel(&r->view) > 0)
        return ctx_error(m->ctx, REFIT_EINVAL, "%s %s: data is NULL", what, r->name);
    return reg_span(m, r, what);
}

static int sig_equal(const signature *a, const signature *b)
{
    if (a->data != b->data || a->device.device_type != b->device.device_type ||
        a->device.device_id != b->device.device_id || !kern_dtype_eq(a->dtype, b->dtype) ||
        a->ndim != b->ndim || a->byte_offset != b->byte_offset)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i])
            return 0;
    return 1;
}

static int check_reg(refit_model *m, const tensor_reg *r, const char *kind, const char *when)
{
    signature now;
    if (signature_take(&now, r->desc) || !sig_equal(&now, &r->sig)) {
        const char *mod = r->module == UINT32_MAX ? "-" : m->modules[r->module].name;
        return ctx_error(m->ctx, REFIT_EMOVED,
                         "%s: %s tensor %s (module %s) moved or changed since seal "
                         "(data %p -> %p, ndim %d -> %d); refusing, nothing written",
                         when, kind, r->name, mod, r->sig.data, now.data, r->sig.ndim, now.ndim);
    }
    return REFIT_OK;
}

int model_check_signatures(refit_model *m, const char *when)
{
    for (uint32_t i = 0; i < m->n_runtime; i++) {
        int rc = check_reg(m, &m->runtime[i], "runtime", when);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < m->n_side; i++) {
        int rc = check_reg(m, &m->side[i], "side", when);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* ---- route geometry ---- */

#define ROUTE_ERR(m, r, status, ...) route_error(m, r, status, __VA_ARGS__)

static int route_error(refit_model *m, const route *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int route_error(refit_model *m, const route *r, int status, const char *fmt, ...)
{
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return ctx_error(m->ctx, status, "module %s, tensor %s: %s", m->modules[r->module].name,
                     r->name, why);
}

/* This rank's rows of the split dim: [lo, hi) of real data plus pad rows. */
static int route_rows(refit_model *m, route *r)
{
    const refit_ckpt_spec *s = &r->spec;
    int sharded = s->shard_count > 1;
    r->split_dim = sharded ? s->shard_dim : (s->ndim > 0 ? 0 : -1);
    if (r->split_dim < 0) {
        if (s->pad_to)
            return ROUTE_ERR(m, r, REFIT_EINVAL, "a scalar cannot be padded");
        r->lo = 0;
        r->hi = 1;
        r->len = 1;
        return REFIT_OK;
    }
    int64_t S = s->shape[r->split_dim];
    int64_t P = s->pad_to ? s->pad_to : S;
    if (P < S)
        return ROUTE_ERR(m, r, REFIT_EINVAL, "pad_to %lld is smaller than the extent %lld",
                         (long long)P, (long long)S);
    int64_t n = sharded ? s->shard_count : 1, rank = sharded ? s->shard_rank : 0;
    int64_t base = P / n, extra = P % n;
    int64_t a = rank * base + (rank < extra ? rank : extra);
    int64_t len = base + (rank < extra ? 1 : 0);
    r->lo = a < S ? a : S;
    r->hi = a + len < S ? a + len : S;
    r->len = len;
    return REFIT_OK;
}

/* Place the route in its target: the box this rank's rows (and pad) fill. */
static int route_place(refit_model *m, route *r, refit_view *dst,
                       refit_view *pad, int64_t *box_lo, int64_t *box_hi)
{
    const refit_ckpt_spec *s = &r->spec;
    const tensor_reg *t = &m->runtime[r->target];
    refit_view v = t->view;
    int tdim = 0;
    box_lo[0] = 0;
    if (s->expert >= 0) {
        if (v.ndim != s->ndim + 1)
            return ROUTE_ERR(m, r, REFIT_EMISMATCH,
                             "expert %lld needs a stacked target of %d dims; %s has %d",
                             (long long)s->expert, s->ndim + 1, t->name, v.ndim);
        if (s->expert >= v.shape[0])
            return ROUTE_ERR(m, r, REFIT_EMISMATCH, "expert %lld is beyond %s's %lld experts",
                             (long long)s->expert, t->name, (long long)v.shape[0]);
        box_lo[0] = s->expert;
        box_hi[0] = s->expert + 1;
        tdim = 1;
    } else if (v.ndim != s->ndim) {
        return ROUTE_ERR(m, r, REFIT_EMISMATCH, "checkpoint has %d dims, runtime %s has %d",
                         s->ndim, t->name, v.ndim);
    }
    size_t e = kern_dtype_size(v.dtype);
    char *base = v.data;
    if (tdim)
        base += s->expert * v.strides[0] * (int64_t)e;
    refit_view out = {.data = NULL, .device = v.device, .dtype = v.dtype, .ndim = s->ndim};
    for (int i = 0; i < s->ndim; i++) {
        int64_t ext = i == r->split_dim ? r->len : s->shape[i];
        int64_t off = s->dst_offset[i], have = v.shape[i + tdim];
        if (off < 0 || ext > have || off > have - ext)
            return ROUTE_ERR(m, r, REFIT_EMISMATCH,
                             "dim %d: rows [%lld, %lld) do not fit runtime %s's extent %lld", i,
                             (long long)off, (long long)(off + ext), t->name, (long long)have);
        base += off * v.strides[i + tdim] * (int64_t)e;
        out.shape[i] = ext;
        out.strides[i] = v.strides[i + tdim];
        box_lo[i + tdim] = off;
        box_hi[i + tdim] = off + ext;
    }
    out.data = base;
    *dst = out;
    *pad = out;
    if (r->split_dim >= 0) {
        int64_t rows = r->hi - r->lo;
        dst->shape[r->split_dim] = rows;
        pad->shape[r->split_dim] = r->len - rows;
        pad->data = base + rows * out.strides[r->split_dim] * (int64_t)e;
    } else {
        pad->ndim = -1; /* no pad */
    }
    return REFIT_OK;
}

/* ---- per-target overlap and coverage ---- */

typedef struct box {
    uint32_t route;
    int64_t lo[REFIT_MAX_DIMS + 1], hi[REFIT_MAX_DIMS + 1];
} box;

static int box_cmp(const void *a, const void *b)
{
    const box *x = a, *y = b;
    return x->lo[0] < y->lo[0] ? -1 : x->lo[0] > y->lo[0];
}

static int box_overlap(const box *a, const box *b, int nd)
{
    for (int i = 0; i < nd; i++)
        if (a->hi[i] <= b->lo[i] || b->hi[i] <= a->lo[i])
            return 0;
    return 1;
}

static int box_empty(const box *a, int nd)
{
    for (int i = 0; i < nd; i++)
        if (a->hi[i] <= a->lo[i])
            return 1;
    return 0;
}

/* Boxes of one target, sorted by dim 0; neighbours in dim 0 are compared. */
static int check_target(refit_model *m, uint32_t ti, box *boxes, uint32_t n, int need_cover)
{
    const tensor_reg *t = &m->runtime[ti];
    int nd = t->view.ndim;
    qsort(boxes, n, sizeof *boxes, box_cmp);
    int64_t covered = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t vol = 1;
        for (int d = 0; d < nd; d++)
            vol *= boxes[i].hi[d] - boxes[i].lo[d];
        covered += vol;
        for (uint32_t j = i + 1; j < n && (nd == 0 || boxes[j].lo[0] < boxes[i].hi[0]); j++) {
            if (box_empty(&boxes[i], nd) || box_empty(&boxes[j], nd) ||
                !box_overlap(&boxes[i], &boxes[j], nd))
                continue;
            return ctx_error(m->ctx, REFIT_EOVERLAP,
                             "module %s: checkpoint tensors %s and %s overlap in runtime %s",
                             m->modules[t->module].name, m->routes[boxes[i].route].name,
                             m->routes[boxes[j].route].name, t->name);
        }
    }
    int64_t numel = kern_view_numel(&t->view);
    if (need_cover && covered != numel)
        return ctx_error(m->ctx, REFIT_EINCOMPLETE,
                         "module %s: %lld of %lld elements of runtime %s receive no checkpoint "
                         "tensor (they would never be reloaded)",
                         m->modules[t->module].name, (long long)(numel - covered),
                         (long long)numel, t->name);
    return REFIT_OK;
}

/* ---- modules ---- */

static int resolve_target(refit_model *m, route *r)
{
    module *mod = &m->modules[r->module];
    if (!r->target_name) {
        if (mod->n_runtime != 1)
            return ROUTE_ERR(m, r, REFIT_EINVAL,
                             "no target named and the module has %u runtime tensors",
                             mod->n_runtime);
        r->target = mod->runtime[0];
        return REFIT_OK;
    }
    r->target = model_find_runtime(m, mod, r->target_name);
    if (r->target == NAMES_NONE)
        return ROUTE_ERR(m, r, REFIT_ENOTFOUND, "target %s is not a runtime tensor of the module",
                         r->target_name);
    return REFIT_OK;
}

static int resolve_tie(refit_model *m, route *r)
{
    uint32_t p = names_find(&m->route_names, r->tie_name);
    if (p == NAMES_NONE)
        return ROUTE_ERR(m, r, REFIT_ENOTFOUND, "tied to %s, which no module expects",
                         r->tie_name);
    const route *pr = &m->routes[p];
    if (pr->flags & ROUTE_ALIAS)
        return ROUTE_ERR(m, r, REFIT_EINVAL, "tied to %s, itself tied to %s", pr->name,
                         pr->tie_name);
    if (pr->module != r->module)
        return ROUTE_ERR(m, r, REFIT_EINVAL, "tied to %s of module %s; ties stay in one module",
                         pr->name, m->modules[pr->module].name);
    r->tie = p;
    m->routes[p].flags |= ROUTE_TIED;
    r->spec = pr->spec;
    r->spec.tie_of = r->tie_name;
    r->split_dim = pr->split_dim;
    r->lo = pr->lo;
    r->hi = pr->hi;
    r->len = pr->len;
    r->bytes = pr->bytes;
    r->target = pr->target;
    return REFIT_OK;
}

static int module_build_fm(refit_model *m, module *mod)
{
    refit_fmt_module *fm = &mod->fm;
    memset(fm, 0, sizeof *fm);
    fm->name = mod->name;
    fm->params = &mod->params;
    fm->ckpt_stride = sizeof *fm->ckpt;
    fm->runtime_stride = sizeof *fm->runtime;
    fm->ckpt = calloc(mod->n_primary ? mod->n_primary : 1, sizeof *fm->ckpt);
    fm->runtime = calloc(mod->n_runtime ? mod->n_runtime : 1, sizeof *fm->runtime);
    mod->primary = calloc(mod->n_primary ? mod->n_primary : 1, sizeof *mod->primary);
    if (!fm->ckpt || !fm->runtime || !mod->primary)
        return ctx_error(m->ctx, REFIT_ENOMEM, "module %s: out of memory", mod->name);
    fm->n_runtime = mod->n_runtime;
    for (uint32_t i = 0; i < mod->n_runtime; i++) {
        fm->runtime[i].name = m->runtime[mod->runtime[i]].name;
        fm->runtime[i].view = m->runtime[mod->runtime[i]].view;
    }
    for (uint32_t i = 0; i < mod->n_routes; i++) {
        route *r = &m->routes[mod->routes[i]];
        if (r->flags & ROUTE_ALIAS)
            continue;
        refit_fmt_ckpt *c = &fm->ckpt[fm->n_ckpt];
        c->name = r->name;
        c->target = m->runtime[r->target].name;
        for (uint32_t k = 0; k < mod->n_runtime; k++)
            if (mod->runtime[k] == r->target)
                c->target_index = (int32_t)k;
        c->dtype = r->spec.dtype;
        c->ndim = r->spec.ndim;
        memcpy(c->shape, r->spec.shape, sizeof c->shape);
        if (r->split_dim >= 0)
            c->shape[r->split_dim] = r->hi - r->lo;
        c->split_dim = r->split_dim;
        c->slice_lo = r->lo;
        c->slice_hi = r->hi;
        memcpy(c->full_shape, r->spec.shape, sizeof c->full_shape);
        c->expert = r->spec.expert;
        memcpy(c->dst_offset, r->spec.dst_offset, sizeof c->dst_offset);
        r->fm_index = fm->n_ckpt;
        mod->expected_bytes += r->bytes;
        mod->primary[fm->n_ckpt++] = mod->routes[i];
    }
    return REFIT_OK;
}

/* Geometry of each primary route of a module, before its format plans. */
static int module_geometry(refit_model *m, module *mod)
{
    if (mod->n_runtime == 0)
        return ctx_error(m->ctx, REFIT_EINVAL, "module %s has no runtime tensor", mod->name);
    if (mod->n_routes == 0)
        return ctx_error(m->ctx, REFIT_EINVAL, "module %s expects no checkpoint tensor",
                         mod->name);
    for (uint32_t i = 0; i < mod->n_routes; i++) {
        route *r = &m->routes[mod->routes[i]];
        if (r->tie_name) {
            r->flags |= ROUTE_ALIAS;
            continue;
        }
        int rc = resolve_target(m, r);
        if (!rc)
            rc = route_rows(m, r);
        if (rc)
            return rc;
        int64_t numel = 1;
        for (int d = 0; d < r->spec.ndim; d++)
            numel *= r->spec.shape[d];
        r->bytes = tensor_dtype_bytes(r->spec.dtype, numel);
        mod->n_primary++;
    }
    for (uint32_t i = 0; i < mod->n_routes; i++) {
        route *r = &m->routes[mod->routes[i]];
        if (r->flags & ROUTE_ALIAS) {
            int rc = resolve_tie(m, r);
            if (rc)
                return rc;
        }
    }
    return module_build_fm(m, mod);
}

static int route_direct(refit_model *m, route *r, const refit_fmt_ckpt *c, box *bx)
{
    const tensor_reg *t = &m->runtime[r->target];
    if (kern_dtype_size(r->spec.dtype) == 0 || kern_dtype_size(t->view.dtype) == 0)
        return ROUTE_ERR(m, r, REFIT_EUNSUPPORTED,
                         "%u-bit elements cannot take a DIRECT route (a format's VIEW does)",
                         r->spec.dtype.bits);
    if (!kern_dtype_eq(r->spec.dtype, t->view.dtype)) {
        if (!(c->flags & REFIT_CKPT_CAST) || !kern_can_cast(t->view.dtype, r->spec.dtype))
            return ROUTE_ERR(m, r, REFIT_EMISMATCH,
                             "checkpoint dtype %s but runtime %s is %s, and format %s declares "
                             "no cast between them",
                             refit_dtype_name(r->spec.dtype), t->name,
                             refit_dtype_name(t->view.dtype), m->modules[r->module].fmt->name);
        r->flags |= ROUTE_CAST;
    }
    int rc = route_place(m, r, &r->dst, &r->pad, bx->lo, bx->hi);
    if (rc)
        return rc;
    if (r->pad.ndim >= 0 && kern_view_numel(&r->pad) > 0)
        r->flags |= ROUTE_HAS_PAD;
    bx->route = (uint32_t)(r - m->routes);
    return REFIT_OK;
}

static int route_staged(refit_model *m, module *mod, route *r, refit_fmt_ckpt *c)
{
    refit_view *v = &r->staged_shape;
    memset(v, 0, sizeof *v);
    v->device = m->runtime[r->target].view.device;
    v->dtype = r->spec.dtype;
    v->ndim = c->ndim;
    memcpy(v->shape, c->shape, sizeof v->shape);
    row_major(v->strides, v->shape, v->ndim);
    r->staged_bytes = tensor_dtype_bytes(v->dtype, kern_view_numel(v));
    r->staged_offset = mod->staged_bytes;
    mod->staged_bytes += (r->staged_bytes + 63) & ~(size_t)63; /* keep each slice aligned */
    /* where a plain copy would land, for formats that place their output */
    int64_t lo[REFIT_MAX_DIMS + 1], hi[REFIT_MAX_DIMS + 1];
    refit_view pad;
    char saved[REFIT_ERRMSG_SIZE];
    memcpy(saved, m->ctx->errmsg, sizeof saved);
    if (route_place(m, r, &c->place, &pad, lo, hi))
        memset(&c->place, 0, sizeof c->place);
    memcpy(m->ctx->errmsg, saved, sizeof saved);
    return REFIT_OK;
}

/* A VIEW route writes through a checkpoint-layout view the format laid over
 * runtime storage; it must have the checkpoint slice's shape and stay inside
 * the target's bytes. */
static int route_view(refit_model *m, route *r, refit_fmt_ckpt *c)
{
    tensor_reg *t = &m->runtime[r->target];
    const refit_view *v = &c->place;
    if (v->ndim != c->ndim || memcmp(v->shape, c->shape, sizeof(int64_t) * (size_t)c->ndim))
        return ROUTE_ERR(m, r, REFIT_EFORMAT, "format %s laid a view whose shape is not the "
                         "checkpoint slice's", m->modules[r->module].fmt->name);
    if (!kern_dtype_eq(v->dtype, r->spec.dtype) &&
        (!(c->flags & REFIT_CKPT_CAST) || !kern_can_cast(v->dtype, r->spec.dtype)))
        return ROUTE_ERR(m, r, REFIT_EFORMAT, "format %s laid a %s view for a %s tensor",
                         m->modules[r->module].fmt->name, refit_dtype_name(v->dtype),
                         refit_dtype_name(r->spec.dtype));
    size_t e = kern_dtype_size(v->dtype);
    if (e == 0)
        return ROUTE_ERR(m, r, REFIT_EFORMAT, "a view needs whole-byte elements");
    if (kern_view_numel(v) > 0) {
        int64_t lo = 0, hi = 0;
        for (int i = 0; i < v->ndim; i++) {
            int64_t reach = (v->shape[i] - 1) * v->strides[i] * (int64_t)e;
            if (reach < 0)
                lo += reach;
            else
                hi += reach;
        }
        uintptr_t first = (uintptr_t)v->data + (uintptr_t)lo;
        uintptr_t last = (uintptr_t)v->data + (uintptr_t)hi + e;
        uintptr_t span = (uintptr_t)t->span;
        if (!v->data || first < span || last > span + t->span_bytes)
            return ROUTE_ERR(m, r, REFIT_EFORMAT, "format %s laid a view outside runtime %s",
                             m->modules[r->module].fmt->name, t->name);
    }
    if (!kern_dtype_eq(v->dtype, r->spec.dtype))
        r->flags |= ROUTE_CAST;
    r->dst = *v;
    t->via_view = true;
    return REFIT_OK;
}

/* A plan that failed without a message still says who refused what. */
static int plan_refused(refit_model *m, const module *mod, int rc)
{
    if (m->ctx->errmsg[0])
        return rc;
    const plugin_entry *pe = plugins_entry_of(m->ctx->plugins, mod->fmt);
    return ctx_error(m->ctx, rc, "module %s: plan() of format %s%s%s refused it (%s) without "
                     "a message", mod->name, mod->fmt->name, pe ? ", plugin " : "",
                     pe ? pe->real : "", refit_status_name(rc));
}

/* A module whose plan asked for a post-load step, on a device below the
 * compute capability its format's device code needs (format.h,
 * min_compute_capability): refused, naming format, module and both. Host
 * memory (0.0: the CPU reference runs there) is never refused. */
static int module_cc_check(refit_model *m, const module *mod)
{
    const refit_fmt_module *fm = &mod->fm;
    const refit_host_v2 *h = &m->ctx->host;
    uint32_t need = REFIT_STRUCT_HAS(mod->fmt, refit_format_v2, min_compute_capability)
                        ? mod->fmt->min_compute_capability : 0;
    if (!need || !(fm->flags & REFIT_MODULE_POST_LOAD))
        return REFIT_OK;
    for (uint32_t i = 0; i < fm->n_runtime; i++) {
        const refit_fmt_runtime *rt = refit_runtime(fm, i);
        refit_device_info di;
        memset(&di, 0, sizeof di);
        di.struct_size = sizeof di;
        if (h->device_info(h->host, rt->view.device, &di) != REFIT_OK || di.cc_major <= 0)
            continue;
        uint32_t have = (uint32_t)di.cc_major * 10u + (uint32_t)di.cc_minor;
        if (have < need)
            return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "module %s: format %s needs compute "
                             "capability %u.%u for its device code; runtime %s is on device %d "
                             "(%s), of compute capability %d.%d", mod->name, mod->fmt->name,
                             need / 10u, need % 10u, rt->name, (int)rt->view.device.device_id,
                             di.backend ? di.backend : "?", (int)di.cc_major, (int)di.cc_minor);
    }
    return REFIT_OK;
}

static int module_plan(refit_model *m, module *mod, box *boxes, uint32_t *n_boxes)
{
    refit_fmt_module *fm = &mod->fm;
    ctx_clear_error(m->ctx);
    host_services_enter(m->ctx, fm);
    int rc = mod->fmt->plan(&m->ctx->host, fm);
    host_services_leave(m->ctx);
    if (rc)
        return plan_refused(m, mod, rc);
    if ((rc = module_cc_check(m, mod)) != REFIT_OK)
        return rc;
    for (uint32_t i = 0; i < fm->n_ckpt; i++) {
        route *r = &m->routes[mod->primary[i]];
        refit_fmt_ckpt *c = &fm->ckpt[i];
        r->kind = c->route;
        if (c->route == REFIT_ROUTE_DIRECT) {
            rc = route_direct(m, r, c, &boxes[(*n_boxes)++]);
            c->place = r->dst;
            m->stats.routes_direct++;
        } else if (c->route == REFIT_ROUTE_VIEW) {
            rc = route_view(m, r, c);
            m->stats.routes_view++;
        } else if (c->route == REFIT_ROUTE_STAGED) {
            rc = route_staged(m, mod, r, c);
            m->stats.routes_staged++;
        } else {
            rc = ROUTE_ERR(m, r, REFIT_EFORMAT, "format %s gave route %u, which this core "
                           "does not carry out", mod->fmt->name, c->route);
        }
        if (rc)
            return rc;
    }
    if ((fm->flags & REFIT_MODULE_POST_LOAD) && !mod->fmt->post_load)
        return ctx_error(m->ctx, REFIT_EFORMAT, "module %s: format %s declares a post-load step "
                         "but has no post_load function", mod->name, mod->fmt->name);
    return REFIT_OK;
}

/* ---- staging units ---- */

/* Whether module mod is staged an expert at a time: its format says its
 * post-load keeps to an expert, every checkpoint tensor has one, and
 * every runtime tensor's dim 0 is the same count of experts. */
static bool module_sliceable(const refit_model *m, const module *mod)
{
    const refit_fmt_module *fm = &mod->fm;
    uint32_t want = REFIT_MODULE_EXPERT_SLICES | REFIT_MODULE_POST_LOAD;
    if ((fm->flags & want) != want || mod->n_primary == 0)
        return false;
    int64_t e = m->runtime[mod->runtime[0]].view.ndim > 0
                    ? m->runtime[mod->runtime[0]].view.shape[0] : -1;
    for (uint32_t i = 0; i < mod->n_runtime; i++) {
        const refit_view *v = &m->runtime[mod->runtime[i]].view;
        if (v->ndim < 1 || v->shape[0] != e)
            return false;
    }
    for (uint32_t i = 0; i < mod->n_primary; i++) {
        int64_t x = m->routes[mod->primary[i]].spec.expert;
        if (x < 0 || x >= e)
            return false;
    }
    return e > 0;
}

/* Room for more units (the array moves: unit fm pointers are set once
 * every unit is built, units_done). */
static int grow_units(refit_model *m, uint32_t more)
{
    uint32_t cap = m->n_units;
    while (cap < m->n_units + more)
        cap = cap ? cap * 2 : m->n_modules + more; /* one a module, unless sliced */
    stage_unit *u = realloc(m->units, (size_t)cap * sizeof *u);
    if (!u)
        return ctx_error(m->ctx, REFIT_ENOMEM, "seal: out of memory");
    m->units = u;
    return REFIT_OK;
}

/* A staged route's slot in its unit's block (64-byte aligned slots). */
static void unit_place(route *r, stage_unit *u)
{
    if (r->kind != REFIT_ROUTE_STAGED)
        return;
    r->staged_offset = u->staged_bytes;
    u->staged_bytes += (r->staged_bytes + 63) & ~(size_t)63;
}

/* The primaries of mod regrouped by expert (stable: declaration order
 * within one), the format's ckpt elements with them, so each expert's
 * tensors are one run of mod->fm.ckpt. */
static int group_by_expert(refit_model *m, module *mod, int64_t experts)
{
    refit_fmt_module *fm = &mod->fm;
    uint32_t n = mod->n_primary;
    uint32_t *count = calloc((size_t)experts + 1, sizeof *count);
    uint32_t *prim = malloc((size_t)n * sizeof *prim);
    refit_fmt_ckpt *ck = malloc((size_t)n * sizeof *ck);
    int rc = REFIT_OK;
    if (!count || !prim || !ck) {
        rc = ctx_error(m->ctx, REFIT_ENOMEM, "seal: module %s: out of memory", mod->name);
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        count[m->routes[mod->primary[i]].spec.expert + 1]++;
    for (int64_t e = 0; e < experts; e++)
        count[e + 1] += count[e];
    for (uint32_t i = 0; i < n; i++) {
        route *r = &m->routes[mod->primary[i]];
        uint32_t at = count[r->spec.expert]++;
        prim[at] = mod->primary[i];
        ck[at] = fm->ckpt[i];
        r->fm_index = at;
    }
    memcpy(mod->primary, prim, (size_t)n * sizeof *prim);
    memcpy(fm->ckpt, ck, (size_t)n * sizeof *ck);
out:
    free(count);
    free(prim);
    free(ck);
    return rc;
}

/* Plan the slice of unit u: it must route its tensors as the module's
 * plan did (the core places and stages them by that plan). */
static int slice_plan(refit_model *m, module *mod, stage_unit *u)
{
    refit_fmt_module *sl = &u->slice;
    uint32_t n = sl->n_ckpt;
    refit_fmt_ckpt *was = malloc((size_t)n * sizeof *was);
    if (!was)
        return ctx_error(m->ctx, REFIT_ENOMEM, "seal: module %s: out of memory", mod->name);
    memcpy(was, sl->ckpt, (size_t)n * sizeof *was);
    ctx_clear_error(m->ctx);
    host_services_enter(m->ctx, sl);
    int rc = mod->fmt->plan(&m->ctx->host, sl);
    host_services_leave(m->ctx);
    if (rc)
        rc = plan_refused(m, mod, rc);
    for (uint32_t i = 0; i < n && !rc; i++) {
        refit_fmt_ckpt *c = &sl->ckpt[i];
        bool view = was[i].route == REFIT_ROUTE_VIEW;
        if (c->route != was[i].route || c->flags != was[i].flags ||
            (view && memcmp(&c->place, &was[i].place, sizeof c->place)))
            rc = ctx_error(m->ctx, REFIT_EFORMAT, "module %s, tensor %s: format %s planned "
                           "expert %lld's slice unlike the whole module (it sets "
                           "REFIT_MODULE_EXPERT_SLICES)", mod->name, c->name, mod->fmt->name,
                           (long long)u->expert);
        c->place = was[i].place;
    }
    if (!rc && !(sl->flags & REFIT_MODULE_POST_LOAD))
        rc = ctx_error(m->ctx, REFIT_EFORMAT, "module %s: format %s asked for no post-load "
                       "step on expert %lld's slice", mod->name, mod->fmt->name,
                       (long long)u->expert);
    free(was);
    return rc;
}

/* Units of a module staged an expert at a time: one per expert it places
 * (grouped by group_by_expert), each with its slice planned. The whole
 * module's plan state goes: post-load only ever gets the slices. */
static int module_slices(refit_model *m, module *mod, int64_t experts)
{
    refit_fmt_module *fm = &mod->fm;
    int rc = group_by_expert(m, mod, experts);
    if (rc)
        return rc;
    if (mod->fmt->release && fm->state)
        mod->fmt->release(&m->ctx->host, fm);
    fm->state = NULL;
    for (uint32_t a = 0, b; a < mod->n_primary && !rc; a = b) {
        int64_t e = m->routes[mod->primary[a]].spec.expert;
        for (b = a + 1; b < mod->n_primary && m->routes[mod->primary[b]].spec.expert == e;)
            b++;
        if ((rc = grow_units(m, 1)))
            return rc;
        stage_unit *u = &m->units[m->n_units];
        memset(u, 0, sizeof *u);
        u->module = (uint32_t)(mod - m->modules);
        u->expert = e;
        u->first = a;
        u->n_primary = b - a;
        refit_fmt_module *sl = &u->slice;
        sl->name = mod->name;
        sl->params = fm->params;
        sl->ckpt_stride = fm->ckpt_stride;
        sl->ckpt = refit_ckpt(fm, a);
        sl->n_ckpt = b - a;
        sl->runtime_stride = fm->runtime_stride;
        sl->n_runtime = fm->n_runtime;
        sl->runtime = calloc(fm->n_runtime, sizeof *sl->runtime);
        m->n_units++; /* model_free_plan frees its runtime from here on */
        if (!sl->runtime)
            return ctx_error(m->ctx, REFIT_ENOMEM, "seal: module %s: out of memory", mod->name);
        for (uint32_t k = 0; k < fm->n_runtime; k++) {
            sl->runtime[k] = fm->runtime[k];
            narrow_view(&sl->runtime[k].view, 0, e, 1);
        }
        for (uint32_t k = a; k < b; k++) {
            route *r = &m->routes[mod->primary[k]];
            unit_place(r, u);
            r->unit = m->n_units - 1;
        }
        rc = slice_plan(m, mod, u);
    }
    return rc;
}

/* The staging units of mod, after its plan: the module whole, or an
 * expert at a time (module_sliceable). Tied names share their primary's. */
static int module_units(refit_model *m, module *mod)
{
    uint32_t mi = (uint32_t)(mod - m->modules);
    mod->unit0 = m->n_units;
    int rc;
    if (module_sliceable(m, mod)) {
        rc = module_slices(m, mod, m->runtime[mod->runtime[0]].view.shape[0]);
    } else if (!(rc = grow_units(m, 1))) {
        stage_unit *u = &m->units[m->n_units];
        memset(u, 0, sizeof *u);
        u->module = mi;
        u->expert = -1;
        u->n_primary = mod->n_primary;
        for (uint32_t k = 0; k < mod->n_primary; k++) {
            route *r = &m->routes[mod->primary[k]];
            unit_place(r, u);
            r->unit = m->n_units;
        }
        m->n_units++;
    }
    mod->n_units = m->n_units - mod->unit0;
    for (uint32_t i = 0; i < mod->n_routes; i++) {
        route *r = &m->routes[mod->routes[i]];
        if (r->flags & ROUTE_ALIAS)
            r->unit = m->routes[r->tie].unit;
    }
    return rc;
}

/* Every unit built: point each at what its post-load gets. */
static void units_done(refit_model *m)
{
    for (uint32_t i = 0; i < m->n_units; i++) {
        stage_unit *u = &m->units[i];
        u->fm = u->expert >= 0 ? &u->slice : &m->modules[u->module].fm;
    }
}

/* The largest unit must fit the staging budget on its own: refused here,
 * at seal, not in the middle of an update. */
static int check_staging_need(refit_model *m)
{
    const stage_unit *big = NULL;
    for (uint32_t i = 0; i < m->n_units; i++)
        if (!big || m->units[i].staged_bytes > big->staged_bytes)
            big = &m->units[i];
    m->staging_need = big ? big->staged_bytes : 0;
    if (!big || big->staged_bytes <= m->ctx->staging_budget)
        return REFIT_OK;
    const module *mod = &m->modules[big->module];
    char what[96];
    if (big->expert >= 0)
        snprintf(what, sizeof what, "expert %lld's slice", (long long)big->expert);
    else
        snprintf(what, sizeof what, "the whole module%s",
                 (mod->fm.flags & REFIT_MODULE_EXPERT_SLICES)
                     ? "" : (mod->fm.flags & REFIT_MODULE_POST_LOAD) && mod->n_primary > 1
                                ? " (its format's post-load does not keep to one expert)" : "");
    return ctx_error(m->ctx, REFIT_EBUDGET, "module %s needs %zu bytes of staging at once "
                     "(%s, staged before its post-load); the staging budget is %llu bytes "
                     "(refit_options.staging_budget)", mod->name, big->staged_bytes, what,
                     (unsigned long long)m->ctx->staging_budget);
}

/* Overlap and coverage of DIRECT placements, target by target. */
static int check_targets(refit_model *m, box *boxes, uint32_t n)
{
    /* group boxes by target: counting sort on the target index */
    uint32_t *count = calloc((size_t)m->n_runtime + 1, sizeof *count);
    box *sorted = malloc((n ? n : 1) * sizeof *sorted);
    int rc = REFIT_OK;
    if (!count || !sorted) {
        rc = ctx_error(m->ctx, REFIT_ENOMEM, "out of memory checking placements");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        count[m->routes[boxes[i].route].target + 1]++;
    for (uint32_t t = 0; t < m->n_runtime; t++)
        count[t + 1] += count[t];
    for (uint32_t i = 0; i < n; i++)
        sorted[count[m->routes[boxes[i].route].target]++] = boxes[i];
    /* count[t] now holds the end of target t's group */
    uint32_t start = 0;
    for (uint32_t t = 0; t < m->n_runtime && !rc; t++) {
        uint32_t end = count[t];
        const module *mod = &m->modules[m->runtime[t].module];
        int post = (mod->fm.flags & REFIT_MODULE_POST_LOAD) != 0 || m->runtime[t].via_view;
        if (end == start && !post)
            rc = ctx_error(m->ctx, REFIT_EINVAL, "module %s: runtime %s receives no checkpoint "
                           "tensor and the format has no post-load step to write it",
                           mod->name, m->runtime[t].name);
        else if (end > start)
            rc = check_target(m, t, sorted + start, end - start, !post);
        start = end;
    }
out:
    free(count);
    free(sorted);
    return rc;
}

void model_free_plan(refit_model *m)
{
    for (uint32_t i = 0; i < m->n_modules; i++) {
        module *mod = &m->modules[i];
        if (mod->fmt && mod->fmt->release && mod->fm.state)
            mod->fmt->release(&m->ctx->host, &mod->fm);
        free(mod->fm.ckpt);
        free(mod->fm.runtime);
        free(mod->primary);
        memset(&mod->fm, 0, sizeof mod->fm);
        mod->unit0 = mod->n_units = 0;
        mod->primary = NULL;
        mod->n_primary = 0;
        mod->staged_bytes = 0;
        mod->expected_bytes = 0;
    }
    for (uint32_t i = 0; i < m->n_routes; i++)
        m->routes[i].flags = 0;
    for (uint32_t i = 0; i < m->n_runtime; i++)
        m->runtime[i].via_view = false;
    for (uint32_t i = 0; i < m->n_units; i++) {
        stage_unit *u = &m->units[i];
        if (u->expert < 0)
            continue;
        const refit_format_v2 *f = m->modules[u->module].fmt;
        if (f->release && u->slice.state)
            f->release(&m->ctx->host, &u->slice);
        free(u->slice.runtime);
    }
    free(m->units);
    m->units = NULL;
    m->n_units = 0;
    m->staging_need = 0;
    free(m->journal_modules);
    m->journal_modules = NULL;
    memset(&m->stats, 0, sizeof m->stats);
}

int plan_build(refit_model *m)
{
    if (m->n_modules == 0)
        return ctx_error(m->ctx, REFIT_EINVAL, "seal: the model has no modules");
    int rc = REFIT_OK;
    for (uint32_t i = 0; i < m->n_runtime && !rc; i++)
        rc = take_reg(m, &m->runtime[i], "runtime tensor", true);
    for (uint32_t i = 0; i < m->n_side && !rc; i++)
        rc = take_reg(m, &m->side[i], "side tensor", false);
    for (uint32_t i = 0; i < m->n_modules && !rc; i++)
        rc = module_geometry(m, &m->modules[i]);
    if (rc)
        return rc;
    box *boxes = malloc((m->n_routes ? m->n_routes : 1) * sizeof *boxes);
    if (!boxes)
        return ctx_error(m->ctx, REFIT_ENOMEM, "seal: out of memory");
    uint32_t n_boxes = 0;
    for (uint32_t i = 0; i < m->n_modules && !rc; i++)
        rc = module_plan(m, &m->modules[i], boxes, &n_boxes);
    if (!rc)
        rc = check_targets(m, boxes, n_boxes);
    for (uint32_t i = 0; i < m->n_modules && !rc; i++)
        rc = module_units(m, &m->modules[i]);
    units_done(m);
    if (!rc)
        rc = check_staging_need(m);
    free(boxes);
    if (rc)
        return rc;
    m->stats.modules = m->n_modules;
    m->stats.runtime_tensors = m->n_runtime;
    m->stats.side_tensors = m->n_side;
    m->stats.ckpt_tensors = m->n_routes;
    for (uint32_t i = 0; i < m->n_runtime; i++)
        m->stats.runtime_bytes += m->runtime[i].span_bytes;
    return REFIT_OK;
}
