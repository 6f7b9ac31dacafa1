/* An update's scope is explicit (DESIGN.md, rule 3): by default it delivers
 * every module and finalize refuses otherwise, naming what is missing; a
 * partial update (a delta) is an opt-in, and each module's version says
 * what it holds. A refused load fails the update closed unless the caller
 * opted to go on. refit_update_opts version 1 callers keep working. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Module "m": runtime w [4] from "m.w"; module "n": runtime b [6] from "n.b". */
static void two_modules(tw *w)
{
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "m", "m.w", &s), REFIT_OK);
    tw_module(w, "n", "unquantized", NULL);
    tw_runtime(w, "n", "b", REFIT_F32, 1, TT_SHAPE(6));
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(6));
    assert_int_equal(tw_expect(w, "n", "n.b", &s), REFIT_OK);
    tw_seal(w);
}

/* A refused load, then finalize: the update must not commit. */
static void test_refused_load_fails_closed(void **state)
{
    tw *w = *state;
    two_modules(w);
    tw_update(w, 1, "v1");
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    tt_tensor *wrong = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(5));
    assert_int_equal(refit_load(t, "m.w", &wrong->t, NULL), REFIT_EMISMATCH);
    tw_assert_msg(w, "m.w", "update 'v2' failed", "keep_going");
    /* nothing more is accepted, and finalize aborts */
    assert_int_equal(tw_load(w, t, "n.b", 2), REFIT_ESTATE);
    assert_int_equal(refit_finalize(t), REFIT_EMISMATCH);
    tw_assert_msg(w, "failed earlier", "update aborted");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    int kept = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(kept);
}

/* An unknown name is a refusal too. */
static void test_unknown_name_fails_closed(void **state)
{
    tw *w = *state;
    two_modules(w);
    refit_txn *t = tw_begin(w, "v1", 1);
    tt_tensor *src = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(refit_load(t, "mystery", &src->t, NULL), REFIT_EUNEXPECTED);
    assert_int_equal(tw_load(w, t, "m.w", 1), REFIT_ESTATE);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

static void test_keep_going_after_refusal(void **state)
{
    tw *w = *state;
    two_modules(w);
    tw_update(w, 1, "v1");
    w->keep_going = 1;
    refit_txn *t = tw_begin(w, "v2", 1);
    tt_tensor *wrong = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(5));
    assert_int_equal(refit_load(t, "m.w", &wrong->t, NULL), REFIT_EMISMATCH);
    assert_null(strstr(refit_errmsg(w->ctx), "keep_going"));
    assert_int_equal(tw_load(w, t, "m.w", 2), REFIT_OK);
    assert_int_equal(tw_load(w, t, "n.b", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
}

/* Default scope: an update that delivers one of two modules is refused. */
static void test_missing_module_refused(void **state)
{
    tw *w = *state;
    two_modules(w);
    tw_update(w, 1, "v1");
    size_t n;
    void *snap = tw_snapshot(w, &n);
    refit_txn *t = tw_begin(w, "v2", 1);
    assert_int_equal(tw_load(w, t, "m.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "update 'v2' delivered 1 of 2 modules", "module n is missing",
                  "refit_update_opts.partial", "bytes rolled back");
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_string_equal(refit_module_version(w->m, "m"), "v1");
    int kept = tw_snapshot_equal(w, snap, n);
    free(snap);
    assert_true(kept);
    /* nothing delivered at all: refused the same way */
    t = tw_begin(w, "v3", 1);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "delivered 0 of 2 modules", "module m (and others) is missing");
    assert_string_equal(refit_worker_version(w->ctx), "v1");
}

static void test_partial_update(void **state)
{
    tw *w = *state;
    two_modules(w);
    tw_update(w, 1, "v1");
    assert_string_equal(refit_module_version(w->m, "n"), "v1");
    w->partial = 1;
    refit_txn *t = tw_begin(w, "v2", 1);
    assert_int_equal(tw_load(w, t, "m.w", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v2 (partial: 1 of 2 modules)");
    assert_string_equal(refit_module_version(w->m, "m"), "v2");
    assert_string_equal(refit_module_version(w->m, "n"), "v1");
    assert_memory_equal(tw_rt(w, "m", "w")->buf, tw_ckpt_tensor(w, "m.w", 2)->buf, 16);
    assert_memory_equal(tw_rt(w, "n", "b")->buf, tw_ckpt_tensor(w, "n.b", 1)->buf, 24);
    /* a partial update that delivers nothing adopts no label */
    t = tw_begin(w, "v3", 1);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v2 (partial: 1 of 2 modules)");
    /* a full update brings every module to one version */
    w->partial = 0;
    tw_update(w, 4, "v4");
    assert_string_equal(refit_worker_version(w->ctx), "v4");
    assert_string_equal(refit_module_version(w->m, "n"), "v4");
    assert_null(refit_module_version(w->m, "nope"));
    assert_null(refit_module_version(NULL, "m"));
}

/* A partial update still must deliver a module that was never loaded. */
static void test_partial_cold_start_refused(void **state)
{
    tw *w = *state;
    two_modules(w);
    w->partial = 1;
    refit_txn *t = tw_begin(w, "v1", 1);
    assert_int_equal(tw_load(w, t, "m.w", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    tw_assert_msg(w, "module n was never loaded");
    assert_null(refit_module_version(w->m, "m"));
}

/* A version 1 caller's struct ends at fingerprint: nothing beyond is read
 * (ASan reports a read past this exact-size allocation), and it gets the
 * default scope. */
static void test_v1_options_accepted(void **state)
{
    tw *w = *state;
    two_modules(w);
    struct update_opts_v1 { /* refit_update_opts as version 1 had it */
        uint32_t version;
        const char *version_label, *source_uri;
        int rollback;
        const char *source_digest;
        int fingerprint;
    };
    assert_int_equal(sizeof(struct update_opts_v1), offsetof(refit_update_opts, partial) + 4);
    struct update_opts_v1 *o = calloc(1, sizeof *o);
    assert_non_null(o);
    o->version = 1;
    o->version_label = "v1";
    o->rollback = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, (const refit_update_opts *)(void *)o), REFIT_OK);
    free(o);
    assert_int_equal(tw_load(w, t, "m.w", 1), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    refit_update_opts bad = REFIT_UPDATE_OPTS_INIT;
    bad.version = REFIT_UPDATE_OPTS_VERSION + 1;
    assert_int_equal(refit_begin(&t, w->m, &bad), REFIT_EINVAL);
    char want[32];
    snprintf(want, sizeof want, "unknown version %d", REFIT_UPDATE_OPTS_VERSION + 1);
    tw_assert_msg(w, want);
}

/* refit.h: the txn is freed either way; on a prepared txn finalize commits. */
static void test_finalize_after_prepare(void **state)
{
    tw *w = *state;
    two_modules(w);
    refit_txn *t = tw_begin(w, "v1", 1);
    tw_load_all(w, t, 1, NULL);
    assert_int_equal(refit_finalize_prepare(t), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_UPDATING);
    assert_int_equal(refit_finalize(t), REFIT_OK); /* LeakSanitizer: t is freed */
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
}

static void test_partial_journaled(void **state)
{
    (void)state;
    char dir[] = "/tmp/refit-scope-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/j.db", dir);
    refit_options opt = REFIT_OPTIONS_INIT;
    opt.journal_path = path;
    tw w;
    assert_int_equal(tw_open(&w, &opt), REFIT_OK);
    two_modules(&w);
    tw_update(&w, 1, "v1");
    w.partial = 1;
    refit_txn *t = tw_begin(&w, "v2", 1);
    assert_int_equal(tw_load(&w, t, "n.b", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    tw_close(&w);
    assert_int_equal(tw_sql_count(path, "SELECT count(*) FROM updates WHERE partial = 0 AND "
                                      "version = 'v1' AND state = 'committed'"), 1);
    assert_int_equal(tw_sql_count(path, "SELECT count(*) FROM updates WHERE partial = 1 AND "
                                      "version = 'v2' AND state = 'committed'"), 1);
    assert_int_equal(tw_sql_count(path, "SELECT count(*) FROM workers WHERE "
                                      "version = 'v2 (partial: 1 of 2 modules)'"), 1);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_refused_load_fails_closed, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_name_fails_closed, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_keep_going_after_refusal, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_missing_module_refused, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_partial_update, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_partial_cold_start_refused, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_v1_options_accepted, tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_finalize_after_prepare, tw_setup, tw_teardown),
        cmocka_unit_test(test_partial_journaled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
