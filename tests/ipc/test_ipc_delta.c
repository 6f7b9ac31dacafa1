/* Patches over the IPC transport (docs/ipc.md "Patches") on the host
 * (memfd memory, a forked trainer): refit_ipc_sender_add_delta next to a
 * whole tensor, received into a delta update, commits the bytes a local
 * refit_load of the patched checkpoint gives, over several steps (each
 * send drops its patches, the next step adds its own); a patch the model
 * refuses (an index out of range, values of another dtype: the trainer is
 * not trusted) fails the update with bytes, version and health as they
 * were; the sender refuses what it can check alone (in the trainer). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <refit/ipc.h>

#include "tests/ipc/itest.h"

static char g_path[108];

enum bad { GOOD, OUT_OF_RANGE, WRONG_DTYPE };

/* Step s's patches of tensors 1.. of version s + 1 over version 1's bytes:
 * every 5th element from offset s; tensor 3 as one run of rows 1..3;
 * tensor 0 whole. Written into c0 (the patched checkpoint) as well. */
typedef struct tpatch {
    int64_t idx[4096], counts[1];
    size_t n;
    int runs;
    void *vals;
    int64_t vshape[1];
    refit_tensor v;
} tpatch;

static size_t esize(refit_dtype dt) { return dt.bits / 8; }

static int64_t numel_of(const refit_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static void make_patches(tpatch *p, nt_ckpt *c0, const nt_ckpt *next, int step, enum bad bad)
{
    for (int i = 1; i < NT_N; i++) {
        tpatch *q = &p[i];
        const refit_tensor *src = &next->t[i];
        size_t es = esize(src->dtype);
        int64_t numel = numel_of(src);
        free(q->vals);
        memset(q, 0, sizeof *q);
        if (i == 3) {
            q->runs = 1;
            q->n = 1;
            q->idx[0] = 8;
            q->counts[0] = 24;
        } else {
            for (int64_t e = step % 5; e < numel && q->n < 4096; e += 5)
                q->idx[q->n++] = e;
        }
        int64_t m = q->runs ? q->counts[0] : (int64_t)q->n;
        q->vals = malloc((size_t)m * es + 1);
        for (size_t k = 0, at = 0; k < q->n; k++) {
            int64_t c = q->runs ? q->counts[0] : 1;
            memcpy((char *)q->vals + at * es, (char *)src->data + q->idx[k] * es,
                   (size_t)c * es);
            memcpy((char *)c0->t[i].data + q->idx[k] * es, (char *)src->data + q->idx[k] * es,
                   (size_t)c * es);
            at += (size_t)c;
        }
        q->vshape[0] = m;
        q->v = (refit_tensor){.data = q->vals, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                              .dtype = src->dtype, .shape = q->vshape};
        if (bad == OUT_OF_RANGE && i == 2)
            q->idx[q->n - 1] = numel;
        if (bad == WRONG_DTYPE && i == 4)
            q->v.dtype = REFIT_F16;
    }
    memcpy(c0->t[0].data, next->t[0].data, (size_t)numel_of(&next->t[0]) * esize(next->t[0].dtype));
}

typedef struct trainer_job {
    int steps;
    enum bad bad;
} trainer_job;

/* What the sender refuses alone: a value count that is not the
 * elements', a negative index, a name added before (whole). 0 when each
 * is refused as it should be, nothing added. */
static int sender_refuses(refit_ipc_sender *s, refit_ctx *ctx, const char *taken)
{
    float v[3] = {1, 2, 3};
    int64_t vs[1] = {3}, idx[2] = {1, 2}, neg[1] = {-2};
    refit_tensor t = {.data = v, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                      .dtype = REFIT_F32, .shape = vs};
    if (refit_ipc_sender_add_delta(s, "w", 2, idx, NULL, &t) != REFIT_EINVAL ||
        !strstr(refit_errmsg(ctx), "3 values for 2 elements"))
        return 20;
    vs[0] = 1;
    if (refit_ipc_sender_add_delta(s, "w", 1, neg, NULL, &t) != REFIT_EINVAL ||
        !strstr(refit_errmsg(ctx), "index 0 is -2 (negative)"))
        return 21;
    if (refit_ipc_sender_add_delta(s, taken, 1, idx, NULL, &t) != REFIT_EEXIST)
        return 22;
    return 0;
}

/* The trainer: tensor 0 PACK (whole, refreshed each step), patches of
 * the others, one send per step; exit status 0 when every send returned
 * what the job expects. */
static int run_trainer(void *arg)
{
    trainer_job *j = arg;
    refit_ctx *ctx = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    if (refit_open(&ctx, &o))
        return 10;
    refit_ipc_send_opts so = REFIT_IPC_SEND_OPTS_INIT;
    so.bucket_bytes = 4096;
    so.timeout_s = 20;
    const char *paths[1] = {g_path};
    refit_ipc_sender *s;
    if (refit_ipc_sender_create(&s, ctx, paths, 1, &so))
        return 11;
    nt_ckpt c0, whole;
    nt_ckpt_make(&c0, 1);
    nt_ckpt_make(&whole, 1);
    tpatch *p = calloc(NT_N, sizeof *p);
    int rc = p ? 0 : 12;
    if (!rc && refit_ipc_sender_add(s, NT_SPECS[0].ckpt, &whole.t[0], REFIT_IPC_PACK))
        rc = 13;
    if (!rc && j->bad == GOOD)
        rc = sender_refuses(s, ctx, NT_SPECS[0].ckpt);
    for (int step = 1; !rc && step <= j->steps; step++) {
        nt_ckpt next;
        nt_ckpt_make(&next, (uint64_t)step + 1);
        make_patches(p, &c0, &next, step, j->bad);
        memcpy(whole.t[0].data, next.t[0].data,
               (size_t)numel_of(&next.t[0]) * esize(next.t[0].dtype));
        nt_ckpt_free(&next);
        for (int i = 1; i < NT_N && !rc; i++)
            if (refit_ipc_sender_add_delta(s, NT_SPECS[i].ckpt, p[i].n, p[i].idx,
                                           p[i].runs ? p[i].counts : NULL, &p[i].v)) {
                fprintf(stderr, "trainer: %s\n", refit_errmsg(ctx));
                rc = 14;
            }
        char label[32];
        snprintf(label, sizeof label, "s%d", step);
        refit_ipc_sender_set_label(s, label);
        refit_group_result res;
        int st = rc ? 0 : refit_ipc_sender_send(s, &res);
        if (!rc && (j->bad ? st == REFIT_OK : st != REFIT_OK || res.tensors != NT_N)) {
            fprintf(stderr, "trainer: send %s: %d (%s)\n", label, st, refit_errmsg(ctx));
            rc = 15;
        }
    }
    for (int i = 0; p && i < NT_N; i++)
        free(p[i].vals);
    free(p);
    refit_ipc_sender_destroy(s);
    nt_ckpt_free(&c0);
    nt_ckpt_free(&whole);
    refit_close(ctx);
    return rc;
}

static void load_local(nt_worker *w, const nt_ckpt *c, const char *label)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    for (int i = 0; i < NT_N; i++)
        assert_int_equal(refit_load(t, NT_SPECS[i].ckpt, &c->t[i], NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
}

static int fresh_path(void **state)
{
    static int n;
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_path, sizeof g_path, "/tmp/refit-ipcd-%d-%d.sock", (int)getpid(), ++n);
    return 0;
}

static refit_ipc_receiver *listen_on(nt_worker *w)
{
    refit_ipc_recv_opts o = REFIT_IPC_RECV_OPTS_INIT;
    o.timeout_s = 20;
    o.start_timeout_s = 20;
    refit_ipc_receiver *r = NULL;
    assert_int_equal(refit_ipc_receiver_create(&r, w->m, g_path, &o), REFIT_OK);
    return r;
}

static int receive(refit_ipc_receiver *r, const char *base, refit_group_result *res)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.base_version = base;
    uo.others_unchanged = 1;
    return refit_ipc_receive_update(r, &uo, res);
}

/* Three steps, each a delta against the last: the bytes a local load of
 * the patched checkpoint gives after each. */
static void t_patches_commit(void **state)
{
    (void)state;
    nt_worker w, ref;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    assert_int_equal(nt_worker_open(&ref, 0, 1, NULL), REFIT_OK);
    nt_ckpt c0, next;
    nt_ckpt_make(&c0, 1);
    load_local(&w, &c0, "s0");
    refit_ipc_receiver *r = listen_on(&w);
    trainer_job j = {3, GOOD};
    pid_t pid = it_fork(run_trainer, &j);
    tpatch *p = calloc(NT_N, sizeof *p);
    assert_non_null(p);
    for (int step = 1; step <= 3; step++) {
        char base[16], label[16];
        snprintf(base, sizeof base, "s%d", step - 1);
        snprintf(label, sizeof label, "s%d", step);
        refit_group_result res;
        int rc = receive(r, base, &res);
        if (rc)
            fail_msg("step %d: %s: %s", step, refit_status_name(rc), refit_errmsg(w.ctx));
        nt_ckpt_make(&next, (uint64_t)step + 1);
        make_patches(p, &c0, &next, step, GOOD);
        nt_ckpt_free(&next);
        load_local(&ref, &c0, label);
        assert_true(nt_fp(&w) == nt_fp(&ref));
        assert_string_equal(refit_worker_version(w.ctx), label);
    }
    assert_int_equal(it_wait(pid), 0);
    for (int i = 0; i < NT_N; i++)
        free(p[i].vals);
    free(p);
    nt_ckpt_free(&c0);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
    nt_worker_close(&ref);
}

static void refused(enum bad bad, int status, const char *say)
{
    nt_worker w;
    assert_int_equal(nt_worker_open(&w, 0, 1, NULL), REFIT_OK);
    nt_ckpt c0;
    nt_ckpt_make(&c0, 1);
    load_local(&w, &c0, "s0");
    uint64_t fp = nt_fp(&w);
    refit_ipc_receiver *r = listen_on(&w);
    trainer_job j = {1, bad};
    pid_t pid = it_fork(run_trainer, &j);
    refit_group_result res;
    int rc = receive(r, "s0", &res);
    if (rc != status || !strstr(refit_errmsg(w.ctx), say))
        fail_msg("%s: %s (want %s, '%s')", refit_status_name(rc), refit_errmsg(w.ctx),
                 refit_status_name(status), say);
    assert_int_equal(it_wait(pid), 0);
    assert_true(nt_fp(&w) == fp);
    assert_string_equal(refit_worker_version(w.ctx), "s0");
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    nt_ckpt_free(&c0);
    refit_ipc_receiver_destroy(r);
    nt_worker_close(&w);
}

static void t_index_out_of_range(void **state)
{
    (void)state;
    refused(OUT_OF_RANGE, REFIT_EINVAL, "is outside the tensor's 64 elements");
}

static void t_wrong_dtype(void **state)
{
    (void)state;
    refused(WRONG_DTYPE, REFIT_EMISMATCH, "model.layers.0.input_layernorm.weight");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(t_patches_commit, fresh_path),
        cmocka_unit_test_setup(t_index_out_of_range, fresh_path),
        cmocka_unit_test_setup(t_wrong_dtype, fresh_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
