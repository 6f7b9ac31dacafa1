/* Patches: refit_load_delta, refit_load_delta_runs, refit_load_deltas.
 *
 * A patch replaces some elements of one checkpoint tensor in a delta
 * update (refit_update_opts.base_version): flat indices, or runs of
 * consecutive elements, with their new values. Two passes, as in
 * load_many.c: every row is checked first (the update takes patches, the
 * route takes them (no post-load), the values' descriptor, every index in
 * range, none given twice, the tensor not yet delivered), with nothing
 * written; then each row is written where refit_load would put those
 * elements.
 *
 * A plain patch (the module has no post-load step) is one backend scatter
 * (txn.c, txn_delta_scatter; kernels/scatter.h): the undo log saves
 * exactly the elements written, gathered in the same pass. Indices are
 * checked in one pass (in range; increasing means none twice; out of
 * order, a sorted copy or a bitmap finds a duplicate) and written in the
 * order given. Where the target holds the checkpoint tensor as it is
 * (contiguous, whole on this rank) the caller's indices or runs are the
 * scatter's offsets; elsewhere each index, or each run cut into a piece
 * per line of the target, is mapped first (another rank's elements
 * skipped).
 *
 * A patch of an online module goes into its master (delta_master.c): its
 * runs sorted and merged, written piece by piece (write_run), the touched
 * groups requantized. A piece is a run of elements the target holds as
 * one strided line: every dim inside it contiguous in the target and
 * whole on this rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/delta_master.h"
#include "core/desc_check.h"
#include "core/load.h"
#include "core/util.h"
#include "kernels/copy.h"

/* One checked row. */
typedef struct patch {
    delivery d;
    bool skip;                  /* a tied name whose other name is patched */
    bool online;                /* into a module quantized at post-load: its
                                   master is patched, then requantized */
    delta_run *runs;            /* online: sorted, merged */
    size_t n_runs;
    int64_t elements;
    refit_view values;          /* 1-D */
    /* plain: the scatter's offsets and counts (the caller's, or own) */
    const int64_t *off, *counts;
    size_t n;
    int64_t run_stride;
    int64_t *own;               /* mapped offsets (counts after them), or NULL */
} patch;

static int run_cmp(const void *a, const void *b)
{
    const delta_run *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The row's runs, sorted, checked against the tensor's numel elements:
 * each in range, none overlapping (an index given twice). */
static int build_runs(refit_model *m, const refit_delta *row, const route *r, int64_t numel,
                      patch *p)
{
    const char *mod = m->modules[r->module].name;
    if (row->n && !row->indices)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): %s is NULL for %zu "
                         "entries", row->name, mod, row->counts ? "starts" : "indices", row->n);
    if (row->n > (size_t)numel) /* also keeps n * sizeof *runs from overflowing */
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): %zu %s for a "
                         "tensor of %lld elements", row->name, mod, row->n,
                         row->counts ? "runs" : "indices", (long long)numel);
    delta_run *runs = malloc((row->n ? row->n : 1) * sizeof *runs);
    if (!runs)
        return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory", row->name);
    p->runs = runs;
    int64_t vpos = 0;
    bool sorted = true;
    for (size_t i = 0; i < row->n; i++) {
        int64_t a = row->indices[i], c = row->counts ? row->counts[i] : 1;
        if (c < 1)
            return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): run %zu has "
                             "%lld elements (at least 1)", row->name, mod, i, (long long)c);
        if (a < 0 || a >= numel || c > numel - a)
            return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): %s %zu (%lld%s) "
                             "is outside the tensor's %lld elements", row->name, mod,
                             row->counts ? "run" : "index", i, (long long)a,
                             row->counts ? ", ..." : "", (long long)numel);
        runs[i] = (delta_run){a, c, vpos};
        vpos += c; /* at most numel * 2: no overflow */
        if (vpos > numel)
            return ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s (module %s): runs "
                             "[0, %zu] give %lld elements, more than the tensor's %lld: "
                             "some are given twice", row->name, mod, i, (long long)vpos,
                             (long long)numel);
        if (i && runs[i - 1].start >= a)
            sorted = false;
    }
    if (!sorted)
        qsort(runs, row->n, sizeof *runs, run_cmp);
    size_t k = 0;
    for (size_t i = 0; i < row->n; i++) {
        delta_run *prev = k ? &runs[k - 1] : NULL;
        if (prev && prev->start + prev->count > runs[i].start)
            return ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s (module %s): element "
                             "%lld is given twice (%s)", row->name, mod,
                             (long long)runs[i].start,
                             row->counts ? "runs overlap" : "a duplicate index");
        if (prev && prev->start + prev->count == runs[i].start &&
            prev->vpos + prev->count == runs[i].vpos)
            prev->count += runs[i].count; /* one run: neighbours in both */
        else
            runs[k++] = runs[i];
    }
    p->n_runs = k;
    p->elements = vpos;
    return REFIT_OK;
}

static int i64_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* One part of the index pass (util_parallel): its first index out of
 * range, and how many are not above the one before. */
typedef struct idx_pass {
    const int64_t *x;
    size_t n;
    int64_t numel;
    size_t bad[8], unsorted[8];
} idx_pass;

#define IDX_PART ((size_t)4 << 20) /* indices a thread takes at least */

static void idx_part(void *arg, uint32_t part, size_t lo, size_t hi)
{
    idx_pass *c = arg;
    size_t bad = c->n, unsorted = 0;
    int64_t prev = lo ? c->x[lo - 1] : -1;
    for (size_t i = lo; i < hi; i++) {
        int64_t a = c->x[i];
        if ((uint64_t)a >= (uint64_t)c->numel) { /* negative ones too */
            bad = i;
            break;
        }
        unsorted += a <= prev;
        prev = a;
    }
    c->bad[part] = bad;
    c->unsorted[part] = unsorted;
}

/* Plain flat indices, one pass (in parts on threads when many): each in
 * range, and increasing (then none is given twice). Out of order: a
 * sorted copy (few indices) or a bitmap of the tensor's elements finds
 * one given twice. */
static int check_indices(refit_model *m, const refit_delta *row, const char *mod, int64_t numel)
{
    const int64_t *x = row->indices;
    idx_pass c = {x, row->n, numel, {0}, {0}};
    uint32_t parts = util_parallel(row->n, IDX_PART, &c, idx_part);
    size_t bad = row->n, unsorted = 0;
    for (uint32_t i = 0; i < parts; i++) {
        bad = c.bad[i] < bad ? c.bad[i] : bad;
        unsorted += c.unsorted[i];
    }
    if (bad < row->n)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): index %zu (%lld) "
                         "is outside the tensor's %lld elements", row->name, mod, bad,
                         (long long)x[bad], (long long)numel);
    if (!unsorted)
        return REFIT_OK;
    int64_t twice = -1;
    if ((uint64_t)row->n * 64 < (uint64_t)numel) {
        int64_t *c = malloc(row->n * sizeof *c);
        if (!c)
            return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory", row->name);
        memcpy(c, x, row->n * sizeof *c);
        qsort(c, row->n, sizeof *c, i64_cmp);
        for (size_t i = 1; i < row->n && twice < 0; i++)
            if (c[i] == c[i - 1])
                twice = c[i];
        free(c);
    } else {
        uint64_t *seen = calloc((size_t)(numel + 63) / 64, sizeof *seen);
        if (!seen)
            return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory", row->name);
        for (size_t i = 0; i < row->n && twice < 0; i++) {
            uint64_t bit = (uint64_t)1 << (x[i] & 63), *w = &seen[x[i] >> 6];
            if (*w & bit)
                twice = x[i];
            *w |= bit;
        }
        free(seen);
    }
    if (twice >= 0)
        return ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s (module %s): element %lld "
                         "is given twice (a duplicate index)", row->name, mod, (long long)twice);
    return REFIT_OK;
}

/* Plain runs: each in range, none overlapping another (an element given
 * twice), checked on a sorted copy; the runs are written as given. */
static int check_runs(refit_model *m, const refit_delta *row, const char *mod, int64_t numel,
                      int64_t *elements)
{
    delta_run *runs = malloc((row->n ? row->n : 1) * sizeof *runs);
    if (!runs)
        return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory", row->name);
    int64_t vpos = 0;
    bool sorted = true;
    int rc = REFIT_OK;
    for (size_t i = 0; i < row->n && !rc; i++) {
        int64_t a = row->indices[i], c = row->counts[i];
        if (c < 1)
            rc = ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): run %zu has "
                           "%lld elements (at least 1)", row->name, mod, i, (long long)c);
        else if (a < 0 || a >= numel || c > numel - a)
            rc = ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): run %zu (%lld, "
                           "...) is outside the tensor's %lld elements", row->name, mod, i,
                           (long long)a, (long long)numel);
        else if ((vpos += c) > numel) /* at most numel * 2: no overflow */
            rc = ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s (module %s): runs "
                           "[0, %zu] give %lld elements, more than the tensor's %lld: "
                           "some are given twice", row->name, mod, i, (long long)vpos,
                           (long long)numel);
        runs[i] = (delta_run){a, c, vpos - c};
        if (i && runs[i - 1].start >= a)
            sorted = false;
    }
    if (!rc && !sorted)
        qsort(runs, row->n, sizeof *runs, run_cmp);
    for (size_t i = 1; i < row->n && !rc; i++)
        if (runs[i - 1].start + runs[i - 1].count > runs[i].start)
            rc = ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s (module %s): element "
                           "%lld is given twice (runs overlap)", row->name, mod,
                           (long long)runs[i].start);
    free(runs);
    *elements = vpos;
    return rc;
}

/* A plain row's indices or runs against the tensor's numel elements;
 * p->elements. */
static int check_plain(refit_model *m, const refit_delta *row, const route *r, int64_t numel,
                       patch *p)
{
    const char *mod = m->modules[r->module].name;
    if (row->n && !row->indices)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): %s is NULL for %zu "
                         "entries", row->name, mod, row->counts ? "starts" : "indices", row->n);
    if (row->n > (size_t)numel)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): %zu %s for a "
                         "tensor of %lld elements", row->name, mod, row->n,
                         row->counts ? "runs" : "indices", (long long)numel);
    p->elements = (int64_t)row->n;
    return row->counts ? check_runs(m, row, mod, numel, &p->elements)
                       : check_indices(m, row, mod, numel);
}

static int map_plain(refit_model *m, const refit_delta *row, patch *p);

/* Everything about one row that can be checked before a write. */
static int check_row(refit_txn *t, const refit_delta *row, patch *p)
{
    refit_model *m = txn_model(t);
    if (!row->name)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta: checkpoint name is NULL");
    int rc = load_resolve(m, row->name, &p->d);
    if (rc)
        return rc;
    const route *r = p->d.r;
    const module *mod = &m->modules[r->module];
    if (!txn_base_version(t))
        return ctx_error(m->ctx, REFIT_ESTATE, "load_delta %s (module %s): update '%s' is not "
                         "a delta update (refit_update_opts.base_version is not set); a patch "
                         "needs the base it applies to; nothing written", row->name, mod->name,
                         txn_version_label(t));
    p->online = r->kind == REFIT_ROUTE_STAGED;
    if (!p->online && (mod->fm.flags & REFIT_MODULE_POST_LOAD))
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load_delta %s (module %s): format %s "
                         "builds this module's runtime tensors from whole checkpoint tensors "
                         "in a post-load step (online quantization), so a patch cannot be "
                         "applied in place; deliver the tensor whole (refit_load); nothing "
                         "written", row->name, mod->name, mod->fmt->name);
    if (p->online && (rc = master_admit(t, &p->d))) /* its master takes the patch */
        return rc;
    refit_dtype written = p->online ? r->staged_shape.dtype : r->dst.dtype;
    if (kern_dtype_size(r->spec.dtype) == 0 || kern_dtype_size(written) == 0)
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load_delta %s (module %s): %u-bit "
                         "elements cannot be patched one by one", row->name, mod->name,
                         r->spec.dtype.bits);
    int64_t numel = 1;
    for (int i = 0; i < r->spec.ndim; i++)
        numel *= r->spec.shape[i]; /* seal checked the byte size for overflow */
    if ((rc = p->online ? build_runs(m, row, r, numel, p) : check_plain(m, row, r, numel, p)))
        return rc;
    /* the values: p->elements of the checkpoint dtype, on a device the
     * target's backend reads */
    char why[256];
    desc_expect want = {1, r->spec.dtype, false, 0};
    if (!row->values)
        return ctx_error(m->ctx, REFIT_EINVAL, "load_delta %s (module %s): values is NULL",
                         row->name, mod->name);
    if ((rc = desc_check(row->values, &want, NULL, why, sizeof why)))
        return ctx_error(m->ctx, rc, "load_delta %s (module %s): values: %s (the "
                         "checkpoint tensor is %s)", row->name, mod->name, why,
                         refit_dtype_name(r->spec.dtype));
    const refit_tensor *v = row->values;
    if (v->shape[0] != p->elements)
        return ctx_error(m->ctx, REFIT_EMISMATCH, "load_delta %s (module %s): %lld values for "
                         "%lld elements", row->name, mod->name, (long long)v->shape[0],
                         (long long)p->elements);
    const backend *be = m->runtime[r->target].be;
    if (!be->can_read(v->device))
        return ctx_error(m->ctx, REFIT_EUNSUPPORTED, "load_delta %s: the %s backend of its "
                         "target cannot read values on device type %d", row->name, be->name,
                         v->device.device_type);
    memset(&p->values, 0, sizeof p->values);
    p->values.data = (char *)v->data + v->byte_offset;
    p->values.device = v->device;
    p->values.dtype = v->dtype;
    p->values.ndim = 1;
    p->values.shape[0] = v->shape[0];
    p->values.strides[0] = v->strides ? v->strides[0] : 1;
    /* as a whole delivery: duplicates, ties, the declared modules */
    delivery *d = &p->d;
    d->off = 0;
    d->len = r->split_dim >= 0 ? r->spec.shape[r->split_dim] : 1;
    d->a = r->split_dim >= 0 ? r->lo : 0;
    d->b = r->split_dim >= 0 ? r->hi : 1;
    memset(&d->src, 0, sizeof d->src);
    d->src.dtype = r->spec.dtype;
    d->src.ndim = r->spec.ndim;
    memcpy(d->src.shape, r->spec.shape, sizeof d->src.shape);
    if ((rc = txn_load_admit(t, d, true, &p->skip)))
        return rc;
    return p->online || p->skip ? REFIT_OK : map_plain(m, row, p);
}

/* The dims [inner, ndim) that dst (the target's rows [lo, hi), or the
 * master) holds as one strided line: each whole on this rank and
 * contiguous over the next. At least the last dim (split or not: pieces
 * of it are clipped to this rank's rows). */
static int line_dims(const route *r, const refit_view *dst)
{
    int nd = r->spec.ndim, j = nd - 1;
    while (j > 0 && dst->shape[j] == r->spec.shape[j] && dst->shape[j - 1] == r->spec.shape[j - 1] &&
           dst->strides[j - 1] == dst->strides[j] * dst->shape[j])
        j--;
    return j;
}

/* Write one run into dst: a piece per line, clipped to this rank's rows. */
static int write_run(refit_txn *t, patch *p, const delta_run *run, int inner, int64_t line,
                     const refit_view *dst)
{
    const route *r = p->d.r;
    int nd = r->spec.ndim, sd = r->split_dim;
    size_t de = kern_dtype_size(dst->dtype), ve = kern_dtype_size(p->values.dtype);
    int64_t f = run->start, left = run->count, vpos = run->vpos;
    int64_t ls = nd ? dst->strides[nd - 1] : 1; /* along the line */
    while (left > 0) {
        int64_t in_line = f % line, k = line - in_line < left ? line - in_line : left;
        /* coordinates of the line's dims outside it */
        int64_t coord[REFIT_MAX_DIMS] = {0}, q = f / line, off = 0, a = in_line, b = in_line + k;
        for (int i = inner - 1; i >= 0; i--) {
            coord[i] = q % r->spec.shape[i];
            q /= r->spec.shape[i];
        }
        bool mine = true;
        for (int i = 0; i < inner; i++) {
            if (i == sd) {
                mine = coord[i] >= r->lo && coord[i] < r->hi;
                coord[i] -= r->lo;
            }
            off += coord[i] * dst->strides[i];
        }
        if (sd == nd - 1 && inner == nd - 1) { /* the line is the split dim: clip it */
            a = a > r->lo ? a : r->lo;
            b = b < r->hi ? b : r->hi;
            off -= r->lo * ls;
        }
        if (mine && a < b) {
            int64_t skipped = a - in_line;
            refit_view dv = {0}, sv = p->values;
            dv.data = (char *)dst->data + (off + a * ls) * (int64_t)de;
            dv.device = dst->device;
            dv.dtype = dst->dtype;
            dv.ndim = 1;
            dv.shape[0] = b - a;
            dv.strides[0] = ls;
            sv.data = (char *)sv.data + (vpos + skipped) * sv.strides[0] * (int64_t)ve;
            sv.shape[0] = b - a;
            int rc = p->online ? master_write(t, &p->d, &dv, &sv)
                               : txn_delta_write(t, &p->d, &dv, &sv);
            if (rc)
                return rc;
        }
        f += k;
        vpos += k;
        left -= k;
    }
    return REFIT_OK;
}

/* ---- plain patches: one scatter ---- */

/* Where the target holds the checkpoint's elements: lines of `line`
 * elements (dims [inner, nd)), ls apart within a line. */
typedef struct layout {
    const route *r;
    int inner;
    int64_t line, ls;
} layout;

static layout layout_of(const route *r)
{
    int nd = r->spec.ndim;
    layout L = {r, nd ? line_dims(r, &r->dst) : 0, 1, nd ? r->dst.strides[nd - 1] : 1};
    for (int i = L.inner; i < nd; i++)
        L.line *= r->spec.shape[i];
    return L;
}

/* The target holds the tensor as it is: element f at offset f. */
static bool layout_identity(const layout *L)
{
    const route *r = L->r;
    for (int i = 0; i < r->spec.ndim; i++)
        if (r->dst.shape[i] != r->spec.shape[i])
            return false;
    return L->inner == 0 && (L->ls == 1 || L->line == 1);
}

/* Flat element f: the target offset of its line's first element on this
 * rank, and the part [a, b) of the line this rank holds (a line that is
 * the split dim is clipped to [lo, hi)); false: another rank's line. */
static bool line_place(const layout *L, int64_t f, int64_t *off, int64_t *a, int64_t *b)
{
    const route *r = L->r;
    int nd = r->spec.ndim, sd = r->split_dim;
    int64_t q = f / L->line, coord[REFIT_MAX_DIMS] = {0}, o = 0;
    for (int i = L->inner - 1; i >= 0; i--) {
        coord[i] = q % r->spec.shape[i];
        q /= r->spec.shape[i];
    }
    bool mine = true;
    for (int i = 0; i < L->inner; i++) {
        if (i == sd) {
            mine = coord[i] >= r->lo && coord[i] < r->hi;
            coord[i] -= r->lo;
        }
        o += coord[i] * r->dst.strides[i];
    }
    *a = 0;
    *b = L->line;
    if (sd == nd - 1 && L->inner == nd - 1) { /* the line is the split dim */
        *a = r->lo;
        *b = r->hi;
        o -= r->lo * L->ls;
    }
    *off = o;
    return mine;
}

/* The scatter of checked row `row` into p. Identity layout: the caller's
 * arrays. Else mapped: each index to its offset (-1: another rank's), or
 * each run to a piece per line, split where this rank's part of the line
 * begins and ends (the parts outside it: skipped values). */
static int map_plain(refit_model *m, const refit_delta *row, patch *p)
{
    layout L = layout_of(p->d.r);
    p->run_stride = L.ls;
    if (layout_identity(&L)) {
        p->off = row->indices;
        p->counts = row->counts;
        p->n = row->n;
        p->run_stride = 1;
        return REFIT_OK;
    }
    if (!row->counts) {
        int64_t *off = malloc((row->n ? row->n : 1) * sizeof *off);
        if (!off)
            return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory", row->name);
        for (size_t i = 0; i < row->n; i++) {
            int64_t o, a, b, f = row->indices[i], in_line = f % L.line;
            bool mine = line_place(&L, f, &o, &a, &b);
            off[i] = mine && in_line >= a && in_line < b ? o + in_line * L.ls : -1;
        }
        p->own = off;
        p->off = off;
        p->n = row->n;
        return REFIT_OK;
    }
    size_t n = 0; /* pass 0 counts the pieces, pass 1 writes them */
    int64_t *off = NULL, *cnt = NULL;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (!(p->own = malloc((n ? n : 1) * 2 * sizeof *p->own)))
                return ctx_error(m->ctx, REFIT_ENOMEM, "load_delta %s: out of memory",
                                 row->name);
            off = p->own;
            cnt = p->own + n;
            n = 0;
        }
        for (size_t i = 0; i < row->n; i++) {
            for (int64_t f = row->indices[i], left = row->counts[i]; left > 0;) {
                int64_t in_line = f % L.line, end = L.line - in_line < left ? L.line : in_line + left;
                int64_t o, a, b;
                bool mine = line_place(&L, f, &o, &a, &b);
                int64_t lo = mine && a > in_line ? a : in_line, hi = mine && b < end ? b : end;
                if (!mine || lo >= hi)
                    lo = hi = end; /* all of it another rank's */
                int64_t part[3][2] = {{in_line, lo}, {lo, hi}, {hi, end}}; /* [1]: ours */
                for (int j = 0; j < 3; j++) {
                    if (part[j][1] <= part[j][0])
                        continue;
                    if (off) {
                        off[n] = j != 1 ? -1 : o + part[j][0] * L.ls;
                        cnt[n] = part[j][1] - part[j][0];
                    }
                    n++;
                }
                f += end - in_line;
                left -= end - in_line;
            }
        }
    }
    p->off = off;
    p->counts = cnt;
    p->n = n;
    return REFIT_OK;
}

static int apply_plain(refit_txn *t, patch *p)
{
    const route *r = p->d.r;
    backend_scatter sc = {
        .dst = r->dst.data, .dst_device = r->dst.device, .dst_dtype = r->dst.dtype,
        .off = p->off, .counts = p->counts, .n = p->n, .run_stride = p->run_stride,
        .elements = p->elements, .values = p->values.data, .values_dtype = p->values.dtype,
        .values_device = p->values.device, .values_stride = p->values.strides[0],
    };
    return txn_delta_scatter(t, &p->d, &sc);
}

static int apply_row(refit_txn *t, patch *p, void *stream)
{
    const route *r = p->d.r;
    p->d.stream = stream;
    int rc = txn_delta_accept(t, &p->d, p->skip, (uint64_t)p->elements);
    if (rc || p->skip)
        return rc;
    if (!p->online)
        return (rc = apply_plain(t, p)) ? rc : txn_delta_done(t, &p->d);
    if (master_holds_whole(&p->d)) { /* checkpoint indices are the master's offsets */
        if ((rc = master_scatter(t, &p->d, p->runs, p->n_runs, &p->values)))
            return rc;
    } else {
        refit_view dst = master_view(txn_model(t), &p->d);
        int inner = r->spec.ndim ? line_dims(r, &dst) : 0;
        int64_t line = 1;
        for (int i = inner; i < r->spec.ndim; i++)
            line *= r->spec.shape[i];
        for (size_t i = 0; i < p->n_runs; i++)
            if ((rc = write_run(t, p, &p->runs[i], inner, line, &dst)))
                return rc;
    }
    /* a patched master: the touched groups' rows now (a whole unit once
     * every row is written: load_patches) */
    if (p->online && !master_whole_unit(txn_model(t), &p->d) &&
        (rc = master_requantize(t, &p->d, p->runs, p->n_runs)))
        return rc;
    return txn_delta_done(t, &p->d);
}

/* Row i patched a master whose unit is rebuilt whole: rebuild it, unless
 * an earlier row of the call did. */
static int requantize_unit_once(refit_txn *t, const patch *p, size_t i)
{
    if (!p[i].online || p[i].skip || !master_whole_unit(txn_model(t), &p[i].d))
        return REFIT_OK;
    for (size_t j = 0; j < i; j++)
        if (p[j].online && !p[j].skip && p[j].d.r->unit == p[i].d.r->unit &&
            master_whole_unit(txn_model(t), &p[j].d))
            return REFIT_OK;
    return master_requantize_unit(t, &p[i].d);
}

/* "row <i> (<name>): " before the message of a refused row of a table. */
static void row_prefix(refit_ctx *ctx, size_t i, const char *name)
{
    char msg[REFIT_ERRMSG_SIZE + 256];
    snprintf(msg, sizeof msg, "row %zu (%.160s): %s", i, name ? name : "NULL", ctx->errmsg);
    size_t n = strlen(msg) < sizeof ctx->errmsg ? strlen(msg) : sizeof ctx->errmsg - 1;
    memcpy(ctx->errmsg, msg, n);
    ctx->errmsg[n] = '\0';
}

static int load_patches(refit_txn *t, size_t n, const refit_delta *rows, void *stream,
                        bool table)
{
    if (!t || (n && !rows))
        return REFIT_EINVAL;
    refit_model *m = txn_model(t);
    ctx_clear_error(m->ctx);
    int rc = txn_load_open(t, n ? rows[0].name : "(no rows)");
    if (rc || n == 0)
        return rc;
    patch *p = calloc(n, sizeof *p);
    if (!p)
        return txn_load_refused(t, ctx_error(m->ctx, REFIT_ENOMEM, "load_delta: out of "
                                             "memory; nothing written"));
    for (size_t i = 0; i < n && !rc; i++) {
        rc = check_row(t, &rows[i], &p[i]);
        for (size_t j = 0; j < i && !rc; j++) {
            if (p[j].d.ri != p[i].d.ri)
                continue;
            if (p[j].d.name_ri == p[i].d.name_ri)
                rc = ctx_error(m->ctx, REFIT_EDUPLICATE, "load_delta %s: row %zu patches "
                               "the same tensor", rows[i].name, j);
            else
                p[i].skip = true; /* a tied name: one storage, one write */
        }
        if (rc && table)
            row_prefix(m->ctx, i, rows[i].name);
    }
    if (rc) {
        size_t len = strlen(m->ctx->errmsg);
        if (!strstr(m->ctx->errmsg, "nothing written"))
            snprintf(m->ctx->errmsg + len, sizeof m->ctx->errmsg - len, "; nothing written");
        rc = txn_load_refused(t, rc);
    } else {
        for (size_t i = 0; i < n && !rc; i++)
            rc = apply_row(t, &p[i], stream);
        for (size_t i = 0; i < n && !rc; i++)
            rc = requantize_unit_once(t, p, i);
    }
    for (size_t i = 0; i < n; i++) {
        free(p[i].runs);
        free(p[i].own);
    }
    free(p);
    return rc;
}

int refit_load_delta(refit_txn *t, const char *name, size_t n, const int64_t *indices,
                     const refit_tensor *values, void *stream)
{
    refit_delta row = {name, n, indices, NULL, values};
    return load_patches(t, 1, &row, stream, false);
}

int refit_load_delta_runs(refit_txn *t, const char *name, size_t n_runs, const int64_t *starts,
                          const int64_t *counts, const refit_tensor *values, void *stream)
{
    if (n_runs && !counts)
        return t ? txn_load_refused(t, ctx_error(txn_model(t)->ctx, REFIT_EINVAL, "load_delta "
                                                 "%s: counts is NULL for %zu runs",
                                                 name ? name : "NULL", n_runs))
                 : REFIT_EINVAL;
    refit_delta row = {name, n_runs, starts, counts, values};
    return load_patches(t, 1, &row, stream, false);
}

int refit_load_deltas(refit_txn *t, size_t n, const refit_delta *rows, void *stream)
{
    return load_patches(t, n, rows, stream, true);
}
