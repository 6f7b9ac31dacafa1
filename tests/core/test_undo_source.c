/* Undo sources (issue 30 item 4, docs/core.md "Undo sources"): an update
 * whose previous version is the files the previous update was loaded from,
 * or a snapshot of it, keeps no undo log; its abort reloads the modules it
 * wrote from there (online fp8 re-quantized by its post-load) and every
 * byte, the version and the health come back. A file changed or replaced
 * between the commit and the next begin keeps the undo log (the journal
 * says why); a file written in place between begin and abort poisons the
 * worker with a message naming it, while a path replaced meanwhile does
 * not matter (its old inode is held). The journal names the source of each
 * update (updates.undo_source); a snapshot serves once written and again
 * once restored. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "testutil.h"
#include "core/safetensors_write.h"

extern const refit_format_v2 refit_format_plugin_v2; /* plugins/fp8/fp8.c */

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

static char tmpdir[64];

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/refit-undosrc-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* An fp8 module quantized online from BF16 ("q") and the transformer of
 * testutil (TP shards, fused, stacked experts, tied embedding, padding,
 * casts, a STAGED module), journaled at tmpdir/<journal>. */
static void open_model(tw *w, const char *journal)
{
    char db[128];
    path_of(db, sizeof db, journal);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "w0";
    o.journal_path = db;
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &refit_format_plugin_v2), REFIT_OK);
    tw_module(w, "q", "fp8", "scheme: per_channel\nonline: true");
    tw_runtime(w, "q", "weight", E4M3, 2, TT_SHAPE(16, 32));
    tw_runtime(w, "q", "weight_scale", REFIT_F32, 1, TT_SHAPE(16));
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(16, 32));
    s.target = "weight";
    assert_int_equal(tw_expect(w, "q", "q.weight", &s), REFIT_OK);
    tt_llm_cfg lc = {0, 1, 1, 1};
    tt_build_llm(w, &lc); /* seals */
}

static st_dtype st_of(refit_dtype dt)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        refit_dtype r = st_dtype_to_refit((st_dtype)i);
        if (r.code == dt.code && r.bits == dt.bits && r.lanes == dt.lanes)
            return (st_dtype)i;
    }
    fail_msg("no safetensors dtype for code %d bits %d", dt.code, dt.bits);
    return ST_F32;
}

/* Version v of every checkpoint tensor (primary names) into file name. */
static void write_ckpt(tw *w, const char *name, uint64_t v)
{
    char path[128];
    path_of(path, sizeof path, name);
    st_out_tensor t[TW_MAX];
    size_t n = 0;
    for (int i = 0; i < w->n_ck; i++) {
        if (w->ck[i].spec.tie_of)
            continue;
        tt_tensor *x = tw_ckpt_tensor(w, w->ck[i].name, v);
        t[n++] = (st_out_tensor){w->ck[i].name, st_of(x->t.dtype), x->t.ndim, x->t.shape,
                                 x->buf};
    }
    st_error err;
    assert_int_equal(st_write_file(path, t, n, NULL, 0, &err), REFIT_OK);
}

/* Begin an update of label from file name (mode: refit_update_opts.undo_source). */
static refit_txn *begin_file(tw *w, const char *name, const char *label, int mode,
                             refit_source **src)
{
    char path[128];
    path_of(path, sizeof path, name);
    assert_int_equal(refit_source_open(src, w->ctx, path), REFIT_OK);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = label;
    uo.source_uri = refit_source_uri(*src);
    uo.undo_source = mode;
    refit_txn *t;
    int rc = refit_begin(&t, w->m, &uo);
    if (rc)
        fail_msg("begin %s: %s", label, refit_errmsg(w->ctx));
    return t;
}

/* A committed update of label from file name, the source closed after. */
static void commit_file(tw *w, const char *name, const char *label)
{
    refit_source *src;
    refit_txn *t = begin_file(w, name, label, REFIT_UNDO_AUTO, &src);
    assert_int_equal(refit_load_source(t, src, NULL, NULL, NULL), REFIT_OK);
    refit_source_close(src); /* the core holds it from here */
    assert_int_equal(refit_finalize(t), REFIT_OK);
}

/* The last update's updates.<col>, as text ("" for NULL). */
static void last_update(tw *w, const char *journal, const char *col, char *out, size_t n)
{
    char db[128], sql[160];
    path_of(db, sizeof db, journal);
    snprintf(sql, sizeof sql, "SELECT %s FROM updates ORDER BY id DESC LIMIT 1", col);
    sqlite3 *h;
    sqlite3_stmt *s;
    (void)w;
    out[0] = '\0';
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &s, NULL), SQLITE_OK);
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
        snprintf(out, n, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    sqlite3_close(h);
}

static void assert_starts(const char *text, const char *prefix)
{
    if (strncmp(text, prefix, strlen(prefix)))
        fail_msg("'%s' does not start with '%s'", text, prefix);
}

static uint64_t undo_bytes(refit_txn *t)
{
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    return st.undo_device_bytes + st.undo_host_bytes;
}

/* v1 from a file, then v2 from another file aborted: served by v1's files,
 * no byte saved, every byte and the version back; the online fp8 module's
 * weight and scales equal v1's (its post-load ran again). */
static void test_files_abort_restores(void **state)
{
    (void)state;
    tw w;
    open_model(&w, "files.db");
    write_ckpt(&w, "a1.safetensors", 1);
    write_ckpt(&w, "a2.safetensors", 2);
    commit_file(&w, "a1.safetensors", "v1");
    char text[512];
    last_update(&w, "files.db", "undo_source", text, sizeof text);
    assert_string_equal(text, "undo-log"); /* nothing held v0 */
    size_t n;
    void *v1 = tw_snapshot(&w, &n);
    tt_tensor *qw = tw_rt(&w, "q", "weight"), *qs = tw_rt(&w, "q", "weight_scale");
    void *q1 = malloc(qw->bytes), *s1 = malloc(qs->bytes);
    memcpy(q1, qw->buf, qw->bytes);
    memcpy(s1, qs->buf, qs->bytes);

    refit_source *src;
    refit_txn *t = begin_file(&w, "a2.safetensors", "v2", REFIT_UNDO_AUTO, &src);
    assert_int_equal(refit_load_source(t, src, NULL, NULL, NULL), REFIT_OK);
    refit_source_close(src);
    assert_int_equal(undo_bytes(t), 0);
    assert_memory_not_equal(qw->buf, q1, qw->bytes); /* v2 is in */
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(tw_snapshot_equal(&w, v1, n));
    assert_memory_equal(qw->buf, q1, qw->bytes);
    assert_memory_equal(qs->buf, s1, qs->bytes);
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    last_update(&w, "files.db", "undo_source", text, sizeof text);
    assert_starts(text, "files file://");
    assert_non_null(strstr(text, "a1.safetensors"));
    last_update(&w, "files.db", "state", text, sizeof text);
    assert_string_equal(text, "rolled_back");

    /* a failed finalize (one module only) aborts the same way, and the
     * source still serves the next update */
    t = begin_file(&w, "a2.safetensors", "v2", REFIT_UNDO_FILES, &src);
    refit_source_close(src);
    assert_int_equal(tw_load(&w, t, "q.weight", 2), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_EINCOMPLETE);
    assert_true(tw_snapshot_equal(&w, v1, n));
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    commit_file(&w, "a2.safetensors", "v2");
    last_update(&w, "files.db", "undo_source", text, sizeof text);
    assert_non_null(strstr(text, "a1.safetensors"));
    free(v1);
    free(q1);
    free(s1);
    tw_close(&w);
}

/* The files changed between the commit and the next begin: in place (a
 * byte and the mtime) or replaced. The update keeps the undo log, the
 * journal says what was passed over and why, its abort still restores;
 * asking for the files by name is refused, nothing written. */
static void test_files_changed_before_begin(void **state)
{
    (void)state;
    for (int replaced = 0; replaced < 2; replaced++) {
        tw w;
        open_model(&w, replaced ? "replaced.db" : "inplace.db");
        const char *db = replaced ? "replaced.db" : "inplace.db";
        write_ckpt(&w, "b1.safetensors", 1);
        write_ckpt(&w, "b2.safetensors", 2);
        commit_file(&w, "b1.safetensors", "v1");
        size_t n;
        void *v1 = tw_snapshot(&w, &n);
        char path[128];
        path_of(path, sizeof path, "b1.safetensors");
        if (replaced) {
            write_ckpt(&w, "b1.safetensors", 1); /* same bytes, another inode */
        } else {
            int fd = open(path, O_WRONLY);
            assert_true(fd >= 0);
            struct stat st;
            assert_int_equal(fstat(fd, &st), 0);
            char b = 0x5a;
            assert_int_equal(pwrite(fd, &b, 1, st.st_size - 1), 1);
            struct timespec ts[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
            assert_int_equal(futimens(fd, ts), 0);
            close(fd);
        }
        refit_source *src;
        char p2[128];
        path_of(p2, sizeof p2, "b2.safetensors");
        assert_int_equal(refit_source_open(&src, w.ctx, p2), REFIT_OK);
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        uo.version_label = "v2";
        uo.undo_source = REFIT_UNDO_FILES;
        refit_txn *t;
        assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_EUNSUPPORTED);
        tw_assert_msg(&w, "undo source files", "b1.safetensors", "nothing written");
        assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
        uo.undo_source = REFIT_UNDO_AUTO;
        assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_OK);
        assert_int_equal(refit_load_source(t, src, NULL, NULL, NULL), REFIT_OK);
        refit_source_close(src);
        assert_true(undo_bytes(t) > 0);
        assert_int_equal(refit_abort(t), REFIT_OK);
        assert_true(tw_snapshot_equal(&w, v1, n));
        char text[512];
        last_update(&w, db, "undo_source", text, sizeof text);
        assert_starts(text, "undo-log; passed over files file://");
        assert_non_null(strstr(text, replaced ? "replaced since open" : "mtime changed"));
        free(v1);
        tw_close(&w);
    }
}

/* A file written in place between begin and abort: the restore refuses it
 * and the worker is POISONED, the message and the journal naming the file.
 * A path replaced meanwhile: the inode loaded is held, the abort restores. */
static void test_files_changed_during_update(void **state)
{
    (void)state;
    for (int replaced = 0; replaced < 2; replaced++) {
        tw w;
        const char *db = replaced ? "during-r.db" : "during-w.db";
        open_model(&w, db);
        write_ckpt(&w, "c1.safetensors", 1);
        write_ckpt(&w, "c2.safetensors", 2);
        commit_file(&w, "c1.safetensors", "v1");
        size_t n;
        void *v1 = tw_snapshot(&w, &n);
        refit_source *src;
        refit_txn *t = begin_file(&w, "c2.safetensors", "v2", REFIT_UNDO_AUTO, &src);
        assert_int_equal(refit_load_source(t, src, NULL, NULL, NULL), REFIT_OK);
        refit_source_close(src);
        char path[128];
        path_of(path, sizeof path, "c1.safetensors");
        if (replaced) {
            write_ckpt(&w, "c1.safetensors", 3); /* other bytes at the path */
        } else {
            int fd = open(path, O_WRONLY);
            assert_true(fd >= 0);
            struct stat st;
            assert_int_equal(fstat(fd, &st), 0);
            char b = 0x5a;
            assert_int_equal(pwrite(fd, &b, 1, st.st_size - 1), 1);
            struct timespec ts[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 7, 0}};
            assert_int_equal(futimens(fd, ts), 0);
            close(fd);
        }
        char text[512];
        if (replaced) {
            assert_int_equal(refit_abort(t), REFIT_OK);
            assert_true(tw_snapshot_equal(&w, v1, n));
            assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
        } else {
            assert_int_equal(refit_abort(t), REFIT_EPOISONED);
            tw_assert_msg(&w, "POISONED", "c1.safetensors", "mtime changed");
            assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_POISONED);
            last_update(&w, db, "state", text, sizeof text);
            assert_string_equal(text, "failed");
            last_update(&w, db, "error", text, sizeof text);
            assert_non_null(strstr(text, "c1.safetensors"));
            /* nothing holds the committed version any more */
            refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
            uo.undo_source = REFIT_UNDO_FILES;
            assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_EUNSUPPORTED);
        }
        free(v1);
        tw_close(&w);
    }
}

/* A snapshot written of the committed state serves the next update (v1
 * came from memory: no files); its abort copies the bytes back. A commit
 * drops it. */
static void test_snapshot_source(void **state)
{
    (void)state;
    tw w;
    open_model(&w, "snap.db");
    tw_update(&w, 1, "v1");
    char snap[128], text[512];
    path_of(snap, sizeof snap, "snap-v1");
    assert_int_equal(refit_snapshot_write(w.m, snap), REFIT_OK);
    size_t n;
    void *v1 = tw_snapshot(&w, &n);
    refit_txn *t = tw_begin(&w, "v2", 1);
    tw_load_all(&w, t, 2, NULL);
    assert_int_equal(undo_bytes(t), 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(tw_snapshot_equal(&w, v1, n));
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    last_update(&w, "snap.db", "undo_source", text, sizeof text);
    assert_starts(text, "snapshot snapshot://");
    tw_update(&w, 2, "v2");
    last_update(&w, "snap.db", "undo_source", text, sizeof text);
    assert_starts(text, "snapshot snapshot://");
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.undo_source = REFIT_UNDO_SNAPSHOT;
    assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_EUNSUPPORTED);
    tw_assert_msg(&w, "undo source snapshot", "none holds the committed version");
    /* a committed restore of it arms it again: its state is the committed one */
    assert_int_equal(refit_restore(w.m, snap, NULL), REFIT_OK);
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    uo.version_label = "v3";
    assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_OK);
    tw_load_all(&w, t, 3, NULL);
    assert_int_equal(undo_bytes(t), 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(tw_snapshot_equal(&w, v1, n));
    free(v1);
    tw_close(&w);
}

/* The modes: the undo log on request while the files could serve; off is
 * no rollback; a partial update from memory breaks the chain. */
static void test_modes_and_chain(void **state)
{
    (void)state;
    tw w;
    open_model(&w, "modes.db");
    write_ckpt(&w, "d1.safetensors", 1);
    write_ckpt(&w, "d2.safetensors", 2);
    commit_file(&w, "d1.safetensors", "v1");
    refit_source *src;
    refit_txn *t = begin_file(&w, "d2.safetensors", "v2", REFIT_UNDO_LOG, &src);
    assert_int_equal(refit_load_source(t, src, NULL, NULL, NULL), REFIT_OK);
    refit_source_close(src);
    assert_true(undo_bytes(t) > 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    char text[512];
    last_update(&w, "modes.db", "undo_source", text, sizeof text);
    assert_string_equal(text, "undo-log");
    /* a partial update (one module, from memory) commits: the files no
     * longer hold the committed version */
    w.partial = 1;
    t = tw_begin(&w, "v1b", 1);
    assert_int_equal(tw_load(&w, t, "q.weight", 3), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    w.partial = 0;
    last_update(&w, "modes.db", "undo_source", text, sizeof text);
    assert_starts(text, "files file://"); /* it was served by them */
    t = tw_begin(&w, "v2", 1);
    tw_load_all(&w, t, 2, NULL);
    assert_true(undo_bytes(t) > 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    last_update(&w, "modes.db", "undo_source", text, sizeof text);
    assert_string_equal(text, "undo-log");
    /* off: no rollback, an abort poisons */
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "v3";
    uo.undo_source = REFIT_UNDO_OFF;
    assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_OK);
    assert_int_equal(tw_load(&w, t, "q.weight", 3), REFIT_OK);
    assert_int_equal(undo_bytes(t), 0);
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    last_update(&w, "modes.db", "undo_source", text, sizeof text);
    assert_string_equal(text, "none");
    uo.undo_source = 9;
    assert_int_equal(refit_begin(&t, w.m, &uo), REFIT_EINVAL);
    tw_assert_msg(&w, "undo_source 9");
    tw_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_abort_restores),
        cmocka_unit_test(test_files_changed_before_begin),
        cmocka_unit_test(test_files_changed_during_update),
        cmocka_unit_test(test_snapshot_source),
        cmocka_unit_test(test_modes_and_chain),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
