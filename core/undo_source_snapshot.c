/* The undo source "durable snapshot": a snapshot (refit_snapshot_write)
 * of the committed state, armed when it is written or restored (its
 * fingerprints are then the committed ones, read from its manifest) and
 * dropped by the next commit. An abort copies the modules the update
 * wrote back from its runtime tensors, DIRECT, as refit_restore does
 * (docs/core.md "Undo sources"). Checked at begin: the manifest and the
 * tensor file are the files written (size, mtime, inode); at abort the
 * restored bytes' fingerprints are checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/undo_source.h"
#include "core/backend.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/safetensors.h"
#include "core/snapshot_manifest.h"
#include "core/txn.h"

typedef struct snap_source {
    undo_source base;
    refit_model *m;
    json_t *man;
    st_set *st;                 /* runtime.safetensors, mapped */
    char manifest[4200];
    struct stat man_stat;       /* of the manifest when armed */
} snap_source;

static int snap_check(undo_source *s, char *why, size_t n)
{
    snap_source *p = (snap_source *)s;
    st_error err;
    struct stat now;
    if (stat(p->manifest, &now) || now.st_ino != p->man_stat.st_ino ||
        now.st_size != p->man_stat.st_size ||
        now.st_mtim.tv_sec != p->man_stat.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != p->man_stat.st_mtim.tv_nsec) {
        snprintf(why, n, "%s: changed or removed since the snapshot was written", p->manifest);
        return REFIT_EIO;
    }
    if (st_set_recheck(p->st, &err)) {
        char line[2048];
        snprintf(why, n, "%s", st_error_line(&err, line, sizeof line));
        return REFIT_EIO;
    }
    return REFIT_OK;
}

/* Runtime tensor k of module entry e, as a host view over the mapping. */
static int entry_view(const snap_source *p, const json_t *e, size_t k, refit_view *v)
{
    const json_t *t = json_array_get(json_object_get(e, "tensors"), k);
    const char *key = json_string_value(json_object_get(t, "key"));
    const st_tensor *st = key ? st_find(p->st, key) : NULL;
    refit_dtype dt = st ? st_dtype_to_refit(st->dtype) : (refit_dtype){0, 0, 0};
    if (!st || dt.code == ST_NO_REFIT)
        return -1;
    memset(v, 0, sizeof *v);
    v->data = (void *)st->data;
    v->device = (refit_device){REFIT_DEVICE_CPU, 0};
    v->dtype = dt;
    v->ndim = st->ndim;
    int64_t stride = 1;
    for (int i = st->ndim - 1; i >= 0; i--) {
        v->shape[i] = st->shape[i];
        v->strides[i] = stride;
        stride *= st->shape[i];
    }
    return 0;
}

static int snap_restore(undo_source *s, refit_txn *t, const uint32_t *modules, uint32_t n)
{
    snap_source *p = (snap_source *)s;
    refit_model *m = p->m;
    const json_t *mods = json_object_get(p->man, "modules");
    uint32_t cap = 0;
    for (uint32_t i = 0; i < n; i++)
        if (m->modules[modules[i]].n_runtime > cap)
            cap = m->modules[modules[i]].n_runtime;
    refit_view *src = calloc(cap + 1, sizeof *src);
    if (!src)
        return ctx_error(m->ctx, REFIT_ENOMEM, "undo source: out of memory");
    const backend *dev = backend_for_device((refit_device){REFIT_DEVICE_CUDA, 0});
    int held = dev && dev->hold_host_sources && !dev->hold_host_sources(NULL, 1);
    int rc = REFIT_OK;
    for (uint32_t i = 0; !rc && i < n; i++) {
        const module *mod = &m->modules[modules[i]];
        const json_t *e = json_array_get(mods, modules[i]);
        for (uint32_t k = 0; !rc && k < mod->n_runtime; k++)
            if (entry_view(p, e, k, &src[k]))
                rc = ctx_error(m->ctx, REFIT_ECORRUPT, "undo source %s: runtime tensor %u of "
                               "module %s is not in the file", s->uri, k, mod->name);
        if (!rc)
            rc = txn_restore_module(t, modules[i], src, NULL);
    }
    if (held) {
        int hrc = dev->hold_host_sources(NULL, 0);
        if (hrc && !rc)
            rc = ctx_error(m->ctx, hrc, "undo source: device copies failed: %s",
                           dev->last_error());
    }
    free(src);
    return rc;
}

static void snap_release(undo_source *s)
{
    snap_source *p = (snap_source *)s;
    json_decref(p->man);
    st_close(p->st);
}

static const undo_source_ops snap_ops = {
    .kind = "snapshot",
    .mode = REFIT_UNDO_SNAPSHOT,
    .check = snap_check,
    .restore = snap_restore,
    .release = snap_release,
};

/* The manifest's module list against the model, and its fingerprints. */
static int manifest_fingerprints(snap_source *p, uint64_t *fp)
{
    refit_model *m = p->m;
    const json_t *mods = json_object_get(p->man, "modules");
    if (json_array_size(mods) != m->n_modules)
        return REFIT_ECORRUPT;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        const json_t *e = json_array_get(mods, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *hex = json_string_value(json_object_get(e, "fingerprint"));
        char *end = NULL;
        if (!name || !hex || strcmp(name, m->modules[i].name) ||
            json_array_size(json_object_get(e, "tensors")) != m->modules[i].n_runtime)
            return REFIT_ECORRUPT;
        fp[i] = strtoull(hex, &end, 16);
        if (!end || *end)
            return REFIT_ECORRUPT;
    }
    return REFIT_OK;
}

int undo_source_snapshot_arm(refit_model *m, const char *path)
{
    snap_source *p = calloc(1, sizeof *p);
    uint64_t *fp = malloc((m->n_modules + 1) * sizeof *fp);
    char file[4200], err[1400], uri[4300];
    int rc = p && fp ? REFIT_OK : REFIT_ENOMEM;
    if (!rc && strlen(path) > 4000)
        rc = REFIT_EINVAL;
    if (!rc) {
        p->m = m;
        snprintf(p->manifest, sizeof p->manifest, "%s/%s", path, SNAP_MANIFEST_NAME);
        snprintf(file, sizeof file, "%s/%s", path, SNAP_TENSORS_NAME);
        snprintf(uri, sizeof uri, "snapshot://%s", path);
        st_error se;
        if (stat(p->manifest, &p->man_stat) ||
            snap_manifest_read(p->manifest, &p->man, err, sizeof err) ||
            st_open(&p->st, file, &se))
            rc = REFIT_EIO;
    }
    if (!rc)
        rc = manifest_fingerprints(p, fp);
    if (!rc)
        rc = undo_source_init(&p->base, m, &snap_ops, uri, fp);
    free(fp);
    if (rc) {
        if (p)
            snap_release(&p->base);
        free(p);
        return rc;
    }
    undo_source_arm(m, &p->base);
    return REFIT_OK;
}
