/* Checkpoint sources: a validated safetensors file or directory, streamed
 * into a transaction straight from its mapping. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/source.h"
#include "core/backend.h"
#include "core/ctx.h"
#include "core/txn.h"
#include "core/safetensors.h"
#include "core/sha256.h"

struct refit_source {
    refit_ctx *ctx;
    st_set *set;
    char *uri;
    int durable;
    int has_digest;
    char digest[ST_SHA256_HEX];
    int refs;                   /* the caller's, plus the core's holds */
};

static int source_error(refit_ctx *ctx, const st_error *e)
{
    char line[2048];
    return ctx_error(ctx, e->status ? e->status : REFIT_ECORRUPT, "%s",
                     st_error_line(e, line, sizeof line));
}

int refit_source_open(refit_source **out, refit_ctx *ctx, const char *path)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (!path)
        return ctx_error(ctx, REFIT_EINVAL, "refit_source_open: path is NULL");
    refit_source *src = calloc(1, sizeof *src);
    if (!src)
        return ctx_error(ctx, REFIT_ENOMEM, "source %s: out of memory", path);
    src->ctx = ctx;
    st_error err;
    int rc = st_open(&src->set, path, &err);
    if (rc) {
        free(src);
        return source_error(ctx, &err);
    }
    char abs[PATH_MAX];
    const char *p = realpath(path, abs) ? abs : path;
    size_t n = strlen(p) + sizeof "file://";
    src->uri = malloc(n);
    if (!src->uri) {
        refit_source_close(src);
        return ctx_error(ctx, REFIT_ENOMEM, "source %s: out of memory", path);
    }
    snprintf(src->uri, n, "file://%s", p);
    src->durable = 1;
    src->refs = 1;
    *out = src;
    return REFIT_OK;
}

int refit_source_open_memory(refit_source **out, refit_ctx *ctx, const void *buf, size_t len,
                             const char *label)
{
    if (!out || !ctx)
        return REFIT_EINVAL;
    *out = NULL;
    ctx_clear_error(ctx);
    if (!buf || !label)
        return ctx_error(ctx, REFIT_EINVAL, "refit_source_open_memory: buffer and label needed");
    refit_source *src = calloc(1, sizeof *src);
    if (!src)
        return ctx_error(ctx, REFIT_ENOMEM, "source %s: out of memory", label);
    src->ctx = ctx;
    st_error err;
    int rc = st_open_memory(&src->set, buf, len, label, &err);
    size_t n = strlen(label) + sizeof "memory://";
    if (!rc && !(src->uri = malloc(n)))
        rc = REFIT_ENOMEM;
    if (rc) {
        refit_source_close(src);
        return rc == REFIT_ENOMEM ? ctx_error(ctx, rc, "source %s: out of memory", label)
                                  : source_error(ctx, &err);
    }
    snprintf(src->uri, n, "memory://%s", label);
    src->refs = 1;
    *out = src;
    return REFIT_OK;
}

void refit_source_close(refit_source *src)
{
    if (!src || --src->refs > 0)
        return;
    st_close(src->set);
    free(src->uri);
    free(src);
}

refit_source *source_hold(refit_source *src)
{
    src->refs++;
    return src;
}

st_set *source_set(const refit_source *src)
{
    return src->set;
}

size_t refit_source_count(const refit_source *src)
{
    return src ? st_count(src->set) : 0;
}

int refit_source_tensor_at(const refit_source *src, size_t i, refit_source_tensor *out)
{
    if (!src || !out || i >= st_count(src->set))
        return REFIT_EINVAL;
    const st_tensor *t = st_tensor_at(src->set, i);
    out->name = t->name;
    out->dtype = st_dtype_to_refit(t->dtype);
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->bytes = t->nbytes;
    out->file = st_file_path(src->set, t->file);
    return REFIT_OK;
}

const char *refit_source_uri(const refit_source *src)
{
    return src ? src->uri : NULL;
}

int refit_source_is_durable(const refit_source *src)
{
    return src && src->durable;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int refit_source_digest(refit_source *src, char hex[65])
{
    if (!src || !hex)
        return REFIT_EINVAL;
    ctx_clear_error(src->ctx);
    if (!src->has_digest) {
        size_t nf = st_file_count(src->set);
        st_sha256_ctx all = {NULL};
        if (nf != 1 && st_sha256_init(&all))
            return ctx_error(src->ctx, REFIT_ENOMEM, "checkpoint digest: out of memory");
        for (size_t i = 0; i < nf; i++) {
            st_error err;
            char fh[ST_SHA256_HEX];
            if (st_file_sha256(src->set, i, fh, &err)) {
                st_sha256_free(&all);
                return source_error(src->ctx, &err);
            }
            if (nf == 1) {
                memcpy(src->digest, fh, sizeof fh);
                break;
            }
            const char *name = base_name(st_file_path(src->set, i));
            if (st_sha256_update(&all, name, strlen(name)) || st_sha256_update(&all, " ", 1) ||
                st_sha256_update(&all, fh, ST_SHA256_HEX - 1) || st_sha256_update(&all, "\n", 1)) {
                st_sha256_free(&all);
                return ctx_error(src->ctx, REFIT_ENOMEM, "checkpoint digest: out of memory");
            }
        }
        if (nf != 1) {
            uint8_t d[ST_SHA256_DIGEST];
            if (st_sha256_final(&all, d))
                return ctx_error(src->ctx, REFIT_ENOMEM, "checkpoint digest: out of memory");
            st_sha256_hex(d, src->digest);
        }
        src->has_digest = 1;
    }
    memcpy(hex, src->digest, ST_SHA256_HEX);
    return REFIT_OK;
}

/* "file-id:" and the SHA-256 of one line per file, "<name> <size> <dev>
 * <ino> <mtime> <ctime>\n": what st_set_recheck compares, so a file
 * rewritten, touched or replaced since gets another identity. ctime is
 * the kernel's (no call sets it back), so a copy with its mtime preserved
 * differs too. */
int refit_source_identity(refit_source *src, char out[REFIT_SOURCE_ID_SIZE])
{
    if (!src || !out)
        return REFIT_EINVAL;
    ctx_clear_error(src->ctx);
    if (!src->durable)
        return ctx_error(src->ctx, REFIT_EUNSUPPORTED, "source identity: %s is held in memory, "
                         "which has no file to identify", src->uri);
    st_sha256_ctx h = {NULL};
    if (st_sha256_init(&h))
        return ctx_error(src->ctx, REFIT_ENOMEM, "source identity: out of memory");
    size_t nf = st_file_count(src->set);
    for (size_t i = 0; i < nf; i++) {
        const struct stat *st = st_file_stat(src->set, i);
        char line[PATH_MAX + 160];
        int n = snprintf(line, sizeof line, "%s %llu %llu %llu %lld.%09ld %lld.%09ld\n",
                         base_name(st_file_path(src->set, i)),
                         (unsigned long long)st->st_size, (unsigned long long)st->st_dev,
                         (unsigned long long)st->st_ino, (long long)st->st_mtim.tv_sec,
                         st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
        if (n < 0 || (size_t)n >= sizeof line || st_sha256_update(&h, line, (size_t)n)) {
            st_sha256_free(&h);
            return ctx_error(src->ctx, REFIT_ENOMEM, "source identity: out of memory");
        }
    }
    uint8_t d[ST_SHA256_DIGEST];
    if (st_sha256_final(&h, d))
        return ctx_error(src->ctx, REFIT_ENOMEM, "source identity: out of memory");
    memcpy(out, REFIT_SOURCE_ID_PREFIX, sizeof REFIT_SOURCE_ID_PREFIX - 1);
    st_sha256_hex(d, out + sizeof REFIT_SOURCE_ID_PREFIX - 1);
    return REFIT_OK;
}

/* Every tensor of src through refit_load, in file and offset order. */
static int load_all(refit_txn *txn, refit_source *src, refit_filter_fn filter, void *filter_user,
                    refit_progress_fn progress, void *user, void *stream, uint64_t *loaded)
{
    refit_ctx *ctx = src->ctx;
    uint64_t bytes = 0, tensors = 0;
    size_t n = st_count(src->set);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(src->set, i);
        if (filter && !filter(filter_user, t->name))
            continue;
        refit_tensor view = {
            .data = (void *)t->data,
            .device = {REFIT_DEVICE_CPU, 0},
            .ndim = t->ndim,
            .dtype = st_dtype_to_refit(t->dtype),
            .shape = (int64_t *)t->shape,
            .strides = NULL,
        };
        if (view.dtype.code == ST_NO_REFIT)
            return ctx_error(ctx, REFIT_EUNSUPPORTED, "%s: tensor %s has dtype %s, which refit "
                             "cannot load", st_file_path(src->set, t->file), t->name,
                             st_dtype_name(t->dtype));
        int rc = refit_load(txn, t->name, &view, stream);
        if (rc) {
            char why[REFIT_ERRMSG_SIZE];
            snprintf(why, sizeof why, "%s", ctx->errmsg);
            return ctx_error(ctx, rc, "%s (from %s)", why, st_file_path(src->set, t->file));
        }
        bytes += t->nbytes;
        *loaded = ++tensors;
        if (progress)
            progress(user, bytes, tensors, t->name);
    }
    return REFIT_OK;
}

int refit_load_source_filtered(refit_txn *txn, refit_source *src, refit_filter_fn filter,
                               void *filter_user, refit_progress_fn progress, void *user,
                               void *stream)
{
    if (!txn || !src)
        return REFIT_EINVAL;
    refit_ctx *ctx = src->ctx;
    ctx_clear_error(ctx);
    st_error err;
    if (st_set_recheck(src->set, &err))
        return source_error(ctx, &err);
    /* the mapping outlives the loop: a device backend may read it after
     * refit_load returns, until the hold ends */
    const backend *dev = backend_for_device((refit_device){REFIT_DEVICE_CUDA, 0});
    int held = dev && dev->hold_host_sources && !dev->hold_host_sources(stream, 1);
    uint64_t tensors = 0;
    int rc = load_all(txn, src, filter, filter_user, progress, user, stream, &tensors);
    /* what the update took from src: an undo source when it was all of it */
    txn_note_source(txn, src, tensors);
    if (held) {
        int hrc = dev->hold_host_sources(stream, 0);
        if (hrc && !rc)
            rc = ctx_error(ctx, hrc, "loading %s: device copies failed: %s", src->uri,
                           dev->last_error());
    }
    return rc;
}

int refit_load_source(refit_txn *txn, refit_source *src, refit_progress_fn progress, void *user,
                      void *stream)
{
    return refit_load_source_filtered(txn, src, NULL, NULL, progress, user, stream);
}
