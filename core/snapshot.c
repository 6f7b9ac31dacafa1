/*
 * Snapshots and restore (docs/restart.md): the committed runtime tensors
 * of a READY worker, as they are, written to a directory, and written
 * back into a restarted worker as an update with DIRECT copies and no
 * post-load, allowed only under an equal plan signature and checked by
 * fingerprint before and after the copies.
 *
 * A snapshot directory holds runtime.safetensors (one tensor
 * "<module>/<runtime name>" per runtime tensor, its runtime dtype and
 * shape, contiguous, larger elements first so every tensor is aligned)
 * and manifest.json (core/snapshot_manifest.h). It is built as
 * PATH.tmp-<pid> and renamed to PATH once both files are on disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/ctx.h"
#include "core/fp_parallel.h"
#include "core/mod_version.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "core/safetensors_write.h"
#include "core/snapshot_manifest.h"
#include "core/snapshot_sig.h"
#include "core/txn.h"
#include "core/txn_journal.h"
#include "core/undo_source.h"
#include "core/util.h"
#include "kernels/copy.h"
#include "kernels/fingerprint.h"

#define SNAP_PATH_MAX 4096

static int snap_st_dtype(refit_dtype dt, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        refit_dtype r = st_dtype_to_refit((st_dtype)i);
        if (r.code != ST_NO_REFIT && kern_dtype_eq(r, dt)) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* dir/name into out (paths were bounded by the callers). */
static void join(char *out, size_t n, const char *dir, const char *name)
{
    if (snprintf(out, n, "%s/%s", dir, name) >= (int)n)
        out[n - 1] = '\0';
}

static void fp_hex(uint64_t fp, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)fp);
}

/* A row-major host view over a contiguous tensor of the file. */
static int file_view(const st_tensor *t, refit_view *v)
{
    refit_dtype dt = st_dtype_to_refit(t->dtype);
    if (dt.code == ST_NO_REFIT)
        return -1;
    memset(v, 0, sizeof *v);
    v->data = (void *)t->data;
    v->device = (refit_device){REFIT_DEVICE_CPU, 0};
    v->dtype = dt;
    v->ndim = t->ndim;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        v->shape[i] = t->shape[i];
        v->strides[i] = s;
        s *= t->shape[i];
    }
    return 0;
}

static int view_row_major(const refit_view *v)
{
    int64_t want = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != want)
            return 0;
        want *= v->shape[i];
    }
    return 1;
}

/* ---- write ---- */

typedef struct snap_writer {
    refit_model *m;
    uint32_t *order;            /* runtime indexes in file order */
    uint64_t *fp;               /* per runtime index, of the bytes written */
    void *span;                 /* host copy of a tensor's span */
    const backend *span_be;     /* whose undo_alloc span came from */
    size_t span_cap;
    void *contig;               /* a strided tensor made contiguous */
    size_t contig_cap;
} snap_writer;

static void *grow(void *p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return p;
    free(p);
    p = malloc(need ? need : 1);
    *cap = p ? need : 0;
    return p;
}

/* The runtime bytes of tensor i of the file, contiguous in host memory. */
static const void *writer_bytes(void *user, size_t i, int *rc)
{
    snap_writer *w = user;
    const tensor_reg *r = &w->m->runtime[w->order[i]];
    if (w->span_cap < r->span_bytes || w->span_be != r->be) {
        if (w->span)
            w->span_be->undo_free(w->span);
        w->span = r->be->undo_alloc(r->span_bytes);
        w->span_be = r->be;
        w->span_cap = w->span ? r->span_bytes : 0;
        if (!w->span) {
            *rc = REFIT_ENOMEM;
            return NULL;
        }
    }
    if ((*rc = r->be->save(w->span, r->span, r->span_bytes, NULL)) ||
        (*rc = r->be->sync(NULL)))
        return NULL;
    refit_view v = r->view;
    v.data = (char *)w->span + ((char *)r->view.data - r->span);
    v.device = (refit_device){REFIT_DEVICE_CPU, 0};
    const void *out = v.data;
    if (!view_row_major(&v)) {
        size_t bytes = tensor_dtype_bytes(v.dtype, kern_view_numel(&v));
        if (!(w->contig = grow(w->contig, &w->contig_cap, bytes))) {
            *rc = REFIT_ENOMEM;
            return NULL;
        }
        refit_view c = v;
        c.data = w->contig;
        for (int64_t d = v.ndim - 1, s = 1; d >= 0; d--) {
            c.strides[d] = s;
            s *= v.shape[d];
        }
        if ((*rc = kern_copy(&c, &v)))
            return NULL;
        out = w->contig;
        v = c;
    }
    w->fp[w->order[i]] = kern_fingerprint_view(&v);
    return out;
}

/* File order: larger elements first (sub-byte last), so each tensor
 * starts aligned to its element in the mapped file. */
static int by_element_size(const void *a, const void *b, void *m)
{
    const refit_model *model = m;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    unsigned bx = model->runtime[x].sig.dtype.bits, by = model->runtime[y].sig.dtype.bits;
    bx = bx % 8 ? 0 : bx;
    by = by % 8 ? 0 : by;
    return bx != by ? (bx > by ? -1 : 1) : (x > y) - (x < y);
}

static char *tensor_key(const refit_model *m, uint32_t ti)
{
    const tensor_reg *r = &m->runtime[ti];
    const char *mod = m->modules[r->module].name;
    size_t n = strlen(mod) + strlen(r->name) + 2;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "%s/%s", mod, r->name);
    return k;
}

static int snapshot_refusals(refit_model *m, const char *path)
{
    refit_ctx *ctx = m->ctx;
    if (!m->sealed || m->txn)
        return ctx_error(ctx, REFIT_ESTATE, "snapshot %s: %s", path,
                         !m->sealed ? "the model is not sealed" : "an update is open");
    refit_health h = model_health(m);
    if (h != REFIT_HEALTH_READY)
        return ctx_error(ctx, REFIT_ESTATE, "snapshot %s: worker %s is %s; only a READY "
                         "worker's committed state is snapshotted", path, ctx->worker_id,
                         refit_health_name(h));
    if (!m->version)
        return ctx_error(ctx, REFIT_ESTATE, "snapshot %s: worker %s has committed nothing",
                         path, ctx->worker_id);
    if (m->n_behind)
        return ctx_error(ctx, REFIT_ESTATE, "snapshot %s: worker %s holds %s: every module "
                         "must hold one version (load a full update first)", path,
                         ctx->worker_id, model_version_text(m));
    for (uint32_t i = 0; i < m->n_modules; i++)
        if (m->modules[i].fm.flags & REFIT_MODULE_NO_SNAPSHOT)
            return ctx_error(ctx, REFIT_EUNSUPPORTED, "snapshot %s: module %s (format %s) "
                             "holds runtime state a snapshot cannot carry "
                             "(REFIT_MODULE_NO_SNAPSHOT); nothing written", path,
                             m->modules[i].name, m->modules[i].fmt->name);
    struct stat sb;
    if (lstat(path, &sb) == 0)
        return ctx_error(ctx, REFIT_EEXIST, "snapshot %s: the path exists; a snapshot is "
                         "written to a new directory", path);
    return REFIT_OK;
}

static json_t *modules_json(const refit_model *m, const snap_writer *w)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        json_t *o = json_object(), *ts = json_array();
        uint64_t h = 0;
        char hex[17];
        for (uint32_t k = 0; k < mod->n_runtime; k++) {
            uint32_t ti = mod->runtime[k];
            char *key = tensor_key(m, ti);
            json_t *t = json_object();
            json_object_set_new(t, "name", json_string(m->runtime[ti].name));
            json_object_set_new(t, "key", key ? json_string(key) : json_null());
            json_array_append_new(ts, t);
            free(key);
            h = kern_fp_combine(h, w->fp[ti]);
        }
        fp_hex(h, hex);
        json_object_set_new(o, "name", json_string(mod->name));
        json_object_set_new(o, "version", json_string(mod->version->label));
        json_object_set_new(o, "fingerprint", json_string(hex));
        json_object_set_new(o, "tensors", ts);
        json_array_append_new(a, o);
    }
    return a;
}

static void iso_now(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd < 0 || fsync(fd) ? -1 : 0;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* The runtime file and the manifest, into dir. */
static int write_files(refit_model *m, const char *dir, snap_writer *w, uint64_t *bytes)
{
    refit_ctx *ctx = m->ctx;
    size_t n = m->n_runtime;
    st_out_tensor *t = calloc(n ? n : 1, sizeof *t);
    char **keys = calloc(n ? n : 1, sizeof *keys);
    char file[SNAP_PATH_MAX];
    int rc = t && keys ? REFIT_OK : ctx_error(ctx, REFIT_ENOMEM, "snapshot: out of memory");
    *bytes = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        const tensor_reg *r = &m->runtime[w->order[i]];
        keys[i] = tensor_key(m, w->order[i]);
        if (!keys[i])
            rc = ctx_error(ctx, REFIT_ENOMEM, "snapshot: out of memory");
        else if (snap_st_dtype(r->sig.dtype, &t[i].dtype))
            rc = ctx_error(ctx, REFIT_EUNSUPPORTED, "snapshot: runtime %s (module %s): dtype "
                           "%s has no safetensors name", r->name, m->modules[r->module].name,
                           refit_dtype_name(r->sig.dtype));
        t[i].name = keys[i];
        t[i].ndim = r->sig.ndim;
        t[i].shape = r->sig.shape;
        *bytes += tensor_dtype_bytes(r->sig.dtype, kern_view_numel(&r->view));
    }
    join(file, sizeof file, dir, SNAP_TENSORS_NAME);
    st_error se;
    if (!rc && st_write_file_from(file, t, n, NULL, 0, writer_bytes, w, &se)) {
        char line[2048];
        rc = ctx_error(ctx, se.status, "snapshot: %s", st_error_line(&se, line, sizeof line));
    }
    for (size_t i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
    free(t);
    if (rc)
        return rc;
    json_t *man = json_object(), *files = json_object(), *sig = snap_signature(m);
    if (!sig) {
        json_decref(man);
        json_decref(files);
        return ctx->errmsg[0] ? REFIT_EIO : ctx_error(ctx, REFIT_ENOMEM, "snapshot: out of memory");
    }
    char when[32];
    iso_now(when);
    json_object_set_new(files, SNAP_TENSORS_NAME, json_integer((json_int_t)*bytes));
    json_object_set_new(man, "refit_snapshot", json_integer(SNAP_FORMAT));
    json_object_set_new(man, "created_at", json_string(when));
    json_object_set_new(man, "worker", json_string(ctx->worker_id));
    json_object_set_new(man, "version", json_string(m->version->label));
    json_object_set_new(man, "update_id", json_integer(m->version_update));
    json_object_set_new(man, "journal", ctx->journal_path ? json_string(ctx->journal_path)
                                                          : json_null());
    json_object_set_new(man, "tensor_bytes", files);
    json_object_set_new(man, "signature", sig);
    json_object_set_new(man, "modules", modules_json(m, w));
    char err[1200];
    join(file, sizeof file, dir, SNAP_MANIFEST_NAME);
    rc = snap_manifest_write(file, man, err, sizeof err)
             ? ctx_error(ctx, REFIT_EIO, "snapshot: %s", err)
             : REFIT_OK;
    json_decref(man);
    return rc;
}

static void remove_tmp(const char *dir)
{
    char f[SNAP_PATH_MAX];
    join(f, sizeof f, dir, SNAP_TENSORS_NAME);
    unlink(f);
    join(f, sizeof f, dir, SNAP_MANIFEST_NAME);
    unlink(f);
    rmdir(dir);
}

int refit_snapshot_write(refit_model *m, const char *path)
{
    if (!m || !path)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (strlen(path) > SNAP_PATH_MAX - 64)
        return ctx_error(ctx, REFIT_EINVAL, "snapshot: path is %zu bytes long", strlen(path));
    int rc = snapshot_refusals(m, path);
    if (rc)
        return rc;
    char tmp[SNAP_PATH_MAX], parent[SNAP_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (slash)
        *(slash == parent ? slash + 1 : slash) = '\0';
    else
        snprintf(parent, sizeof parent, ".");
    remove_tmp(tmp); /* a crashed attempt of this pid */
    if (mkdir(tmp, 0755))
        return ctx_error(ctx, REFIT_EIO, "snapshot: cannot create %s: %s", tmp, strerror(errno));
    snap_writer w = {m, calloc(m->n_runtime + 1, sizeof *w.order),
                     calloc(m->n_runtime + 1, sizeof *w.fp), NULL, NULL, 0, NULL, 0};
    uint64_t bytes = 0;
    if (!w.order || !w.fp) {
        rc = ctx_error(ctx, REFIT_ENOMEM, "snapshot: out of memory");
    } else {
        for (uint32_t i = 0; i < m->n_runtime; i++)
            w.order[i] = i;
        qsort_r(w.order, m->n_runtime, sizeof *w.order, by_element_size, m);
        rc = write_files(m, tmp, &w, &bytes);
    }
    if (!rc && fsync_dir(tmp))
        rc = ctx_error(ctx, REFIT_EIO, "snapshot: cannot flush %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
        rc = ctx_error(ctx, errno == EEXIST || errno == ENOTEMPTY ? REFIT_EEXIST : REFIT_EIO,
                       "snapshot: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc)
        remove_tmp(tmp);
    else
        fsync_dir(parent);
    if (w.span)
        w.span_be->undo_free(w.span);
    free(w.contig);
    free(w.order);
    free(w.fp);
    if (!rc && undo_source_snapshot_arm(m, path))
        ctx_clear_error(ctx); /* written; only not an undo source (docs/core.md) */
    if (!rc)
        txj_event(m, m->version_update, "snapshot", "snapshot of version %s written to %s: "
                  "%u modules, %u runtime tensors, %llu bytes", m->version->label, path,
                  m->n_modules, m->n_runtime, (unsigned long long)bytes);
    return rc;
}

/* ---- reading a snapshot ---- */

typedef struct snap_in {
    json_t *man;
    st_set *st;
    char file[SNAP_PATH_MAX];   /* of the tensors */
} snap_in;

static void snap_in_free(snap_in *s)
{
    json_decref(s->man);
    st_close(s->st);
}

/* Module entry i's tensor k of the manifest, found in the file. */
static const st_tensor *entry_tensor(const snap_in *s, const json_t *mod, size_t k)
{
    const json_t *t = json_array_get(json_object_get(mod, "tensors"), k);
    const char *key = json_string_value(json_object_get(t, "key"));
    return key ? st_find(s->st, key) : NULL;
}

/* The manifest (checksum) and the file (every safetensors rule), and each
 * module's fingerprint recomputed from the file's bytes: nothing is
 * believed that was changed. what: "restore", "verify". */
static int snap_open_checked(refit_ctx *ctx, const char *path, const char *what, snap_in *s)
{
    memset(s, 0, sizeof *s);
    char mpath[SNAP_PATH_MAX], err[1400];
    if (strlen(path) > SNAP_PATH_MAX - 64)
        return ctx_error(ctx, REFIT_EINVAL, "%s: path is %zu bytes long", what, strlen(path));
    join(mpath, sizeof mpath, path, SNAP_MANIFEST_NAME);
    int rc = snap_manifest_read(mpath, &s->man, err, sizeof err);
    if (rc)
        return ctx_error(ctx, rc, "%s: %s; refused, nothing written", what, err);
    join(s->file, sizeof s->file, path, SNAP_TENSORS_NAME);
    st_error se;
    if (st_open(&s->st, s->file, &se)) {
        char line[2048];
        rc = se.status == REFIT_ENOMEM ? se.status : REFIT_ECORRUPT;
        return ctx_error(ctx, rc, "%s: %s; refused, nothing written", what,
                         st_error_line(&se, line, sizeof line));
    }
    const json_t *mods = json_object_get(s->man, "modules");
    size_t n_tensors = 0, i;
    json_t *mod;
    json_array_foreach(mods, i, mod)
        n_tensors += json_array_size(json_object_get(mod, "tensors"));
    /* every tensor's fingerprint first, on threads (the whole file is
     * read once), then each module's in the manifest's order; a tensor of
     * sub-byte elements or none (at NULL, no bytes for the threads) takes
     * its view's own walk */
    const void **at = calloc(n_tensors + 1, sizeof *at);
    size_t *len = calloc(n_tensors + 1, sizeof *len);
    uint64_t *fps = malloc((n_tensors + 1) * sizeof *fps);
    uint64_t *got = malloc((n_tensors + 1) * sizeof *got);
    size_t k = 0;
    rc = at && len && fps && got ? REFIT_OK
                                 : ctx_error(ctx, REFIT_ENOMEM, "%s: out of memory", what);
    json_array_foreach(mods, i, mod) {
        const char *name = json_string_value(json_object_get(mod, "name"));
        size_t nt = json_array_size(json_object_get(mod, "tensors"));
        for (size_t j = 0; j < nt && !rc; j++, k++) {
            const st_tensor *t = entry_tensor(s, mod, j);
            refit_view v;
            if (!t || file_view(t, &v))
                rc = ctx_error(ctx, REFIT_ECORRUPT, "%s: %s: module %s: tensor %zu of the "
                               "manifest is %s; refused, nothing written", what, s->file,
                               name ? name : "?", j, t ? "of a dtype refit has no name for"
                                                       : "not in the file");
            else if (v.dtype.bits % 8 || t->nbytes == 0)
                fps[k] = kern_fingerprint_view(&v);
            else
                at[k] = t->data, len[k] = (size_t)t->nbytes;
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!rc && fp_ranges(at, len, n_tensors, got, cpus > 16 ? 16 : cpus < 1 ? 1 : (int)cpus))
        rc = ctx_error(ctx, REFIT_ENOMEM, "%s: out of memory", what);
    k = 0;
    json_array_foreach(mods, i, mod) {
        if (rc)
            break;
        const char *name = json_string_value(json_object_get(mod, "name"));
        const char *want = json_string_value(json_object_get(mod, "fingerprint"));
        size_t nt = json_array_size(json_object_get(mod, "tensors"));
        uint64_t h = 0;
        for (size_t j = 0; j < nt; j++, k++)
            h = kern_fp_combine(h, at[k] ? got[k] : fps[k]);
        char hex[17];
        fp_hex(h, hex);
        if (!name || !want || strcmp(hex, want))
            rc = ctx_error(ctx, REFIT_ECORRUPT, "%s: %s: module %s: the file's bytes "
                           "fingerprint to %s, the manifest recorded %s (the file was "
                           "changed); refused, nothing written", what, s->file,
                           name ? name : "?", hex, want ? want : "none");
    }
    free(at);
    free(len);
    free(fps);
    free(got);
    if (rc)
        return rc;
    if (!json_is_array(mods) || n_tensors != st_count(s->st))
        return ctx_error(ctx, REFIT_ECORRUPT, "%s: %s holds %zu tensors, the manifest lists "
                         "%zu; refused, nothing written", what, s->file, st_count(s->st),
                         n_tensors);
    return REFIT_OK;
}

int refit_snapshot_verify(refit_ctx *ctx, const char *path)
{
    if (!ctx || !path)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    snap_in s;
    int rc = snap_open_checked(ctx, path, "verify", &s);
    snap_in_free(&s);
    return rc;
}

/* ---- restore ---- */

/* The worker's plan signature against the snapshot's, then each file
 * tensor against the runtime tensor it goes to. */
static int restore_admit(refit_model *m, const char *path, const snap_in *s)
{
    refit_ctx *ctx = m->ctx;
    json_t *mine = snap_signature(m);
    if (!mine)
        return ctx->errmsg[0] ? REFIT_EIO : ctx_error(ctx, REFIT_ENOMEM, "restore: out of memory");
    char diff[1024];
    int differs = snap_json_diff(json_object_get(s->man, "signature"), mine, diff, sizeof diff);
    json_decref(mine);
    if (differs)
        return ctx_error(ctx, REFIT_EMISMATCH, "restore: %s: the plan signature differs at "
                         "%s; refused, nothing written (load the checkpoint instead)", path,
                         diff);
    const json_t *mods = json_object_get(s->man, "modules");
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const module *mod = &m->modules[i];
        const json_t *e = json_array_get(mods, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || strcmp(name, mod->name) ||
            json_array_size(json_object_get(e, "tensors")) != mod->n_runtime)
            return ctx_error(ctx, REFIT_ECORRUPT, "restore: %s: the manifest's module %u is "
                             "%s, the signature's %s; refused, nothing written", path, i,
                             name ? name : "missing", mod->name);
        for (uint32_t k = 0; k < mod->n_runtime; k++) {
            const tensor_reg *r = &m->runtime[mod->runtime[k]];
            const st_tensor *t = entry_tensor(s, e, k);
            refit_view v;
            int same = t && !file_view(t, &v) && kern_dtype_eq(v.dtype, r->sig.dtype) &&
                       v.ndim == r->sig.ndim;
            for (int d = 0; same && d < v.ndim; d++)
                same = v.shape[d] == r->sig.shape[d];
            if (!same)
                return ctx_error(ctx, REFIT_ECORRUPT, "restore: %s: runtime %s (module %s) "
                                 "is not in the file as %s %dd; refused, nothing written",
                                 s->file, r->name, mod->name, refit_dtype_name(r->sig.dtype),
                                 r->sig.ndim);
        }
    }
    return REFIT_OK;
}

/* Every module's bytes, then the prepare; nothing commits yet. */
static int restore_copy(refit_txn *t, refit_model *m, const snap_in *s)
{
    const json_t *mods = json_object_get(s->man, "modules");
    uint32_t cap = 0;
    for (uint32_t i = 0; i < m->n_modules; i++)
        cap = m->modules[i].n_runtime > cap ? m->modules[i].n_runtime : cap;
    refit_view *src = calloc(cap + 1, sizeof *src);
    if (!src)
        return ctx_error(m->ctx, REFIT_ENOMEM, "restore: out of memory");
    /* the mapping outlives the loop (the snapshot is open until the end):
     * a device backend may read it after each copy returns, until the hold
     * ends, as refit_load_source lets it */
    const backend *dev = backend_for_device((refit_device){REFIT_DEVICE_CUDA, 0});
    int held = dev && dev->hold_host_sources && !dev->hold_host_sources(NULL, 1);
    int rc = REFIT_OK;
    for (uint32_t i = 0; !rc && i < m->n_modules; i++) {
        const json_t *e = json_array_get(mods, i);
        for (uint32_t k = 0; k < m->modules[i].n_runtime; k++)
            file_view(entry_tensor(s, e, k), &src[k]); /* admitted above */
        rc = txn_restore_module(t, i, src, NULL);
    }
    if (held) {
        int hrc = dev->hold_host_sources(NULL, 0);
        if (hrc && !rc)
            rc = ctx_error(m->ctx, hrc, "restore: device copies failed: %s", dev->last_error());
    }
    free(src);
    return rc;
}

/* After the copies: the runtime bytes fingerprint as the manifest says. */
static int restore_fingerprints(refit_model *m, const snap_in *s)
{
    const json_t *mods = json_object_get(s->man, "modules");
    for (uint32_t i = 0; i < m->n_modules; i++) {
        uint64_t fp;
        char hex[17];
        const char *want = json_string_value(json_object_get(json_array_get(mods, i),
                                                             "fingerprint"));
        int rc = module_fingerprint(m, &m->modules[i], &fp);
        if (rc)
            return ctx_error(m->ctx, rc, "restore: module %s: fingerprint failed: %s",
                             m->modules[i].name, refit_strerror(rc));
        fp_hex(fp, hex);
        if (strcmp(hex, want))
            return ctx_error(m->ctx, REFIT_ECORRUPT, "restore: module %s: its runtime bytes "
                             "fingerprint to %s after the copy, the snapshot recorded %s",
                             m->modules[i].name, hex, want);
    }
    return REFIT_OK;
}

int refit_restore(refit_model *m, const char *path, const refit_restore_opts *opts)
{
    refit_restore_opts defaults = REFIT_RESTORE_OPTS_INIT;
    if (!m || !path)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (!opts)
        opts = &defaults;
    if (opts->version != REFIT_RESTORE_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "restore: options of unknown version %u",
                         opts->version);
    if (!m->sealed || m->txn)
        return ctx_error(ctx, REFIT_ESTATE, "restore %s: %s", path,
                         !m->sealed ? "the model is not sealed" : "an update is open");
    snap_in s;
    int rc = snap_open_checked(ctx, path, "restore", &s);
    if (!rc)
        rc = restore_admit(m, path, &s);
    char abs[PATH_MAX], uri[PATH_MAX + 16], digest[80];
    refit_txn *t = NULL;
    if (!rc) {
        if (!realpath(path, abs))
            snprintf(abs, sizeof abs, "%s", path);
        snprintf(uri, sizeof uri, "snapshot://%s", abs);
        snprintf(digest, sizeof digest, "manifest-sha256:%s",
                 json_string_value(json_object_get(s.man, SNAP_CHECKSUM_KEY)));
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        uo.version_label = json_string_value(json_object_get(s.man, "version"));
        uo.source_uri = uri;
        uo.source_digest = digest;
        uo.rollback = opts->rollback;
        uo.fingerprint = 1;
        rc = txn_begin(&t, m, &uo, 0);
    }
    if (!rc && !(rc = restore_copy(t, m, &s)) && !(rc = refit_finalize_prepare(t))) {
        if ((rc = restore_fingerprints(m, &s))) {
            char why[REFIT_ERRMSG_SIZE];
            memcpy(why, ctx->errmsg, sizeof why);
            int arc = refit_abort_reason(t, why);
            ctx_error(ctx, rc, "%s; restore aborted, %s", why,
                      arc == REFIT_EPOISONED ? "worker POISONED" : "bytes rolled back");
        } else {
            int64_t id = refit_txn_journal_id(t);
            refit_commit(t);
            if (undo_source_snapshot_arm(m, abs)) /* the committed state: the next undo source */
                ctx_clear_error(ctx);
            txj_event(m, id, "restore", "restored version %s from snapshot %s (written by "
                      "worker %s, update %lld)", model_version_text(m), abs,
                      json_string_value(json_object_get(s.man, "worker")),
                      (long long)json_integer_value(json_object_get(s.man, "update_id")));
        }
    } else if (t && rc && m->txn == t) {
        char why[REFIT_ERRMSG_SIZE];
        memcpy(why, ctx->errmsg, sizeof why);
        int arc = refit_abort_reason(t, why);
        ctx_error(ctx, rc, "%s; restore aborted, %s", why,
                  arc == REFIT_EPOISONED ? "worker POISONED" : "bytes rolled back");
    }
    snap_in_free(&s);
    return rc;
}
