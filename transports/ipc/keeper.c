/*
 * The keeper (include/refit/ipc.h, docs/restart.md "The keeper"): a sealed
 * worker of the group's plan whose runtime tensors lie in shareable memory,
 * serving restores of its committed state on a socket of its own and, when
 * it follows a trainer, voting on every update as one more worker.
 *
 * What it offers, and when:
 *
 *   SERVING   READY, every module at one version, no update in doubt:
 *             a restore gets MEMS, K_OFFER, and K_CONFIRM after its K_DONE
 *   REFUSING  an update open, EMPTY or POISONED, a partial update, or in
 *             doubt: a restore gets K_OFFER with REFIT_ESTATE and the reason
 *
 *   SERVING  -> REFUSING  [follow: voted prepared, then no decision (the
 *                          trainer died or stalled: the group may hold a
 *                          version this keeper rolled back)]
 *   REFUSING -> SERVING   [follow: the group committed an update]
 *
 * A version the group aborted is rolled back here too (the keeper runs with
 * rollback), so it never serves a version one worker refused. One restore
 * or update at a time: the trainer's vote waits for a restore in progress,
 * and a restorer connected during an update waits in the listen queue.
 */
#include "transports/ipc/keeper.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "transports/ipc/keeper_msg.h"
#include "transports/ipc/pool.h"
#include "transports/ipc/receiver.h"
#include "core/ctx.h"
#include "core/model.h"
#include "core/mod_version.h"
#include "transports/nccl/xport.h"
#include "core/snapshot_sig.h"
#include "core/util.h"

typedef struct k_mem {
    ipc_mem_desc d;             /* HOST_FD: d.fd is the pool's (borrowed) */
    uintptr_t base;
} k_mem;

struct refit_ipc_keeper {
    refit_model *m;
    refit_ctx *ctx;
    refit_ipc_pool *pool;
    refit_ipc_keeper_opts o;
    char *path;
    int lfd;
    ipc_sock_id sock_id;
    uint32_t *allow;
    refit_ipc_receiver *follow;
    k_mem *mems;
    uint32_t n_mems;
    ipc_k_place *places;        /* per runtime tensor */
    char *sig;                  /* the plan signature, JSON text */
    uint64_t *fps;              /* per module, of the version fp_of */
    mod_version *fp_of;         /* held while cached */
    bool in_doubt;
    char doubt[400];
    refit_ipc_keeper_stats st;
    ipc_cuda cu;
    ipc_wbuf wb;
    char err[1024];
};

static double wait_of(const refit_ipc_keeper *k)
{
    return k->o.timeout_s > 0 ? k->o.timeout_s : 60.0;
}

static int k_err(refit_ipc_keeper *k, int rc)
{
    return ctx_error(k->ctx, rc, "keeper %s: %s", k->path ? k->path : "?", k->err);
}

/* ---- what it exports ---- */

/* The memory holding [p, p + n) as memory id *mem: the pool, or (device)
 * the allocation cuMemGetAddressRange names, shared once. */
static int place_in(refit_ipc_keeper *k, const tensor_reg *r, uint32_t *mem, uint64_t *off)
{
    uint64_t n = r->span_bytes;
    if (ipc_pool_holds(k->pool, r->span, n, off)) {
        *mem = 1;
        return REFIT_OK;
    }
    if (r->sig.device.device_type != REFIT_DEVICE_CUDA) {
        snprintf(k->err, sizeof k->err, "runtime %s (module %s) is not in the keeper's pool: "
                 "host memory a keeper serves comes from refit_ipc_pool_alloc", r->name,
                 k->m->modules[r->module].name);
        return REFIT_EINVAL;
    }
    int rc = ipc_cuda_open(&k->cu, r->sig.device.device_id, k->err, sizeof k->err);
    if (!rc)
        rc = ipc_cuda_enter(&k->cu, k->err, sizeof k->err);
    CUdeviceptr base = 0;
    size_t size = 0;
    uint8_t handle[IPC_HANDLE_BYTES];
    if (!rc)
        rc = ipc_cuda_share(&k->cu, (CUdeviceptr)(uintptr_t)r->span, &base, &size, handle,
                            k->err, sizeof k->err);
    if (rc)
        return rc;
    uint32_t i = 0;
    while (i < k->n_mems && k->mems[i].base != (uintptr_t)base)
        i++;
    if (i == k->n_mems) {
        k_mem *nm = realloc(k->mems, (k->n_mems + 1) * sizeof *nm);
        if (!nm)
            return REFIT_ENOMEM;
        k->mems = nm;
        nm[i] = (k_mem){.d = {.id = i + 1, .gen = 1, .kind = IPC_MEM_CUDA,
                              .device = r->sig.device.device_id, .bytes = size, .fd = -1},
                        .base = (uintptr_t)base};
        memcpy(nm[i].d.handle, handle, IPC_HANDLE_BYTES);
        k->n_mems++;
    }
    *mem = k->mems[i].d.id;
    *off = (uintptr_t)r->span - k->mems[i].base;
    return REFIT_OK;
}

static int build_exports(refit_ipc_keeper *k)
{
    refit_model *m = k->m;
    if (k->pool) {
        if (!(k->mems = calloc(1, sizeof *k->mems)))
            return REFIT_ENOMEM;
        k->mems[0] = (k_mem){.d = k->pool->d, .base = (uintptr_t)k->pool->base};
        k->n_mems = 1;
    }
    if (!(k->places = calloc(m->n_runtime + 1, sizeof *k->places)))
        return REFIT_ENOMEM;
    for (uint32_t i = 0; i < m->n_runtime; i++) {
        const tensor_reg *r = &m->runtime[i];
        ipc_k_place *p = &k->places[i];
        int rc = place_in(k, r, &p->mem, &p->span_off);
        if (rc)
            return rc;
        p->span_bytes = r->span_bytes;
        p->data_off = p->span_off + (uint64_t)((char *)r->view.data - r->span);
    }
    json_t *sig = snap_signature(m);
    if (!sig) {
        ipc_copy_str(k->err, sizeof k->err, refit_errmsg(k->ctx));
        return REFIT_EIO;
    }
    k->sig = json_dumps(sig, JSON_COMPACT);
    json_decref(sig);
    return k->sig ? REFIT_OK : REFIT_ENOMEM;
}

int refit_ipc_keeper_create(refit_ipc_keeper **out, refit_model *model, refit_ipc_pool *pool,
                            const char *path, const refit_ipc_keeper_opts *opts)
{
    refit_ipc_keeper_opts defaults = REFIT_IPC_KEEPER_OPTS_INIT;
    if (!out || !model || !path)
        return REFIT_EINVAL;
    *out = NULL;
    refit_ctx *ctx = model->ctx;
    ctx_clear_error(ctx);
    if (!opts)
        opts = &defaults;
    if (opts->version != REFIT_IPC_KEEPER_OPTS_VERSION)
        return ctx_error(ctx, REFIT_EINVAL, "keeper: options of unknown version %u",
                         opts->version);
    if (!model->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "keeper %s: the model is not sealed", path);
    if (pool && pool->ctx != ctx)
        return ctx_error(ctx, REFIT_EINVAL, "keeper %s: the pool is of another context", path);
    refit_ipc_keeper *k = calloc(1, sizeof *k);
    if (!k)
        return ctx_error(ctx, REFIT_ENOMEM, "keeper: out of memory");
    k->m = model;
    k->ctx = ctx;
    k->pool = pool;
    k->o = *opts;
    k->lfd = -1;
    k->path = xstrdup(path);
    int rc = k->path ? REFIT_OK : REFIT_ENOMEM;
    if (!rc && opts->n_allow_uids) {
        k->allow = malloc(opts->n_allow_uids * sizeof *k->allow);
        if (k->allow)
            memcpy(k->allow, opts->allow_uids, opts->n_allow_uids * sizeof *k->allow);
        else
            rc = REFIT_ENOMEM;
    }
    k->o.follow = NULL;
    k->o.allow_uids = k->allow;
    if (!rc && (rc = build_exports(k)))
        rc = k_err(k, rc);
    if (!rc && (rc = ipc_listen(path, opts->socket_mode ? opts->socket_mode : 0600, &k->lfd,
                                &k->sock_id, k->err, sizeof k->err)))
        rc = k_err(k, rc);
    if (!rc && opts->follow_path) {
        refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
        if (opts->follow)
            ro = *opts->follow;
        if (!(rc = refit_ipc_receiver_create(&k->follow, model, opts->follow_path, &ro)))
            ipc_receiver_set_role(k->follow, IPC_ROLE_KEEPER);
    }
    if (rc) {
        refit_ipc_keeper_destroy(k);
        return rc;
    }
    *out = k;
    return REFIT_OK;
}

void refit_ipc_keeper_destroy(refit_ipc_keeper *k)
{
    if (!k)
        return;
    refit_ipc_receiver_destroy(k->follow);
    if (k->lfd >= 0) {
        close(k->lfd);
        ipc_unlink_own(k->path, &k->sock_id);
    }
    if (k->cu.open)
        ipc_cuda_close(&k->cu);
    mod_version_drop(k->fp_of);
    free(k->fps);
    free(k->sig);
    free(k->places);
    free(k->mems);
    free(k->allow);
    free(k->path);
    ipc_wbuf_free(&k->wb);
    free(k);
}

/* ---- serving ---- */

/* Why a restore now would be refused; NULL: it would be served. */
static const char *why_not(const refit_ipc_keeper *k)
{
    const refit_model *m = k->m;
    if (m->txn)
        return "an update is open on the keeper";
    if (k->in_doubt)
        return k->doubt;
    switch (model_health(m)) {
    case REFIT_HEALTH_EMPTY: return "the keeper holds no committed version yet";
    case REFIT_HEALTH_POISONED: return "the keeper is POISONED (an update aborted without "
                                       "rollback)";
    case REFIT_HEALTH_READY: break;
    default: return "the keeper is not READY";
    }
    if (m->n_behind)
        return "the keeper's modules hold different versions (a partial update)";
    return NULL;
}

/* Each module's fingerprint of the version held, computed once per
 * version (a rolled-back update leaves the version and its bytes). */
static int fingerprints(refit_ipc_keeper *k)
{
    refit_model *m = k->m;
    if (k->fps && k->fp_of == m->version)
        return REFIT_OK;
    if (!k->fps && !(k->fps = calloc(m->n_modules + 1, sizeof *k->fps)))
        return REFIT_ENOMEM;
    mod_version_drop(k->fp_of);
    k->fp_of = NULL;
    for (uint32_t i = 0; i < m->n_modules; i++) {
        int rc = module_fingerprint(m, &m->modules[i], &k->fps[i]);
        if (rc) {
            snprintf(k->err, sizeof k->err, "fingerprint of module %s: %s", m->modules[i].name,
                     refit_strerror(rc));
            return rc;
        }
    }
    k->fp_of = m->version;
    mod_version_hold(k->fp_of);
    return REFIT_OK;
}

static int send_frame(refit_ipc_keeper *k, int fd, uint16_t type, const int *fds, uint16_t nf,
                      double dl)
{
    return k->wb.failed ? REFIT_ENOMEM
                        : ipc_send(fd, type, k->wb.p, (uint32_t)k->wb.len, fds, nf, dl, k->err,
                                   sizeof k->err);
}

static void wb_reset(refit_ipc_keeper *k)
{
    k->wb.len = 0;
    k->wb.failed = 0;
}

/* MEMS, then K_OFFER: what the restorer maps and copies. */
int keeper_offer(refit_ipc_keeper *k, int fd, double dl)
{
    refit_model *m = k->m;
    ipc_k_offer o = {0};
    const char *why = why_not(k);
    int rc = why ? REFIT_OK : fingerprints(k);
    if (why || rc) {
        o.status = why ? REFIT_ESTATE : rc;
        snprintf(o.msg, sizeof o.msg, "keeper %.300s serves nothing now: %.600s", k->path,
                 why ? why : k->err);
        wb_reset(k);
        ipc_k_offer_encode(&k->wb, &o, NULL);
        (void)send_frame(k, fd, IPC_K_OFFER, NULL, 0, dl);
        return o.status;
    }
    ipc_mems t = {.epoch = 1, .n = k->n_mems};
    if (!(t.m = calloc(k->n_mems + 1, sizeof *t.m)))
        return REFIT_ENOMEM;
    for (uint32_t i = 0; i < k->n_mems; i++)
        t.m[i] = k->mems[i].d;
    int fds[IPC_MAX_FDS];
    uint16_t nf = ipc_mems_fds(&t, fds, IPC_MAX_FDS);
    wb_reset(k);
    ipc_mems_encode(&k->wb, &t);
    free(t.m);
    if ((rc = send_frame(k, fd, IPC_MEMS, fds, nf, dl)))
        return rc;
    o.n_modules = m->n_modules;
    o.n_runtime = m->n_runtime;
    ipc_copy_str(o.label, sizeof o.label, m->version->label);
    ipc_copy_str(o.worker, sizeof o.worker, k->ctx->worker_id ? k->ctx->worker_id : "");
    o.update_id = m->version_update;
    o.pid = (uint32_t)getpid();
    o.sig = k->sig;
    o.sig_bytes = (uint32_t)strlen(k->sig);
    o.places = k->places;
    wb_reset(k);
    ipc_k_offer_encode(&k->wb, &o, k->fps);
    return send_frame(k, fd, IPC_K_OFFER, NULL, 0, dl);
}

/* After the offer: the restorer's K_DONE, and K_CONFIRM when it copied. */
int keeper_confirm(refit_ipc_keeper *k, int fd, double dl, char *why, size_t n)
{
    ipc_frame f;
    int rc = ipc_recv(fd, &f, IPC_MAX_MSG + 64, dl, k->err, sizeof k->err);
    ipc_status_msg s;
    if (!rc) {
        rc = f.type == IPC_K_DONE ? ipc_status_decode(&s, &f, 0, k->err, sizeof k->err)
                                  : REFIT_ECORRUPT;
        if (f.type != IPC_K_DONE)
            snprintf(k->err, sizeof k->err, "a %s frame where K_DONE was expected",
                     ipc_type_name(f.type));
        ipc_frame_free(&f);
    }
    if (rc) {
        snprintf(why, n, "%s", k->err);
        return rc;
    }
    if (s.status) {
        snprintf(why, n, "%s", s.msg);
        return s.status;
    }
    wb_reset(k);
    ipc_status_encode(&k->wb, 0, REFIT_OK, "");
    rc = send_frame(k, fd, IPC_K_CONFIRM, NULL, 0, dl);
    if (rc)
        snprintf(why, n, "%s", k->err);
    return rc;
}

/* The peer's uid, then its HELLO as a restorer, then ours. */
int keeper_greet(refit_ipc_keeper *k, int fd, uint32_t *uid, int32_t *pid)
{
    int rc = ipc_peer_cred(fd, uid, pid, k->err, sizeof k->err);
    if (!rc && !ipc_uid_allowed(*uid, k->allow, k->o.n_allow_uids)) {
        snprintf(k->err, sizeof k->err, "not this keeper's uid %u nor in its allow_uids",
                 (unsigned)geteuid());
        rc = REFIT_EIO;
    }
    double greet = k->o.greet_timeout_s > 0 ? k->o.greet_timeout_s : 1.0;
    ipc_frame f;
    if (!rc && !(rc = ipc_recv(fd, &f, 64, ipc_now() + greet, k->err, sizeof k->err))) {
        ipc_hello peer;
        rc = ipc_hello_decode(&peer, &f, IPC_ROLE_RESTORER, k->err, sizeof k->err);
        ipc_frame_free(&f);
    }
    if (!rc) {
        ipc_hello me = {IPC_ROLE_KEEPER, (uint32_t)getpid(), k->ctx->rank, 0};
        wb_reset(k);
        ipc_hello_encode(&k->wb, &me);
        rc = send_frame(k, fd, IPC_HELLO, NULL, 0, ipc_now() + wait_of(k));
    }
    return rc;
}

int keeper_accept(refit_ipc_keeper *k, double dl, int *fd)
{
    return ipc_accept(k->lfd, dl, fd, k->err, sizeof k->err);
}

/* One restore, start to end, on a connection accepted now. */
static void serve_one(refit_ipc_keeper *k)
{
    int fd = -1;
    if (keeper_accept(k, ipc_now() + 0.1, &fd))
        return; /* the peer left before accept */
    uint32_t uid = 0;
    int32_t pid = 0;
    int rc = keeper_greet(k, fd, &uid, &pid);
    if (rc) {
        k->st.peers_refused++;
        xport_journal(k->ctx, 0, "ipc-peer", "keeper %.300s: dropped a peer, uid %u, pid %d: "
                      "%.600s", k->path, uid, (int)pid, k->err);
        close(fd);
        return;
    }
    double dl = ipc_now() + wait_of(k);
    const char *label = k->m->version ? k->m->version->label : "none";
    char why[IPC_MAX_MSG + 1] = "";
    rc = keeper_offer(k, fd, dl);
    if (rc)
        snprintf(why, sizeof why, "%s", rc == REFIT_ESTATE ? why_not(k) : k->err);
    else
        rc = keeper_confirm(k, fd, dl + wait_of(k), why, sizeof why);
    close(fd);
    if (rc) {
        k->st.restores_refused++;
        xport_journal(k->ctx, 0, "keeper", "keeper %.300s: a restore by pid %d not served "
                      "(%s): %.600s", k->path, (int)pid, refit_status_name(rc), why);
        return;
    }
    k->st.restores_served++;
    xport_journal(k->ctx, k->m->version_update, "keeper", "keeper %.300s: served version "
                  "%.256s to pid %d (uid %u)", k->path, label, (int)pid, uid);
}

/* ---- following ---- */

static void follow_one(refit_ipc_keeper *k)
{
    double greet = k->o.greet_timeout_s > 0 ? k->o.greet_timeout_s : 1.0;
    if (ipc_receiver_ready(k->follow, ipc_now() + greet) != 1)
        return;
    refit_group_result res;
    /* partial: never stricter than the workers (a subset the group takes
     * commits here too; the keeper then serves nothing until a full one) */
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.partial = 1;
    int rc = refit_ipc_receive_update(k->follow, &uo, &res);
    if (!rc) {
        k->st.updates_committed++;
        k->in_doubt = false;
        return;
    }
    k->st.updates_aborted++;
    if (!res.vote_taken && !res.local_status) {
        /* voted prepared, heard no decision: the workers may have committed */
        k->in_doubt = true;
        snprintf(k->doubt, sizeof k->doubt, "update %.64s: voted prepared, then no decision "
                 "from the trainer (the group may hold it; this keeper rolled it back); "
                 "serving again after the next committed update", res.version_label);
    }
}

int refit_ipc_keeper_run(refit_ipc_keeper *k, double seconds)
{
    if (!k)
        return REFIT_EINVAL;
    double end = seconds < 0 ? 0 : ipc_now() + seconds;
    for (;;) {
        double left = seconds < 0 ? 1.0 : end - ipc_now();
        if (left <= 0)
            return REFIT_OK;
        struct pollfd p[2] = {{.fd = k->lfd, .events = POLLIN},
                              {.fd = k->follow ? ipc_receiver_wait_fd(k->follow) : -1,
                               .events = POLLIN}};
        int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
        int n = poll(p, 2, ms);
        if (n < 0 && errno != EINTR) {
            snprintf(k->err, sizeof k->err, "poll: %s", strerror(errno));
            return k_err(k, REFIT_EIO);
        }
        if (n <= 0)
            continue;
        if (p[1].revents)
            follow_one(k); /* the trainer's group waits on this vote */
        if (p[0].revents)
            serve_one(k);
    }
}

int refit_ipc_keeper_stats_get(refit_ipc_keeper *k, refit_ipc_keeper_stats *out)
{
    if (!k || !out)
        return REFIT_EINVAL;
    *out = k->st;
    const char *why = why_not(k);
    out->servable = !why;
    ipc_copy_str(out->why_not, sizeof out->why_not, why ? why : "");
    return REFIT_OK;
}
