/* Reading a delta file into an open delta update: refit_load_delta_file.
 *
 * Everything is checked before refit_load_deltas sees a row: the file
 * (st_open: a truncated or malformed file is refused there), that it is a
 * delta file of the update's base and version, every tensor's names,
 * dtypes and shapes, and every tensor's SHA-256. Then refit_load_deltas
 * checks the patches against the model (indices in range, none twice,
 * the checkpoint dtype) and writes them; a refusal anywhere writes
 * nothing. Values are read from the file's mapping, in place; indices too
 * unless the file placed them unaligned (another writer's file). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/delta_file.h"
#include "core/load.h"
#include "core/safetensors.h"
#include "core/sha256.h"

/* One tensor's patch as the file holds it. */
typedef struct file_patch {
    char *name;                 /* the checkpoint tensor */
    const st_tensor *idx, *counts, *vals;
    int64_t *idx_copy;          /* an aligned copy, when idx's bytes are not */
    int64_t *counts_copy;
    int64_t shape[1];
    refit_tensor values;
} file_patch;

typedef struct delta_read {
    refit_ctx *ctx;
    const char *path;
    st_set *set;
    file_patch *p;
    size_t n;
} delta_read;

static int suffixed(const char *name, const char *suffix, size_t *stem)
{
    size_t n = strlen(name), k = strlen(suffix);
    if (n <= k || strcmp(name + n - k, suffix))
        return 0;
    *stem = n - k;
    return 1;
}

/* tensor stem + suffix of the set, NULL when absent */
static const st_tensor *sibling(const st_set *s, const char *stem, const char *suffix)
{
    size_t n = strlen(stem), k = strlen(suffix);
    char *name = malloc(n + k + 1);
    if (!name)
        return NULL;
    memcpy(name, stem, n);
    memcpy(name + n, suffix, k + 1);
    const st_tensor *t = st_find(s, name);
    free(name);
    return t;
}

static int bad(delta_read *r, int status, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(delta_read *r, int status, const char *tensor, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (tensor)
        return ctx_error(r->ctx, status, "load_delta_file %s: tensor %s: %s; nothing written",
                         r->path, tensor, what);
    return ctx_error(r->ctx, status, "load_delta_file %s: %s; nothing written", r->path, what);
}

/* An I64 vector of the file, aligned for reading as int64_t. */
static int int64s(delta_read *r, const char *name, const st_tensor *t, int64_t **copy,
                  const int64_t **out)
{
    if (t->dtype != ST_I64 || t->ndim != 1)
        return bad(r, REFIT_ECORRUPT, name, "%s is not a 1-D I64 tensor (dtype %s)",
                   t->name, st_dtype_name(t->dtype));
    if (((uintptr_t)t->data % sizeof(int64_t)) == 0) {
        *out = t->data;
        return REFIT_OK;
    }
    *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (!*copy)
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", r->path);
    memcpy(*copy, t->data, t->nbytes);
    *out = *copy;
    return REFIT_OK;
}

/* SHA-256 of indices, counts and values bytes against the header's. */
static int check_sum(delta_read *r, const file_patch *p)
{
    char key[sizeof DELTA_KEY_SHA256 + 512];
    if (strlen(p->name) >= sizeof key - sizeof DELTA_KEY_SHA256)
        return bad(r, REFIT_ECORRUPT, p->name, "name too long");
    snprintf(key, sizeof key, DELTA_KEY_SHA256 "%s", p->name);
    const char *want = st_metadata_get(r->set, 0, key);
    if (!want)
        return bad(r, REFIT_ECORRUPT, p->name, "no checksum (%s) in __metadata__", key);
    const st_tensor *parts[3] = {p->idx, p->counts, p->vals};
    st_sha256_ctx c;
    uint8_t digest[ST_SHA256_DIGEST];
    if (st_sha256_init(&c))
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", r->path);
    for (int i = 0; i < 3; i++)
        if (parts[i] && st_sha256_update(&c, parts[i]->data, parts[i]->nbytes)) {
            st_sha256_free(&c);
            return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory",
                             r->path);
        }
    if (st_sha256_final(&c, digest))
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", r->path);
    char got[ST_SHA256_HEX];
    st_sha256_hex(digest, got);
    if (strcmp(got, want))
        return bad(r, REFIT_ECORRUPT, p->name, "checksum mismatch: the header says %s, its "
                   "indices and values give %s", want, got);
    return REFIT_OK;
}

/* One patch, from its indices: its three tensors checked, its row's
 * values described. */
static int read_patch(delta_read *r, const st_tensor *idx, size_t stem, file_patch *p)
{
    p->name = malloc(stem + 1);
    if (!p->name)
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", r->path);
    memcpy(p->name, idx->name, stem);
    p->name[stem] = '\0';
    p->idx = idx;
    p->counts = sibling(r->set, p->name, DELTA_SUFFIX_COUNTS);
    p->vals = sibling(r->set, p->name, DELTA_SUFFIX_VALUES);
    if (!p->vals)
        return bad(r, REFIT_ECORRUPT, p->name, "indices without values (no %s%s)", p->name,
                   DELTA_SUFFIX_VALUES);
    const int64_t *unused;
    int rc;
    if ((rc = int64s(r, p->name, p->idx, &p->idx_copy, &unused)) ||
        (p->counts && (rc = int64s(r, p->name, p->counts, &p->counts_copy, &unused))))
        return rc;
    if (p->counts && p->counts->shape[0] != p->idx->shape[0])
        return bad(r, REFIT_ECORRUPT, p->name, "%lld run starts but %lld counts",
                   (long long)p->idx->shape[0], (long long)p->counts->shape[0]);
    const st_tensor *vals = p->vals;
    refit_dtype dt = st_dtype_to_refit(vals->dtype);
    if (vals->ndim != 1 || dt.code == ST_NO_REFIT)
        return bad(r, REFIT_ECORRUPT, p->name, "values are not a 1-D tensor of a refit dtype "
                   "(%s)", st_dtype_name(vals->dtype));
    if ((rc = check_sum(r, p)))
        return rc;
    p->shape[0] = vals->shape[0];
    p->values = (refit_tensor){(void *)vals->data, {REFIT_DEVICE_CPU, 0}, 1, dt, p->shape,
                               NULL, 0};
    return REFIT_OK;
}

/* Every tensor of the file belongs to a patch; each patch checked, in
 * the order of their indices (the writer's row order). */
static int read_patches(delta_read *r)
{
    size_t n = st_count(r->set), stem;
    r->p = calloc(n ? n : 1, sizeof *r->p);
    if (!r->p)
        return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", r->path);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(r->set, i);
        if (suffixed(t->name, DELTA_SUFFIX_INDICES, &stem)) {
            int rc = read_patch(r, t, stem, &r->p[r->n++]);
            if (rc)
                return rc;
        } else if (!suffixed(t->name, DELTA_SUFFIX_VALUES, &stem) &&
                   !suffixed(t->name, DELTA_SUFFIX_COUNTS, &stem)) {
            return bad(r, REFIT_ECORRUPT, t->name, "not a delta tensor (names end in %s, %s "
                       "or %s)", DELTA_SUFFIX_INDICES, DELTA_SUFFIX_COUNTS,
                       DELTA_SUFFIX_VALUES);
        } else {
            char *s = malloc(stem + 1);
            if (!s)
                return ctx_error(r->ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory",
                                 r->path);
            memcpy(s, t->name, stem);
            s[stem] = '\0';
            int orphan = !sibling(r->set, s, DELTA_SUFFIX_INDICES);
            free(s);
            if (orphan)
                return bad(r, REFIT_ECORRUPT, t->name, "has no %s beside it",
                           DELTA_SUFFIX_INDICES);
        }
    }
    const char *count = st_metadata_get(r->set, 0, DELTA_KEY_TENSORS);
    char have[32];
    snprintf(have, sizeof have, "%zu", r->n);
    if (!count || strcmp(count, have))
        return bad(r, REFIT_ECORRUPT, NULL, "__metadata__ declares %s patched tensors, the "
                   "file holds %s", count ? count : "no number of", have);
    return REFIT_OK;
}

/* The file's base and version against the update's. */
static int check_versions(delta_read *r, refit_txn *t)
{
    const char *fmt = st_metadata_get(r->set, 0, DELTA_KEY_FORMAT);
    const char *base = st_metadata_get(r->set, 0, DELTA_KEY_BASE);
    const char *version = st_metadata_get(r->set, 0, DELTA_KEY_VERSION);
    if (!fmt || !base || !version)
        return bad(r, REFIT_ECORRUPT, NULL, "not a refit delta file (its __metadata__ lacks "
                   "%s, %s or refit.delta.version)", DELTA_KEY_FORMAT, DELTA_KEY_BASE);
    if (strcmp(fmt, DELTA_FORMAT))
        return bad(r, REFIT_EUNSUPPORTED, NULL, "delta file format %s (this refit reads "
                   "format %s)", fmt, DELTA_FORMAT);
    const char *tb = txn_base_version(t);
    if (!tb)
        return ctx_error(r->ctx, REFIT_ESTATE, "load_delta_file %s: update '%s' is not a "
                         "delta update; the file patches base '%s' (begin with "
                         "base_version '%s'); nothing written", r->path, txn_version_label(t),
                         base, base);
    if (strcmp(tb, base))
        return ctx_error(r->ctx, REFIT_EMISMATCH, "load_delta_file %s: the file patches base "
                         "'%s', the update's base is '%s'; nothing written", r->path, base, tb);
    if (strcmp(txn_version_label(t), version))
        return ctx_error(r->ctx, REFIT_EMISMATCH, "load_delta_file %s: the file makes "
                         "version '%s', the update is '%s'; nothing written", r->path,
                         version, txn_version_label(t));
    return REFIT_OK;
}

static int open_file(delta_read *r)
{
    st_error e;
    char line[2048];
    int rc = st_open(&r->set, r->path, &e);
    if (!rc)
        rc = st_set_recheck(r->set, &e);
    if (rc)
        return ctx_error(r->ctx, rc, "load_delta_file %s: %s; nothing written", r->path,
                         st_error_line(&e, line, sizeof line));
    return REFIT_OK;
}

/* "load_delta_file PATH: " before a message of refit_load_deltas. */
static void prefix(refit_ctx *ctx, const char *path)
{
    char msg[REFIT_ERRMSG_SIZE + 256];
    snprintf(msg, sizeof msg, "load_delta_file %.200s: %s", path, ctx->errmsg);
    size_t n = strlen(msg) < sizeof ctx->errmsg ? strlen(msg) : sizeof ctx->errmsg - 1;
    memcpy(ctx->errmsg, msg, n);
    ctx->errmsg[n] = '\0';
}

int refit_load_delta_file(refit_txn *t, const char *path, void *stream)
{
    if (!t)
        return REFIT_EINVAL;
    refit_ctx *ctx = txn_model(t)->ctx;
    ctx_clear_error(ctx);
    if (!path)
        return txn_load_refused(t, ctx_error(ctx, REFIT_EINVAL, "load_delta_file: path is "
                                             "NULL; nothing written"));
    int rc = txn_load_open(t, path);
    if (rc)
        return rc;
    delta_read r = {ctx, path, NULL, NULL, 0};
    rc = open_file(&r);
    if (!rc)
        rc = check_versions(&r, t);
    if (!rc)
        rc = read_patches(&r);
    refit_delta *rows = NULL;
    if (!rc && !(rows = calloc(r.n ? r.n : 1, sizeof *rows)))
        rc = ctx_error(ctx, REFIT_ENOMEM, "load_delta_file %s: out of memory", path);
    if (rc) {
        rc = txn_load_refused(t, rc);
    } else {
        for (size_t i = 0; i < r.n; i++) {
            file_patch *p = &r.p[i];
            rows[i] = (refit_delta){p->name, (size_t)p->idx->shape[0],
                                    p->idx_copy ? p->idx_copy : p->idx->data,
                                    p->counts ? (p->counts_copy ? p->counts_copy
                                                                : p->counts->data)
                                              : NULL,
                                    &p->values};
        }
        if ((rc = refit_load_deltas(t, r.n, rows, stream)))
            prefix(ctx, path);
    }
    free(rows);
    for (size_t i = 0; i < r.n; i++) {
        free(r.p[i].name);
        free(r.p[i].idx_copy);
        free(r.p[i].counts_copy);
    }
    free(r.p);
    st_close(r.set);
    return rc;
}

int delta_file_versions(const char *path, char **base, char **version, char *why, size_t n)
{
    st_set *s = NULL;
    st_error e;
    *base = *version = NULL;
    int rc = st_open(&s, path, &e);
    if (rc) {
        st_error_line(&e, why, n);
        return rc;
    }
    const char *b = st_metadata_get(s, 0, DELTA_KEY_BASE);
    const char *v = st_metadata_get(s, 0, DELTA_KEY_VERSION);
    rc = REFIT_ENOTFOUND;
    if (b && v && st_metadata_get(s, 0, DELTA_KEY_FORMAT)) {
        *base = strdup(b);
        *version = strdup(v);
        rc = *base && *version ? REFIT_OK : REFIT_ENOMEM;
        if (rc) {
            free(*base);
            free(*version);
            *base = *version = NULL;
        }
    }
    if (rc)
        snprintf(why, n, "%s is not a refit delta file", path);
    st_close(s);
    return rc;
}
