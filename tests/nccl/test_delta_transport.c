/* Patches over the NCCL transport's wire (docs/nccl.md "Patches"), on the
 * loopback transport: a trainer adds patches (refit_sender_add_delta)
 * next to whole tensors, two TP ranks receive them into a delta update
 * and commit what a local refit_load of the patched checkpoint gives, bit
 * for bit. A patch the model refuses (an index out of range, one given
 * twice, values of another dtype: the trainer is a peer, not trusted) makes
 * its rank vote no: every rank aborts with bytes, version and health as
 * they were. Planning keeps a patch in one bucket; the header decoder
 * refuses entries that do not form a patch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntest.h"
#include "transports/nccl/bucket.h"
#include "transports/nccl/xport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

#define NR 3                    /* rank 0 sends; ranks 1, 2: TP 2 */

enum bad { GOOD, OUT_OF_RANGE, DUPLICATE, WRONG_DTYPE };

/* A patch of checkpoint tensor i: every 7th element (from an offset) takes
 * version 2's value; tensor 3 in run form (rows 2..4), tensor 0 whole. */
typedef struct tpatch {
    int64_t idx[4096], counts[4];
    size_t n;
    int runs;
    void *vals;
    int64_t vshape[1];
    refit_tensor v;
} tpatch;

typedef struct fixture {
    nt_ckpt c[3];               /* versions 1, 2; [0] the patched checkpoint */
    tpatch p[NT_N];
    nt_worker w[NR];
    uint64_t fp_v1[NR], fp_patched[NR];
} fixture;

static size_t esize(refit_dtype dt) { return dt.bits / 8; }

static int64_t numel_of(const refit_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static void make_patch(fixture *f, int i, enum bad bad)
{
    tpatch *p = &f->p[i];
    const refit_tensor *v2 = &f->c[2].t[i];
    refit_tensor *pt = &f->c[0].t[i];
    int64_t numel = numel_of(v2);
    size_t es = esize(v2->dtype);
    memset(p, 0, sizeof *p);
    if (i == 3) { /* rows 2..4 of [16, 8]: one run */
        p->runs = 1;
        p->n = 1;
        p->idx[0] = 2 * 8;
        p->counts[0] = 3 * 8;
    } else {
        for (int64_t e = i % 7; e < numel && p->n < 4096; e += 7)
            p->idx[p->n++] = e;
    }
    int64_t m = p->runs ? p->counts[0] : (int64_t)p->n;
    p->vals = malloc((size_t)m * 4 + 4);
    assert_non_null(p->vals);
    for (size_t k = 0, at = 0; k < p->n; k++) {
        int64_t c = p->runs ? p->counts[k] : 1;
        memcpy((char *)p->vals + at * es, (char *)v2->data + p->idx[k] * es, (size_t)c * es);
        memcpy((char *)pt->data + p->idx[k] * es, (char *)v2->data + p->idx[k] * es,
               (size_t)c * es);
        at += (size_t)c;
    }
    p->vshape[0] = m;
    p->v = (refit_tensor){.data = p->vals, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                          .dtype = v2->dtype, .shape = p->vshape};
    if (bad == OUT_OF_RANGE && i == 1)
        p->idx[p->n - 1] = numel;
    if (bad == DUPLICATE && i == 2)
        p->idx[1] = p->idx[0];
    if (bad == WRONG_DTYPE && i == 4) /* bf16 norm: its values as f16 */
        p->v.dtype = REFIT_F16;
}

/* v1 loaded whole on rank r's worker, locally; the label "v1". */
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

static void setup_bad(fixture *f, enum bad bad)
{
    memset(f, 0, sizeof *f);
    nt_ckpt_make(&f->c[0], 1);
    nt_ckpt_make(&f->c[1], 1);
    nt_ckpt_make(&f->c[2], 2);
    for (int i = 1; i < NT_N; i++)
        make_patch(f, i, bad);
    /* tensor 0 goes whole: the patched checkpoint holds version 2's */
    memcpy(f->c[0].t[0].data, f->c[2].t[0].data,
           (size_t)numel_of(&f->c[2].t[0]) * esize(f->c[2].t[0].dtype));
    for (int r = 1; r < NR; r++) {
        assert_int_equal(nt_worker_open(&f->w[r], r - 1, NR - 1, NULL), REFIT_OK);
        load_local(&f->w[r], &f->c[0], "patched");
        f->fp_patched[r] = nt_fp(&f->w[r]);
        load_local(&f->w[r], &f->c[1], "v1");
        f->fp_v1[r] = nt_fp(&f->w[r]);
        assert_true(f->fp_v1[r] != f->fp_patched[r]);
    }
}

static int setup(void **state)
{
    fixture *f = malloc(sizeof *f);
    assert_non_null(f);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    for (int r = 1; r < NR; r++)
        nt_worker_close(&f->w[r]);
    for (int i = 0; i < NT_N; i++)
        free(f->p[i].vals);
    for (int k = 0; k < 3; k++)
        nt_ckpt_free(&f->c[k]);
    free(f);
    return 0;
}

typedef struct job {
    fixture *f;
    refit_loopback *g;
    int rank;
    uint64_t bucket_bytes;
    int rc;
    refit_group_result res;
    char msg[1100];
} job;

static void *sender_main(void *arg)
{
    job *j = arg;
    refit_ctx *ctx = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    refit_transport *x = NULL;
    refit_sender *s = NULL;
    refit_send_opts so = REFIT_SEND_OPTS_INIT;
    so.version_label = "v2";
    so.bucket_bytes = j->bucket_bytes;
    j->rc = refit_open(&ctx, &o);
    if (!j->rc)
        j->rc = refit_transport_loopback(&x, ctx, j->g, 0, 20);
    if (!j->rc)
        j->rc = refit_sender_create(&s, x, &so);
    if (!j->rc)
        j->rc = refit_sender_add(s, NT_SPECS[0].ckpt, &j->f->c[2].t[0]);
    for (int i = 1; i < NT_N && !j->rc; i++) {
        tpatch *p = &j->f->p[i];
        j->rc = refit_sender_add_delta(s, NT_SPECS[i].ckpt, p->n, p->idx,
                                       p->runs ? p->counts : NULL, &p->v);
    }
    if (!j->rc)
        j->rc = refit_sender_send(s, &j->res);
    snprintf(j->msg, sizeof j->msg, "%s", ctx ? refit_errmsg(ctx) : "");
    refit_sender_destroy(s);
    refit_transport_close(x);
    refit_close(ctx);
    return NULL;
}

static void *receiver_main(void *arg)
{
    job *j = arg;
    nt_worker *w = &j->f->w[j->rank];
    refit_transport *x = NULL;
    refit_receiver *r = NULL;
    refit_recv_opts ro = REFIT_RECV_OPTS_INIT;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.base_version = "v1";
    uo.others_unchanged = 1;
    j->rc = refit_transport_loopback(&x, w->ctx, j->g, j->rank, 20);
    if (!j->rc)
        j->rc = refit_receiver_create(&r, w->m, x, &ro);
    if (!j->rc)
        j->rc = refit_receive_update(r, &uo, &j->res);
    snprintf(j->msg, sizeof j->msg, "%s", refit_errmsg(w->ctx));
    refit_receiver_destroy(r);
    refit_transport_close(x);
    return NULL;
}

static void run(fixture *f, uint64_t bucket_bytes, job j[NR])
{
    refit_loopback *g = NULL;
    assert_int_equal(refit_loopback_create(&g, NR), REFIT_OK);
    pthread_t th[NR];
    for (int r = 0; r < NR; r++) {
        j[r] = (job){f, g, r, bucket_bytes, 0, {0}, {0}};
        pthread_create(&th[r], NULL, r ? receiver_main : sender_main, &j[r]);
    }
    for (int r = 0; r < NR; r++)
        pthread_join(th[r], NULL);
    refit_loopback_destroy(g);
}

static void test_patches_equal_patched_reload(void **state)
{
    fixture *f = *state;
    setup_bad(f, GOOD);
    /* 4 KiB: the two large patches start buckets of their own; 1 MiB: one */
    const uint64_t sizes[] = {4096, 1 << 20};
    for (int k = 0; k < 2; k++) {
        job j[NR];
        if (k)
            for (int r = 1; r < NR; r++)
                load_local(&f->w[r], &f->c[1], "v1");
        run(f, sizes[k], j);
        for (int r = 0; r < NR; r++)
            if (j[r].rc)
                fail_msg("bucket %llu: rank %d: %s: %s", (unsigned long long)sizes[k], r,
                         refit_status_name(j[r].rc), j[r].msg);
        for (int r = 1; r < NR; r++) {
            assert_true(nt_fp(&f->w[r]) == f->fp_patched[r]);
            assert_string_equal(refit_worker_version(f->w[r].ctx), "v2");
            assert_int_equal(j[r].res.tensors, NT_N);
        }
        if (k == 0)
            assert_true(j[0].res.buckets >= 3);
        assert_int_equal(j[0].res.tensors, NT_N);
    }
}

/* A patch the model refuses on the receivers: every rank votes it down,
 * nothing changes on any. */
static void refused(fixture *f, enum bad bad, int status, const char *say)
{
    setup_bad(f, bad);
    job j[NR];
    run(f, 1 << 20, j);
    assert_int_equal(j[0].res.decision, status);
    for (int r = 1; r < NR; r++) {
        if (j[r].rc != status || !strstr(j[r].msg, say))
            fail_msg("rank %d: %s: %s (want %s, '%s')", r, refit_status_name(j[r].rc), j[r].msg,
                     refit_status_name(status), say);
        assert_true(nt_fp(&f->w[r]) == f->fp_v1[r]);
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1");
        assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_READY);
    }
}

/* A patch larger than a bucket: the trainer's plan refuses the update
 * and every rank votes that, the transport still sound (a first send
 * without an announce buffer aborted the transport instead: the workers
 * waited out their deadline). */
static void test_patch_larger_than_a_bucket(void **state)
{
    fixture *f = *state;
    setup_bad(f, GOOD);
    job j[NR];
    run(f, 1024, j);
    assert_int_equal(j[0].rc, REFIT_EINVAL);
    assert_non_null(strstr(j[0].msg, "its patch is"));
    for (int r = 1; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EINVAL);
        assert_int_equal(j[r].res.vote_taken, 1);
        assert_true(nt_fp(&f->w[r]) == f->fp_v1[r]);
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1");
    }
}

static void test_index_out_of_range(void **state)
{
    refused(*state, OUT_OF_RANGE, REFIT_EINVAL, "is outside the tensor's 64 elements");
}

static void test_duplicate_index(void **state)
{
    refused(*state, DUPLICATE, REFIT_EDUPLICATE, "is given twice");
}

static void test_wrong_dtype(void **state)
{
    refused(*state, WRONG_DTYPE, REFIT_EMISMATCH, "model.layers.0.input_layernorm.weight");
}

/* ---- the wire: planning and decoding patches ---- */

static const int64_t SH_N[] = {40}, SH_M[] = {40}, SH_W[] = {4, 8};

static void test_plan_and_decode(void **state)
{
    (void)state;
    bkt_tensor t[5] = {{"w", REFIT_F32, 2, SH_W, false},
                       {"p", {REFIT_DTYPE_INT, 64, 1}, 1, SH_N, false},
                       {"p", {REFIT_DTYPE_INT, 64, 1}, 1, SH_N, false},
                       {"p", REFIT_BF16, 1, SH_M, false},
                       {"z", REFIT_F32, 2, SH_W, false}};
    uint8_t kinds[5] = {BKT_E_WHOLE, BKT_E_DELTA_INDICES, BKT_E_DELTA_COUNTS,
                        BKT_E_DELTA_VALUES, BKT_E_WHOLE};
    char err[512];
    bkt_plan p;
    /* 1200 bytes: after w (128), the patch (320 + 320 + 80, each 256-aligned:
     * 1104 bytes) does not fit: it starts the next bucket, z the third */
    assert_int_equal(bkt_plan_build_kinds(&p, t, kinds, 5, 1200, 0, 2, err, sizeof err), 0);
    assert_int_equal(p.n_buckets, 3);
    assert_int_equal(p.buckets[1].n, 3);
    uint8_t buf[4096];
    bkt_header h = {0};
    bkt_header_encode(buf, &p, 1, t, "v2", 7);
    bkt_expect ex = {1, 3, 7, p.buckets[1].header_bytes, bkt_total(&p, 1), p.max_total};
    assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), 0);
    assert_int_equal(h.entries[0].kind, BKT_E_DELTA_INDICES);
    assert_int_equal(h.entries[1].kind, BKT_E_DELTA_COUNTS);
    assert_int_equal(h.entries[2].kind, BKT_E_DELTA_VALUES);
    assert_string_equal(h.entries[2].name, "p");
    /* a peer's header whose entries do not form a patch, checksum valid */
    const uint8_t bad[][3] = {{BKT_E_DELTA_COUNTS, BKT_E_DELTA_COUNTS, BKT_E_DELTA_VALUES},
                              {BKT_E_DELTA_INDICES, BKT_E_DELTA_COUNTS, BKT_E_WHOLE},
                              {BKT_E_WHOLE, BKT_E_WHOLE, BKT_E_DELTA_VALUES}};
    for (int k = 0; k < 3; k++) {
        uint8_t kk[5] = {BKT_E_WHOLE, bad[k][0], bad[k][1], bad[k][2], BKT_E_WHOLE};
        p.kinds = kk;
        bkt_header_encode(buf, &p, 1, t, "v2", 7);
        assert_int_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), REFIT_ECORRUPT);
        assert_non_null(strstr(err, "but it is not a patch"));
    }
    /* counts of another length than the indices */
    p.kinds = kinds;
    int64_t other[] = {39};
    t[2].shape = other;
    bkt_header_encode(buf, &p, 1, t, "v2", 7);
    ex.header_bytes = p.buckets[1].header_bytes;
    assert_int_not_equal(bkt_header_decode(&h, buf, &ex, err, sizeof err), 0);
    t[2].shape = SH_N;
    bkt_header_free(&h);
    bkt_plan_free(&p);
    /* a patch larger than a bucket, and entries that are not a patch */
    assert_int_equal(bkt_plan_build_kinds(&p, t, kinds, 5, 1000, 0, 2, err, sizeof err),
                     REFIT_EINVAL);
    assert_non_null(strstr(err, "p: its patch is"));
    kinds[2] = BKT_E_WHOLE;
    assert_int_equal(bkt_plan_build_kinds(&p, t, kinds, 5, 4096, 0, 2, err, sizeof err),
                     REFIT_EINVAL);
    assert_non_null(strstr(err, "not the start of a patch"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_and_decode),
        cmocka_unit_test_setup_teardown(test_patches_equal_patched_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_patch_larger_than_a_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_dtype, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
