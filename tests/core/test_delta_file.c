/* Delta files (docs/delta-file.md): refit_delta_file_write, then
 * refit_load_delta_file into a delta update, gives the bytes
 * refit_load_deltas of the same rows gives; a file cut short, a flipped
 * value byte (the checksum names the tensor), another base or version, an
 * index out of range, or an update that is not a delta are each refused
 * with bytes, version and health unchanged; and a failed delta update is
 * replayed from its file (refit_replay), unless the file changed. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "testutil.h"

#define MAX_ROWS 64

/* Patches of every primary tensor of the model, about 5% of elements,
 * values of checkpoint version 2; every third row in run form. */
typedef struct patches {
    refit_delta rows[MAX_ROWS];
    int64_t *idx[MAX_ROWS], *counts[MAX_ROWS];
    size_t n;
} patches;

static void make_patches(tw *w, patches *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < w->n_ck && p->n < MAX_ROWS; i++) {
        if (w->ck[i].spec.tie_of)
            continue;
        const char *name = w->ck[i].name;
        tt_tensor *nv = tw_ckpt_tensor(w, name, 2);
        int64_t numel = tt_numel(nv), n = 0;
        size_t k = p->n++;
        int runs = k % 3 == 2;
        p->idx[k] = malloc(sizeof(int64_t) * (size_t)numel);
        p->counts[k] = malloc(sizeof(int64_t) * (size_t)numel);
        assert_non_null(p->idx[k]);
        assert_non_null(p->counts[k]);
        tt_rng rng = {tt_hash_str(name)};
        int64_t nvals = 0;
        for (int64_t e = 0; e < numel; e++) {
            if (tt_randn(&rng, 100) >= 5 && !(e == numel - 1 && n == 0))
                continue;
            int64_t c = runs && e + 1 < numel ? 2 : 1;
            p->idx[k][n] = e;
            p->counts[k][n++] = c;
            nvals += c;
            e += c - 1;
        }
        tt_tensor *vals = tw_tmp(w, nv->t.dtype, 1, TT_SHAPE(nvals));
        for (int64_t j = 0, v = 0; j < n; j++)
            for (int64_t c = 0; c < p->counts[k][j]; c++)
                tt_set_flat(vals, v++, tt_get_flat(nv, p->idx[k][j] + c));
        p->rows[k] = (refit_delta){name, (size_t)n, p->idx[k], runs ? p->counts[k] : NULL,
                                   &vals->t};
    }
}

static void free_patches(patches *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->idx[i]);
        free(p->counts[i]);
    }
}

static refit_txn *begin_delta(tw *w, const char *label, const char *base, const char *uri)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = 1;
    o.base_version = base;
    o.others_unchanged = 1;
    o.source_uri = uri;
    refit_txn *t = NULL;
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        fail_msg("begin %s: %s: %s", label, refit_status_name(rc), refit_errmsg(w->ctx));
    return t;
}

typedef struct fixture {
    tw w;
    char dir[64], path[96], journal[96], uri[128];
    patches p;
    void *v1, *v2;              /* runtime bytes at v1, and patched */
    size_t nb;
} fixture;

/* A model at v1; the bytes refit_load_deltas leaves (v2); back at v1; a
 * delta file of the same rows at path. */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/refit-delta-file-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/step2.delta.safetensors", f->dir);
    snprintf(f->journal, sizeof f->journal, "%s/j.db", f->dir);
    snprintf(f->uri, sizeof f->uri, "file://%s", f->path);
    refit_options opt = REFIT_OPTIONS_INIT;
    opt.journal_path = f->journal;
    assert_int_equal(tw_open(&f->w, &opt), REFIT_OK);
    tt_llm_cfg c = {0, 1, 2, 0};
    tt_build_llm(&f->w, &c);
    tw_update(&f->w, 1, "v1");
    f->v1 = tw_snapshot(&f->w, &f->nb);
    make_patches(&f->w, &f->p);
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    assert_int_equal(refit_load_deltas(t, f->p.n, f->p.rows, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    size_t nb;
    f->v2 = tw_snapshot(&f->w, &nb);
    assert_false(tw_snapshot_equal(&f->w, f->v1, f->nb));
    tw_update(&f->w, 1, "v1");
    assert_true(tw_snapshot_equal(&f->w, f->v1, f->nb));
    int rc = refit_delta_file_write(f->w.ctx, f->path, "v1", "v2", f->p.n, f->p.rows);
    if (rc)
        fail_msg("delta_file_write: %s", refit_errmsg(f->w.ctx));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tw_close(&f->w);
    free_patches(&f->p);
    free(f->v1);
    free(f->v2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

static void test_file_equals_rows(void **state)
{
    fixture *f = *state;
    refit_txn *t = begin_delta(&f->w, "v2", "v1", f->uri);
    int rc = refit_load_delta_file(t, f->path, NULL);
    if (rc)
        fail_msg("load_delta_file: %s", refit_errmsg(f->w.ctx));
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_true(tw_snapshot_equal(&f->w, f->v2, f->nb));
    assert_string_equal(refit_worker_version(f->w.ctx), "v2");
    assert_int_equal(tw_sql_count(f->journal, "SELECT count(*) FROM updates WHERE version = "
                                              "'v2' AND base_version = 'v1' AND state = "
                                              "'committed' AND source_uri LIKE 'file://%'"), 1);
}

/* The update fails closed, and bytes, version and health are v1's. */
static void assert_refused(fixture *f, refit_txn *t, int rc, int want, const char *say)
{
    if (rc != want)
        fail_msg("want %s, got %s: %s", refit_status_name(want), refit_status_name(rc),
                 refit_errmsg(f->w.ctx));
    tw_assert_msg(&f->w, say, "nothing written");
    assert_int_not_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(refit_worker_health(f->w.ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(f->w.ctx), "v1");
    assert_true(tw_snapshot_equal(&f->w, f->v1, f->nb));
}

/* The file offset of tensor name's data. */
static uint64_t data_offset(const char *path, const char *name)
{
    st_set *s = NULL;
    st_error e;
    assert_int_equal(st_open(&s, path, &e), REFIT_OK);
    const st_tensor *t = st_find(s, name);
    assert_non_null(t);
    uint64_t off = t->offset;
    st_close(s);
    return off;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static void test_flipped_value_names_tensor(void **state)
{
    fixture *f = *state;
    const char *name = f->p.rows[1].name;
    char vn[256];
    snprintf(vn, sizeof vn, "%s.delta_values", name);
    flip_byte(f->path, data_offset(f->path, vn));
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    char say[300];
    snprintf(say, sizeof say, "tensor %s: checksum mismatch", name);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_ECORRUPT, say);
}

static void test_flipped_index_names_tensor(void **state)
{
    fixture *f = *state;
    const char *name = f->p.rows[2].name; /* run form: its counts follow */
    char in[256];
    snprintf(in, sizeof in, "%s.delta_counts", name);
    flip_byte(f->path, data_offset(f->path, in));
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    char say[300];
    snprintf(say, sizeof say, "tensor %s: checksum mismatch", name);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_ECORRUPT, say);
}

static void test_truncated(void **state)
{
    fixture *f = *state;
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fclose(fp);
    assert_int_equal(truncate(f->path, len - 3), 0);
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_ECORRUPT,
                   "data-size");
}

static void test_other_base(void **state)
{
    fixture *f = *state;
    assert_int_equal(refit_delta_file_write(f->w.ctx, f->path, "v0", "v2", f->p.n, f->p.rows),
                     REFIT_OK);
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_EMISMATCH,
                   "the file patches base 'v0', the update's base is 'v1'");
}

static void test_other_version(void **state)
{
    fixture *f = *state;
    refit_txn *t = begin_delta(&f->w, "v3", "v1", NULL);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_EMISMATCH,
                   "the file makes version 'v2', the update is 'v3'");
}

static void test_not_a_delta_update(void **state)
{
    fixture *f = *state;
    refit_txn *t = tw_begin(&f->w, "v2", 1);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_ESTATE,
                   "is not a delta update; the file patches base 'v1'");
}

/* The writer cannot know the tensor's size: the model refuses, naming the
 * file and the row, before any row is written. */
static void test_index_out_of_range(void **state)
{
    fixture *f = *state;
    size_t last = f->p.n - 1;
    int64_t keep = f->p.idx[last][0];
    f->p.idx[last][0] = 1 << 30;
    assert_int_equal(refit_delta_file_write(f->w.ctx, f->path, "v1", "v2", f->p.n, f->p.rows),
                     REFIT_OK);
    f->p.idx[last][0] = keep;
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    char say[300];
    snprintf(say, sizeof say, "load_delta_file %s: row %zu (%s)", f->path, last,
             f->p.rows[last].name);
    assert_refused(f, t, refit_load_delta_file(t, f->path, NULL), REFIT_EINVAL, say);
}

static void test_writer_refuses(void **state)
{
    fixture *f = *state;
    refit_delta rows[2] = {f->p.rows[0], f->p.rows[0]};
    assert_int_equal(refit_delta_file_write(f->w.ctx, f->path, "v1", "v2", 2, rows),
                     REFIT_EDUPLICATE);
    tw_assert_msg(&f->w, "rows 0 and 1 patch the same tensor");
    rows[1] = f->p.rows[1];
    int64_t bad[1] = {-4};
    rows[1].indices = bad;
    rows[1].n = 1;
    rows[1].counts = NULL;
    assert_int_equal(refit_delta_file_write(f->w.ctx, f->path, "v1", "v2", 2, rows),
                     REFIT_EINVAL);
    tw_assert_msg(&f->w, "row 1", "index 0 is -4 (negative)");
    /* the file written by setup is still there, whole */
    refit_txn *t = begin_delta(&f->w, "v2", "v1", NULL);
    assert_int_equal(refit_load_delta_file(t, f->path, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_true(tw_snapshot_equal(&f->w, f->v2, f->nb));
}

/* An update from the file that failed (aborted, rolled back) is replayed
 * from it: the worker then holds the patched bytes at v2. */
static void test_replay_from_file(void **state)
{
    fixture *f = *state;
    refit_txn *t = begin_delta(&f->w, "v2", "v1", f->uri);
    int64_t id = refit_txn_journal_id(t);
    assert_true(id > 0);
    assert_int_equal(refit_load_delta_file(t, f->path, NULL), REFIT_OK);
    assert_int_equal(refit_abort_reason(t, "the trainer went away"), REFIT_OK);
    assert_true(tw_snapshot_equal(&f->w, f->v1, f->nb));
    int rc = refit_replay(f->w.m, id, NULL);
    if (rc)
        fail_msg("replay: %s: %s", refit_status_name(rc), refit_errmsg(f->w.ctx));
    assert_string_equal(refit_worker_version(f->w.ctx), "v2");
    assert_true(tw_snapshot_equal(&f->w, f->v2, f->nb));
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE replay_of = %lld AND "
                              "state = 'committed' AND base_version = 'v1'", (long long)id);
    assert_int_equal(tw_sql_count(f->journal, sql), 1);
}

static void test_replay_refuses_changed_file(void **state)
{
    fixture *f = *state;
    refit_txn *t = begin_delta(&f->w, "v2", "v1", f->uri);
    int64_t id = refit_txn_journal_id(t);
    assert_int_equal(refit_load_delta_file(t, f->path, NULL), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    /* rewritten since (same bytes, new identity) */
    assert_int_equal(refit_delta_file_write(f->w.ctx, f->path, "v1", "v2", f->p.n, f->p.rows),
                     REFIT_OK);
    assert_int_equal(refit_replay(f->w.m, id, NULL), REFIT_ECORRUPT);
    tw_assert_msg(&f->w, "the source of update", "changed");
    assert_string_equal(refit_worker_version(f->w.ctx), "v1");
    assert_true(tw_snapshot_equal(&f->w, f->v1, f->nb));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_file_equals_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_value_names_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_index_names_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_base, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_delta_update, setup, teardown),
        cmocka_unit_test_setup_teardown(test_index_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_from_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_refuses_changed_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
