/* The keeper (issue 30 item 3, docs/restart.md "The keeper") on the host:
 * a forked keeper process holds its model in a memfd pool, follows a
 * forked trainer's refit.ipc sends as one more worker, and serves
 * restores to workers of this process. Checked: a restore is bit-equal
 * to the keeper's state and commits at its version with no post-load;
 * several workers restore from one keeper; an update after a restore
 * equals a cold start; another plan signature is refused with nothing
 * written; a keeper killed mid-restore rolls the worker back; a version
 * the group aborted, or one whose decision the keeper never heard, is
 * never served. */
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sqlite3.h>

#include <refit/ipc.h>
#include <refit/sys/stats.h>

#include "transports/ipc/keeper.h"
#include "journal/journal.h"
#include "tests/ipc/itest.h"

static char g_serve[108], g_follow[108], g_worker[108];

static int fresh_paths(void **state)
{
    static int n;
    (void)state;
    n++;
    snprintf(g_serve, sizeof g_serve, "/tmp/refit-keeper-%d-%d-s.sock", (int)getpid(), n);
    snprintf(g_follow, sizeof g_follow, "/tmp/refit-keeper-%d-%d-f.sock", (int)getpid(), n);
    snprintf(g_worker, sizeof g_worker, "/tmp/refit-keeper-%d-%d-w.sock", (int)getpid(), n);
    return 0;
}

/* Whether the journal's reader calls the update of label "v<v>" a restore. */
typedef struct mode_seen {
    const char *version;
    int restore;
} mode_seen;

static int on_update(void *user, const journal_update_row *row)
{
    mode_seen *m = user;
    if (row->version && !strcmp(row->version, m->version))
        m->restore = row->mode && !strcmp(row->mode, "restore");
    return 0;
}

static int journal_mode_of(const char *path, uint64_t v)
{
    char label[32], err[256];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)v);
    journal_opts jo = JOURNAL_OPTS_INIT;
    jo.readonly = 1;
    journal *j = NULL;
    if (journal_open(&j, path, &jo, err, sizeof err))
        fail_msg("journal %s: %s", path, err);
    mode_seen m = {label, -1};
    assert_int_equal(journal_updates_list(j, on_update, &m), REFIT_OK);
    journal_close(j);
    return m.restore;
}

/* ---- the keeper process: the workers' model, its tensors in a pool ---- */

typedef struct keeper_proc {
    refit_ctx *ctx;
    refit_model *m;
    refit_ipc_pool *pool;
    refit_ipc_keeper *k;
    refit_tensor rt[NT_N];
    int64_t shape[NT_N][2];
} keeper_proc;

/* The model nt_worker_open(rank 0 of 1) registers, bound in the pool. */
static int kp_open(keeper_proc *p, const char *follow, const char *journal, uint32_t mode)
{
    memset(p, 0, sizeof *p);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "keeper";
    o.journal_path = journal ? journal : "";
    int rc = refit_open(&p->ctx, &o);
    if (!rc)
        rc = refit_model_create(&p->m, p->ctx);
    if (!rc)
        rc = refit_ipc_pool_create(&p->pool, p->ctx, -1, 1 << 20);
    for (int i = 0; i < NT_N && !rc; i++) {
        const nt_spec *s = &NT_SPECS[i];
        memcpy(p->shape[i], s->shape, sizeof p->shape[i]);
        uint64_t n = (uint64_t)s->shape[0] * (s->ndim > 1 ? (uint64_t)s->shape[1] : 1);
        void *buf = NULL;
        rc = refit_ipc_pool_alloc(p->pool, n * s->dt.bits / 8, &buf);
        p->rt[i] = (refit_tensor){.data = buf, .device = {REFIT_DEVICE_CPU, 0}, .ndim = s->ndim,
                                  .dtype = s->dt, .shape = p->shape[i]};
        int first = i == 0 || strcmp(NT_SPECS[i - 1].module, s->module);
        if (!rc && first)
            rc = refit_model_add_module(p->m, s->module, "unquantized", NULL);
        if (!rc)
            rc = refit_module_bind_runtime(p->m, s->module, s->target, &p->rt[i]);
        refit_ckpt_spec sp = REFIT_CKPT_SPEC_INIT;
        sp.dtype = s->dt;
        sp.ndim = s->ndim;
        memcpy(sp.shape, s->shape, sizeof s->shape);
        sp.target = s->target;
        if (!rc)
            rc = refit_model_expect(p->m, s->module, s->ckpt, &sp);
    }
    if (!rc)
        rc = refit_model_seal(p->m);
    refit_ipc_keeper_opts ko = REFIT_IPC_KEEPER_OPTS_INIT;
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.timeout_s = 20;
    ko.follow_path = follow;
    ko.follow = &ro;
    ko.timeout_s = 20;
    ko.socket_mode = mode;
    if (!rc)
        rc = refit_ipc_keeper_create(&p->k, p->m, p->pool, g_serve, &ko);
    if (rc)
        fprintf(stderr, "keeper: %s\n", refit_errmsg(p->ctx));
    return rc;
}

static int load_version(refit_model *m, uint64_t v)
{
    nt_ckpt c;
    nt_ckpt_make(&c, v);
    char label[32];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)v);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    refit_txn *t = NULL;
    int rc = refit_begin(&t, m, &o);
    for (int i = 0; i < NT_N && !rc; i++)
        rc = refit_load(t, NT_SPECS[i].ckpt, &c.t[i], NULL);
    if (t)
        rc = rc ? refit_abort(t) : refit_finalize(t);
    nt_ckpt_free(&c);
    return rc;
}

typedef struct keeper_job {
    int follow;                 /* follow the trainer at g_follow */
    uint64_t seed;              /* load this version first (0: none) */
    int die_after_offer;        /* serve one restore as far as its offer, then SIGKILL */
    const char *journal;        /* the keeper's (NULL: none) */
    uint32_t socket_mode;       /* 0: 0600 */
    const char *scribbled;      /* after one restore served, change a byte of its
                                   memory behind refit's back, then create this file */
} keeper_job;

static int run_keeper(void *arg)
{
    const keeper_job *j = arg;
    keeper_proc p;
    if (kp_open(&p, j->follow ? g_follow : NULL, j->journal, j->socket_mode))
        return 10;
    if (j->seed && load_version(p.m, j->seed))
        return 11;
    if (j->die_after_offer) {
        int fd = -1;
        uint32_t uid;
        int32_t pid;
        if (keeper_accept(p.k, ipc_now() + 20, &fd) || keeper_greet(p.k, fd, &uid, &pid) ||
            keeper_offer(p.k, fd, ipc_now() + 20))
            return 12;
        raise(SIGKILL); /* the worker has the offer, not the confirmation */
    }
    refit_ipc_keeper_stats st = {0};
    while (j->scribbled && !st.restores_served) {
        if (refit_ipc_keeper_run(p.k, 0.05) || refit_ipc_keeper_stats_get(p.k, &st))
            return 14;
    }
    if (j->scribbled) {
        ((uint8_t *)p.rt[3].data)[1] ^= 0x40; /* a stray write into shared memory */
        FILE *f = fopen(j->scribbled, "w");
        if (!f || fclose(f))
            return 15;
    }
    int rc = refit_ipc_keeper_run(p.k, 60);
    refit_ipc_keeper_destroy(p.k);
    refit_close(p.ctx);
    refit_ipc_pool_destroy(p.pool);
    return rc ? 13 : 0;
}

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    it_wait(pid);
    unlink(g_serve); /* a killed keeper leaves its socket files */
    unlink(g_follow);
}

static int sql_count(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *s = NULL;
    int n = -1;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

/* ---- a trainer process: the real sender ---- */

typedef struct send_step {
    int n_paths;
    const char *paths[2];
    uint64_t version;
    int expect;                 /* what the send returns; 1: any failure */
    int subset;                 /* send only the first 3 tensors (a partial update) */
    const char *expect_msg;     /* in the sender's message when it fails (NULL: any) */
} send_step;

typedef struct trainer_job {
    const send_step *steps;
    int n_steps;
    int raw_die_version;        /* then a raw trainer's UPDATE of this version to the
                                   keeper, which dies once the keeper voted (0: none) */
} trainer_job;

static int send_one(const send_step *st)
{
    refit_ctx *ctx = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    if (refit_open(&ctx, &o))
        return 20;
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.bucket_bytes = 2048;
    so.timeout_s = 20;
    refit_ipc_sender *s = NULL;
    nt_ckpt c;
    nt_ckpt_make(&c, st->version);
    int rc = refit_ipc_sender_create(&s, ctx, st->paths, st->n_paths, &so) ? 21 : 0;
    for (int i = 0; i < (st->subset ? 3 : NT_N) && !rc; i++)
        rc = refit_ipc_sender_add(s, NT_SPECS[i].ckpt, &c.t[i], REFIT_IPC_PACK) ? 22 : 0;
    char label[32];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)st->version);
    if (!rc)
        refit_ipc_sender_set_label(s, label);
    int got = rc ? 0 : refit_ipc_sender_send(s, NULL);
    if (!rc && got && st->expect_msg && !strstr(refit_errmsg(ctx), st->expect_msg)) {
        fprintf(stderr, "trainer: %s: '%s' lacks '%s'\n", label, refit_errmsg(ctx),
                st->expect_msg);
        rc = 24;
    }
    if (!rc && (st->expect == 1 ? got == REFIT_OK : got != st->expect)) {
        fprintf(stderr, "trainer: %s: %d, %d expected (%s)\n", label, got, st->expect,
                refit_errmsg(ctx));
        rc = 23;
    }
    refit_ipc_sender_destroy(s);
    nt_ckpt_free(&c);
    refit_close(ctx);
    return rc;
}

static int run_trainer(void *arg)
{
    const trainer_job *j = arg;
    for (int i = 0; i < j->n_steps; i++) {
        int rc = send_one(&j->steps[i]);
        if (rc)
            return rc;
    }
    if (j->raw_die_version) {
        rt t;
        if (rt_open(&t, g_follow, (uint64_t)j->raw_die_version, 2048) || rt_send_mems(&t) ||
            rt_send_update(&t, NULL, NULL))
            return 30;
        ipc_frame f;
        if (ipc_recv(t.fd, &f, 4096, ipc_now() + 20, t.err, sizeof t.err) ||
            f.type != IPC_VOTE)
            return 31;
        ipc_frame_free(&f);
        rt_close(&t); /* dies with the keeper's vote in hand, deciding nothing */
    }
    return 0;
}

/* ---- workers of this process ---- */

static void expect_at(nt_worker *w, uint64_t v)
{
    char label[32];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)v);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), label);
    assert_true(nt_fp(w) == nt_cold_fp(0, 1, v));
}

static int restore(nt_worker *w, int rollback)
{
    refit_ipc_restore_opts o = REFIT_IPC_RESTORE_OPTS_INIT;
    o.rollback = rollback;
    o.timeout_s = 20;
    return refit_ipc_restore(w->m, g_serve, &o);
}

/* The value of the series of name in w's metrics text whose labels end
 * with tail ("" for a counter without labels of its own). */
static double metric(const nt_worker *w, const char *name, const char *tail)
{
    char *text = NULL, key[160];
    assert_int_equal(refit_metrics_text(w->ctx, &text, NULL), REFIT_OK);
    snprintf(key, sizeof key, "\n%s{", name);
    double v = -1;
    for (const char *at = strstr(text, key); at && v < 0; at = strstr(at + 1, key)) {
        const char *end = strstr(at, "} ");
        size_t n = strlen(tail);
        if (end && (size_t)(end - at) >= n && !strncmp(end - n, tail, n))
            v = strtod(end + 2, NULL);
    }
    refit_metrics_free(text);
    return v;
}

static int all_zero(const nt_worker *w)
{
    for (int i = 0; i < NT_N; i++)
        for (size_t k = 0; k < w->bytes[i]; k++)
            if (((const uint8_t *)w->buf[i])[k])
                return 0;
    return 1;
}

/* The keeper follows v1 and v2 with worker A; workers B and C, fresh,
 * restore v2 from it bit-equal; B then takes v3 and equals a cold start. */
static void t_restore_follows_and_serves(void **state)
{
    (void)state;
    char dir[256], journal[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/b.db", dir);
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker a, b, c;
    assert_int_equal(nt_worker_open(&a, 0, 1, NULL), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.timeout_s = ro.start_timeout_s = 20;
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, a.m, g_worker, &ro), REFIT_OK);
    send_step steps[2] = {{2, {g_worker, g_follow}, 1, REFIT_OK, 0, NULL},
                          {2, {g_worker, g_follow}, 2, REFIT_OK, 0, NULL}};
    trainer_job tj = {steps, 2, 0};
    pid_t trainer = it_fork(run_trainer, &tj);
    for (int v = 1; v <= 2; v++) {
        if (refit_ipc_receive_update(r, NULL, NULL))
            fail_msg("worker A, v%d: %s", v, refit_errmsg(a.ctx));
        expect_at(&a, (uint64_t)v);
    }
    assert_int_equal(it_wait(trainer), 0);

    assert_int_equal(nt_worker_open(&b, 0, 1, journal), REFIT_OK);
    assert_int_equal(nt_worker_open(&c, 0, 1, NULL), REFIT_OK);
    int rc = restore(&b, 1);
    if (rc)
        fail_msg("restore B: %s", refit_errmsg(b.ctx));
    expect_at(&b, 2);
    for (int i = 0; i < NT_N; i++)
        assert_memory_equal(b.buf[i], a.buf[i], a.bytes[i]);
    /* journaled as a restore whose source names the keeper */
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE state = 'committed' AND "
             "version = 'v2' AND source_uri = 'keeper://%s'", g_serve);
    assert_int_equal(sql_count(journal, sql), 1);
    assert_int_equal(sql_count(journal, "SELECT count(*) FROM events WHERE kind = 'restore' "
                                        "AND message LIKE '%from keeper%'"), 1);
    assert_int_equal(journal_mode_of(journal, 2), 1); /* read as a restore */
    /* counted as a restore, its bytes under source "keeper" */
    assert_true(metric(&b, "refit_restores_started_total", "") == 1);
    assert_true(metric(&b, "refit_restores_committed_total", "") == 1);
    double restored = 0;
    for (int i = 0; i < NT_N; i++)
        restored += (double)b.bytes[i];
    assert_true(metric(&b, "refit_source_bytes_total", ",source=\"keeper\"") == restored);
    assert_true(metric(&b, "refit_source_bytes_total", ",source=\"memory\"") == 0);
    if ((rc = restore(&c, 0)))
        fail_msg("restore C: %s", refit_errmsg(c.ctx));
    expect_at(&c, 2); /* one keeper, several workers of its signature */

    /* an update after the restore is any update: a cold start's bytes */
    assert_int_equal(load_version(b.m, 3), REFIT_OK);
    expect_at(&b, 3);
    stop(keeper);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&a);
    nt_worker_close(&b);
    nt_worker_close(&c);
    nt_rmdir(dir);
}

/* Another TP rank: the signature differs at "rank"; nothing written, the
 * worker stays EMPTY (the engine loads its checkpoint instead). */
static void t_signature_differs_refused(void **state)
{
    (void)state;
    keeper_job kj = {.seed = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 1, 2, NULL), REFIT_OK);
    assert_int_equal(restore(&w, 1), REFIT_EMISMATCH);
    const char *msg = refit_errmsg(w.ctx);
    assert_non_null(strstr(msg, "plan signature differs at rank: keeper 0, this worker 1"));
    assert_non_null(strstr(msg, "nothing written"));
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);
    assert_true(all_zero(&w));
    nt_worker_close(&w);
    /* the keeper goes on serving a worker of its signature */
    nt_worker ok;
    assert_int_equal(nt_worker_open(&ok, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&ok, 1), REFIT_OK);
    expect_at(&ok, 1);
    nt_worker_close(&ok);
    stop(keeper);
}

/* The keeper dies after its offer, before confirming: the worker copied
 * and checked every byte, and still rolls back to what it held. */
static void t_keeper_killed_mid_restore(void **state)
{
    (void)state;
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    assert_int_equal(load_version(w.m, 1), REFIT_OK);
    keeper_job kj = {.seed = 2, .die_after_offer = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    int rc = restore(&w, 1);
    assert_int_equal(it_wait(keeper), 128 + SIGKILL);
    assert_true(rc != REFIT_OK);
    const char *msg = refit_errmsg(w.ctx);
    assert_non_null(strstr(msg, "did not confirm"));
    assert_non_null(strstr(msg, "rolled back"));
    expect_at(&w, 1);
    nt_worker_close(&w);

    /* without rollback the worker says it cannot serve */
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    assert_int_equal(load_version(w.m, 1), REFIT_OK);
    keeper = it_fork(run_keeper, &kj);
    assert_true(restore(&w, 0) != REFIT_OK);
    assert_int_equal(it_wait(keeper), 128 + SIGKILL);
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_POISONED);
    nt_worker_close(&w);
}

/* Nothing committed yet: refused. v1 commits on the keeper alone; v2 is
 * refused by worker D (its bucket limit), so the group aborts and the
 * keeper serves v1, never v2; a raw trainer that dies after the keeper's
 * vote on v3 leaves it in doubt: refused; v4 committed: served again. */
static void t_uncommitted_never_served(void **state)
{
    (void)state;
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w, d;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&w, 1), REFIT_ESTATE);
    assert_non_null(strstr(refit_errmsg(w.ctx), "no committed version yet"));
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);

    assert_int_equal(nt_worker_open(&d, 0, 1, NULL), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.timeout_s = ro.start_timeout_s = 20;
    ro.max_bucket_bytes = 64; /* D refuses every index: it votes no */
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, d.m, g_worker, &ro), REFIT_OK);
    send_step steps[2] = {{1, {g_follow}, 1, REFIT_OK, 0, NULL},
                          {2, {g_worker, g_follow}, 2, 1, 0, NULL}};
    trainer_job tj = {steps, 2, 3};
    pid_t trainer = it_fork(run_trainer, &tj);
    assert_true(refit_ipc_receive_update(r, NULL, NULL) != REFIT_OK); /* D refuses v2 */
    assert_int_equal(it_wait(trainer), 0);
    assert_int_equal(refit_worker_health(d.ctx), REFIT_HEALTH_EMPTY);

    /* v3's decision never came: the keeper serves nothing */
    int rc = restore(&w, 1);
    assert_int_equal(rc, REFIT_ESTATE);
    assert_non_null(strstr(refit_errmsg(w.ctx), "no decision"));
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);
    assert_true(all_zero(&w));

    send_step ok[1] = {{1, {g_follow}, 4, REFIT_OK, 0, NULL}};
    trainer_job tj4 = {ok, 1, 0};
    trainer = it_fork(run_trainer, &tj4);
    assert_int_equal(it_wait(trainer), 0);
    if ((rc = restore(&w, 1)))
        fail_msg("restore after v4: %s", refit_errmsg(w.ctx));
    expect_at(&w, 4);
    stop(keeper);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
    nt_worker_close(&d);
}

/* Between v1 (committed) and v3 (in doubt), v2 was aborted by the group:
 * before the raw trainer ran, the keeper served v1. */
static void t_group_abort_serves_previous(void **state)
{
    (void)state;
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w, d;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    assert_int_equal(nt_worker_open(&d, 0, 1, NULL), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.timeout_s = ro.start_timeout_s = 20;
    ro.max_bucket_bytes = 64; /* D refuses every index: it votes no */
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, d.m, g_worker, &ro), REFIT_OK);
    send_step steps[2] = {{1, {g_follow}, 1, REFIT_OK, 0, NULL},
                          {2, {g_worker, g_follow}, 2, 1, 0, NULL}};
    trainer_job tj = {steps, 2, 0};
    pid_t trainer = it_fork(run_trainer, &tj);
    assert_true(refit_ipc_receive_update(r, NULL, NULL) != REFIT_OK);
    assert_non_null(strstr(refit_errmsg(d.ctx), "bucket"));
    assert_int_equal(it_wait(trainer), 0);
    int rc = restore(&w, 1);
    if (rc)
        fail_msg("restore: %s", refit_errmsg(w.ctx));
    expect_at(&w, 1); /* v1, not the aborted v2 */
    stop(keeper);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
    nt_worker_close(&d);
}

/* Bytes of the keeper's memory changed after it fingerprinted them: the
 * worker's check finds it, names the module and rolls back; without
 * verify the copies alone commit what the memory holds. */
static void t_verify_catches_changed_memory(void **state)
{
    (void)state;
    char dir[256], mark[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(mark, sizeof mark, "%s/scribbled", dir);
    keeper_job kj = {.seed = 1, .scribbled = mark};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker a, b;
    assert_int_equal(nt_worker_open(&a, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&a, 1), REFIT_OK);
    expect_at(&a, 1);
    for (int i = 0; i < 2000 && access(mark, F_OK); i++)
        usleep(10000);
    assert_int_equal(access(mark, F_OK), 0);
    assert_int_equal(nt_worker_open(&b, 0, 1, NULL), REFIT_OK);
    assert_int_equal(load_version(b.m, 2), REFIT_OK);
    assert_int_equal(restore(&b, 1), REFIT_ECORRUPT);
    const char *msg = refit_errmsg(b.ctx);
    assert_non_null(strstr(msg, "module layers.0.mlp"));
    assert_non_null(strstr(msg, "rolled back"));
    expect_at(&b, 2);
    refit_ipc_restore_opts o = REFIT_IPC_RESTORE_OPTS_INIT;
    o.timeout_s = 20;
    o.verify = 0;
    assert_int_equal(refit_ipc_restore(b.m, g_serve, &o), REFIT_OK);
    assert_string_equal(refit_worker_version(b.ctx), "v1");
    assert_memory_not_equal(b.buf[3], a.buf[3], a.bytes[3]);
    o.verify = 2;
    assert_int_equal(refit_ipc_restore(b.m, g_serve, &o), REFIT_EINVAL);
    stop(keeper);
    nt_worker_close(&a);
    nt_worker_close(&b);
    nt_rmdir(dir);
}

/* A subset of the modules (the group's delta) commits on the keeper too,
 * which then serves nothing until a full update commits. */
static void t_partial_update_not_served(void **state)
{
    (void)state;
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    send_step steps[2] = {{1, {g_follow}, 1, REFIT_OK, 0, NULL}, {1, {g_follow}, 2, REFIT_OK, 1, NULL}};
    trainer_job tj = {steps, 2, 0};
    assert_int_equal(it_wait(it_fork(run_trainer, &tj)), 0);
    assert_int_equal(restore(&w, 1), REFIT_ESTATE);
    assert_non_null(strstr(refit_errmsg(w.ctx), "partial update"));
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);
    send_step full[1] = {{1, {g_follow}, 3, REFIT_OK, 0, NULL}};
    trainer_job tj3 = {full, 1, 0};
    assert_int_equal(it_wait(it_fork(run_trainer, &tj3)), 0);
    assert_int_equal(restore(&w, 1), REFIT_OK);
    expect_at(&w, 3);
    stop(keeper);
    nt_worker_close(&w);
}

/* ---- the keeper as an undo source (core/undo_source.h) ---- */

/* v2 loaded whole with the keeper as the undo source, then aborted:
 * returns refit_abort's status. */
static int update_aborted(nt_worker *w, int undo_source, int *begin_rc)
{
    nt_ckpt c;
    nt_ckpt_make(&c, 2);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.undo_source = undo_source;
    refit_txn *t = NULL;
    int rc = *begin_rc = refit_begin(&t, w->m, &o);
    for (int i = 0; i < NT_N && !rc; i++)
        rc = refit_load(t, NT_SPECS[i].ckpt, &c.t[i], NULL);
    nt_ckpt_free(&c);
    return t ? refit_abort(t) : rc;
}

/* refit_ipc_keeper_undo_arm arms a keeper holding the worker's version
 * (a restore alone does not). An update served by it keeps no undo log
 * and its abort copies the written modules back from the keeper; a keeper
 * gone by then poisons the worker, named. */
static void t_keeper_undo_source(void **state)
{
    (void)state;
    char dir[256], journal[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/w.db", dir);
    keeper_job kj = {.seed = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w, x;
    int brc;
    assert_int_equal(nt_worker_open(&w, 0, 1, journal), REFIT_OK);
    assert_int_equal(restore(&w, 1), REFIT_OK);
    assert_int_equal(update_aborted(&w, REFIT_UNDO_KEEPER, &brc), REFIT_EUNSUPPORTED);
    assert_int_equal(brc, REFIT_EUNSUPPORTED); /* a restore arms nothing */
    assert_int_equal(refit_ipc_keeper_undo_arm(w.m, g_serve, NULL), REFIT_OK);
    int rc = update_aborted(&w, REFIT_UNDO_KEEPER, &brc);
    if (brc || rc)
        fail_msg("an abort served by the keeper: begin %d, abort %d: %s", brc, rc,
                 refit_errmsg(w.ctx));
    expect_at(&w, 1); /* every byte back from the keeper */
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE version = 'v2' AND "
             "undo_source = 'keeper keeper://%s'", g_serve);
    assert_int_equal(sql_count(journal, sql), 1);

    /* on a worker that loaded v1 itself, and served under auto */
    char journal_x[300];
    snprintf(journal_x, sizeof journal_x, "%s/x.db", dir);
    assert_int_equal(nt_worker_open(&x, 0, 1, journal_x), REFIT_OK);
    assert_int_equal(load_version(x.m, 1), REFIT_OK);
    assert_int_equal(refit_ipc_keeper_undo_arm(x.m, g_serve, NULL), REFIT_OK);
    assert_int_equal(update_aborted(&x, REFIT_UNDO_AUTO, &brc), REFIT_OK);
    expect_at(&x, 1);
    assert_int_equal(sql_count(journal_x, sql), 1);
    nt_worker_close(&x);

    /* a worker at another version: not armed */
    assert_int_equal(nt_worker_open(&x, 0, 1, NULL), REFIT_OK);
    assert_int_equal(load_version(x.m, 3), REFIT_OK);
    assert_int_equal(refit_ipc_keeper_undo_arm(x.m, g_serve, NULL), REFIT_EMISMATCH);
    assert_non_null(strstr(refit_errmsg(x.ctx), "holds version v1, this worker v3"));
    nt_worker_close(&x);

    /* the keeper gone between begin and abort: POISONED, the keeper named */
    assert_int_equal(nt_worker_open(&x, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&x, 1), REFIT_OK);
    assert_int_equal(refit_ipc_keeper_undo_arm(x.m, g_serve, NULL), REFIT_OK);
    nt_ckpt c;
    nt_ckpt_make(&c, 2);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.undo_source = REFIT_UNDO_KEEPER;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, x.m, &o), REFIT_OK);
    for (int i = 0; i < NT_N; i++)
        assert_int_equal(refit_load(t, NT_SPECS[i].ckpt, &c.t[i], NULL), REFIT_OK);
    nt_ckpt_free(&c);
    stop(keeper);
    assert_true(refit_abort(t) != REFIT_OK);
    assert_int_equal(refit_worker_health(x.ctx), REFIT_HEALTH_POISONED);
    assert_non_null(strstr(refit_errmsg(x.ctx), g_serve));
    nt_worker_close(&x);
    nt_worker_close(&w);
    nt_rmdir(dir);
}

/* The keeper armed as the undo source of a worker whose trainer it also
 * follows (issue 30 item 4's configuration). v2 reaches the worker only
 * in part: its prepare fails after writing two modules, before its vote;
 * v3 comes whole to a worker taking it as a delta of four modules: the
 * whole tensors are written, then the first part of "big" is refused, a
 * load failure before the vote. Each abort's restore waits for the
 * keeper, which waits for the group's decision, which waits for this
 * vote: so the worker votes no first, the group aborts, the keeper rolls
 * back and serves v1. The worker ends READY at v1, every byte back from
 * the keeper (no undo log), well before the keeper's timeout_s (5 s), and
 * takes v4 after. (Before the fix, it waited out the 5 s and ended
 * POISONED.) */
static void t_keeper_undo_in_the_group(void **state)
{
    (void)state;
    char dir[256], journal[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/w.db", dir);
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w, fresh;
    assert_int_equal(nt_worker_open(&w, 0, 1, journal), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.timeout_s = ro.start_timeout_s = 20;
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, w.m, g_worker, &ro), REFIT_OK);
    send_step v1[1] = {{2, {g_worker, g_follow}, 1, REFIT_OK, 0, NULL}};
    trainer_job tj1 = {v1, 1, 0};
    pid_t trainer = it_fork(run_trainer, &tj1);
    if (refit_ipc_receive_update(r, NULL, NULL))
        fail_msg("v1: %s", refit_errmsg(w.ctx));
    assert_int_equal(it_wait(trainer), 0);
    expect_at(&w, 1);
    refit_ipc_restore_opts ao = REFIT_IPC_RESTORE_OPTS_INIT;
    ao.timeout_s = 5; /* the abort's wait for the keeper: under the trainer's 20 s */
    assert_int_equal(refit_ipc_keeper_undo_arm(w.m, g_serve, &ao), REFIT_OK);

    /* the worker's own reason reaches the trainer in its vote */
    send_step v2v4[3] = {{2, {g_worker, g_follow}, 2, 1, 1, "delivered 2 of"},
                         {2, {g_worker, g_follow}, 3, 1, 0, "does not list module big"},
                         {2, {g_worker, g_follow}, 4, REFIT_OK, 0, NULL}};
    trainer_job tj2 = {v2v4, 3, 0};
    trainer = it_fork(run_trainer, &tj2);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.undo_source = REFIT_UNDO_KEEPER;
    refit_group_result res;
    assert_int_equal(refit_ipc_receive_update(r, &uo, &res), REFIT_EINCOMPLETE);
    assert_non_null(strstr(refit_errmsg(w.ctx), "delivered 2 of"));
    assert_int_equal(res.local_status, REFIT_EINCOMPLETE);
    assert_int_equal(res.worker_status, REFIT_OK); /* rolled back, not POISONED */
    expect_at(&w, 1);
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE version = 'v2' AND "
             "undo_source = 'keeper keeper://%s' AND state = 'rolled_back'", g_serve);
    assert_int_equal(sql_count(journal, sql), 1);
    /* an abort the keeper served is a rollback, not a restore */
    assert_true(metric(&w, "refit_rollbacks_total", "") == 1);
    assert_true(metric(&w, "refit_restores_started_total", "") == 0);

    const char *changes[4] = {"embed", "layers.0.attn", "layers.0.mlp", "layers.0.norm"};
    uo.base_version = "v1";
    uo.changed_modules = changes;
    uo.n_changed_modules = 4;
    assert_int_equal(refit_ipc_receive_update(r, &uo, &res), REFIT_EUNEXPECTED);
    assert_non_null(strstr(refit_errmsg(w.ctx), "does not list module big"));
    assert_int_equal(res.worker_status, REFIT_OK);
    expect_at(&w, 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE version = 'v3' AND "
             "undo_source = 'keeper keeper://%s' AND state = 'rolled_back'", g_serve);
    assert_int_equal(sql_count(journal, sql), 1);

    /* the group goes on: v4 everywhere, and the keeper serves it */
    if (refit_ipc_receive_update(r, NULL, NULL))
        fail_msg("v4: %s", refit_errmsg(w.ctx));
    assert_int_equal(it_wait(trainer), 0);
    expect_at(&w, 4);
    assert_int_equal(nt_worker_open(&fresh, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&fresh, 1), REFIT_OK);
    expect_at(&fresh, 4);
    stop(keeper);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&fresh);
    nt_worker_close(&w);
    nt_rmdir(dir);
}

/* ---- the window: a worker's deadline passes as the decision comes ---- */

/* sql's count in the journal at path; -1 when it cannot be read (yet). */
static int sql_count_quiet(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *s = NULL;
    int n = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

static int rt_vote(rt *t, int *vote)
{
    ipc_frame f;
    ipc_status_msg m;
    int rc = ipc_recv(t->fd, &f, 4096, ipc_now() + 20, t->err, sizeof t->err);
    if (!rc) {
        rc = f.type == IPC_VOTE ? ipc_status_decode(&m, &f, t->seq, t->err, sizeof t->err)
                                : REFIT_ECORRUPT;
        ipc_frame_free(&f);
    }
    *vote = rc ? rc : m.status;
    return rc;
}

static int rt_decide(rt *t, int decision)
{
    ipc_wbuf w = {0};
    ipc_status_encode(&w, t->seq, decision, "");
    int rc = ipc_send(t->fd, IPC_DECISION, w.p, (uint32_t)w.len, NULL, 0, ipc_now() + 20,
                      t->err, sizeof t->err);
    ipc_wbuf_free(&w);
    return rc;
}

/* A trainer of v2 to the worker and the keeper, both voting prepared,
 * whose commit decision goes out only once the worker journaled that its
 * deadline passed with no decision (arg: the worker's journal): the worker
 * gives up, the keeper commits. */
static int run_late_trainer(void *arg)
{
    const char *journal = arg;
    rt w, k;
    int vw = 1, vk = 1;
    if (rt_open(&w, g_worker, 2, 2048) || rt_open(&k, g_follow, 2, 2048))
        return 40;
    if (rt_send_mems(&w) || rt_send_update(&w, NULL, NULL) || rt_send_mems(&k) ||
        rt_send_update(&k, NULL, NULL))
        return 41;
    if (rt_vote(&w, &vw) || vw || rt_vote(&k, &vk) || vk)
        return 42;
    const char *gave_up = "SELECT count(*) FROM events WHERE kind = 'transport' AND "
                          "message LIKE '%no decision%'";
    for (int i = 0; i < 2000 && sql_count_quiet(journal, gave_up) < 1; i++)
        usleep(10000);
    if (sql_count_quiet(journal, gave_up) < 1)
        return 43;
    (void)rt_decide(&w, REFIT_OK); /* to a worker that no longer reads it */
    ipc_frame f;
    if (rt_decide(&k, REFIT_OK) || ipc_recv(k.fd, &f, 4096, ipc_now() + 20, k.err,
                                            sizeof k.err))
        return 44;
    int result_ok = f.type == IPC_RESULT;
    ipc_frame_free(&f);
    rt_close(&w);
    rt_close(&k);
    return result_ok ? 0 : 45;
}

/* The worker W voted prepared on v2; its decision deadline (1 s) passes,
 * it aborts; the commit then reaches the keeper, which holds v2, the
 * group's version (docs/restart.md "The window of a missed decision").
 * armed 0: W rolls back with its undo log, READY at v1, behind the group.
 * armed 1: its undo source is the keeper, which holds v2 when it serves
 * the abort: W is POISONED, the keeper named, never left with v2's bytes
 * called v1. Either way a restore from the keeper brings it to v2. */
static void decision_missed(int armed)
{
    char dir[256], journal[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/w.db", dir);
    keeper_job kj = {.follow = 1};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, journal), REFIT_OK);
    refit_ipc_recv_opts ro = REFIT_IPC_RECV_OPTS_INIT;
    ro.start_timeout_s = 20;
    ro.timeout_s = 1; /* the wait for the decision after the vote */
    refit_ipc_receiver *r;
    assert_int_equal(refit_ipc_receiver_create(&r, w.m, g_worker, &ro), REFIT_OK);
    send_step v1[1] = {{2, {g_worker, g_follow}, 1, REFIT_OK, 0, NULL}};
    trainer_job tj = {v1, 1, 0};
    pid_t trainer = it_fork(run_trainer, &tj);
    if (refit_ipc_receive_update(r, NULL, NULL))
        fail_msg("v1: %s", refit_errmsg(w.ctx));
    assert_int_equal(it_wait(trainer), 0);
    refit_ipc_restore_opts ao = REFIT_IPC_RESTORE_OPTS_INIT;
    ao.timeout_s = 20;
    if (armed)
        assert_int_equal(refit_ipc_keeper_undo_arm(w.m, g_serve, &ao), REFIT_OK);

    trainer = it_fork(run_late_trainer, journal);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.undo_source = armed ? REFIT_UNDO_KEEPER : REFIT_UNDO_LOG;
    refit_group_result res;
    assert_int_equal(refit_ipc_receive_update(r, &uo, &res), REFIT_ETIMEDOUT);
    assert_non_null(strstr(refit_errmsg(w.ctx), "no decision"));
    assert_int_equal(res.vote_taken, 0);
    assert_int_equal(it_wait(trainer), 0);
    if (armed) {
        assert_int_equal(res.worker_status, REFIT_EPOISONED);
        assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_POISONED);
        if (!strstr(refit_errmsg(w.ctx), "the keeper holds version v2 now, not v1"))
            fail_msg("the abort's message: %s", refit_errmsg(w.ctx));
        assert_int_equal(sql_count(journal, "SELECT count(*) FROM updates WHERE version = "
                                            "'v2' AND state = 'failed'"), 1);
    } else {
        assert_int_equal(res.worker_status, REFIT_OK);
        expect_at(&w, 1); /* rolled back: one version behind the keeper */
        assert_int_equal(sql_count(journal, "SELECT count(*) FROM updates WHERE version = "
                                            "'v2' AND state = 'rolled_back'"), 1);
    }
    /* the recovery: the keeper's committed state */
    int rc = refit_ipc_restore(w.m, g_serve, &ao);
    if (rc)
        fail_msg("restore after the missed decision: %s", refit_errmsg(w.ctx));
    expect_at(&w, 2);
    stop(keeper);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
    nt_rmdir(dir);
}

static void t_decision_missed_undo_log(void **state)
{
    (void)state;
    decision_missed(0);
}

static void t_decision_missed_keeper_undo(void **state)
{
    (void)state;
    decision_missed(1);
}

/* ---- who may restore (the checks of docs/ipc.md, "Trust model") ---- */

static int become_nobody(void)
{
    return setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
                   setresuid(65534, 65534, 65534) ? -1 : 0;
}

/* As uid 65534, a restore: trust_root 1 trusts the keeper (uid 0), so the
 * keeper's own check is what refuses. 0: refused, with nothing written;
 * 1: restored; else a setup failure. */
static int run_nobody_restorer(void *arg)
{
    int trust_root = *(const int *)arg;
    if (become_nobody())
        return 50;
    nt_worker w;
    if (nt_worker_open(&w, 0, 1, NULL))
        return 51;
    uint32_t root[1] = {0};
    refit_ipc_restore_opts o = REFIT_IPC_RESTORE_OPTS_INIT;
    o.timeout_s = 20;
    o.allow_uids = trust_root ? root : NULL;
    o.n_allow_uids = trust_root ? 1 : 0;
    int rc = refit_ipc_restore(w.m, g_serve, &o);
    const char *msg = refit_errmsg(w.ctx);
    int refused = rc && strstr(msg, "nothing written") &&
                  (trust_root ? strstr(msg, "greeting") != NULL
                              : strstr(msg, "neither this worker's uid") != NULL);
    if (rc && !refused)
        fprintf(stderr, "nobody restorer: %s\n", msg);
    int empty = refit_worker_health(w.ctx) == REFIT_HEALTH_EMPTY;
    nt_worker_close(&w);
    return !rc ? 1 : refused && empty ? 0 : 2;
}

/* A worker of another uid reaches the keeper's socket (its mode opened)
 * and is refused by the keeper's check, journaled with its uid; one that
 * does not trust the keeper's uid refuses it first. */
static void t_peer_other_uid(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("# skipped: acting as another uid (setresuid 65534) needs root\n");
        skip();
    }
    char dir[256], journal[300];
    nt_tmpdir(dir, sizeof dir);
    snprintf(journal, sizeof journal, "%s/keeper.db", dir);
    keeper_job kj = {.seed = 1, .journal = journal, .socket_mode = 0666};
    pid_t keeper = it_fork(run_keeper, &kj);
    nt_worker ok; /* its own uid is served (and the keeper listens: its mode is set) */
    assert_int_equal(nt_worker_open(&ok, 0, 1, NULL), REFIT_OK);
    assert_int_equal(restore(&ok, 1), REFIT_OK);
    expect_at(&ok, 1);
    nt_worker_close(&ok);
    int trust = 1;
    assert_int_equal(it_wait(it_fork(run_nobody_restorer, &trust)), 0);
    trust = 0;
    assert_int_equal(it_wait(it_fork(run_nobody_restorer, &trust)), 0);
    /* the keeper journals after it answered: wait for its rows */
    for (int i = 0; i < 1000 && sql_count(journal, "SELECT count(*) FROM events WHERE "
                                                   "kind IN ('keeper', 'ipc-peer')") < 3; i++)
        usleep(10000);
    stop(keeper);
    /* both of uid 65534's connections, the one that left at once too */
    assert_int_equal(sql_count(journal, "SELECT count(*) FROM events WHERE kind = 'ipc-peer' "
                                        "AND message LIKE '%uid 65534%'"), 2);
    assert_int_equal(sql_count(journal, "SELECT count(*) FROM events WHERE kind = 'keeper' "
                                        "AND message LIKE '%served version v1%'"), 1);
    nt_rmdir(dir);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(t_restore_follows_and_serves, fresh_paths),
        cmocka_unit_test_setup(t_signature_differs_refused, fresh_paths),
        cmocka_unit_test_setup(t_keeper_killed_mid_restore, fresh_paths),
        cmocka_unit_test_setup(t_group_abort_serves_previous, fresh_paths),
        cmocka_unit_test_setup(t_uncommitted_never_served, fresh_paths),
        cmocka_unit_test_setup(t_partial_update_not_served, fresh_paths),
        cmocka_unit_test_setup(t_verify_catches_changed_memory, fresh_paths),
        cmocka_unit_test_setup(t_keeper_undo_source, fresh_paths),
        cmocka_unit_test_setup(t_keeper_undo_in_the_group, fresh_paths),
        cmocka_unit_test_setup(t_decision_missed_undo_log, fresh_paths),
        cmocka_unit_test_setup(t_decision_missed_keeper_undo, fresh_paths),
        cmocka_unit_test_setup(t_peer_other_uid, fresh_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
