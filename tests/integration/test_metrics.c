/* refit_metrics_text on the host backend (issue 33): the counters,
 * histograms and gauges move as a scripted sequence of updates says they
 * must (commits, refusals, aborts with and without rollback, a failed
 * finalize, a poisoned worker, a replay from a file, a restore from a
 * snapshot), the text is
 * well-formed exposition, and the series of the journal agree with
 * refitctl metrics' reading of the same journal (tests/python/
 * test_metrics.py checks that side). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/metrics_text.h"
#include "core/safetensors_write.h"
#include "tests/integration/three_modules.h"

#define TENSOR_BYTES (ROWS * COLS * 4)

typedef struct world {
    char dir[64], db[96], ckpt[96];
    refit_ctx *ctx;
    refit_model *model;
    float rt[N_MOD][ROWS * COLS];
    int64_t shape[2];
    refit_tensor desc[N_MOD];
    float ck[N_MOD][ROWS * COLS];
    char *text;
} world;

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    if (!w)
        return -1;
    snprintf(w->dir, sizeof w->dir, "/tmp/refit-metrics-XXXXXX");
    if (!mkdtemp(w->dir))
        return -1;
    snprintf(w->db, sizeof w->db, "%s/j.db", w->dir);
    snprintf(w->ckpt, sizeof w->ckpt, "%s/model.safetensors", w->dir);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "w\"0";   /* a quote, escaped in the labels */
    o.rank = 3;
    o.journal_path = w->db;
    if (refit_open(&w->ctx, &o) || refit_model_create(&w->model, w->ctx) ||
        three_modules_add(w->model, w->rt, w->shape, w->desc))
        return -1;
    if (refit_model_seal(w->model))
        return -1;
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    refit_metrics_free(w->text);
    refit_close(w->ctx);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", w->dir);
    int rc = system(cmd);
    free(w);
    return rc ? -1 : 0;
}

static void make_version(world *w, int version)
{
    for (int i = 0; i < N_MOD; i++)
        for (int k = 0; k < ROWS * COLS; k++)
            w->ck[i][k] = (float)(version * 1000 + i * 100) + (float)k;
}

static refit_txn *begin(world *w, const char *label, const char *uri, int rollback)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = label;
    uo.source_uri = uri;
    uo.rollback = rollback;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    return t;
}

static void load(world *w, refit_txn *t, int i)
{
    refit_tensor src = {.data = w->ck[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                        .dtype = REFIT_F32, .shape = w->shape};
    assert_int_equal(refit_load(t, three_modules_name(i), &src, NULL), REFIT_OK);
}

/* The text now (kept in w for teardown). */
static const char *metrics(world *w)
{
    refit_metrics_free(w->text);
    w->text = NULL;
    size_t len = 0;
    assert_int_equal(refit_metrics_text(w->ctx, &w->text, &len), REFIT_OK);
    assert_non_null(w->text);
    assert_int_equal(len, strlen(w->text));
    return w->text;
}

/* The value of one series: name and labels after worker and rank, exactly
 * as printed ("" for none, else ",k=\"v\""); NAN when absent. */
static double value(const char *text, const char *name, const char *labels)
{
    char key[256];
    snprintf(key, sizeof key, "\n%s{worker=\"w\\\"0\",rank=\"3\"%s} ", name, labels);
    const char *at = strstr(text, key);
    return at ? strtod(at + strlen(key), NULL) : NAN;
}

#define V(name, labels) value(metrics(w), name, labels)

static void test_counters_follow_a_scripted_sequence(void **state)
{
    world *w = *state;
    const double tb = TENSOR_BYTES;
    /* nothing happened yet: every counter at 0, health EMPTY */
    assert_true(V("refit_updates_started_total", "") == 0);
    assert_true(V("refit_health", ",state=\"empty\"") == 1);
    assert_true(V("refit_health", ",state=\"ready\"") == 0);
    assert_null(strstr(metrics(w), "refit_version_info{"));

    /* 1. v1 from memory, committed */
    make_version(w, 1);
    refit_txn *t = begin(w, "v1", NULL, 1);
    assert_true(V("refit_health", ",state=\"updating\"") == 1);
    for (int i = 0; i < N_MOD; i++)
        load(w, t, i);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_true(V("refit_updates_started_total", "") == 1);
    assert_true(V("refit_updates_committed_total", "") == 1);
    assert_true(V("refit_source_bytes_total", ",source=\"memory\"") == 3 * tb);
    assert_true(V("refit_route_bytes_total", ",route=\"direct\",format=\"unquantized\"") == 3 * tb);
    assert_true(V("refit_update_bytes_count", "") == 1);
    assert_true(V("refit_update_bytes_sum", "") == 3 * tb);
    assert_true(V("refit_update_bytes_bucket", ",le=\"1024\"") == 0);
    assert_true(V("refit_update_bytes_bucket", ",le=\"16384\"") == 1); /* 6144 bytes */
    assert_true(V("refit_update_duration_seconds_count", ",outcome=\"committed\"") == 1);
    assert_true(V("refit_update_phase_seconds_count", ",phase=\"load\"") == 1);
    assert_true(V("refit_version_info", ",version=\"v1\"") == 1);
    assert_true(V("refit_version_commit_time_seconds", "") > 1.7e9);
    assert_true(V("refit_health", ",state=\"ready\"") == 1);

    /* 2. refusals: a second begin while one is open, an unknown tensor
     * (which fails the update closed; the caller aborts: nothing written) */
    t = begin(w, "v2", NULL, 1);
    refit_txn *t2 = NULL;
    assert_int_equal(refit_begin(&t2, w->model, NULL), REFIT_ESTATE);
    refit_tensor src = {.data = w->ck[0], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                        .dtype = REFIT_F32, .shape = w->shape};
    int rc = refit_load(t, "model.nope.weight", &src, NULL);
    assert_true(rc < 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    char lab[64];
    snprintf(lab, sizeof lab, ",status=\"%s\"", refit_status_name(rc));
    assert_true(V("refit_refusals_total", ",status=\"REFIT_ESTATE\"") == 1);
    assert_true(V("refit_refusals_total", lab) == 1);
    assert_true(V("refit_updates_started_total", "") == 2); /* the refused begin is not one */
    assert_true(V("refit_updates_aborted_total", ",reason=\"caller\"") == 1);
    assert_true(V("refit_rollbacks_total", "") == 0);          /* nothing was written */

    /* 3. rollback after a write: restored */
    make_version(w, 2);
    t = begin(w, "v2", NULL, 1);
    load(w, t, 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(V("refit_updates_aborted_total", ",reason=\"caller\"") == 2);
    assert_true(V("refit_rollbacks_total", "") == 1);
    assert_true(V("refit_update_duration_seconds_count", ",outcome=\"aborted\"") == 2);
    assert_true(V("refit_undo_bytes", ",placement=\"host\"") == tb); /* one tensor saved */
    assert_true(V("refit_undo_bytes", ",placement=\"device\"") == 0);

    /* 4. an incomplete update: finalize refuses the commit, rolls back */
    t = begin(w, "v2", NULL, 1);
    load(w, t, 0);
    load(w, t, 1);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    assert_true(V("refit_updates_aborted_total", ",reason=\"finalize\"") == 1);
    assert_true(V("refit_rollbacks_total", "") == 2);
    assert_true(V("refit_updates_poisoned_total", ",reason=\"finalize\"") == 0);

    /* 5. a file update without rollback, aborted after one tensor: poisoned */
    st_out_tensor ot[N_MOD];
    for (int i = 0; i < N_MOD; i++)
        ot[i] = (st_out_tensor){three_modules_name(i), ST_F32, 2, w->shape, w->ck[i]};
    st_error err;
    assert_int_equal(st_write_file(w->ckpt, ot, N_MOD, NULL, 0, &err), REFIT_OK);
    refit_source *fs = NULL;
    assert_int_equal(refit_source_open(&fs, w->ctx, w->ckpt), REFIT_OK);
    char ident[REFIT_SOURCE_ID_SIZE];
    assert_int_equal(refit_source_identity(fs, ident), REFIT_OK);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "v2";
    uo.source_uri = refit_source_uri(fs);
    uo.source_digest = ident;
    uo.rollback = 0;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    int64_t failed_id = refit_txn_journal_id(t);
    load(w, t, 0);
    refit_source_close(fs);
    assert_int_equal(refit_abort_reason(t, "trainer lost"), REFIT_EPOISONED);
    assert_true(V("refit_updates_aborted_total", ",reason=\"caller\"") == 3);
    assert_true(V("refit_updates_poisoned_total", ",reason=\"caller\"") == 1);
    assert_true(V("refit_rollbacks_total", "") == 2);
    assert_true(V("refit_source_bytes_total", ",source=\"file\"") == tb);
    assert_true(V("refit_health", ",state=\"poisoned\"") == 1);
    assert_true(V("refit_health", ",state=\"ready\"") == 0);
    assert_null(strstr(metrics(w), "refit_version_info{")); /* serving nothing */

    /* 6. the replay from the file: READY at v2 */
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    assert_int_equal(refit_replay(w->model, failed_id, &ro), REFIT_OK);
    assert_true(V("refit_replays_started_total", "") == 1);
    assert_true(V("refit_replays_committed_total", "") == 1);
    assert_true(V("refit_updates_started_total", "") == 6);
    assert_true(V("refit_updates_committed_total", "") == 2);
    /* started = committed + aborted, nothing in flight */
    double aborted = 0;
    static const char *reasons[] = {"caller", "failed", "finalize", "interrupted"};
    for (int i = 0; i < 4; i++) {
        snprintf(lab, sizeof lab, ",reason=\"%s\"", reasons[i]);
        aborted += V("refit_updates_aborted_total", lab);
    }
    assert_true(aborted == 4);
    assert_true(V("refit_source_bytes_total", ",source=\"file\"") == 4 * tb);
    assert_true(V("refit_health", ",state=\"ready\"") == 1);
    assert_true(V("refit_version_info", ",version=\"v2\"") == 1);
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
    /* every phase observed once per ended update (6 begun, 6 ended) */
    assert_true(V("refit_update_phase_seconds_count", ",phase=\"finalize\"") == 6);
    assert_true(V("refit_update_phase_seconds_count", ",phase=\"journal\"") == 6);
    assert_true(V("refit_update_phase_seconds_sum", ",phase=\"journal\"") > 0);
    assert_true(V("refit_route_bytes_total", ",route=\"direct\",format=\"unquantized\"") ==
                3 * tb + 1 * tb + 2 * tb + 1 * tb + 3 * tb);

    /* 7. a snapshot of v2, an update to v3, the snapshot restored */
    char snap[128];
    snprintf(snap, sizeof snap, "%s/snap", w->dir);
    assert_int_equal(refit_snapshot_write(w->model, snap), REFIT_OK);
    make_version(w, 3);
    t = begin(w, "v3", NULL, 1);
    for (int i = 0; i < N_MOD; i++)
        load(w, t, i);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_true(V("refit_restores_started_total", "") == 0);
    refit_restore_opts rs = REFIT_RESTORE_OPTS_INIT;
    assert_int_equal(refit_restore(w->model, snap, &rs), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_true(V("refit_restores_started_total", "") == 1);
    assert_true(V("refit_restores_committed_total", "") == 1);
    assert_true(V("refit_replays_started_total", "") == 1);
    assert_true(V("refit_updates_started_total", "") == 8);
    assert_true(V("refit_updates_committed_total", "") == 4);
    assert_true(V("refit_version_info", ",version=\"v2\"") == 1);
}

/* Exposition rules a parser relies on: every family once, HELP then
 * TYPE before its samples, samples of a family together, histogram
 * buckets cumulative and ending at +Inf equal to _count. */
static void test_text_is_well_formed(void **state)
{
    world *w = *state;
    make_version(w, 1);
    refit_txn *t = begin(w, "v\n1", NULL, 1); /* a newline, escaped in the label */
    for (int i = 0; i < N_MOD; i++)
        load(w, t, i);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    const char *text = metrics(w);
    assert_non_null(strstr(text, "refit_version_info{worker=\"w\\\"0\",rank=\"3\",version=\"v\\n1\"} 1\n"));
    char fams[64][64];
    int n_fams = 0;
    char cur[64] = "";
    double last_bucket = -1;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        assert_non_null(end); /* every line ends */
        char l[512];
        size_t n = (size_t)(end - line);
        assert_true(n < sizeof l);
        memcpy(l, line, n);
        l[n] = '\0';
        line = end + 1;
        if (!strncmp(l, "# HELP ", 7)) {
            sscanf(l + 7, "%63s", cur);
            for (int i = 0; i < n_fams; i++)
                assert_string_not_equal(fams[i], cur);
            assert_true(n_fams < 64);
            strcpy(fams[n_fams++], cur);
            last_bucket = -1;
            continue;
        }
        if (!strncmp(l, "# TYPE ", 7)) {
            char name[64], type[16];
            assert_int_equal(sscanf(l + 7, "%63s %15s", name, type), 2);
            assert_string_equal(name, cur);
            continue;
        }
        assert_true(strncmp(l, cur, strlen(cur)) == 0); /* a sample of the current family */
        const char *sp = strrchr(l, ' ');
        assert_non_null(sp);
        char *num_end;
        double v = strtod(sp + 1, &num_end);
        assert_true(*num_end == '\0');
        if (strstr(l, "_bucket{")) {
            if (strstr(l, "le=\"0.001\"") || strstr(l, "le=\"1024\""))
                last_bucket = -1;
            assert_true(v >= last_bucket);
            last_bucket = v;
        } else if (strstr(l, "_count{")) {
            assert_true(v == last_bucket); /* +Inf equals _count */
        }
    }
    assert_int_equal(n_fams, 20); /* docs/operators.md: 12 counters, 3 histograms, 5 gauges */
}

static void test_refuses_null(void **state)
{
    world *w = *state;
    char *text = (char *)1;
    assert_int_equal(refit_metrics_text(NULL, &text, NULL), REFIT_EINVAL);
    assert_null(text);
    assert_int_equal(refit_metrics_text(w->ctx, NULL, NULL), REFIT_EINVAL);
    refit_metrics_free(NULL);
}

/* The reason and source rules refitctl applies to a journal's text. */
static void test_classifiers(void **state)
{
    (void)state;
    assert_int_equal(metrics_reason_of(NULL, false), METRICS_REASON_CALLER);
    assert_int_equal(metrics_reason_of("aborted by the caller", false), METRICS_REASON_CALLER);
    assert_int_equal(metrics_reason_of("finalize: module m0 is partly delivered", false),
                     METRICS_REASON_FINALIZE);
    assert_int_equal(metrics_reason_of("finalize: the update failed earlier (REFIT_EIO); aborted",
                                       false), METRICS_REASON_FAILED);
    assert_int_equal(metrics_reason_of("aborted by the caller", true),
                     METRICS_REASON_INTERRUPTED);
    assert_int_equal(metrics_source_of(NULL), METRICS_SOURCE_MEMORY);
    assert_int_equal(metrics_source_of("memory://x"), METRICS_SOURCE_MEMORY);
    assert_int_equal(metrics_source_of("file:///a/b"), METRICS_SOURCE_FILE);
    assert_int_equal(metrics_source_of("nccl://rank0/00ff"), METRICS_SOURCE_NCCL);
    assert_int_equal(metrics_source_of("loopback://rank0/00ff"), METRICS_SOURCE_NCCL);
    assert_int_equal(metrics_source_of("ipc:///run/x.sock"), METRICS_SOURCE_IPC);
    assert_int_equal(metrics_source_of("snapshot:///a/snap"), METRICS_SOURCE_SNAPSHOT);
    assert_int_equal(metrics_source_of("keeper:///run/k.sock"), METRICS_SOURCE_KEEPER);
    /* both restores count as restores; the transports' updates do not */
    assert_true(metrics_source_is_restore(METRICS_SOURCE_SNAPSHOT));
    assert_true(metrics_source_is_restore(METRICS_SOURCE_KEEPER));
    assert_false(metrics_source_is_restore(METRICS_SOURCE_IPC));
    assert_false(metrics_source_is_restore(METRICS_SOURCE_FILE));
}

/* A second format that routes every tensor DIRECT, as unquantized does. */
static int direct_plan(const refit_host_v2 *host, refit_fmt_module *m)
{
    (void)host;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_DIRECT;
    m->flags = 0;
    return REFIT_OK;
}

static const refit_format_v2 fmt_direct = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "t-direct",
    .plan = direct_plan,
};

/* Route bytes of modules of two formats loaded in turns (each load's
 * format another than the last's): each format's sum, committed or
 * aborted, its series in the order the formats were first loaded. */
static void test_route_bytes_of_formats_in_turns(void **state)
{
    (void)state;
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "w\"0";
    o.rank = 3;
    o.journal_path = "";
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &fmt_direct), REFIT_OK);
    assert_int_equal(refit_model_create(&w->model, w->ctx), REFIT_OK);
    static const char *fmts[N_MOD] = {"unquantized", "t-direct", "unquantized"};
    w->shape[0] = ROWS;
    w->shape[1] = COLS;
    for (int i = 0; i < N_MOD; i++) {
        char mod[16];
        snprintf(mod, sizeof mod, "m%d", i);
        w->desc[i] = (refit_tensor){.data = w->rt[i], .device = {REFIT_DEVICE_CPU, 0},
                                    .ndim = 2, .dtype = REFIT_F32, .shape = w->shape};
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = REFIT_F32;
        s.ndim = 2;
        s.shape[0] = ROWS;
        s.shape[1] = COLS;
        assert_int_equal(refit_model_add_module(w->model, mod, fmts[i], NULL), REFIT_OK);
        assert_int_equal(refit_module_bind_runtime(w->model, mod, "w", &w->desc[i]), REFIT_OK);
        assert_int_equal(refit_model_expect(w->model, mod, three_modules_name(i), &s), REFIT_OK);
    }
    assert_int_equal(refit_model_seal(w->model), REFIT_OK);
    const double tb = TENSOR_BYTES;
    const char *unq = ",route=\"direct\",format=\"unquantized\"";
    const char *dir = ",route=\"direct\",format=\"t-direct\"";

    make_version(w, 1);
    refit_txn *t = begin(w, "v1", NULL, 1);
    for (int i = 0; i < N_MOD; i++) /* unquantized, t-direct, unquantized */
        load(w, t, i);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_true(V("refit_route_bytes_total", unq) == 2 * tb);
    assert_true(V("refit_route_bytes_total", dir) == 1 * tb);
    const char *text = metrics(w);
    assert_true(strstr(text, "format=\"unquantized\"") < strstr(text, "format=\"t-direct\""));

    make_version(w, 2); /* the other way round, then aborted: counted too */
    t = begin(w, "v2", NULL, 1);
    for (int i = N_MOD - 1; i >= 0; i--)
        load(w, t, i);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(V("refit_route_bytes_total", unq) == 4 * tb);
    assert_true(V("refit_route_bytes_total", dir) == 2 * tb);
    assert_true(V("refit_route_bytes_total", ",route=\"view\",format=\"t-direct\"") == 0);
    refit_metrics_free(w->text);
    refit_close(w->ctx);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counters_follow_a_scripted_sequence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_is_well_formed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_null, setup, teardown),
        cmocka_unit_test(test_classifiers),
        cmocka_unit_test(test_route_bytes_of_formats_in_turns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
