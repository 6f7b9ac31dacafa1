/* Many tensors per call: refit_load_many and prepared source sets.
 * A call is the same as one refit_load per row, byte for byte; a bad row
 * anywhere refuses the call with nothing written and the txn usable; a
 * name twice in a call is a duplicate; the staging budget is forecast as
 * the rows fill and free modules; a set is reused across updates,
 * re-pointed, and refused once stale. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* A table of checkpoint rows of version v: names and descriptors. */
typedef struct table {
    int n;
    const char *names[TW_MAX];
    refit_tensor srcs[TW_MAX];
    tt_tensor *tensors[TW_MAX];
} table;

/* Every recorded checkpoint tensor of w (aliases too when with_ties), in
 * declaration order or shuffled by seed. */
static table *table_of(tw *w, uint64_t v, int with_ties, uint64_t seed)
{
    table *tb = calloc(1, sizeof *tb);
    assert_non_null(tb);
    for (int i = 0; i < w->n_ck; i++) {
        if (w->ck[i].spec.tie_of && !with_ties)
            continue;
        tb->names[tb->n] = w->ck[i].name;
        tb->tensors[tb->n] = tw_ckpt_tensor(w, w->ck[i].name, v);
        tb->srcs[tb->n] = tb->tensors[tb->n]->t;
        tb->n++;
    }
    tt_rng r = {seed};
    for (int i = tb->n - 1; seed && i > 0; i--) {
        int j = (int)tt_randn(&r, (uint64_t)i + 1);
        const char *nm = tb->names[i];
        refit_tensor s = tb->srcs[i];
        tt_tensor *t = tb->tensors[i];
        tb->names[i] = tb->names[j], tb->srcs[i] = tb->srcs[j], tb->tensors[i] = tb->tensors[j];
        tb->names[j] = nm, tb->srcs[j] = s, tb->tensors[j] = t;
    }
    return tb;
}

static int snap_equal(const tw *a, const tw *b)
{
    size_t na, nb;
    void *sa = tw_snapshot(a, &na), *sb = tw_snapshot(b, &nb);
    int eq = na == nb && !memcmp(sa, sb, na);
    free(sa);
    free(sb);
    return eq;
}


static void build_llm(tw *w)
{
    tw_register_test_formats(w);
    tt_llm_cfg cfg = {.rank = 1, .tp = 2, .layers = 2, .staged = 1};
    tt_build_llm(w, &cfg);
}

/* Two identical worlds: a loads row by row with refit_load, b in one
 * refit_load_many call. */
typedef struct pair {
    tw a, b;
} pair;

static int pair_setup(void **state)
{
    pair *p = calloc(1, sizeof *p);
    if (!p || tw_open(&p->a, NULL) || tw_open(&p->b, NULL))
        return -1;
    /* these cases go on after a refused call: the caller's opt-in */
    p->a.keep_going = p->b.keep_going = 1;
    *state = p;
    return 0;
}

/* One world whose updates go on after a refused call (keep_going). */
static int kg_setup(void **state)
{
    int rc = tw_setup(state);
    if (!rc)
        ((tw *)*state)->keep_going = 1;
    return rc;
}

static int pair_teardown(void **state)
{
    pair *p = *state;
    tw_close(&p->a);
    tw_close(&p->b);
    free(p);
    return 0;
}

static void load_rows_one_by_one(tw *w, refit_txn *t, const table *tb)
{
    for (int i = 0; i < tb->n; i++) {
        int rc = refit_load(t, tb->names[i], &tb->srcs[i], NULL);
        if (rc)
            fail_msg("load %s: %s", tb->names[i], refit_errmsg(w->ctx));
    }
}

static void load_rows_at_once(tw *w, refit_txn *t, const table *tb)
{
    int rc = refit_load_many(t, (size_t)tb->n, tb->names, tb->srcs, NULL);
    if (rc)
        fail_msg("load_many: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
}

/* One update of both worlds from the same table; the stats and every
 * runtime byte must agree. */
static void update_both(pair *p, uint64_t v, int with_ties, uint64_t seed, int rollback)
{
    char label[16];
    snprintf(label, sizeof label, "v%llu", (unsigned long long)v);
    table *ta = table_of(&p->a, v, with_ties, seed), *tb = table_of(&p->b, v, with_ties, seed);
    refit_txn *t1 = tw_begin(&p->a, label, rollback), *t2 = tw_begin(&p->b, label, rollback);
    load_rows_one_by_one(&p->a, t1, ta);
    load_rows_at_once(&p->b, t2, tb);
    refit_txn_stats s1, s2;
    assert_int_equal(refit_txn_stats_get(t1, &s1), REFIT_OK);
    assert_int_equal(refit_txn_stats_get(t2, &s2), REFIT_OK);
    assert_memory_equal(&s1, &s2, sizeof s1);
    assert_int_equal(refit_finalize(t1), REFIT_OK);
    assert_int_equal(refit_finalize(t2), REFIT_OK);
    assert_true(snap_equal(&p->a, &p->b));
    assert_true(tw_fp(&p->a) == tw_fp(&p->b));
    free(ta);
    free(tb);
}

static void test_many_equals_one_load_per_row(void **state)
{
    pair *p = *state;
    build_llm(&p->a);
    build_llm(&p->b);
    update_both(p, 1, 0, 0, 0);           /* cold start, declaration order */
    update_both(p, 2, 1, 7, 1);           /* tied names too, shuffled, rollback */
    update_both(p, 3, 1, 11, 0);
    assert_int_equal(refit_worker_health(p->b.ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(p->b.ctx), "v3");
}

/* ---- a bad row anywhere ---- */

enum fault { F_NAME, F_DTYPE, F_SHAPE, F_NULL_DATA, F_NULL_NAME, F_NDIM, F_COUNT };

static int apply_fault(tw *w, table *tb, int row, enum fault f, int64_t *shape_buf)
{
    refit_tensor *s = &tb->srcs[row];
    switch (f) {
    case F_NAME:
        tb->names[row] = "model.layers.9.no_such.weight";
        return REFIT_EUNEXPECTED;
    case F_DTYPE:
        s->dtype = s->dtype.bits == 16 ? REFIT_F32 : REFIT_F16;
        return REFIT_EMISMATCH;
    case F_SHAPE:
        memcpy(shape_buf, s->shape, (size_t)s->ndim * sizeof *shape_buf);
        shape_buf[s->ndim - 1] += 1;
        s->shape = shape_buf;
        return REFIT_EMISMATCH;
    case F_NULL_DATA:
        s->data = NULL;
        return REFIT_EINVAL;
    case F_NULL_NAME:
        tb->names[row] = NULL;
        return REFIT_EINVAL;
    case F_NDIM:
        s->ndim = s->ndim + 1;
        return REFIT_EMISMATCH;
    default:
        (void)w;
        return REFIT_OK;
    }
}

static void test_bad_row_refuses_the_call(void **state)
{
    tw *w = *state;
    build_llm(w);
    tw_update(w, 1, "v1");
    for (int f = 0; f < F_COUNT; f++) {
        table *tb = table_of(w, 2, 0, 3);
        int rows[3] = {0, tb->n / 2, tb->n - 1};
        for (int k = 0; k < 3; k++) {
            table *bad = malloc(sizeof *bad);
            assert_non_null(bad);
            memcpy(bad, tb, sizeof *bad);
            int64_t shape_buf[REFIT_MAX_DIMS];
            const char *victim = bad->names[rows[k]];
            int want = apply_fault(w, bad, rows[k], (enum fault)f, shape_buf);
            size_t n;
            void *snap = tw_snapshot(w, &n);
            refit_txn *t = tw_begin(w, "v2", 0); /* rollback off: a write would poison */
            int rc = refit_load_many(t, (size_t)bad->n, bad->names, bad->srcs, NULL);
            if (rc != want)
                fail_msg("fault %d row %d: %s (%s), want %s", f, rows[k], refit_status_name(rc),
                         refit_errmsg(w->ctx), refit_status_name(want));
            char row_txt[32];
            snprintf(row_txt, sizeof row_txt, "row %d (", rows[k]);
            tw_assert_msg(w, "refit_load_many", row_txt, "nothing written");
            if (f != F_NAME && f != F_NULL_NAME)
                tw_assert_msg(w, victim);
            int same = tw_snapshot_equal(w, snap, n);
            free(snap);
            assert_true(same);
            refit_txn_stats st;
            assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
            assert_int_equal(st.tensors_loaded, 0);
            assert_int_equal(st.modules_touched, 0);
            /* the txn goes on: the good table loads and commits */
            load_rows_at_once(w, t, tb);
            assert_int_equal(refit_finalize(t), REFIT_OK);
            assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
            free(bad);
        }
        /* and a refused call then aborted leaves the worker as it was */
        table *bad = malloc(sizeof *bad);
        assert_non_null(bad);
        memcpy(bad, tb, sizeof *bad);
        int64_t shape_buf[REFIT_MAX_DIMS];
        apply_fault(w, bad, tb->n - 1, (enum fault)f, shape_buf);
        refit_txn *t = tw_begin(w, "v3", 0);
        assert_int_not_equal(refit_load_many(t, (size_t)bad->n, bad->names, bad->srcs, NULL),
                             REFIT_OK);
        assert_int_equal(refit_abort(t), REFIT_OK); /* not POISONED: nothing written */
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
        free(bad);
        free(tb);
    }
}

/* ---- duplicates and ties ---- */

/* Without keep_going a refused call fails the update closed: nothing was
 * written, nothing more is taken, finalize cannot commit it, and the worker
 * stays READY at its version with its bytes. */
static void test_refused_call_fails_closed_by_default(void **state)
{
    tw *w = *state;
    build_llm(w);
    tw_update(w, 1, "v1");
    table *tb = table_of(w, 2, 0, 3);
    table *bad = malloc(sizeof *bad);
    assert_non_null(bad);
    memcpy(bad, tb, sizeof *bad);
    int64_t shape_buf[REFIT_MAX_DIMS];
    int want = apply_fault(w, bad, tb->n / 2, F_SHAPE, shape_buf);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    assert_int_equal(refit_load_many(t, (size_t)bad->n, bad->names, bad->srcs, NULL), want);
    tw_assert_msg(w, "nothing written", "keep_going");
    assert_int_equal(refit_load_many(t, (size_t)tb->n, tb->names, tb->srcs, NULL),
                     REFIT_ESTATE);
    assert_int_not_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    int same = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(same);
    free(bad);
    free(tb);
}

static void test_duplicates_in_a_call_refused(void **state)
{
    tw *w = *state;
    build_llm(w);
    tw_update(w, 1, "v1");
    table *tb = table_of(w, 2, 0, 0);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 0);
    /* the same name in rows 1 and 4 */
    const char *names[5] = {tb->names[0], tb->names[1], tb->names[2], tb->names[3],
                            tb->names[1]};
    refit_tensor srcs[5] = {tb->srcs[0], tb->srcs[1], tb->srcs[2], tb->srcs[3], tb->srcs[1]};
    assert_int_equal(refit_load_many(t, 5, names, srcs, NULL), REFIT_EDUPLICATE);
    tw_assert_msg(w, "row 4", tb->names[1], "rows 1 and 4", "nothing written");
    assert_true(tw_snapshot_equal(w, snap, n));
    /* delivered by an earlier call, then again */
    assert_int_equal(refit_load_many(t, 2, names, srcs, NULL), REFIT_OK);
    assert_int_equal(refit_load_many(t, 2, names + 1, srcs + 1, NULL), REFIT_EDUPLICATE);
    tw_assert_msg(w, "row 0", tb->names[1], "delivered twice");
    /* the rest of the table, less rows 0 and 1, commits */
    assert_int_equal(refit_load_many(t, (size_t)tb->n - 2, tb->names + 2, tb->srcs + 2, NULL),
                     REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    free(snap);
    free(tb);
}

static void test_tied_names_in_one_call_write_once(void **state)
{
    tw *w = *state;
    build_llm(w);
    tw_update(w, 1, "v1");
    /* every name, tied ones too, in both orders of each pair */
    for (uint64_t seed = 0; seed < 4; seed++) {
        table *tb = table_of(w, 2 + seed, 1, seed);
        refit_txn *t = tw_begin(w, "v", 1);
        load_rows_at_once(w, t, tb);
        /* and the tied name again in a later call: a duplicate */
        for (int i = 0; i < tb->n; i++) {
            const tw_ckpt *c = tw_find_ckpt(w, tb->names[i]);
            if (!c->spec.tie_of)
                continue;
            assert_int_equal(refit_load_many(t, 1, &tb->names[i], &tb->srcs[i], NULL),
                             REFIT_EDUPLICATE);
        }
        assert_int_equal(refit_finalize(t), REFIT_OK);
        free(tb);
    }
    /* the pair twice in one call: the second of the name is refused */
    table *tb = table_of(w, 9, 1, 0);
    int alias = -1;
    for (int i = 0; i < tb->n && alias < 0; i++)
        if (tw_find_ckpt(w, tb->names[i])->spec.tie_of)
            alias = i;
    assert_true(alias >= 0);
    const char *names[3] = {tb->names[alias], tb->names[0], tb->names[alias]};
    refit_tensor srcs[3] = {tb->srcs[alias], tb->srcs[0], tb->srcs[alias]};
    refit_txn *t = tw_begin(w, "v9", 0);
    assert_int_equal(refit_load_many(t, 3, names, srcs, NULL), REFIT_EDUPLICATE);
    tw_assert_msg(w, "row 2", "rows 0 and 2");
    assert_int_equal(refit_abort(t), REFIT_OK);
    free(tb);
}

/* ---- the staging budget ---- */

/* Modules s0 and s1 of test-scale: w [4, 4] and b [4] f32 each, 128 bytes
 * of staging a module (64-byte slices); the budget holds one at a time. */
static void two_staged(tw *w)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.staging_budget = 200;
    tw_close(w);
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    w->keep_going = 1;
    tw_register_test_formats(w);
    for (int k = 0; k < 2; k++) {
        char mod[8], nw[16], nb[16];
        snprintf(mod, sizeof mod, "s%d", k);
        snprintf(nw, sizeof nw, "s%d.w", k);
        snprintf(nb, sizeof nb, "s%d.b", k);
        tw_module(w, mod, "test-scale", NULL);
        tw_runtime(w, mod, "w", REFIT_F32, 2, TT_SHAPE(4, 4));
        tw_runtime(w, mod, "b", REFIT_F32, 1, TT_SHAPE(4));
        refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 4));
        s.target = "w";
        assert_int_equal(tw_expect(w, mod, nw, &s), REFIT_OK);
        s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
        s.target = "b";
        assert_int_equal(tw_expect(w, mod, nb, &s), REFIT_OK);
    }
    tw_seal(w);
}

static void rows_in_order(tw *w, uint64_t v, const char *const *order, const char **names,
                          refit_tensor *srcs)
{
    for (int i = 0; i < 4; i++) {
        names[i] = order[i];
        srcs[i] = tw_ckpt_tensor(w, order[i], v)->t;
    }
}

static void test_staging_budget_forecast(void **state)
{
    tw *w = *state;
    two_staged(w);
    const char *names[4];
    refit_tensor srcs[4];
    /* module by module: each frees its staging before the next takes it */
    static const char *const fits[4] = {"s0.w", "s0.b", "s1.b", "s1.w"};
    rows_in_order(w, 1, fits, names, srcs);
    refit_txn *t = tw_begin(w, "v1", 1);
    assert_int_equal(refit_load_many(t, 4, names, srcs, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tt_tensor *rw = tw_rt(w, "s1", "w"), *cw = tw_ckpt_tensor(w, "s1.w", 1);
    for (int64_t i = 0; i < 16; i++)
        assert_true(tt_get_flat(rw, i) == 2.0 * tt_get_flat(cw, i));
    /* interleaved: both modules in flight at once, over the budget; one
     * refit_load per row refuses at the same row */
    static const char *const over[4] = {"s0.w", "s1.w", "s0.b", "s1.b"};
    rows_in_order(w, 2, over, names, srcs);
    size_t n;
    void *snap = tw_snapshot(w, &n);
    t = tw_begin(w, "v2", 0);
    assert_int_equal(refit_load_many(t, 4, names, srcs, NULL), REFIT_EBUDGET);
    tw_assert_msg(w, "row 1 (s1.w)", "module s1", "staging budget", "nothing written");
    assert_true(tw_snapshot_equal(w, snap, n));
    assert_int_equal(refit_abort(t), REFIT_OK);
    t = tw_begin(w, "v2", 0);
    assert_int_equal(refit_load(t, names[0], &srcs[0], NULL), REFIT_OK);
    assert_int_equal(refit_load(t, names[1], &srcs[1], NULL), REFIT_EBUDGET);
    /* a module started by an earlier call holds its staging: s0.w then
     * [s1.w, ...] is over too, [s0.b, s1.w, s1.b] fits */
    assert_int_equal(refit_load_many(t, 3, names + 1, srcs + 1, NULL), REFIT_EBUDGET);
    const char *rest[3] = {"s0.b", "s1.w", "s1.b"};
    refit_tensor rs[3] = {srcs[2], srcs[1], srcs[3]};
    assert_int_equal(refit_load_many(t, 3, rest, rs, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    free(snap);
}

/* ---- state ---- */

static void test_many_refused_when_prepared(void **state)
{
    tw *w = *state;
    build_llm(w);
    table *tb = table_of(w, 1, 0, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    assert_int_equal(refit_load_many(t, 0, NULL, NULL, NULL), REFIT_OK); /* nothing to do */
    assert_int_equal(refit_load_many(t, 3, NULL, tb->srcs, NULL), REFIT_EINVAL);
    load_rows_at_once(w, t, tb);
    assert_int_equal(refit_finalize_prepare(t), REFIT_OK);
    assert_int_equal(refit_load_many(t, 1, tb->names, tb->srcs, NULL), REFIT_ESTATE);
    tw_assert_msg(w, "prepared");
    assert_int_equal(refit_commit(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    free(tb);
}

/* ---- source sets ---- */

/* Caller-owned buffers a set points at: one per primary checkpoint name. */
typedef struct bufs {
    int n;
    const char *names[TW_MAX];
    refit_tensor srcs[TW_MAX];
    tt_tensor *t[TW_MAX];
} bufs;

static bufs *bufs_of(tw *w)
{
    bufs *b = calloc(1, sizeof *b);
    assert_non_null(b);
    for (int i = 0; i < w->n_ck; i++) {
        if (w->ck[i].spec.tie_of)
            continue;
        b->names[b->n] = w->ck[i].name;
        b->t[b->n] = tw_ckpt_tensor(w, w->ck[i].name, 0);
        b->srcs[b->n] = b->t[b->n]->t;
        b->n++;
    }
    return b;
}

/* The trainer's step: new values in the same buffers. */
static void bufs_fill(bufs *b, uint64_t v)
{
    for (int i = 0; i < b->n; i++)
        tt_fill(b->t[i], tt_ckpt_seed(b->names[i], v));
}

static void test_set_reused_across_updates(void **state)
{
    pair *p = *state;
    build_llm(&p->a);
    build_llm(&p->b);
    bufs *b = bufs_of(&p->b);
    refit_source_set *set = NULL;
    assert_int_equal(refit_source_set_create(&set, p->b.m, (size_t)b->n, b->names, b->srcs),
                     REFIT_OK);
    assert_int_equal(refit_source_set_count(set), (size_t)b->n);
    for (uint64_t v = 1; v <= 3; v++) {
        tw_update(&p->a, v, "v");
        bufs_fill(b, v);
        refit_txn *t = tw_begin(&p->b, "v", (int)(v & 1));
        int rc = refit_load_set(t, set, NULL);
        if (rc)
            fail_msg("load_set v%llu: %s", (unsigned long long)v, refit_errmsg(p->b.ctx));
        assert_int_equal(refit_finalize(t), REFIT_OK);
        assert_true(snap_equal(&p->a, &p->b));
    }
    /* the set's rows and a later call: duplicates, nothing written */
    refit_txn *t = tw_begin(&p->b, "v4", 0);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_OK);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_EDUPLICATE);
    tw_assert_msg(&p->b, "refit_load_set", "row 0", "nothing written");
    assert_int_equal(refit_finalize(t), REFIT_OK);
    refit_source_set_destroy(set);
    free(b);
}

/* No STAGED module: the set is loaded without the forecast pass into a
 * txn that holds nothing; with it once the txn holds something. Tied
 * names both in the set: written once either way. */
static void test_plain_set_with_tied_names(void **state)
{
    pair *p = *state;
    tt_llm_cfg cfg = {.rank = 0, .tp = 2, .layers = 2, .staged = 0};
    tt_build_llm(&p->a, &cfg);
    tt_build_llm(&p->b, &cfg);
    table *tb = table_of(&p->b, 0, 1, 5);
    refit_source_set *set = NULL;
    assert_int_equal(refit_source_set_create(&set, p->b.m, (size_t)tb->n, tb->names, tb->srcs),
                     REFIT_OK);
    for (uint64_t v = 1; v <= 2; v++) {
        for (int i = 0; i < tb->n; i++) { /* a tied name: its primary's content */
            const tw_ckpt *c = tw_find_ckpt(&p->b, tb->names[i]);
            tt_fill(tb->tensors[i], tt_ckpt_seed(c->spec.tie_of ? c->spec.tie_of : c->name, v));
        }
        tw_update(&p->a, v, "v");
        refit_txn *t = tw_begin(&p->b, "v", 1);
        assert_int_equal(refit_load_set(t, set, NULL), REFIT_OK);
        refit_txn_stats st;
        assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
        assert_int_equal(st.tensors_loaded, (uint64_t)tb->n);
        assert_int_equal(refit_finalize(t), REFIT_OK);
        assert_true(snap_equal(&p->a, &p->b));
    }
    /* one name delivered first: the set's pass finds it a duplicate */
    size_t n;
    void *snap = tw_snapshot(&p->b, &n);
    refit_txn *t = tw_begin(&p->b, "v3", 0);
    assert_int_equal(refit_load(t, tb->names[tb->n - 1], &tb->srcs[tb->n - 1], NULL), REFIT_OK);
    void *snap1 = tw_snapshot(&p->b, &n);
    assert_int_not_equal(refit_load_set(t, set, NULL), REFIT_OK);
    tw_assert_msg(&p->b, "refit_load_set", "nothing written");
    assert_true(tw_snapshot_equal(&p->b, snap1, n));
    assert_int_equal(refit_abort(t), REFIT_EPOISONED); /* the one load, rollback off */
    free(snap);
    free(snap1);
    refit_source_set_destroy(set);
    free(tb);
}

static void test_set_repoint(void **state)
{
    pair *p = *state;
    build_llm(&p->a);
    build_llm(&p->b);
    bufs *b = bufs_of(&p->b), *b2 = bufs_of(&p->b);
    refit_source_set *set = NULL;
    assert_int_equal(refit_source_set_create(&set, p->b.m, (size_t)b->n, b->names, b->srcs),
                     REFIT_OK);
    bufs_fill(b, 1);
    bufs_fill(b2, 2);
    void *data[TW_MAX];
    for (int i = 0; i < b->n; i++)
        data[i] = b2->srcs[i].data;
    assert_int_equal(refit_source_set_repoint(set, (size_t)b->n, data), REFIT_OK);
    refit_txn *t = tw_begin(&p->b, "v2", 1);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_update(&p->a, 2, "v2");
    assert_true(snap_equal(&p->a, &p->b));
    /* a NULL pointer is refused, the set kept as it was (at b2) */
    data[3] = NULL;
    assert_int_equal(refit_source_set_repoint(set, (size_t)b->n, data), REFIT_EINVAL);
    tw_assert_msg(&p->b, "row 3", b->names[3], "NULL");
    assert_int_equal(refit_source_set_repoint(set, 2, data), REFIT_EINVAL);
    bufs_fill(b2, 3);
    t = tw_begin(&p->b, "v3", 1);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_update(&p->a, 3, "v3");
    assert_true(snap_equal(&p->a, &p->b));
    refit_source_set_destroy(set);
    free(b);
    free(b2);
}

static void test_set_build_refused(void **state)
{
    tw *w = *state;
    build_llm(w);
    bufs *b = bufs_of(w);
    refit_source_set *set = (refit_source_set *)1;
    /* the model is sealed by build_llm; a fresh one is not */
    refit_model *m2 = NULL;
    assert_int_equal(refit_source_set_create(NULL, w->m, 0, NULL, NULL), REFIT_EINVAL);
    const char *names[3] = {b->names[0], b->names[1], b->names[0]};
    refit_tensor srcs[3] = {b->srcs[0], b->srcs[1], b->srcs[0]};
    assert_int_equal(refit_source_set_create(&set, w->m, 3, names, srcs), REFIT_EDUPLICATE);
    assert_null(set);
    tw_assert_msg(w, "row 2", b->names[0], "row 0");
    srcs[2] = b->srcs[2];
    names[2] = b->names[2];
    srcs[1].dtype = srcs[1].dtype.bits == 16 ? REFIT_F32 : REFIT_F16;
    assert_int_equal(refit_source_set_create(&set, w->m, 3, names, srcs), REFIT_EMISMATCH);
    tw_assert_msg(w, "source set", "row 1", b->names[1], "dtype");
    names[1] = "no.such.tensor";
    assert_int_equal(refit_source_set_create(&set, w->m, 3, names, srcs), REFIT_EUNEXPECTED);
    tw_assert_msg(w, "row 1", "no.such.tensor");
    assert_int_equal(refit_source_set_create(&set, w->m, 3, NULL, srcs), REFIT_EINVAL);
    (void)m2;
    free(b);
}

static void test_set_unsealed_refused(void **state)
{
    tw *w = *state;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "x", &s), REFIT_OK);
    tt_tensor *x = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(4));
    const char *name = "x";
    refit_source_set *set = NULL;
    assert_int_equal(refit_source_set_create(&set, w->m, 1, &name, &x->t), REFIT_ESTATE);
    tw_assert_msg(w, "not sealed");
    tw_seal(w);
    assert_int_equal(refit_source_set_create(&set, w->m, 1, &name, &x->t), REFIT_OK);
    refit_source_set_destroy(set);
    refit_source_set_destroy(NULL);
}

static void test_stale_set_refused(void **state)
{
    pair *p = *state;
    build_llm(&p->a);
    build_llm(&p->b);
    bufs *b = bufs_of(&p->a);
    refit_source_set *set = NULL, *other = NULL;
    assert_int_equal(refit_source_set_create(&set, p->a.m, (size_t)b->n, b->names, b->srcs),
                     REFIT_OK);
    assert_int_equal(refit_source_set_create(&other, p->a.m, 1, b->names, b->srcs), REFIT_OK);
    bufs_fill(b, 1);
    /* another model's set */
    refit_txn *t = tw_begin(&p->b, "v1", 1);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_ESTATE);
    tw_assert_msg(&p->b, "stale", "another model", "nothing written");
    assert_int_equal(refit_load_set(t, NULL, NULL), REFIT_EINVAL);
    assert_int_equal(refit_abort(t), REFIT_OK);
    /* its model destroyed (the context kept, a new model made) */
    refit_source_set_destroy(other); /* unlinked before: the model's list stays sound */
    refit_model_destroy(p->a.m);
    p->a.m = NULL;
    void *data[TW_MAX] = {0};
    for (int i = 0; i < b->n; i++)
        data[i] = b->srcs[i].data;
    assert_int_equal(refit_source_set_repoint(set, (size_t)b->n, data), REFIT_ESTATE);
    t = tw_begin(&p->b, "v1", 1);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_ESTATE);
    tw_assert_msg(&p->b, "stale", "its model was destroyed");
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.tensors_loaded, 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(refit_source_set_count(set), (size_t)b->n);
    refit_source_set_destroy(set); /* after its model: still freed cleanly */
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_many_equals_one_load_per_row, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_bad_row_refuses_the_call, kg_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_refused_call_fails_closed_by_default, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_in_a_call_refused, kg_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_tied_names_in_one_call_write_once, kg_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_staging_budget_forecast, kg_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_many_refused_when_prepared, kg_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_set_reused_across_updates, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_plain_set_with_tied_names, pair_setup,
                                        pair_teardown),
        cmocka_unit_test_setup_teardown(test_set_repoint, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(test_set_build_refused, kg_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_set_unsealed_refused, kg_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_stale_set_refused, pair_setup, pair_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
