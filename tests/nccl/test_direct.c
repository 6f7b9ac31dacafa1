/* DIRECT buckets (wire version 4) over the loopback transport: tensors of
 * at least direct_min bytes go unpacked from the trainer's tensors and,
 * where the route is a plain copy onto contiguous runtime bytes, straight
 * into the runtime tensors (the loopback writes host runtime tensors as
 * NCCL writes device ones). Bit-exact against a cold start for any bucket
 * size, order and mix; routes that cannot take the bytes as they come (a
 * rank's share of dim-0 rows, a dim-1 shard: strided) fall back to a slot
 * and a scatter; a corrupt direct payload, trailer word or trailer stamp is
 * refused and every rank rolls back the bytes written directly (POISONED
 * without an undo log); a CANCEL in the trailer is voted; a version-3
 * announce is refused by name; a sender killed in a direct bucket rolls
 * back at the deadline; direct_min 0 sends what version 3 planned. */
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

#define NW 2                    /* receiving ranks */
#define NR (NW + 1)
#define DMIN 200                /* direct_min of most tests: all but the norm (16 bytes) */

typedef struct fx {
    int tp;                     /* 1: both receivers hold whole tensors; 2: TP shards */
    nt_worker w[NW];
    nt_ckpt c[3];
    uint64_t cold[3][NW];
    char dir[256], db[NW][300];
} fx;

static int setup_tp(void **state, int tp)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->tp = tp;
    nt_tmpdir(f->dir, sizeof f->dir);
    for (int r = 0; r < NW; r++) {
        snprintf(f->db[r], sizeof f->db[r], "%s/journal%d.db", f->dir, r);
        if (nt_worker_open(&f->w[r], r % tp, tp, f->db[r]))
            return -1;
    }
    for (int v = 1; v <= 2; v++) {
        nt_ckpt_make(&f->c[v], (uint64_t)v);
        for (int r = 0; r < NW; r++)
            f->cold[v][r] = nt_cold_fp(r % tp, tp, (uint64_t)v);
    }
    *state = f;
    return 0;
}

static int setup1(void **state)
{
    return setup_tp(state, 1);
}

static int setup2(void **state)
{
    return setup_tp(state, 2);
}

static int teardown(void **state)
{
    fx *f = *state;
    nt_fixture_end(f->w, NW, f->c, f->dir);
    free(f);
    return 0;
}

static void jobs_for(fx *f, nt_job *j, int v, uint64_t bucket, int64_t direct_min,
                     double timeout)
{
    memset(j, 0, NR * sizeof *j);
    static const char *labels[] = {"v0", "v1", "v2"};
    j[0] = (nt_job){.c = &f->c[v], .bucket_bytes = bucket, .checksum = 1, .label = labels[v],
                    .timeout = timeout, .direct_min = direct_min};
    for (int r = 0; r < NW; r++)
        j[1 + r] = (nt_job){.w = &f->w[r], .rollback = 1, .timeout = timeout};
}

static void assert_at(fx *f, int v)
{
    for (int r = 0; r < NW; r++) {
        assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_READY);
        if (nt_fp(&f->w[r]) != f->cold[v][r])
            fail_msg("rank %d does not hold version %d's bytes", r + 1, v);
    }
}

static void assert_contains(const char *s, const char *sub)
{
    if (!strstr(s, sub))
        fail_msg("\"%s\" does not contain \"%s\"", s, sub);
}

/* Payload bytes of tensors that go DIRECT with direct_min (all but the
 * 16-byte norm at DMIN). */
static uint64_t direct_payload(fx *f, int64_t direct_min)
{
    uint64_t n = 0;
    for (int i = 0; i < NT_N; i++) {
        uint64_t b = 1;
        for (int d = 0; d < NT_SPECS[i].ndim; d++)
            b *= (uint64_t)f->c[1].shape[i][d];
        b = b * NT_SPECS[i].dt.bits / 8;
        if (direct_min > 0 && b >= (uint64_t)direct_min)
            n += b;
    }
    return n;
}

/* The plan the sender makes (every checkpoint tensor is contiguous host
 * memory, so DIRECT-able on the loopback). */
static void plan_of(fx *f, uint64_t bucket, int64_t direct_min, bkt_plan *p)
{
    bkt_tensor t[NT_N];
    for (int i = 0; i < NT_N; i++)
        t[i] = (bkt_tensor){NT_SPECS[i].ckpt, NT_SPECS[i].dt, NT_SPECS[i].ndim,
                            f->c[1].shape[i], true};
    char err[256];
    assert_int_equal(bkt_plan_build_direct(p, t, NT_N, bucket ? bucket : BKT_DEFAULT_BYTES,
                                           direct_min > 0 ? (uint64_t)direct_min : 0, 2, err,
                                           sizeof err), 0);
}

/* Bytes a receiver takes in place with refit_receive_update (one holding
 * whole tensors): every DIRECT byte but bucket 0's, which goes into a
 * slot while the receiver begins its transaction. */
static uint64_t in_place_after_begin(fx *f, uint64_t bucket, int64_t direct_min)
{
    bkt_plan p;
    plan_of(f, bucket, direct_min, &p);
    assert_true(p.n_direct > 0 && p.buckets[0].direct);
    uint64_t n = direct_payload(f, direct_min) - p.buckets[0].payload_bytes;
    bkt_plan_free(&p);
    return n;
}

/* The bucket index of the j-th DIRECT bucket. */
static uint32_t direct_bucket(fx *f, uint64_t bucket, int64_t direct_min, uint32_t j)
{
    bkt_plan p;
    plan_of(f, bucket, direct_min, &p);
    uint32_t b = 0;
    for (uint32_t seen = 0; b < p.n_buckets; b++)
        if (p.buckets[b].direct && seen++ == j)
            break;
    assert_true(b < p.n_buckets);
    bkt_plan_free(&p);
    return b;
}

/* The sender's broadcasts in order: 0 the announce, 1 the index, 2 + b
 * bucket b, then the trailer. */
#define SEQ_BUCKET(b) (2 + (uint64_t)(b))

/* One update to version v; every rank commits, bytes as a cold start's. */
static void update_to(fx *f, int v, uint64_t bucket, int64_t direct_min, uint64_t seed,
                      int checksum, nt_job *out)
{
    nt_job j[NR];
    jobs_for(f, j, v, bucket, direct_min, 5);
    j[0].order_seed = seed;
    j[0].checksum = checksum;
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    assert_at(f, v);
    for (int r = 0; r < NW; r++)
        assert_string_equal(refit_worker_version(f->w[r].ctx), v == 1 ? "v1" : "v2");
    if (out)
        memcpy(out, j, sizeof j);
}

/* ---- bit-exact ---- */

static void test_mixed_any_bucket_size_bit_exact(void **state)
{
    fx *f = *state;
    uint64_t want = direct_payload(f, DMIN);
    static const uint64_t sizes[] = {128, 200, 1000, 4096, 65536, 0};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        bkt_plan p;
        plan_of(f, sizes[k], DMIN, &p);
        for (int v = 1; v <= 2; v++) {
            nt_job j[NR];
            update_to(f, v, sizes[k], DMIN, 0, 1, j);
            /* every DIRECT byte went from the tensors, and into the runtime
             * but bucket 0's (scattered from a slot while they began) */
            assert_true(j[0].direct_bytes == want);
            for (int r = 1; r < NR; r++) {
                assert_true(j[r].direct_bytes == in_place_after_begin(f, sizes[k], DMIN));
                assert_int_equal(j[r].res.buckets, p.n_buckets);
                assert_int_equal(j[r].res.tensors, p.n_pieces);
            }
        }
        assert_true(p.n_direct > 0 && p.n_direct < p.n_buckets); /* a mix */
        bkt_plan_free(&p);
    }
}

static void test_shuffled_orders_and_checksum_off(void **state)
{
    fx *f = *state;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        int v = (int)(1 + seed % 2);
        nt_job j[NR];
        update_to(f, v, seed % 3 ? 300 : 0, (int64_t)(seed % 2 ? DMIN : 1), seed,
                  (int)(seed & 1), j);
        for (int r = 1; r < NR; r++)
            assert_true(j[r].direct_bytes > 0 && j[r].direct_bytes < j[0].direct_bytes);
    }
}

/* One sender and receiver kept across two updates: the trailer's memory
 * is reused, the second update lands like the first. */
static void test_sender_reused(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000, DMIN, 0, 1, NULL);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 5);
    j[0].again_label = "v2b";
    for (int r = 1; r < NR; r++)
        j[r].again_label = "v2b";
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    assert_at(f, 2);
    for (int r = 0; r < NW; r++)
        assert_string_equal(refit_worker_version(f->w[r].ctx), "v2b");
    assert_true(j[1].direct_bytes == in_place_after_begin(f, 1000, DMIN));
}

/* direct_min 0: no DIRECT bucket, no trailer: the version-3 plan. */
static void test_direct_off_sends_the_packed_plan(void **state)
{
    fx *f = *state;
    bkt_plan p;
    plan_of(f, 1000, 0, &p);
    assert_int_equal(p.n_direct, 0);
    nt_job j[NR];
    update_to(f, 2, 1000, -1, 0, 1, j);
    for (int r = 0; r < NR; r++)
        assert_true(j[r].direct_bytes == 0);
    assert_int_equal(j[1].res.buckets, p.n_buckets);
    bkt_plan_free(&p);
    /* and the default (no DIRECT buckets) sends them packed too */
    update_to(f, 1, 1000, 0, 0, 1, j);
    assert_true(j[1].direct_bytes == 0 && j[0].direct_bytes == 0);
}

/* ---- routes that cannot take the bytes as they come ---- */

/* TP 2: a whole tensor's rows are half another rank's, a dim-1 shard is
 * strided: those DIRECT buckets land in a slot and are scattered. With
 * small buckets, parts of dim-0 shards that fall inside one rank's rows
 * are received straight. */
static void test_sharded_routes_fall_back(void **state)
{
    fx *f = *state;
    uint64_t want = direct_payload(f, DMIN);
    nt_job j[NR];
    update_to(f, 1, 0, DMIN, 0, 1, j);
    assert_true(j[0].direct_bytes == want);
    for (int r = 1; r < NR; r++)
        assert_true(j[r].direct_bytes == 0); /* every one scattered from a slot */
    update_to(f, 2, 128, DMIN, 0, 1, j);
    for (int r = 1; r < NR; r++)
        assert_true(j[r].direct_bytes > 0 && j[r].direct_bytes < want);
    update_to(f, 1, 128, DMIN, 3, 0, j);
}

/* A transport whose abort might leave a broadcast running (NCCL: a
 * borrowed communicator without abort_borrowed) never receives into
 * runtime tensors: a stuck broadcast could land after a rollback. Every
 * DIRECT bucket then goes through a slot; the bytes are the same. */
static void test_transport_that_cannot_abort_keeps_to_slots(void **state)
{
    fx *f = *state;
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 5);
    j[1].stuck_abort = 1;
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    assert_at(f, 2);
    assert_true(j[1].direct_bytes == 0);
    assert_true(j[2].direct_bytes == in_place_after_begin(f, 1000, DMIN));
}

/* ---- failures after bytes landed directly ---- */

static void corrupt_direct(fx *f, int rollback, uint64_t seq, uint64_t at, const char *want)
{
    update_to(f, 1, 1000, DMIN, 0, 1, NULL);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 30);
    for (int r = 1; r < NR; r++)
        j[r].rollback = rollback;
    j[0].corrupt_seq = seq;
    j[0].corrupt_at = at;
    j[0].corrupt_mask = 0x10;
    nt_run(j, NR, UINT64_MAX);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_ECORRUPT);
        assert_int_equal(j[r].res.vote_taken, 1);
    }
    for (int r = 1; r < NR; r++) {
        assert_contains(j[r].msg, want);
        assert_true(j[r].direct_bytes > 0); /* bytes had been written in place */
        assert_int_equal(j[r].res.worker_status, rollback ? REFIT_OK : REFIT_EPOISONED);
    }
    if (rollback) {
        assert_at(f, 1);
    } else {
        for (int r = 0; r < NW; r++)
            assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_POISONED);
        update_to(f, 2, 0, DMIN, 0, 1, NULL); /* a full update heals */
    }
}

/* A DIRECT bucket's payload flips on the wire after it was received into
 * the runtime tensor: the device sum against the trailer's word refuses
 * it, and the abort restores the bytes written in place. */
static void test_corrupt_direct_payload_rolls_back(void **state)
{
    fx *f = *state;
    uint32_t b = direct_bucket(f, 1000, DMIN, 2);
    char want[96];
    snprintf(want, sizeof want, "bucket %u of update 'v2': payload checksum", b);
    corrupt_direct(f, 1, SEQ_BUCKET(b), 5, want);
}

static void test_corrupt_direct_payload_poisons_without_rollback(void **state)
{
    fx *f = *state;
    corrupt_direct(f, 0, SEQ_BUCKET(0), 7, "bucket 0 of update 'v2': payload checksum");
}

/* The trailer's checksum word, then a stamp in it, flip on the wire. */
static void test_corrupt_trailer_rolls_back(void **state)
{
    fx *f = *state;
    bkt_plan p;
    plan_of(f, 1000, DMIN, &p);
    uint64_t seq = SEQ_BUCKET(p.n_buckets);
    char want[96];
    snprintf(want, sizeof want, "bucket %u of update 'v2': payload checksum",
             direct_bucket(f, 1000, DMIN, 2));
    corrupt_direct(f, 1, seq, bkt_trailer_sum(p.n_direct, 2) + 3, want);
    snprintf(want, sizeof want, "the trailer: bucket %u: stamp checksum mismatch",
             direct_bucket(f, 1000, DMIN, 1));
    corrupt_direct(f, 1, seq, bkt_trailer_stamp(1) + 20, want);
    bkt_plan_free(&p);
}

/* With the checksum off the same flip goes through: what it is for. */
static void test_corrupt_direct_payload_unchecked_goes_through(void **state)
{
    fx *f = *state;
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 30);
    j[0].checksum = 0;
    j[0].corrupt_seq = SEQ_BUCKET(0);
    j[0].corrupt_at = 5;
    j[0].corrupt_mask = 0x10;
    nt_run(j, NR, UINT64_MAX);
    nt_assert_all_ok(j, NR);
    for (int r = 0; r < NW; r++)
        assert_true(nt_fp(&f->w[r]) != f->cold[2][r]);
}

/* The sender's device checksum of its third DIRECT bucket fails: that
 * bucket and every later one are stamped CANCEL in the trailer (every
 * bucket DIRECT: nothing else carries a stamp), every rank votes the
 * sender's status, bytes written in place roll back. */
static void test_cancel_in_trailer(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000, 1, 0, 1, NULL);
    bkt_plan p;
    plan_of(f, 1000, 1, &p);
    assert_int_equal(p.n_direct, p.n_buckets);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, 1, 30);
    j[0].fail_fingerprint = 3;
    nt_run(j, NR, UINT64_MAX);
    assert_int_equal(j[0].rc, REFIT_EIO);
    assert_contains(j[0].msg, "failed (simulated)");
    char want[96];
    snprintf(want, sizeof want, "the sender cancelled update 'v2' at bucket 2 of %u",
             p.n_buckets);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(j[r].res.vote_taken, 1);
        assert_int_equal(j[r].res.decision, REFIT_EIO);
    }
    for (int r = 1; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EIO);
        assert_contains(j[r].msg, want);
        assert_int_equal(j[r].res.buckets, p.n_buckets); /* every one still came */
        assert_true(j[r].direct_bytes > 0);
        assert_true(j[r].seconds < 10);
    }
    assert_at(f, 1);
    bkt_plan_free(&p);
}

/* A version-3 sender: its announce is refused by name before anything is
 * begun; the sender's vote times out. */
static void test_version3_announce_refused(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000, DMIN, 0, 1, NULL);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 0.5);
    j[0].corrupt_seq = 0;
    j[0].corrupt_at = 4; /* the version: 5 ^ 6 = 3 */
    j[0].corrupt_mask = 0x06;
    nt_run(j, NR, UINT64_MAX);
    for (int r = 1; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EIO);
        assert_contains(j[r].msg, "wire version 3, this refit reads 5");
        assert_int_equal(j[r].res.buckets, 0);
    }
    assert_int_equal(j[0].rc, REFIT_EIO);
    assert_at(f, 1);
}

/* The sender dies in the middle of DIRECT bucket 2, after buckets 0 and 1
 * were received into the runtime tensors: the deadline aborts the
 * transport, the undo log restores them (POISONED without it). */
static void killed_in_direct_bucket(fx *f, int rollback)
{
    update_to(f, 1, 1000, DMIN, 0, 1, NULL);
    bkt_plan p;
    plan_of(f, 1000, DMIN, &p);
    assert_true(p.buckets[2].direct);
    uint64_t kill = BKT_ANNOUNCE_BYTES + bkt_index_bytes(&p) + bkt_total(&p, 0) +
                    bkt_total(&p, 1) + bkt_total(&p, 2) / 2;
    bkt_plan_free(&p);
    nt_job j[NR];
    const double timeout = 0.4;
    jobs_for(f, j, 2, 1000, DMIN, timeout);
    for (int r = 1; r < NR; r++)
        j[r].rollback = rollback;
    nt_run(j, NR, kill);
    for (int r = 1; r < NR; r++) {
        nt_job *w = &j[r];
        assert_int_equal(w->rc, REFIT_ETIMEDOUT);
        assert_contains(w->msg, "stopped part-way");
        assert_contains(w->msg, "transport is aborted");
        assert_int_equal(w->res.vote_taken, 0);
        assert_true(w->direct_bytes > 0);
        assert_true(w->seconds < timeout + 2.0);
        assert_int_equal(w->res.worker_status, rollback ? REFIT_OK : REFIT_EPOISONED);
    }
    if (rollback) {
        assert_at(f, 1);
    } else {
        for (int r = 0; r < NW; r++)
            assert_int_equal(refit_worker_health(f->w[r].ctx), REFIT_HEALTH_POISONED);
        update_to(f, 2, 0, DMIN, 0, 1, NULL);
    }
}

static void test_killed_in_direct_bucket_rolls_back(void **state)
{
    killed_in_direct_bucket(*state, 1);
}

static void test_killed_in_direct_bucket_poisons_without_rollback(void **state)
{
    killed_in_direct_bucket(*state, 0);
}

/* Every byte came, in place, then rank 1's engine moves a tensor before
 * the vote (refit_receive on a txn the caller began): every rank aborts,
 * the bytes written in place roll back. */
static void test_failed_prepare_rolls_back_direct_bytes(void **state)
{
    fx *f = *state;
    update_to(f, 1, 1000, DMIN, 0, 1, NULL);
    nt_job j[NR];
    jobs_for(f, j, 2, 1000, DMIN, 30);
    j[1].move_before_vote = 1;
    nt_run(j, NR, UINT64_MAX);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(j[r].rc, REFIT_EMOVED);
        assert_int_equal(j[r].res.failed_rank, 1);
    }
    /* rank 1 had begun (refit_receive): bucket 0 in place too */
    assert_true(j[1].direct_bytes == direct_payload(f, DMIN));
    assert_true(j[2].direct_bytes == in_place_after_begin(f, 1000, DMIN));
    assert_at(f, 1);
}

int main(void)
{
#define T1(fn) cmocka_unit_test_setup_teardown(fn, setup1, teardown)
#define T2(fn) cmocka_unit_test_setup_teardown(fn, setup2, teardown)
    const struct CMUnitTest tests[] = {
        T1(test_mixed_any_bucket_size_bit_exact),
        T1(test_shuffled_orders_and_checksum_off),
        T1(test_sender_reused),
        T1(test_direct_off_sends_the_packed_plan),
        T1(test_transport_that_cannot_abort_keeps_to_slots),
        T2(test_sharded_routes_fall_back),
        T1(test_corrupt_direct_payload_rolls_back),
        T1(test_corrupt_direct_payload_poisons_without_rollback),
        T1(test_corrupt_trailer_rolls_back),
        T1(test_corrupt_direct_payload_unchecked_goes_through),
        T1(test_cancel_in_trailer),
        T1(test_version3_announce_refused),
        T1(test_killed_in_direct_bucket_rolls_back),
        T1(test_killed_in_direct_bucket_poisons_without_rollback),
        T1(test_failed_prepare_rolls_back_direct_bytes),
    };
    return cmocka_run_group_tests_name("nccl-direct", tests, NULL, NULL);
}
