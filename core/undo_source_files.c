/* The undo source "previous update's files": the safetensors files an
 * update was loaded from, wholly, kept open and mapped from its commit
 * (docs/core.md "Undo sources"). An abort reloads the modules the next
 * update wrote from them, post-load included: what a cold start of that
 * version does.
 *
 * When they count as the committed version: armed at the commit of an
 * update that is neither partial nor a delta and took every tensor it
 * delivered from one durable source (txn_note_source), and whose files
 * are the very inodes that were loaded. Any other commit drops them.
 * Checked at begin (st_set_recheck: size, mtime, the path still naming the
 * same inode; anything else keeps the undo log) and again at abort, on the
 * inodes held: a file written in place between begin and abort fails the
 * restore, naming it (the worker is POISONED); a path replaced meanwhile
 * does not matter, its old inode is still held and read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/undo_source.h"
#include "core/backend.h"
#include "core/ctx.h"
#include "core/load.h"
#include "core/model.h"
#include "core/source.h"
#include "core/txn.h"

typedef struct files_source {
    undo_source base;
    refit_model *m;
    refit_source *src;          /* held (source_hold) */
    int *fds;                   /* one a file: the inodes loaded */
    size_t n_fds;
} files_source;

static bool same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static int files_check(undo_source *s, char *why, size_t n)
{
    files_source *f = (files_source *)s;
    st_error err;
    if (st_set_recheck(source_set(f->src), &err) == REFIT_OK)
        return REFIT_OK;
    char line[2048];
    snprintf(why, n, "%s", st_error_line(&err, line, sizeof line));
    return REFIT_EIO;
}

/* The inodes held still have the size and mtime they were loaded with. */
static int files_unchanged(files_source *f)
{
    const st_set *set = source_set(f->src);
    for (size_t i = 0; i < f->n_fds; i++) {
        const struct stat *was = st_file_stat(set, i);
        struct stat now;
        if (fstat(f->fds[i], &now))
            return ctx_error(f->m->ctx, REFIT_EIO, "undo source: cannot stat %s: %s",
                             st_file_path(set, i), strerror(errno));
        if (now.st_size != was->st_size || !same_time(&now.st_mtim, &was->st_mtim))
            return ctx_error(f->m->ctx, REFIT_EIO, "undo source: %s was %s since it was "
                             "loaded; it no longer holds the committed version",
                             st_file_path(set, i), now.st_size != was->st_size
                                 ? "truncated or extended" : "written (mtime changed)");
    }
    return REFIT_OK;
}

/* Every tensor of the files that goes to one of the modules flagged. */
static int load_flagged(files_source *f, refit_txn *t, const uint8_t *flag)
{
    refit_model *m = f->m;
    const st_set *set = source_set(f->src);
    size_t n = st_count(set);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *st = st_tensor_at(set, i);
        delivery d;
        if (load_resolve(m, st->name, &d) || !flag[d.r->module])
            continue; /* skipped by the update too (another rank's expert) */
        refit_tensor view = {
            .data = (void *)st->data,
            .device = {REFIT_DEVICE_CPU, 0},
            .ndim = st->ndim,
            .dtype = st_dtype_to_refit(st->dtype),
            .shape = (int64_t *)st->shape,
            .strides = NULL,
        };
        int rc = refit_load(t, st->name, &view, NULL);
        if (rc) {
            char why[REFIT_ERRMSG_SIZE];
            snprintf(why, sizeof why, "%s", m->ctx->errmsg);
            return ctx_error(m->ctx, rc, "undo source: reloading %s from %s: %s", st->name,
                             st_file_path(set, st->file), why);
        }
    }
    ctx_clear_error(m->ctx);
    return REFIT_OK;
}

static int files_restore(undo_source *s, refit_txn *t, const uint32_t *modules, uint32_t n)
{
    files_source *f = (files_source *)s;
    refit_model *m = f->m;
    int rc = files_unchanged(f);
    if (rc)
        return rc;
    uint8_t *flag = calloc(m->n_modules + 1, 1);
    if (!flag)
        return ctx_error(m->ctx, REFIT_ENOMEM, "undo source: out of memory");
    for (uint32_t i = 0; i < n; i++)
        flag[modules[i]] = 1;
    /* the mapping is read by device copies until the hold ends, as in
     * refit_load_source */
    const backend *dev = backend_for_device((refit_device){REFIT_DEVICE_CUDA, 0});
    int held = dev && dev->hold_host_sources && !dev->hold_host_sources(NULL, 1);
    rc = load_flagged(f, t, flag);
    if (held) {
        int hrc = dev->hold_host_sources(NULL, 0);
        if (hrc && !rc)
            rc = ctx_error(m->ctx, hrc, "undo source: device copies failed: %s",
                           dev->last_error());
    }
    free(flag);
    /* read again: a write that raced the reload is seen here, or by the
     * fingerprints */
    return rc ? rc : files_unchanged(f);
}

static void files_release(undo_source *s)
{
    files_source *f = (files_source *)s;
    for (size_t i = 0; i < f->n_fds; i++)
        close(f->fds[i]);
    free(f->fds);
    refit_source_close(f->src);
}

static const undo_source_ops files_ops = {
    .kind = "files",
    .mode = REFIT_UNDO_FILES,
    .check = files_check,
    .restore = files_restore,
    .release = files_release,
};

/* Open each file again, by fd, and require the inode that was loaded. */
static int open_inodes(files_source *f)
{
    const st_set *set = source_set(f->src);
    size_t n = st_file_count(set);
    if (!(f->fds = malloc((n + 1) * sizeof *f->fds)))
        return ctx_error(f->m->ctx, REFIT_ENOMEM, "undo source: out of memory");
    for (size_t i = 0; i < n; i++) {
        const struct stat *was = st_file_stat(set, i);
        struct stat now;
        int fd = open(st_file_path(set, i), O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && (fstat(fd, &now) || now.st_ino != was->st_ino ||
                        now.st_dev != was->st_dev)) {
            close(fd);
            fd = -1;
        }
        if (fd < 0)
            return ctx_error(f->m->ctx, REFIT_EIO, "undo source: %s is not the file loaded "
                             "any more", st_file_path(set, i));
        f->fds[f->n_fds++] = fd;
    }
    return REFIT_OK;
}

int undo_source_files_arm(refit_model *m, refit_source *src)
{
    if (!refit_source_is_durable(src))
        return REFIT_EUNSUPPORTED;
    files_source *f = calloc(1, sizeof *f);
    if (!f)
        return ctx_error(m->ctx, REFIT_ENOMEM, "undo source: out of memory");
    f->m = m;
    f->src = source_hold(src);
    int rc = open_inodes(f);
    if (!rc)
        rc = undo_source_init(&f->base, m, &files_ops, refit_source_uri(src), NULL);
    if (rc) {
        files_release(&f->base);
        free(f);
        return rc;
    }
    undo_source_arm(m, &f->base);
    return REFIT_OK;
}
