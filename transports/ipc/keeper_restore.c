/*
 * A worker's restore from a keeper (refit_ipc_restore, docs/restart.md
 * "The keeper"):
 *
 *   connect     the keeper's uid checked before a byte goes (SO_PEERCRED)
 *   HELLO       both ways (restorer, keeper)
 *   K_OFFER     a refusal (the keeper serves nothing now): returned,
 *               nothing begun; else MEMS came first
 *   admit       the plan signatures compared (the first difference
 *               refuses, nothing written); every memory mapped, every
 *               tensor's placement inside its memory and shaped as this
 *               worker's runtime tensor
 *   update      begin (source keeper://PATH), every runtime tensor copied
 *               DIRECT from the keeper's memory, no post-load, prepare
 *               (its sync: the reads are over), every module's fingerprint
 *               against the keeper's (opts.verify)
 *   K_DONE      0, or why not (the keeper counts and journals it)
 *   K_CONFIRM   by the deadline: commit. A keeper gone before it confirms
 *               may have freed its memory under the copies: abort
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <refit/ipc.h>

#include "transports/ipc/keeper_restore.h"

#include "transports/ipc/keeper_msg.h"
#include "transports/ipc/mem.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/snapshot_manifest.h"
#include "core/snapshot_sig.h"
#include "core/txn.h"
#include "core/txn_journal.h"
#include "core/undo_source.h"

typedef struct kr {
    refit_model *m;
    refit_ctx *ctx;
    const char *path;
    refit_ipc_restore_opts o;
    int fd;
    double dl;
    ipc_mems t;
    void **base;                /* per memory of t, mapped */
    ipc_cuda cu;
    ipc_k_offer off;
    ipc_frame f;                /* the K_OFFER frame (off points into it) */
    ipc_wbuf wb;
    const char *tail;           /* after a refusal's message */
    char err[1024];
} kr;

static int kr_fail(kr *r, int rc, const char *what)
{
    return ctx_error(r->ctx, rc, "restore from keeper %s: %s: %s%s", r->path, what, r->err,
                     r->tail);
}

static int kr_connect(kr *r)
{
    int rc = ipc_connect(r->path, r->dl, &r->fd, r->err, sizeof r->err);
    if (rc)
        return kr_fail(r, rc, "connect");
    uint32_t uid = 0;
    int32_t pid = 0;
    if ((rc = ipc_peer_cred(r->fd, &uid, &pid, r->err, sizeof r->err)))
        return kr_fail(r, rc, "its credentials");
    if (!ipc_uid_allowed(uid, r->o.allow_uids, r->o.n_allow_uids)) {
        snprintf(r->err, sizeof r->err, "the listener runs as uid %u (pid %d), neither this "
                 "worker's uid %u nor in its allow_uids", uid, (int)pid, (unsigned)geteuid());
        return kr_fail(r, REFIT_EIO, "not trusted");
    }
    ipc_hello me = {IPC_ROLE_RESTORER, (uint32_t)getpid(), r->ctx->rank, 0};
    ipc_hello_encode(&r->wb, &me);
    rc = r->wb.failed ? REFIT_ENOMEM
                      : ipc_send(r->fd, IPC_HELLO, r->wb.p, (uint32_t)r->wb.len, NULL, 0, r->dl,
                                 r->err, sizeof r->err);
    ipc_frame f;
    if (!rc && !(rc = ipc_recv(r->fd, &f, 64, r->dl, r->err, sizeof r->err))) {
        ipc_hello peer;
        rc = ipc_hello_decode(&peer, &f, IPC_ROLE_KEEPER, r->err, sizeof r->err);
        ipc_frame_free(&f);
    }
    return rc ? kr_fail(r, rc, "greeting") : REFIT_OK;
}

/* MEMS (unless refused), then K_OFFER. */
static int kr_offer(kr *r)
{
    int rc = ipc_recv(r->fd, &r->f, IPC_MAX_PAYLOAD, r->dl, r->err, sizeof r->err);
    if (!rc && r->f.type == IPC_MEMS) {
        rc = ipc_mems_decode(&r->t, &r->f, r->err, sizeof r->err);
        ipc_frame_free(&r->f);
        if (!rc)
            rc = ipc_recv(r->fd, &r->f, IPC_MAX_PAYLOAD, r->dl, r->err, sizeof r->err);
        if (!rc && r->f.type != IPC_K_OFFER) {
            snprintf(r->err, sizeof r->err, "a %s frame where K_OFFER was expected",
                     ipc_type_name(r->f.type));
            rc = REFIT_ECORRUPT;
        }
    }
    if (!rc)
        rc = ipc_k_offer_decode(&r->off, &r->f, r->m->n_modules, r->m->n_runtime, r->err,
                                sizeof r->err);
    if (rc)
        return kr_fail(r, rc, "its offer");
    if (r->off.status)
        return ctx_error(r->ctx, r->off.status, "restore from keeper %s: %s%s", r->path,
                         r->off.msg, r->tail);
    if (!r->t.m && r->off.n_runtime) {
        snprintf(r->err, sizeof r->err, "an offer without its memories");
        return kr_fail(r, REFIT_ECORRUPT, "its offer");
    }
    return REFIT_OK;
}

/* The signatures, then where each tensor lies. */
static int kr_admit(kr *r)
{
    refit_model *m = r->m;
    json_error_t je;
    json_t *theirs = json_loadb(r->off.sig, r->off.sig_bytes, 0, &je);
    if (!theirs) {
        snprintf(r->err, sizeof r->err, "its signature is not JSON: %s", je.text);
        return kr_fail(r, REFIT_ECORRUPT, "its offer");
    }
    json_t *mine = snap_signature(m);
    if (!mine) {
        json_decref(theirs);
        return ctx_error(r->ctx, REFIT_ENOMEM, "restore from keeper %s: this worker's "
                         "signature: %s", r->path, refit_errmsg(r->ctx));
    }
    char diff[1024];
    int differs = snap_json_diff(theirs, mine, diff, sizeof diff);
    json_decref(theirs);
    json_decref(mine);
    if (differs) {
        /* snap_json_diff calls the first side the snapshot's */
        char *at = strstr(diff, ": snapshot ");
        char said[1100];
        if (at)
            snprintf(said, sizeof said, "%.*s: keeper %s", (int)(at - diff), diff, at + 11);
        else
            snprintf(said, sizeof said, "%s", diff);
        return ctx_error(r->ctx, REFIT_EMISMATCH, "restore from keeper %s: the plan signature "
                         "differs at %s; refused, nothing written (load the checkpoint "
                         "instead)", r->path, said);
    }
    if (r->off.n_modules != m->n_modules || r->off.n_runtime != m->n_runtime) {
        snprintf(r->err, sizeof r->err, "it offers %u modules and %u runtime tensors, this "
                 "worker has %u and %u", r->off.n_modules, r->off.n_runtime, m->n_modules,
                 m->n_runtime);
        return kr_fail(r, REFIT_ECORRUPT, "its offer");
    }
    if (!(r->base = calloc(r->t.n + 1, sizeof *r->base)))
        return ctx_error(r->ctx, REFIT_ENOMEM, "restore from keeper: out of memory");
    for (uint32_t i = 0; i < r->t.n; i++) {
        int rc = ipc_mem_open(&r->cu, &r->t.m[i], &r->base[i], r->err, sizeof r->err);
        if (rc)
            return kr_fail(r, rc, "its memory");
    }
    for (uint32_t i = 0; i < m->n_runtime; i++) {
        const ipc_k_place *p = &r->off.places[i];
        const tensor_reg *reg = &m->runtime[i];
        uint32_t k = 0;
        while (k < r->t.n && r->t.m[k].id != p->mem)
            k++;
        uint64_t bytes = k < r->t.n ? r->t.m[k].bytes : 0;
        if (k == r->t.n || p->span_off > bytes || p->span_bytes > bytes - p->span_off ||
            p->span_bytes != reg->span_bytes || p->data_off < p->span_off ||
            p->data_off - p->span_off != (uint64_t)((char *)reg->view.data - reg->span)) {
            snprintf(r->err, sizeof r->err, "runtime %s (module %s) is placed at memory %u, "
                     "bytes [%llu, +%llu), which does not hold it as this worker lays it out",
                     reg->name, m->modules[reg->module].name, p->mem,
                     (unsigned long long)p->span_off, (unsigned long long)p->span_bytes);
            return kr_fail(r, REFIT_ECORRUPT, "its offer");
        }
    }
    return REFIT_OK;
}

static refit_view src_view(const kr *r, uint32_t ti)
{
    const tensor_reg *reg = &r->m->runtime[ti];
    const ipc_k_place *p = &r->off.places[ti];
    uint32_t k = 0;
    while (r->t.m[k].id != p->mem)
        k++;
    refit_view v = reg->view;
    v.data = (char *)r->base[k] + p->data_off;
    v.device = r->t.m[k].kind == IPC_MEM_CUDA
                   ? (refit_device){REFIT_DEVICE_CUDA, r->t.m[k].device}
                   : (refit_device){REFIT_DEVICE_CPU, 0};
    return v;
}

/* Every module's bytes; the prepare; the fingerprints. Nothing commits. */
static int kr_copy(kr *r, refit_txn *t)
{
    refit_model *m = r->m;
    uint32_t cap = 1;
    for (uint32_t i = 0; i < m->n_modules; i++)
        cap = m->modules[i].n_runtime > cap ? m->modules[i].n_runtime : cap;
    refit_view *src = calloc(cap, sizeof *src);
    if (!src)
        return ctx_error(r->ctx, REFIT_ENOMEM, "restore from keeper: out of memory");
    int rc = REFIT_OK;
    for (uint32_t i = 0; !rc && i < m->n_modules; i++) {
        for (uint32_t k = 0; k < m->modules[i].n_runtime; k++)
            src[k] = src_view(r, m->modules[i].runtime[k]);
        rc = txn_restore_module(t, i, src, r->o.stream);
    }
    free(src);
    if (rc || (rc = refit_finalize_prepare(t)))
        return rc;
    for (uint32_t i = 0; r->o.verify && i < m->n_modules; i++) {
        uint64_t fp, want = ipc_k_offer_fp(&r->off, i);
        if ((rc = module_fingerprint(m, &m->modules[i], &fp)))
            return ctx_error(r->ctx, rc, "restore from keeper %s: module %s: fingerprint "
                             "failed: %s", r->path, m->modules[i].name, refit_strerror(rc));
        if (fp != want)
            return ctx_error(r->ctx, REFIT_ECORRUPT, "restore from keeper %s: module %s: its "
                             "runtime bytes fingerprint to %016llx after the copy, the keeper "
                             "holds %016llx", r->path, m->modules[i].name,
                             (unsigned long long)fp, (unsigned long long)want);
    }
    return REFIT_OK;
}

static int kr_status(kr *r, uint16_t type, int status, const char *msg)
{
    r->wb.len = 0;
    r->wb.failed = 0;
    ipc_status_encode(&r->wb, 0, status, msg);
    return r->wb.failed ? REFIT_ENOMEM
                        : ipc_send(r->fd, type, r->wb.p, (uint32_t)r->wb.len, NULL, 0, r->dl,
                                   r->err, sizeof r->err);
}

/* K_DONE, then the keeper's K_CONFIRM: it outlived the reads. */
static int kr_confirmed(kr *r)
{
    int rc = kr_status(r, IPC_K_DONE, REFIT_OK, "");
    ipc_frame f;
    if (!rc && !(rc = ipc_recv(r->fd, &f, IPC_MAX_MSG + 64, r->dl, r->err, sizeof r->err))) {
        ipc_status_msg s;
        rc = f.type == IPC_K_CONFIRM ? ipc_status_decode(&s, &f, 0, r->err, sizeof r->err)
                                     : REFIT_ECORRUPT;
        if (f.type != IPC_K_CONFIRM)
            snprintf(r->err, sizeof r->err, "a %s frame where K_CONFIRM was expected",
                     ipc_type_name(f.type));
        else if (!rc && s.status)
            snprintf(r->err, sizeof r->err, "it refused: %.900s", s.msg);
        rc = rc ? rc : s.status;
        ipc_frame_free(&f);
    }
    if (rc)
        return ctx_error(r->ctx, rc, "restore from keeper %s: the keeper did not confirm it "
                         "outlived the copies (%s): its memory may have gone under them",
                         r->path, r->err);
    return REFIT_OK;
}

static void kr_end(kr *r)
{
    for (uint32_t i = 0; r->base && i < r->t.n; i++)
        if (r->base[i])
            ipc_mem_close(&r->cu, &r->t.m[i], r->base[i]);
    free(r->base);
    if (r->cu.open)
        ipc_cuda_close(&r->cu);
    ipc_mems_free(&r->t);
    ipc_k_offer_free(&r->off);
    ipc_frame_free(&r->f);
    ipc_wbuf_free(&r->wb);
    if (r->fd >= 0)
        close(r->fd);
}

static void kr_abort(kr *r, refit_txn *t, int rc)
{
    char why[REFIT_ERRMSG_SIZE];
    memcpy(why, r->ctx->errmsg, sizeof why);
    int arc = refit_abort_reason(t, why);
    ctx_error(r->ctx, rc, "%s; restore aborted, %s", why,
              arc == REFIT_EPOISONED ? "worker POISONED" : "bytes rolled back");
}

int refit_ipc_restore(refit_model *m, const char *path, const refit_ipc_restore_opts *opts)
{
    refit_ipc_restore_opts defaults = REFIT_IPC_RESTORE_OPTS_INIT;
    if (!m || !path)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (!opts)
        opts = &defaults;
    if (opts->version != REFIT_IPC_RESTORE_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "restore from keeper: options of unknown version "
                         "%u", opts->version);
    if (opts->verify != 0 && opts->verify != 1)
        return ctx_error(ctx, REFIT_EINVAL, "restore from keeper: verify is 0 or 1, not %d",
                         opts->verify);
    if (!m->sealed || m->txn)
        return ctx_error(ctx, REFIT_ESTATE, "restore from keeper %s: %s", path,
                         !m->sealed ? "the model is not sealed" : "an update is open");
    kr r = {.m = m, .ctx = ctx, .path = path, .o = *opts, .fd = -1,
            .tail = "; refused, nothing written"};
    r.dl = ipc_now() + (opts->timeout_s > 0 ? opts->timeout_s : 60.0);
    int rc = kr_connect(&r);
    if (!rc)
        rc = kr_offer(&r);
    if (!rc && (rc = kr_admit(&r)))
        (void)kr_status(&r, IPC_K_DONE, rc, refit_errmsg(ctx));
    char uri[REFIT_SOURCE_URI_MAX], digest[96];
    refit_txn *t = NULL;
    if (!rc) {
        snprintf(uri, sizeof uri, "keeper://%s", path);
        uint64_t all = 0;
        for (uint32_t i = 0; i < m->n_modules; i++)
            all = all * 0x100000001b3ull ^ ipc_k_offer_fp(&r.off, i);
        snprintf(digest, sizeof digest, "keeper-fingerprints:%016llx", (unsigned long long)all);
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        uo.version_label = r.off.label;
        uo.source_uri = uri;
        uo.source_digest = digest;
        uo.rollback = opts->rollback;
        uo.fingerprint = 1;
        if ((rc = txn_begin(&t, m, &uo, 0)))
            (void)kr_status(&r, IPC_K_DONE, rc, refit_errmsg(ctx));
    }
    if (!rc && ((rc = kr_copy(&r, t)) || (rc = kr_confirmed(&r)))) {
        (void)kr_status(&r, IPC_K_DONE, rc, refit_errmsg(ctx)); /* the keeper may be gone */
        if (m->txn == t)
            kr_abort(&r, t, rc);
    } else if (!rc) {
        int64_t id = refit_txn_journal_id(t);
        rc = refit_commit(t);
        if (!rc)
            txj_event(m, id, "restore", "restored version %s from keeper %s (pid %u, worker "
                      "%s, update %lld)", r.off.label, path, r.off.pid, r.off.worker,
                      (long long)r.off.update_id);
    }
    kr_end(&r);
    return rc;
}

/* ---- the keeper as an undo source (core/undo_source.h) ---- */

typedef struct keeper_source {
    undo_source base;
    refit_model *m;
    char *path;
    refit_ipc_restore_opts o;   /* allow_uids copied */
    uint32_t *allow;
    char label[BKT_MAX_LABEL + 1];
    struct stat sock;           /* the socket file when armed */
    keeper_undo_wait_fn before_wait; /* keeper_undo_before_wait's */
    void *before_arg;
} keeper_source;

static int ks_check(undo_source *s, char *why, size_t n)
{
    keeper_source *p = (keeper_source *)s;
    struct stat now;
    if (stat(p->path, &now) || !S_ISSOCK(now.st_mode) || now.st_ino != p->sock.st_ino ||
        now.st_dev != p->sock.st_dev) {
        snprintf(why, n, "%s: the keeper's socket is gone or another since it was armed",
                 p->path);
        return REFIT_EIO;
    }
    return REFIT_OK;
}

/* The keeper must still hold the armed version: its label, and each
 * module's fingerprint the committed one. */
static int ks_same(kr *r, const keeper_source *p, const uint32_t *modules, uint32_t n)
{
    if (strcmp(r->off.label, p->label))
        return ctx_error(r->ctx, REFIT_EMISMATCH, "undo source %s: the keeper holds version "
                         "%s now, not %s", p->base.uri, r->off.label, p->label);
    for (uint32_t i = 0; i < n; i++)
        if (ipc_k_offer_fp(&r->off, modules[i]) != p->base.fp[modules[i]])
            return ctx_error(r->ctx, REFIT_EMISMATCH, "undo source %s: module %s: the "
                             "keeper's bytes are not the committed ones", p->base.uri,
                             r->m->modules[modules[i]].name);
    return REFIT_OK;
}

/* Write modules back from the keeper through t (RESTORING). The copies
 * are waited for before K_DONE: the keeper's confirmation then says its
 * memory outlived them; the caller checks the fingerprints. */
static int ks_restore(undo_source *s, refit_txn *t, const uint32_t *modules, uint32_t n)
{
    keeper_source *p = (keeper_source *)s;
    refit_model *m = p->m;
    if (p->before_wait) { /* e.g. the receiver's vote: the keeper may wait on it */
        const char *cause = NULL;
        int status = txn_abort_cause(t, &cause);
        p->before_wait(p->before_arg, status, cause);
    }
    kr r = {.m = m, .ctx = m->ctx, .path = p->path, .o = p->o, .fd = -1, .tail = ""};
    r.dl = ipc_now() + (p->o.timeout_s > 0 ? p->o.timeout_s : 60.0);
    char why[600];
    if (ks_check(s, why, sizeof why)) /* gone: no connection to wait for */
        return ctx_error(m->ctx, REFIT_EIO, "undo source %s: %s", s->uri, why);
    int rc = kr_connect(&r);
    if (!rc)
        rc = kr_offer(&r);
    if (!rc)
        rc = kr_admit(&r);
    if (!rc)
        rc = ks_same(&r, p, modules, n);
    uint32_t cap = 1;
    for (uint32_t i = 0; i < n; i++)
        cap = m->modules[modules[i]].n_runtime > cap ? m->modules[modules[i]].n_runtime : cap;
    refit_view *src = rc ? NULL : calloc(cap, sizeof *src);
    if (!rc && !src)
        rc = ctx_error(m->ctx, REFIT_ENOMEM, "undo source: out of memory");
    for (uint32_t i = 0; !rc && i < n; i++) {
        const module *mod = &m->modules[modules[i]];
        for (uint32_t k = 0; k < mod->n_runtime; k++)
            src[k] = src_view(&r, mod->runtime[k]);
        rc = txn_restore_module(t, modules[i], src, NULL);
    }
    free(src);
    for (uint32_t i = 0; !rc && i < n; i++) {
        const module *mod = &m->modules[modules[i]];
        for (uint32_t k = 0; !rc && k < mod->n_runtime; k++) {
            const tensor_reg *reg = &m->runtime[mod->runtime[k]];
            if (reg->be->sync && (rc = reg->be->sync(NULL)))
                ctx_error(m->ctx, rc, "undo source %s: copies failed: %s", s->uri,
                          reg->be->last_error());
        }
    }
    if (!rc)
        rc = kr_confirmed(&r);
    else if (r.fd >= 0)
        (void)kr_status(&r, IPC_K_DONE, rc, refit_errmsg(m->ctx));
    kr_end(&r);
    return rc;
}

static void ks_release(undo_source *s)
{
    keeper_source *p = (keeper_source *)s;
    free(p->path);
    free(p->allow);
}

static const undo_source_ops keeper_ops = {
    .kind = "keeper",
    .mode = REFIT_UNDO_KEEPER,
    .check = ks_check,
    .restore = ks_restore,
    .release = ks_release,
};

void keeper_undo_before_wait(refit_model *m, keeper_undo_wait_fn fn, void *arg)
{
    for (undo_source *s = m->undo_sources; s; s = s->next)
        if (s->ops == &keeper_ops) {
            ((keeper_source *)s)->before_wait = fn;
            ((keeper_source *)s)->before_arg = arg;
        }
}

static int keeper_undo_arm(refit_model *m, const char *path, const refit_ipc_restore_opts *o,
                           const ipc_k_offer *off)
{
    keeper_source *p = calloc(1, sizeof *p);
    uint64_t *fp = malloc((m->n_modules + 1) * sizeof *fp);
    char uri[REFIT_SOURCE_URI_MAX];
    int rc = p && fp ? REFIT_OK : REFIT_ENOMEM;
    if (!rc) {
        p->m = m;
        p->o = *o;
        p->path = strdup(path);
        p->allow = o->n_allow_uids ? malloc(o->n_allow_uids * sizeof *p->allow) : NULL;
        if (!p->path || (o->n_allow_uids && !p->allow))
            rc = REFIT_ENOMEM;
        else if (o->n_allow_uids)
            memcpy(p->allow, o->allow_uids, o->n_allow_uids * sizeof *p->allow);
        p->o.allow_uids = p->allow;
        p->o.stream = NULL;
        ipc_copy_str(p->label, sizeof p->label, off->label);
        if (!rc && stat(path, &p->sock))
            rc = REFIT_EIO;
        for (uint32_t i = 0; i < m->n_modules; i++)
            fp[i] = ipc_k_offer_fp(off, i);
        snprintf(uri, sizeof uri, "keeper://%s", path);
    }
    if (!rc)
        rc = undo_source_init(&p->base, m, &keeper_ops, uri, fp);
    free(fp);
    if (rc) {
        if (p)
            ks_release(&p->base);
        free(p);
        return rc;
    }
    undo_source_arm(m, &p->base);
    return REFIT_OK;
}

int refit_ipc_keeper_undo_arm(refit_model *m, const char *path, const refit_ipc_restore_opts *opts)
{
    refit_ipc_restore_opts defaults = REFIT_IPC_RESTORE_OPTS_INIT;
    if (!m || !path)
        return REFIT_EINVAL;
    refit_ctx *ctx = m->ctx;
    ctx_clear_error(ctx);
    if (!opts)
        opts = &defaults;
    if (opts->version != REFIT_IPC_RESTORE_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "keeper undo source: options of unknown version "
                         "%u", opts->version);
    if (!m->sealed || m->txn || model_health(m) != REFIT_HEALTH_READY || m->n_behind)
        return ctx_error(ctx, REFIT_ESTATE, "keeper undo source %s: the worker holds no "
                         "whole committed version (READY, every module at one version)", path);
    kr r = {.m = m, .ctx = ctx, .path = path, .o = *opts, .fd = -1, .tail = "; not armed"};
    r.dl = ipc_now() + (opts->timeout_s > 0 ? opts->timeout_s : 60.0);
    int rc = kr_connect(&r);
    if (!rc)
        rc = kr_offer(&r);
    if (!rc)
        rc = kr_admit(&r);
    if (!rc && strcmp(r.off.label, model_version_text(m)))
        rc = ctx_error(ctx, REFIT_EMISMATCH, "keeper undo source %s: the keeper holds "
                       "version %s, this worker %s; not armed", path, r.off.label,
                       model_version_text(m));
    for (uint32_t i = 0; !rc && i < m->n_modules; i++) {
        uint64_t fp;
        if ((rc = module_fingerprint(m, &m->modules[i], &fp)))
            ctx_error(ctx, rc, "keeper undo source: fingerprint of module %s failed",
                      m->modules[i].name);
        else if (fp != ipc_k_offer_fp(&r.off, i))
            rc = ctx_error(ctx, REFIT_EMISMATCH, "keeper undo source %s: module %s: the "
                           "keeper's bytes are not this worker's committed ones; not armed",
                           path, m->modules[i].name);
    }
    if (r.fd >= 0) /* nothing is copied: the keeper counts a restore not served */
        (void)kr_status(&r, IPC_K_DONE, REFIT_ESTATE, "an undo source's check: nothing copied");
    if (!rc)
        rc = keeper_undo_arm(m, path, opts, &r.off);
    kr_end(&r);
    return rc;
}
