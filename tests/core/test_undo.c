/* The undo log's placement (core/undo.c): device memory within the
 * context's undo_device_budget, host memory for the rest, chunks pooled
 * across updates. The log alone runs on a backend that counts its
 * allocations; the API tests run on the host backend, whose "device" undo
 * memory is malloc'd memory, so every placement is exercised without a GPU. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <refit/sys/stats.h>

#include "core/model.h"
#include "core/undo.h"
#include "journal/journal.h"
#include "testutil.h"

/* ---- the log alone ---- */

static struct {
    int dev_allocs, dev_frees, host_allocs, host_frees;
    int dev_refuse;             /* undo_dev_alloc returns NULL */
    int saves_dev, saves_host;
} C;

static void *f_dev_alloc(int device, size_t n)
{
    assert_int_equal(device, 3);
    if (C.dev_refuse)
        return NULL;
    C.dev_allocs++;
    return malloc(n);
}

static void f_dev_free(int device, void *p)
{
    assert_int_equal(device, 3);
    C.dev_frees++;
    free(p);
}

static void *f_host_alloc(size_t n)
{
    C.host_allocs++;
    return malloc(n);
}

static void f_host_free(void *p)
{
    C.host_frees++;
    free(p);
}

static int f_save_dev(void *d, const void *s, size_t n, int device, void *stream)
{
    (void)device;
    (void)stream;
    C.saves_dev++;
    memcpy(d, s, n);
    return REFIT_OK;
}

static int f_save(void *d, const void *s, size_t n, void *stream)
{
    (void)stream;
    C.saves_host++;
    memcpy(d, s, n);
    return REFIT_OK;
}

static int f_restore(void *d, const void *s, size_t n, void *stream)
{
    (void)stream;
    memcpy(d, s, n);
    return REFIT_OK;
}

static int f_restore_dev(void *d, const void *s, size_t n, int device)
{
    (void)device;
    memcpy(d, s, n);
    return REFIT_OK;
}

static const backend fake = {
    .name = "fake",
    .undo_alloc = f_host_alloc,
    .undo_free = f_host_free,
    .save = f_save,
    .restore = f_restore,
    .undo_dev_alloc = f_dev_alloc,
    .undo_dev_free = f_dev_free,
    .save_dev = f_save_dev,
    .restore_dev = f_restore_dev,
};

/* The same backend with no device undo memory. */
static const backend fake_host_only = {
    .name = "fake-host-only",
    .undo_alloc = f_host_alloc,
    .undo_free = f_host_free,
    .save = f_save,
    .restore = f_restore,
};

#define MIB ((size_t)1 << 20)

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)tt_mix(seed + i);
}

/* Regions of odd sizes at odd offsets of one buffer, saved in order,
 * overwritten, then restored: every byte must be the original. Returns
 * the log still holding its chunks (the caller frees it). */
typedef struct region {
    size_t off, n;
} region;

static const region regions[] = {
    {3, 1}, {100, 3 * MIB + 17}, {3 * MIB + 200, 70001}, {4 * MIB, 2 * MIB + 1},
    {6 * MIB + 77, 513}, {6 * MIB + 1000, 3 * MIB},
    {1 * MIB, 4 * MIB}, /* overlaps three earlier ones: saved after they were written */
};
#define N_REGIONS (sizeof regions / sizeof regions[0])
#define BUF_BYTES (9 * MIB + 2048)

static void run_log(undo_log *u, const backend *be, unsigned char *buf, uint64_t seed)
{
    unsigned char *orig = malloc(BUF_BYTES);
    assert_non_null(orig);
    fill(buf, BUF_BYTES, seed);
    memcpy(orig, buf, BUF_BYTES);
    for (size_t i = 0; i < N_REGIONS; i++) {
        assert_int_equal(undo_save(u, be, 3, (char *)buf + regions[i].off, regions[i].n, NULL),
                         REFIT_OK);
        fill(buf + regions[i].off, regions[i].n, seed * 7 + i + 1); /* the update's write */
    }
    assert_int_equal(u->n, N_REGIONS);
    assert_int_equal(undo_restore_all(u, NULL), REFIT_OK);
    int same = !memcmp(buf, orig, BUF_BYTES);
    free(orig);
    assert_true(same);
}

static uint64_t total_saved(void)
{
    uint64_t n = 0;
    for (size_t i = 0; i < N_REGIONS; i++)
        n += regions[i].n;
    return n;
}

/* A budget smaller than the saves: device chunks up to it, never more,
 * the rest on the host, one save split across both; abort is exact. */
static void test_budget_splits_device_and_host(void **state)
{
    (void)state;
    memset(&C, 0, sizeof C);
    unsigned char *buf = malloc(BUF_BYTES);
    assert_non_null(buf);
    undo_pool *pool = NULL;
    undo_log u;
    uint64_t budget = 5 * MIB + 1000;
    undo_init(&u, &pool, budget);
    run_log(&u, &fake, buf, 1);
    assert_true(u.held[UNDO_DEVICE] <= budget);
    assert_true(u.held[UNDO_DEVICE] >= budget - 256); /* the budget is used, not rounded away */
    assert_true(u.placed[UNDO_DEVICE] > 4 * MIB);
    assert_true(u.placed[UNDO_DEVICE] <= budget);
    assert_true(u.placed[UNDO_HOST] > 0);
    assert_int_equal(u.placed[UNDO_DEVICE] + u.placed[UNDO_HOST], total_saved());
    assert_true(u.n_entries > N_REGIONS); /* some save was split */
    assert_true(C.saves_dev > 0 && C.saves_host > 0);
    undo_free(&u);
    uint64_t pooled[2];
    undo_pool_bytes(&pool, pooled);
    assert_true(pooled[UNDO_DEVICE] <= budget);
    undo_pool_free(&pool);
    assert_int_equal(C.dev_frees, C.dev_allocs);
    assert_int_equal(C.host_frees, C.host_allocs);
    free(buf);
}

/* Pooled chunks serve the next update: the same saves allocate nothing,
 * land in the same placements, and the pool does not grow; a pooled
 * device chunk still counts against the budget. */
static void test_pool_reused_without_growth(void **state)
{
    (void)state;
    memset(&C, 0, sizeof C);
    unsigned char *buf = malloc(BUF_BYTES);
    assert_non_null(buf);
    undo_pool *pool = NULL;
    uint64_t budget = 6 * MIB + 4096, placed_dev = 0, pooled0[2] = {0, 0};
    int allocs = 0;
    for (int round = 0; round < 4; round++) {
        undo_log u;
        undo_init(&u, &pool, budget);
        run_log(&u, &fake, buf, 10 + (uint64_t)round);
        assert_true(u.held[UNDO_DEVICE] <= budget);
        if (round == 0) {
            placed_dev = u.placed[UNDO_DEVICE];
            allocs = C.dev_allocs + C.host_allocs;
        } else {
            assert_int_equal(u.placed[UNDO_DEVICE], placed_dev);
            assert_int_equal(C.dev_allocs + C.host_allocs, allocs);
        }
        undo_free(&u);
        uint64_t pooled[2];
        uint32_t n = undo_pool_bytes(&pool, pooled);
        assert_int_equal(n, (uint32_t)allocs);
        if (round == 0)
            memcpy(pooled0, pooled, sizeof pooled);
        assert_memory_equal(pooled, pooled0, sizeof pooled);
    }
    assert_int_equal(C.dev_frees + C.host_frees, 0);
    /* a smaller budget now: the pooled device chunks are still held, so no
     * new device chunk is allocated, however much is saved */
    undo_log u;
    undo_init(&u, &pool, MIB);
    int dev_allocs = C.dev_allocs;
    run_log(&u, &fake, buf, 99);
    assert_true(u.held[UNDO_DEVICE] > MIB);
    assert_int_equal(C.dev_allocs, dev_allocs);
    undo_free(&u);
    undo_pool_free(&pool);
    assert_int_equal(C.dev_frees, C.dev_allocs);
    assert_int_equal(C.host_frees, C.host_allocs);
    free(buf);
}

/* A pool reserved for a set of saves serves those saves with no
 * allocation: large and small, misaligned, several chunks, at budgets
 * that hold none, part or all of them, on a backend with and without
 * device memory, reserved on its thread or in place; the reservation
 * keeps device chunks within the budget and is exact on abort. */
static void test_reserve_covers_saves(void **state)
{
    (void)state;
    unsigned char *buf = malloc(BUF_BYTES);
    assert_non_null(buf);
    enum { SMALL = 3000 };
    undo_span *sp = malloc(sizeof *sp * (N_REGIONS + SMALL));
    assert_non_null(sp);
    const uint64_t budgets[] = {0, MIB + 4097, 6 * MIB + 4096, 1u << 30};
    for (int set = 0; set < 2; set++)
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
            for (int k = 0; k < 2; k++) {
                const backend *be = k ? &fake_host_only : &fake;
                uint32_t n = 0;
                if (set == 0)
                    for (size_t i = 0; i < N_REGIONS; i++)
                        sp[n++] = (undo_span){be, 3, regions[i].n};
                else
                    for (uint32_t i = 0; i < SMALL; i++)
                        sp[n++] = (undo_span){be, 3, 1 + (i * 37) % 300};
                memset(&C, 0, sizeof C);
                undo_pool *pool = NULL;
                assert_int_equal(undo_pool_reserve(&pool, sp, n, budgets[b], (int)b & 1),
                                 REFIT_OK);
                undo_pool_settle(pool);
                undo_pool_stats st;
                undo_pool_stats_get(pool, &st);
                assert_false(st.reserve_failed);
                assert_true(st.reserved[UNDO_DEVICE] <= budgets[b]);
                int allocs = C.dev_allocs + C.host_allocs;
                assert_int_equal((int)st.allocs, allocs);
                undo_log u;
                undo_init(&u, &pool, budgets[b]);
                if (set == 0) {
                    run_log(&u, be, buf, 40 + b);
                } else { /* odd offsets: every piece misaligned its own way */
                    fill(buf, BUF_BYTES, 50 + b);
                    size_t off = 1;
                    for (uint32_t i = 0; i < n; i++) {
                        assert_int_equal(undo_save(&u, be, 3, (char *)buf + off, sp[i].bytes,
                                                   NULL), REFIT_OK);
                        off += sp[i].bytes + 7;
                    }
                    assert_true(off < BUF_BYTES);
                }
                assert_int_equal(C.dev_allocs + C.host_allocs, allocs);
                if (k == 0 && budgets[b] >= (1u << 30))
                    assert_int_equal(u.placed[UNDO_HOST], 0);
                undo_free(&u);
                undo_pool_free(&pool);
                assert_null(pool);
                assert_int_equal(C.dev_frees, C.dev_allocs);
                assert_int_equal(C.host_frees, C.host_allocs);
            }
    free(sp);
    free(buf);
}

/* A host allocator the test lets through one call at a time: each call
 * counts itself in, then waits for the gate. */
static atomic_int gate_entered, gate_open;

static void *f_gated_alloc(size_t n)
{
    atomic_fetch_add(&gate_entered, 1);
    while (!atomic_load(&gate_open))
        nanosleep(&(struct timespec){0, 200 * 1000}, NULL);
    return malloc(n);
}

static const backend gated_host = {
    .name = "gated-host",
    .undo_alloc = f_gated_alloc,
    .undo_free = free,
    .save = f_save,
    .restore = f_restore,
};

static void wait_entered(int n)
{
    while (atomic_load(&gate_entered) < n)
        nanosleep(&(struct timespec){0, 200 * 1000}, NULL);
}

/* A hold (an update that saves nothing is copying) keeps a reservation
 * from allocating its next chunk until it ends; settle (the reservation
 * wanted now) ends it too. Each pinned allocation stalls the driver's
 * other calls while it runs: a restore right after seal waited for the
 * whole reservation. */
static void test_reserve_held_off(void **state)
{
    (void)state;
    undo_span sp[1] = {{&gated_host, 0, 600 * MIB}}; /* three chunks of at most 256 MiB */
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    undo_pool *pool = NULL;
    assert_int_equal(undo_pool_reserve(&pool, sp, 1, 0, 1), REFIT_OK);
    wait_entered(1);
    undo_pool_hold(pool, 1); /* an update begins while the first chunk is allocated */
    atomic_store(&gate_open, 1);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    undo_pool_stats st;
    undo_pool_stats_get(pool, &st);
    assert_true(st.reserving);
    assert_int_equal(atomic_load(&gate_entered), 1);
    undo_pool_hold(pool, 0); /* it ends: the reservation goes on */
    undo_pool_settle(pool);
    undo_pool_stats_get(pool, &st);
    assert_false(st.reserving);
    assert_int_equal(atomic_load(&gate_entered), 3);
    assert_true(st.reserved[UNDO_HOST] >= 600 * MIB);
    /* held, then settled: settle does not wait for the hold to end */
    atomic_store(&gate_open, 0);
    sp[0].bytes = 1200 * MIB;
    assert_int_equal(undo_pool_reserve(&pool, sp, 1, 0, 1), REFIT_OK);
    wait_entered(4);
    undo_pool_hold(pool, 1);
    atomic_store(&gate_open, 1);
    undo_pool_settle(pool);
    assert_true(atomic_load(&gate_entered) > 4);
    undo_pool_free(&pool);
}

/* Budget 0, a backend without device undo memory, or one whose device
 * allocation fails: everything on the host, restored exactly. */
static void test_host_only_cases(void **state)
{
    (void)state;
    unsigned char *buf = malloc(BUF_BYTES);
    assert_non_null(buf);
    for (int k = 0; k < 3; k++) {
        memset(&C, 0, sizeof C);
        C.dev_refuse = k == 2;
        undo_log u;
        undo_init(&u, NULL, k == 0 ? 0 : 1u << 30);
        run_log(&u, k == 1 ? &fake_host_only : &fake, buf, 20 + (uint64_t)k);
        assert_int_equal(u.placed[UNDO_DEVICE], 0);
        assert_int_equal(u.placed[UNDO_HOST], total_saved());
        assert_int_equal(C.saves_dev, 0);
        assert_int_equal(C.dev_allocs, 0);
        assert_true(C.saves_host > 0);
        undo_free(&u); /* no pool: chunks freed */
        assert_int_equal(C.host_frees, C.host_allocs);
    }
    free(buf);
}

/* ---- through the API, on the host backend ---- */

static void open_world(tw *w, uint64_t budget, const char *journal)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = journal ? journal : "";
    o.undo_device_budget = budget;
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    tw_register_test_formats(w);
    tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(w, &cfg);
    tw_update(w, 1, "v1");
}

/* An update with rollback, loaded whole and aborted: returns its stats. */
static refit_txn_stats load_and_abort(tw *w)
{
    size_t n;
    void *snap = tw_snapshot(w, &n);
    uint64_t fp = tw_fp(w);
    refit_txn *t = tw_begin(w, "v2", 1);
    tw_load_all(w, t, 2, NULL);
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_true(tw_fp(w) != fp);
    assert_int_equal(refit_abort(t), REFIT_OK);
    size_t m;
    void *now = tw_snapshot(w, &m);
    int same = m == n && !memcmp(now, snap, n);
    free(now);
    free(snap);
    assert_true(same);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    return st;
}

/* Abort restores bit-exact with the log in host memory, in device memory,
 * and split between them; the stats say which. */
static void test_abort_exact_each_placement(void **state)
{
    (void)state;
    tw w;
    open_world(&w, 0, NULL);
    refit_txn_stats host = load_and_abort(&w);
    tw_close(&w);
    uint64_t total = host.undo_host_bytes;
    assert_true(total > 0);
    assert_int_equal(host.undo_device_bytes, 0);

    open_world(&w, 64u << 20, NULL);
    refit_txn_stats dev = load_and_abort(&w);
    assert_int_equal(dev.undo_device_bytes, total);
    assert_int_equal(dev.undo_host_bytes, 0);
    tw_close(&w);

    uint64_t half = (total / 2) & ~(uint64_t)255;
    open_world(&w, half, NULL);
    refit_txn_stats mix = load_and_abort(&w);
    assert_true(mix.undo_device_bytes > 0 && mix.undo_device_bytes <= half);
    assert_true(mix.undo_host_bytes > 0);
    assert_int_equal(mix.undo_device_bytes + mix.undo_host_bytes, total);
    /* the next updates take the pooled chunks: the same placement */
    for (int i = 0; i < 2; i++) {
        refit_txn_stats again = load_and_abort(&w);
        assert_int_equal(again.undo_device_bytes, mix.undo_device_bytes);
        assert_int_equal(again.undo_host_bytes, mix.undo_host_bytes);
    }
    /* rollback off: nothing saved */
    refit_txn *t = tw_begin(&w, "v3", 0);
    tw_load_all(&w, t, 3, NULL);
    refit_txn_stats off;
    assert_int_equal(refit_txn_stats_get(t, &off), REFIT_OK);
    assert_int_equal(off.undo_device_bytes + off.undo_host_bytes, 0);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_close(&w);
}

typedef struct last_update {
    journal_update_row r;
    int n;
} last_update;

static int keep_last(void *user, const journal_update_row *r)
{
    last_update *l = user;
    l->r = *r;
    l->r.state = NULL; /* borrowed strings are not kept */
    l->n++;
    return 0;
}

static last_update read_last(const char *db)
{
    journal *j;
    char err[256];
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    assert_int_equal(journal_open(&j, db, &o, err, sizeof err), REFIT_OK);
    last_update l = {.n = 0};
    assert_int_equal(journal_updates_list(j, keep_last, &l), REFIT_OK);
    journal_close(j);
    return l;
}

/* The journal records each update's placement with its end; a journal of
 * schema 1 migrates and shows its old updates as not recorded. */
static void test_journal_records_placement(void **state)
{
    (void)state;
    char dir[] = "/tmp/refit-undo-XXXXXX", db[64], cmd[1200];
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/j.db", dir);
    tw w;
    open_world(&w, 0, db);
    refit_txn_stats host = load_and_abort(&w);
    last_update l = read_last(db);
    assert_true(l.r.undo_recorded);
    assert_int_equal(l.r.undo_device_bytes, 0);
    assert_int_equal(l.r.undo_host_bytes, host.undo_host_bytes);
    tw_close(&w);

    uint64_t half = (host.undo_host_bytes / 2) & ~(uint64_t)255;
    open_world(&w, half, db);
    refit_txn_stats mix = load_and_abort(&w);
    l = read_last(db);
    assert_true(l.r.undo_recorded);
    assert_int_equal(l.r.undo_device_bytes, mix.undo_device_bytes);
    assert_int_equal(l.r.undo_host_bytes, mix.undo_host_bytes);
    assert_true(mix.undo_device_bytes > 0 && mix.undo_host_bytes > 0);
    tw_close(&w);

    const char *src = getenv("REFIT_SOURCE_ROOT");
    snprintf(cmd, sizeof cmd, "cp '%s/tests/data/journal-v1.db' '%s/old.db'",
             src ? src : "..", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(db, sizeof db, "%s/old.db", dir);
    journal *j;
    char err[256];
    assert_int_equal(journal_open(&j, db, NULL, err, sizeof err), REFIT_OK); /* migrates */
    journal_close(j);
    l = read_last(db);
    assert_true(l.n > 0);
    assert_false(l.r.undo_recorded);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The model's undo pool, its reservation waited for. */
static undo_pool_stats pool_stats(tw *w)
{
    undo_pool_settle(w->m->undo_pool);
    undo_pool_stats st;
    undo_pool_stats_get(w->m->undo_pool, &st);
    assert_false(st.reserving);
    return st;
}

/* Seal reserves the undo log's memory (on a thread of its own) for a full
 * update with rollback: the first update after seal allocates no chunk,
 * with the log in host memory, in device memory and split between them,
 * and takes exactly what was reserved. REFIT_UNDO_RESERVE=0 keeps the old
 * way (the first update allocates), which this test tells apart. */
static void test_seal_reserves_undo(void **state)
{
    (void)state;
    uint64_t budgets[3] = {0, 64u << 20, 0};
    for (int b = 0; b < 3; b++) {
        for (int off = 0; off < 2; off++) {
            setenv("REFIT_UNDO_RESERVE", off ? "0" : "1", 1);
            tw w;
            refit_options o = REFIT_OPTIONS_INIT;
            o.journal_path = "";
            o.undo_device_budget = budgets[b];
            assert_int_equal(tw_open(&w, &o), REFIT_OK);
            tw_register_test_formats(&w);
            tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
            tt_build_llm(&w, &cfg); /* sealed */
            uint64_t held_dev = 1, held_host = 1;
            assert_int_equal(refit_sys_undo_held(w.m, 1, &held_dev, &held_host), REFIT_OK);
            undo_pool_stats seal = pool_stats(&w);
            assert_int_equal(held_dev, seal.bytes[UNDO_DEVICE]);
            assert_int_equal(held_host, seal.bytes[UNDO_HOST]);
            if (off) {
                assert_int_equal(seal.allocs, 0);
            } else {
                assert_true(seal.allocs > 0);
                assert_false(seal.reserve_failed);
                assert_int_equal(seal.reserved[0] + seal.reserved[1],
                                 seal.bytes[0] + seal.bytes[1]);
                assert_true(seal.reserved[UNDO_DEVICE] <= budgets[b]);
            }
            tw_update(&w, 1, "v1"); /* the first update, with rollback */
            undo_pool_stats after = pool_stats(&w);
            refit_txn_stats first = load_and_abort(&w); /* the next, aborted */
            undo_pool_stats again = pool_stats(&w);
            print_message("# budget %llu, reserve %s: seal %llu chunks (%llu + %llu bytes), "
                          "first update allocated %llu chunks, the next saved %llu + %llu "
                          "bytes\n",
                          (unsigned long long)budgets[b], off ? "off" : "on",
                          (unsigned long long)seal.allocs,
                          (unsigned long long)seal.reserved[0],
                          (unsigned long long)seal.reserved[1],
                          (unsigned long long)(after.allocs - seal.allocs),
                          (unsigned long long)first.undo_device_bytes,
                          (unsigned long long)first.undo_host_bytes);
            if (off) {
                assert_int_equal(held_dev + held_host, 0);
                assert_true(after.allocs > 0); /* the old way: in the first update */
            } else {
                assert_int_equal(after.allocs, seal.allocs);
            }
            assert_int_equal(refit_sys_undo_held(w.m, 0, &held_dev, &held_host), REFIT_OK);
            assert_int_equal(held_dev, again.bytes[UNDO_DEVICE]);
            assert_int_equal(held_host, again.bytes[UNDO_HOST]);
            assert_true(held_dev + held_host > 0);
            if (b == 1)
                assert_int_equal(first.undo_host_bytes, 0);
            if (b == 0)
                assert_int_equal(first.undo_device_bytes, 0);
            /* the next update: no allocation either way */
            assert_int_equal(again.allocs, after.allocs);
            if (b == 1 && off == 0)
                budgets[2] = (first.undo_device_bytes / 2) & ~(uint64_t)255; /* split next */
            if (b == 2) {
                assert_true(first.undo_device_bytes > 0 && first.undo_host_bytes > 0);
            }
            tw_close(&w);
        }
    }
    unsetenv("REFIT_UNDO_RESERVE");
}

/* refit_model_seal_with: undo_reserve 0 reserves nothing and 1 reserves,
 * whatever REFIT_UNDO_RESERVE says (it overrides refit_model_seal's
 * default only, which a NULL opts also takes); an unknown version or
 * value is refused naming it, and the model stays unsealed. */
static void test_seal_opts_undo_reserve(void **state)
{
    (void)state;
    static const struct { int opts, reserve; const char *env; int held; } cases[] = {
        {1, 0, NULL, 0}, {1, 1, "0", 1}, {0, 0, "0", 0}, {0, 0, NULL, 1}, {0, 0, "1", 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].env)
            setenv("REFIT_UNDO_RESERVE", cases[c].env, 1);
        else
            unsetenv("REFIT_UNDO_RESERVE");
        refit_options o = REFIT_OPTIONS_INIT;
        o.journal_path = "";
        refit_ctx *ctx = NULL;
        refit_model *m = NULL;
        float buf[256] = {0};
        int64_t shape[1] = {256};
        refit_tensor t = {buf, {REFIT_DEVICE_CPU, 0}, 1, REFIT_F32, shape, NULL, 0};
        refit_ckpt_spec spec = REFIT_CKPT_SPEC_INIT;
        spec.dtype = REFIT_F32;
        spec.ndim = 1;
        spec.shape[0] = 256;
        assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
        assert_int_equal(refit_model_create(&m, ctx), REFIT_OK);
        assert_int_equal(refit_model_add_module(m, "m", "unquantized", NULL), REFIT_OK);
        assert_int_equal(refit_module_bind_runtime(m, "m", "w", &t), REFIT_OK);
        assert_int_equal(refit_model_expect(m, "m", "x", &spec), REFIT_OK);
        refit_seal_opts bad = REFIT_SEAL_OPTS_INIT;
        bad.version = 2;
        assert_int_equal(refit_model_seal_with(m, &bad), REFIT_EINVAL);
        assert_non_null(strstr(refit_errmsg(ctx), "invalid version 2 on refit_seal_opts"));
        bad.version = 0;
        assert_int_equal(refit_model_seal_with(m, &bad), REFIT_EINVAL);
        bad = (refit_seal_opts)REFIT_SEAL_OPTS_INIT;
        bad.undo_reserve = 2;
        assert_int_equal(refit_model_seal_with(m, &bad), REFIT_EINVAL);
        assert_non_null(strstr(refit_errmsg(ctx), "undo_reserve is 2, not 0 or 1"));
        refit_seal_opts so = REFIT_SEAL_OPTS_INIT;
        so.undo_reserve = cases[c].reserve;
        assert_int_equal(refit_model_seal_with(m, cases[c].opts ? &so : NULL), REFIT_OK);
        uint64_t dev = 1, host = 1;
        assert_int_equal(refit_sys_undo_held(m, 1, &dev, &host), REFIT_OK);
        assert_int_equal(dev, 0);
        if (cases[c].held)
            assert_true(host >= sizeof buf);
        else
            assert_int_equal(host, 0);
        assert_int_equal(refit_model_seal_with(m, NULL), REFIT_ESTATE); /* sealed once */
        refit_close(ctx);
    }
    unsetenv("REFIT_UNDO_RESERVE");
}

/* An update without rollback never waits for the reservation; a model
 * closed while it runs waits for it and frees everything (ASan's check). */
static void test_reserve_close_early(void **state)
{
    (void)state;
    tw w;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(tw_open(&w, &o), REFIT_OK);
    tw_register_test_formats(&w);
    tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(&w, &cfg);
    refit_txn *t = tw_begin(&w, "v1", 0);
    tw_load_all(&w, t, 1, NULL);
    uint64_t d, h;
    assert_int_equal(refit_sys_undo_held(w.m, 1, &d, &h), REFIT_ESTATE); /* an update open */
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_close(&w); /* the reservation perhaps still running */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_splits_device_and_host),
        cmocka_unit_test(test_pool_reused_without_growth),
        cmocka_unit_test(test_host_only_cases),
        cmocka_unit_test(test_reserve_covers_saves),
        cmocka_unit_test(test_abort_exact_each_placement),
        cmocka_unit_test(test_journal_records_placement),
        cmocka_unit_test(test_seal_reserves_undo),
        cmocka_unit_test(test_seal_opts_undo_reserve),
        cmocka_unit_test(test_reserve_close_early),
        cmocka_unit_test(test_reserve_held_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
