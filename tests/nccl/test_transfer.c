/* Trainer to workers over the loopback transport: bit-exact reloads for
 * any bucket size and order, a sender killed mid-bucket, a rank failing its
 * checks, a rank refusing a tensor, a cancelled send, a vote that never
 * completes. Each is checked on every rank: status, message, health,
 * bytes (fingerprints against a cold start), and the journal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ntest.h"
#include "transports/nccl/bucket.h"
#include "journal/journal.h"

#define TP 2
#define NR (TP + 1)

typedef struct fx {
    nt_worker w[TP];
    nt_ckpt c[3];               /* versions 1 and 2 (index = version) */
    uint64_t cold[3][TP];       /* cold-start fingerprints */
    char dir[256], db[TP][300];
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    nt_tmpdir(f->dir, sizeof f->dir);
    for (int r = 0; r < TP; r++) {
        snprintf(f->db[r], sizeof f->db[r], "%s/journal%d.db", f->dir, r);
        if (nt_worker_open(&f->w[r], r, TP, f->db[r]))
            return -1;
    }
    for (int v = 1; v <= 2; v++) {
        nt_ckpt_make(&f->c[v], (uint64_t)v);
        for (int r = 0; r < TP; r++)
            f->cold[v][r] = nt_cold_fp(r, TP, (uint64_t)v);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    nt_fixture_end(f->w, TP, f->c, f->dir);
    free(f);
    return 0;
}

/* Sender job for version v and TP receiver jobs. */
static void jobs_for(fx *f, nt_job *j, int v, uint64_t bucket, double timeout)
{
    memset(j, 0, NR * sizeof *j);
    static const char *labels[] = {"v0", "v1", "v2"};
    j[0] = (nt_job){.c = &f->c[v], .bucket_bytes = bucket, .checksum = 1, .label = labels[v],
                    .timeout = timeout};
    for (int r = 0; r < TP; r++)
        j[1 + r] = (nt_job){.w = &f->w[r], .rollback = 1, .timeout = timeout};
}

static void update_to(fx *f, int v, uint64_t bucket)
{
    nt_job j[NR];
    jobs_for(f, j, v, bucket, 5);
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    for (int r = 0; r < TP; r++) {
        assert_true(nt_fp(&f->w[r]) == f->cold[v][r]);
        assert_string_equal(refit_worker_version(f->w[r].ctx), v == 1 ? "v1" : "v2");
    }
}

static void assert_at(fx *f, int v)
{
    for (int r = 0; r < TP; r++) {
        assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_READY);
        assert_true(nt_fp(&f->w[r]) == f->cold[v][r]);
    }
}

static void assert_contains(const char *s, const char *sub)
{
    if (!strstr(s, sub))
        fail_msg("\"%s\" does not contain \"%s\"", s, sub);
}

/* ---- bit-exact for any bucket size ---- */

static void test_bucket_sizes_give_identical_bytes(void **state)
{
    fx *f = *state;
    /* 128 bytes: every tensor but the smallest is split, dim-1 shards are
     * assembled; 1 GiB (the default): one bucket */
    static const uint64_t sizes[] = {128, 200, 1000, 4096, 65536, 0};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        update_to(f, 1, sizes[k]);
        update_to(f, 2, sizes[k]);
    }
}

static void test_order_and_checksum_off(void **state)
{
    fx *f = *state;
    update_to(f, 1, 0);
    for (uint64_t seed = 1; seed <= 4; seed++) {
        nt_job j[NR];
        jobs_for(f, j, (int)(1 + seed % 2), 300, 5);
        j[0].order_seed = seed;
        j[0].checksum = (int)(seed & 1);
        nt_run(j, NR, UINT64_MAX);
        nt_assert_all_ok(j, NR);
        assert_at(f, (int)(1 + seed % 2));
    }
}

/* One receiver kept across updates whose second has many more buckets than
 * the first (a new sender with small buckets): its index, stamp and
 * checksum memory grows, and the bytes are a cold start's. */
static void test_receiver_grows_for_a_larger_index(void **state)
{
    fx *f = *state;
    update_to(f, 2, 0);
    nt_job j[NR];
    jobs_for(f, j, 1, 0, 5); /* version 1 in one bucket, then again in many */
    j[0].again_label = "v1-small";
    j[0].again_bucket_bytes = 128; /* every tensor split: dozens of buckets */
    for (int r = 1; r < NR; r++)
        j[r].again_label = "v1-small";
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    for (int r = 0; r < TP; r++) {
        assert_true(j[1 + r].res.buckets > 20); /* the second update's */
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1-small");
    }
    assert_at(f, 1);
}

/* One sender kept across steps: relabelled, sent again (slots reused);
 * the receivers' second update carries the new label, the same bytes. */
static void test_sender_reused_across_updates(void **state)
{
    fx *f = *state;
    nt_job j[NR];
    jobs_for(f, j, 1, 1000, 5);
    for (int i = 0; i < NR; i++)
        j[i].again_label = "v1-again";
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    for (int r = 0; r < TP; r++) {
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1-again");
        assert_string_equal(j[1 + r].res.version_label, "v1-again");
    }
    assert_at(f, 1);
}

static void test_result_counts(void **state)
{
    fx *f = *state;
    nt_job j[NR];
    jobs_for(f, j, 1, 1000, 5);
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    assert_true(j[0].res.buckets > 1);
    assert_int_equal(j[1].res.buckets, j[0].res.buckets);
    assert_true(j[1].res.bytes == j[0].res.bytes);
    assert_string_equal(j[1].res.version_label, "v1");
    assert_true(j[1].res.tensors >= NT_N);
}

/* ---- a sender killed mid-bucket ---- */

/* The events of the journal at path, concatenated. */
static int event_cat(void *user, const journal_event_row *row)
{
    char *s = user;
    size_t n = strlen(s);
    snprintf(s + n, 4096 - n, "[%s] %s\n", row->kind, row->message);
    return 0;
}

static int update_state(void *user, const journal_update_row *row)
{
    snprintf(user, 64, "%s", row->state);
    return 0;
}

static void journal_of(const char *db, int64_t update, char events[4096], char state[64])
{
    journal *jr = NULL;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    assert_int_equal(journal_open(&jr, db, &o, err, sizeof err), REFIT_OK);
    events[0] = state[0] = '\0';
    assert_int_equal(journal_events_list(jr, update, 0, event_cat, events), REFIT_OK);
    if (update)
        assert_int_equal(journal_update_get(jr, update, update_state, state), REFIT_OK);
    journal_close(jr);
}

static int max_id(void *user, const journal_update_row *row)
{
    *(int64_t *)user = row->id;
    return 0;
}

static int64_t newest_update(const char *db)
{
    journal *jr = NULL;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    int64_t id = 0;
    assert_int_equal(journal_open(&jr, db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_updates_list(jr, max_id, &id), REFIT_OK);
    journal_close(jr);
    return id;
}

/* Bytes version v's update puts on the wire (announce, index, buckets)
 * before the middle of bucket 'from_end' buckets before the last. */
static uint64_t wire_bytes_to(fx *f, int v, uint64_t bucket, uint32_t from_end)
{
    bkt_tensor t[NT_N];
    for (int i = 0; i < NT_N; i++)
        t[i] = (bkt_tensor){NT_SPECS[i].ckpt, NT_SPECS[i].dt, NT_SPECS[i].ndim,
                            f->c[v].shape[i], false};
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, t, NT_N, bucket, 2, err, sizeof err), 0);
    assert_true(p.n_buckets > from_end + 2);
    uint32_t stop = p.n_buckets - 1 - from_end;
    uint64_t n = BKT_ANNOUNCE_BYTES + bkt_index_bytes(&p) + bkt_total(&p, stop) / 2;
    for (uint32_t b = 0; b < stop; b++)
        n += bkt_total(&p, b);
    bkt_plan_free(&p);
    return n;
}

static void killed_sender(fx *f, int rollback)
{
    update_to(f, 1, 1000);
    nt_job j[NR];
    const double timeout = 0.4;
    jobs_for(f, j, 2, 1000, timeout);
    for (int r = 0; r < TP; r++)
        j[1 + r].rollback = rollback;
    /* it dies in the middle of the third bucket from the end: receivers
     * (posting up to 8 buckets ahead) have scattered some by then */
    nt_run(j, NR, wire_bytes_to(f, 2, 1000, 2));
    for (int r = 0; r < TP; r++) {
        nt_job *w = &j[1 + r];
        assert_int_equal(w->rc, REFIT_ETIMEDOUT);
        assert_true(w->res.buckets < j[0].res.buckets || j[0].res.buckets == 0);
        assert_contains(w->msg, "stopped part-way");
        assert_true(w->seconds < timeout + 2.0);
        assert_int_equal(w->res.vote_taken, 0);
        assert_contains(w->msg, "deadline");
        assert_contains(w->msg, "transport is aborted");
        char ev[4096], st[64];
        journal_of(f->db[r], newest_update(f->db[r]), ev, st);
        assert_contains(ev, "[transport]");
        assert_contains(ev, "deadline");
        if (rollback) {
            assert_string_equal(st, "rolled_back");
            assert_int_equal(w->res.worker_status, REFIT_OK);
        } else {
            assert_string_equal(st, "failed");
            assert_int_equal(w->res.worker_status, REFIT_EPOISONED);
        }
    }
    if (rollback) {
        assert_at(f, 1);
    } else {
        for (int r = 0; r < TP; r++)
            assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_POISONED);
        update_to(f, 2, 0); /* a full update heals */
    }
}

static void test_sender_killed_mid_bucket_rolls_back(void **state)
{
    killed_sender(*state, 1);
}

static void test_sender_killed_mid_bucket_poisons_without_rollback(void **state)
{
    killed_sender(*state, 0);
}

/* ---- one rank fails: every rank aborts ---- */

static int skip_q(void *user, const char *name)
{
    (void)user;
    return strcmp(name, "model.layers.0.self_attn.q_proj.weight") != 0;
}

static void test_one_rank_fails_finalize_all_abort(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 5);
    j[2].filter = skip_q; /* rank 2: layers.0.attn partly delivered */
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[2].rc, REFIT_EINCOMPLETE);
    assert_contains(j[2].msg, "layers.0.attn");
    assert_int_equal(j[1].rc, REFIT_EINCOMPLETE);
    assert_contains(j[1].msg, "rank 2 of 3 voted REFIT_EINCOMPLETE");
    assert_contains(j[1].msg, "rolled back");
    assert_int_equal(j[0].rc, REFIT_EINCOMPLETE);
    for (int i = 0; i < NR; i++) {
        assert_int_equal(j[i].res.vote_taken, 1);
        assert_int_equal(j[i].res.failed_rank, 2);
    }
    assert_at(f, 1);
    char ev[4096], st[64];
    journal_of(f->db[0], newest_update(f->db[0]), ev, st);
    assert_contains(ev, "[group] rank 2 of 3 voted REFIT_EINCOMPLETE");
    assert_string_equal(st, "rolled_back");
}

static void test_moved_tensor_fails_prepare_all_abort(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 5);
    j[1].move_before_vote = 1;
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[1].rc, REFIT_EMOVED);
    assert_int_equal(j[2].rc, REFIT_EMOVED);
    assert_int_equal(j[0].rc, REFIT_EMOVED);
    assert_int_equal(j[2].res.failed_rank, 1);
    assert_at(f, 1);
}

static int no_extra(void *user, const char *name)
{
    (void)user;
    return strcmp(name, "model.extra.weight") != 0;
}

/* A rank that refuses a load keeps receiving (draining) the buckets the
 * others still broadcast, so the group decides at once, not at a
 * deadline. The refused tensor comes first: everything after is drained. */
static void test_refused_load_drains_and_votes(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    float junk[16] = {0};
    int64_t shape[1] = {16};
    refit_tensor extra = {.data = junk, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                          .dtype = REFIT_F32, .shape = shape};
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 30);
    j[0].extra_name = "model.extra.weight";
    j[0].extra = &extra;
    j[1].filter = no_extra; /* rank 1 skips it; rank 2 refuses it */
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[2].rc, REFIT_EUNEXPECTED);
    assert_contains(j[2].msg, "model.extra.weight");
    assert_true(j[2].res.buckets > 1); /* drained to the end */
    for (int i = 0; i < NR; i++) {
        assert_int_equal(j[i].res.decision, REFIT_EUNEXPECTED);
        assert_int_equal(j[i].res.failed_rank, 2);
        assert_true(j[i].seconds < 10);
    }
    assert_int_equal(j[1].rc, REFIT_EUNEXPECTED);
    assert_at(f, 1);
}

static void test_sender_cancel_reaches_every_rank(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_ckpt bad = f->c[2];
    bad.t[5].device.device_type = REFIT_DEVICE_CUDA; /* the host backend cannot read it */
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 30);
    j[0].c = &bad;
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[0].rc, REFIT_EUNSUPPORTED);
    assert_contains(j[0].msg, "model.big.weight");
    assert_true(j[0].res.buckets > 3);
    for (int r = 1; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EUNSUPPORTED);
        assert_contains(j[r].msg, "cancelled");
        assert_true(j[r].seconds < 10);
        /* every planned broadcast still came (the receivers posted them) */
        assert_int_equal(j[r].res.buckets, j[0].res.buckets);
    }
    assert_at(f, 1);
}

/* The sender's broadcasts in order: 0 the announce, 1 the index, 2 + b
 * bucket b. */
#define SEQ_INDEX 1
#define SEQ_BUCKET(b) (2 + (b))

/* Where bucket k's header starts in version v's index. */
static uint64_t header_at(fx *f, int v, uint64_t bucket, uint32_t k)
{
    bkt_tensor t[NT_N];
    for (int i = 0; i < NT_N; i++)
        t[i] = (bkt_tensor){NT_SPECS[i].ckpt, NT_SPECS[i].dt, NT_SPECS[i].ndim,
                            f->c[v].shape[i], false};
    bkt_plan p;
    char err[256];
    assert_int_equal(bkt_plan_build(&p, t, NT_N, bucket, 2, err, sizeof err), 0);
    assert_true(k < p.n_buckets);
    uint64_t at = 0;
    for (uint32_t b = 0; b < k; b++)
        at += p.buckets[b].header_bytes;
    bkt_plan_free(&p);
    return at;
}

/* A header is corrupt on the wire: the chain of sizes cannot be trusted,
 * so receivers abort their transport before any payload is posted (nothing
 * was begun, bytes and health as they were); the sender's vote times out. */
static void test_corrupt_header_aborts_before_any_payload(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 0.5);
    j[0].corrupt_seq = SEQ_INDEX;
    j[0].corrupt_at = header_at(f, 2, 1000, 2) + 44; /* bucket 2's payload size */
    j[0].corrupt_mask = 0x01;
    nt_run(j, NR, UINT64_MAX);
    for (int r = 1; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EIO);
        assert_contains(j[r].msg, "index: bucket 2: header checksum mismatch");
        assert_contains(j[r].msg, "transport is aborted");
        assert_int_equal(j[r].res.buckets, 0);
        char ev[4096], st[64];
        journal_of(f->db[r - 1], 0, ev, st);
        assert_contains(ev, "[transport]");
    }
    assert_int_equal(j[0].rc, REFIT_EIO);
    assert_at(f, 1);
    for (int r = 0; r < TP; r++)
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1");
}

/* A bucket's stamp is corrupt: sizes come from the index, so receivers
 * drain the rest and vote; every rank aborts, bytes rolled back. */
static void test_corrupt_stamp_drains_and_votes(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 30);
    j[0].corrupt_seq = SEQ_BUCKET(3);
    j[0].corrupt_at = 20; /* the stamp's payload size */
    j[0].corrupt_mask = 0x80;
    nt_run(j, NR, UINT64_MAX);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_ECORRUPT);
        assert_int_equal(j[r].res.vote_taken, 1);
        assert_true(j[r].seconds < 10);
    }
    for (int r = 1; r < NR; r++) {
        assert_contains(j[r].msg, "bucket 3: stamp checksum mismatch");
        assert_int_equal(j[r].res.buckets, j[0].res.buckets); /* drained to the end */
    }
    assert_at(f, 1);
}

/* A payload byte flips on the wire: the payload checksum (on by default)
 * refuses that bucket before it is loaded and the group aborts; with the
 * checksum off the same flip goes through (what the checksum is for). */
static void test_corrupt_payload_caught_by_checksum(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    for (int sum = 1; sum >= 0; sum--) {
        nt_job j[NR];
        jobs_for(f, j, 2, 1000, 30);
        j[0].checksum = sum;
        j[0].corrupt_seq = SEQ_BUCKET(1);
        j[0].corrupt_at = BKT_ALIGN + 5;
        j[0].corrupt_mask = 0x10;
        nt_run(j, NR, UINT64_MAX);
        if (sum) {
            for (int r = 0; r < NR; r++)
                assert_int_equal(j[r].rc, REFIT_ECORRUPT);
            assert_contains(j[1].msg, "bucket 1 of update 'v2': payload checksum");
            assert_at(f, 1);
        } else {
            nt_assert_all_ok(j, NR);
            int differs = 0;
            for (int r = 0; r < TP; r++)
                differs += nt_fp(&f->w[r]) != f->cold[2][r];
            assert_true(differs >= 1);
        }
    }
}

/* A middle bucket's payload, or the sender's checksum word after its stamp
 * (outside the stamp's own checksum), or the last bucket's payload, flips
 * on the wire. Receivers sum
 * every bucket on the device and compare once after the last: every bucket
 * is still scattered, the mismatch is named and voted, and the abort rolls
 * every rank back. */
static void test_corrupt_middle_bucket_rolls_back(void **state)
{
    fx *f = *state;
    nt_job j[NR];
    jobs_for(f, j, 1, 1000, 30);
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    uint32_t n = j[1].res.buckets, mid = n / 2;
    uint64_t tensors[TP];
    for (int r = 0; r < TP; r++)
        tensors[r] = j[1 + r].res.tensors;
    assert_true(n >= 5);
    /* the last bucket too: on a GPU its sum runs on the transport's stream */
    static const uint64_t at[] = {BKT_ALIGN + 5, BKT_SUM_AT + 3};
    const uint32_t bad[] = {mid, mid, n - 1};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        jobs_for(f, j, 2, 1000, 30);
        j[0].corrupt_seq = SEQ_BUCKET(bad[k]);
        j[0].corrupt_at = at[k % 2];
        j[0].corrupt_mask = 0x04;
        nt_run(j, NR, UINT64_MAX);
        char want[96];
        snprintf(want, sizeof want, "bucket %u of update 'v2': payload checksum", bad[k]);
        for (int r = 0; r < NR; r++) {
            assert_int_equal(j[r].rc, REFIT_ECORRUPT);
            assert_int_equal(j[r].res.vote_taken, 1);
        }
        for (int r = 1; r < NR; r++) {
            assert_contains(j[r].msg, want);
            assert_int_equal(j[r].res.buckets, n);
            assert_int_equal(j[r].res.tensors, tensors[r - 1]);
        }
        assert_at(f, 1);
    }
}

static void test_vote_never_completes(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 0.3);
    j[2].skip_vote = 1;
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[1].rc, REFIT_EIO);
    assert_int_equal(j[1].res.vote_taken, 0);
    assert_contains(j[1].msg, "commit vote failed");
    assert_int_equal(j[0].rc, REFIT_EIO);
    assert_at(f, 1);
}

/* No tensors: an announce of no buckets, then the vote; the version label
 * moves, the bytes stay. */
static void test_empty_update(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 5);
    j[0].no_tensors = 1;
    for (int r = 0; r < TP; r++)
        j[1 + r].partial = 1; /* by default an update delivers every module */
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    assert_int_equal(j[1].res.buckets, 1); /* no entries: it carries the label */
    assert_int_equal(j[1].res.tensors, 0);
    for (int r = 0; r < TP; r++) {
        assert_true(nt_fp(&f->w[r]) == f->cold[1][r]);
        /* nothing of v2 arrived: no module holds it, the worker stays at v1 */
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v1");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bucket_sizes_give_identical_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_and_checksum_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_result_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sender_reused_across_updates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_receiver_grows_for_a_larger_index, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sender_killed_mid_bucket_rolls_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sender_killed_mid_bucket_poisons_without_rollback,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_rank_fails_finalize_all_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moved_tensor_fails_prepare_all_abort, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_refused_load_drains_and_votes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sender_cancel_reaches_every_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_header_aborts_before_any_payload, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_stamp_drains_and_votes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_payload_caught_by_checksum, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_middle_bucket_rolls_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_vote_never_completes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_update, setup, teardown),
    };
    return cmocka_run_group_tests_name("nccl-transfer", tests, NULL, NULL);
}
