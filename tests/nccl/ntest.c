#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <cmocka.h>

#include "ntest.h"
#include "transports/nccl/xport.h"
#include <refit/sys/stats.h>
#include <refit/sys/transport.h>

const nt_spec NT_SPECS[NT_N] = {
    {"embed", "weight", "model.embed_tokens.weight", REFIT_F32, 2, {10, 8}, 0},
    {"layers.0.attn", "q", "model.layers.0.self_attn.q_proj.weight", REFIT_F32, 2, {8, 8}, 0},
    {"layers.0.attn", "o", "model.layers.0.self_attn.o_proj.weight", REFIT_F32, 2, {8, 8}, 1},
    {"layers.0.mlp", "weight", "model.layers.0.mlp.up_proj.weight", REFIT_BF16, 2, {16, 8}, 0},
    {"layers.0.norm", "weight", "model.layers.0.input_layernorm.weight", REFIT_BF16, 1, {8, 0},
     -1},
    {"big", "weight", "model.big.weight", REFIT_F32, 2, {64, 32}, 1},
    {"big2", "weight", "model.big2.weight", REFIT_F16, 2, {100, 24}, 0},
};

static size_t numel(const int64_t *shape, int ndim)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    return n;
}

static int add_tensor(nt_worker *w, int i)
{
    const nt_spec *s = &NT_SPECS[i];
    memcpy(w->shape[i], s->shape, sizeof w->shape[i]);
    if (s->shard_dim >= 0)
        w->shape[i][s->shard_dim] /= w->tp;
    w->bytes[i] = numel(w->shape[i], s->ndim) * s->dt.bits / 8;
    if (!(w->buf[i] = calloc(1, w->bytes[i])))
        return REFIT_ENOMEM;
    w->rt[i] = (refit_tensor){.data = w->buf[i], .device = {REFIT_DEVICE_CPU, 0},
                              .ndim = s->ndim, .dtype = s->dt, .shape = w->shape[i]};
    bool first = i == 0 || strcmp(NT_SPECS[i - 1].module, s->module);
    int rc = first ? refit_model_add_module(w->m, s->module, "unquantized", NULL) : REFIT_OK;
    if (!rc)
        rc = refit_module_bind_runtime(w->m, s->module, s->target, &w->rt[i]);
    refit_ckpt_spec sp = REFIT_CKPT_SPEC_INIT;
    sp.dtype = s->dt;
    sp.ndim = s->ndim;
    memcpy(sp.shape, s->shape, sizeof s->shape);
    sp.target = s->target;
    if (s->shard_dim >= 0 && w->tp > 1) {
        sp.shard_dim = s->shard_dim;
        sp.shard_rank = w->rank;
        sp.shard_count = w->tp;
    }
    return rc ? rc : refit_model_expect(w->m, s->module, s->ckpt, &sp);
}

int nt_worker_open(nt_worker *w, int tp_rank, int tp, const char *journal)
{
    memset(w, 0, sizeof *w);
    w->rank = tp_rank;
    w->tp = tp;
    char id[32];
    snprintf(id, sizeof id, "worker%d", tp_rank);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = id;
    o.rank = tp_rank;
    o.journal_path = journal ? journal : "";
    int rc = refit_open(&w->ctx, &o);
    if (!rc)
        rc = refit_model_create(&w->m, w->ctx);
    for (int i = 0; i < NT_N && !rc; i++)
        rc = add_tensor(w, i);
    if (!rc)
        rc = refit_model_seal(w->m);
    /* seal reserves undo memory on a thread of its own; the tests fork
     * trainers next, and a child forked while that thread is inside the
     * allocator may find the allocator's lock held forever (ASan's): wait
     * for the reservation first */
    uint64_t dev_b, host_b;
    return rc ? rc : refit_sys_undo_held(w->m, 1, &dev_b, &host_b);
}

void nt_worker_close(nt_worker *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < NT_N; i++)
        free(w->buf[i]);
    memset(w, 0, sizeof *w);
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void nt_ckpt_make(nt_ckpt *c, uint64_t version)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NT_N; i++) {
        const nt_spec *s = &NT_SPECS[i];
        memcpy(c->shape[i], s->shape, sizeof c->shape[i]);
        size_t n = numel(s->shape, s->ndim), es = s->dt.bits / 8;
        uint8_t *b = malloc(n * es);
        for (size_t k = 0; b && k < n * es; k++)
            b[k] = (uint8_t)mix(version * 1000003u + (uint64_t)i * 7919u + k);
        c->buf[i] = b;
        c->t[i] = (refit_tensor){.data = b, .device = {REFIT_DEVICE_CPU, 0}, .ndim = s->ndim,
                                 .dtype = s->dt, .shape = c->shape[i]};
    }
}

void nt_ckpt_free(nt_ckpt *c)
{
    for (int i = 0; i < NT_N; i++)
        free(c->buf[i]);
    memset(c, 0, sizeof *c);
}

uint64_t nt_fp(nt_worker *w)
{
    uint64_t fp = 0;
    return refit_model_fingerprint(w->m, &fp) ? 0 : fp;
}

uint64_t nt_cold_fp(int tp_rank, int tp, uint64_t version)
{
    nt_worker w;
    nt_ckpt c;
    nt_ckpt_make(&c, version);
    uint64_t fp = 0;
    refit_txn *t = NULL;
    int rc = nt_worker_open(&w, tp_rank, tp, NULL);
    if (!rc)
        rc = refit_begin(&t, w.m, NULL);
    for (int i = 0; i < NT_N && !rc; i++)
        rc = refit_load(t, NT_SPECS[i].ckpt, &c.t[i], NULL);
    if (t && rc)
        refit_abort(t);
    else if (t)
        rc = refit_finalize(t);
    if (!rc)
        fp = nt_fp(&w);
    nt_worker_close(&w);
    nt_ckpt_free(&c);
    return fp;
}

/* ---- threads ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A sender with options o and the job's tensors, added in order. */
static int sender_make(nt_job *j, const refit_send_opts *o, const int *order, refit_sender **s)
{
    int rc = refit_sender_create(s, j->x, o);
    if (!rc && j->extra)
        rc = refit_sender_add(*s, j->extra_name, j->extra);
    for (int i = 0; i < NT_N && !rc && !j->no_tensors; i++)
        rc = refit_sender_add(*s, NT_SPECS[order[i]].ckpt, &j->c->t[order[i]]);
    return rc;
}

static void *sender_main(void *arg)
{
    nt_job *j = arg;
    refit_send_opts o = REFIT_SEND_OPTS_INIT;
    o.version_label = j->label;
    o.bucket_bytes = j->bucket_bytes;
    o.checksum_payload = j->checksum;
    o.timeout_s = j->timeout;
    if (j->direct_min)
        o.direct_min_bytes = j->direct_min < 0 ? 0 : (uint64_t)j->direct_min;
    refit_sender *s = NULL;
    double t0 = now_s();
    int order[NT_N];
    for (int i = 0; i < NT_N; i++)
        order[i] = i;
    for (uint64_t z = j->order_seed, i = NT_N - 1; z && i > 0; i--) {
        z = mix(z);
        uint64_t k = z % (i + 1);
        int tmp = order[i];
        order[i] = order[k];
        order[k] = tmp;
    }
    j->rc = sender_make(j, &o, order, &s);
    if (!j->rc)
        j->rc = refit_sender_send(s, &j->res);
    if (!j->rc && j->again_label && j->again_bucket_bytes) {
        refit_sender_destroy(s);
        s = NULL;
        o.version_label = j->again_label;
        o.bucket_bytes = j->again_bucket_bytes;
        if (!(j->rc = sender_make(j, &o, order, &s)))
            j->rc = refit_sender_send(s, &j->res);
    } else if (!j->rc && j->again_label && !(j->rc = refit_sender_set_label(s, j->again_label))) {
        j->rc = refit_sender_send(s, &j->res);
    }
    j->seconds = now_s() - t0;
    snprintf(j->msg, sizeof j->msg, "%s", refit_errmsg(j->x->ctx));
    j->direct_bytes = sender_direct_bytes(s);
    refit_sender_destroy(s);
    return NULL;
}

/* begin + refit_receive, then the engine moves a tensor (or the rank stops
 * answering) before the vote. */
static int receive_low_level(nt_job *j, refit_receiver *r, const refit_update_opts *u)
{
    refit_txn *t = NULL;
    int rc = refit_begin(&t, j->w->m, u);
    if (rc)
        return rc;
    int lrc = refit_receive(r, t, NULL, NULL);
    if (j->skip_vote) {
        refit_abort(t);
        return lrc ? lrc : REFIT_EIO;
    }
    void *keep = j->w->rt[0].data, *moved = malloc(j->w->bytes[0]);
    j->w->rt[0].data = moved;
    rc = refit_group_finalize(j->x, t, lrc, &j->res);
    j->w->rt[0].data = keep;
    free(moved);
    return rc;
}

static void *receiver_main(void *arg)
{
    nt_job *j = arg;
    refit_recv_opts o = REFIT_RECV_OPTS_INIT;
    o.timeout_s = j->timeout;
    o.filter = j->filter;
    o.filter_user = j->filter_user;
    refit_receiver *r = NULL;
    refit_update_opts u = REFIT_UPDATE_OPTS_INIT;
    u.rollback = j->rollback;
    u.partial = j->partial;
    double t0 = now_s();
    j->rc = refit_receiver_create(&r, j->w->m, j->x, &o);
    if (!j->rc && (j->move_before_vote || j->skip_vote))
        j->rc = receive_low_level(j, r, &u);
    else if (!j->rc)
        j->rc = refit_receive_update(r, &u, &j->res);
    if (!j->rc && j->again_label)
        j->rc = refit_receive_update(r, &u, &j->res);
    j->seconds = now_s() - t0;
    snprintf(j->msg, sizeof j->msg, "%s", refit_errmsg(j->w->ctx));
    j->direct_bytes = refit_sys_receiver_direct_bytes(r);
    refit_receiver_destroy(r);
    return NULL;
}

void nt_run(nt_job *jobs, int n, uint64_t kill_after)
{
    refit_loopback *g = NULL;
    refit_ctx *sctx = NULL;
    refit_options so = REFIT_OPTIONS_INIT;
    so.worker_id = "trainer";
    so.journal_path = "";
    if (refit_loopback_create(&g, n) || refit_open(&sctx, &so)) {
        refit_loopback_destroy(g);
        for (int i = 0; i < n; i++)
            jobs[i].rc = REFIT_ENOMEM;
        return;
    }
    for (int i = 0; i < n; i++) {
        refit_ctx *ctx = i == 0 ? sctx : jobs[i].w->ctx;
        double to = jobs[i].timeout > 0 ? jobs[i].timeout : 5;
        jobs[i].rc = refit_transport_loopback(&jobs[i].x, ctx, g, i, to);
        if (!jobs[i].rc && jobs[i].stuck_abort)
            jobs[i].x->writes_outside = false;
    }
    if (kill_after != UINT64_MAX)
        xport_loopback_kill_after(g, 0, kill_after);
    if (jobs[0].fail_fingerprint)
        xport_loopback_fail_fingerprint(g, 0, jobs[0].fail_fingerprint);
    if (jobs[0].corrupt_mask)
        xport_loopback_corrupt(g, 0, jobs[0].corrupt_seq, jobs[0].corrupt_at,
                               jobs[0].corrupt_mask);
    pthread_t th[NT_MAX_RANKS];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, i == 0 ? sender_main : receiver_main, &jobs[i]);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++) {
        refit_transport_close(jobs[i].x);
        jobs[i].x = NULL;
    }
    refit_loopback_destroy(g);
    refit_close(sctx);
}

void nt_tmpdir(char *out, size_t n)
{
    const char *root = getenv("REFIT_BUILD_ROOT");
    snprintf(out, n, "%s/nccl-test-XXXXXX", root ? root : ".");
    if (!mkdtemp(out))
        out[0] = '\0';
}

void nt_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

void nt_assert_all_ok(const nt_job *jobs, int n)
{
    for (int i = 0; i < n; i++) {
        if (jobs[i].rc)
            fail_msg("rank %d: %s: %s", i, refit_status_name(jobs[i].rc), jobs[i].msg);
        assert_int_equal(jobs[i].res.decision, REFIT_OK);
        assert_int_equal(jobs[i].res.vote_taken, 1);
    }
}

void nt_fixture_end(nt_worker *w, int n, nt_ckpt c[3], const char *dir)
{
    for (int r = 0; r < n; r++)
        nt_worker_close(&w[r]);
    for (int v = 1; v <= 2; v++)
        nt_ckpt_free(&c[v]);
    nt_rmdir(dir);
}
