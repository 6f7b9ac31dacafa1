/* Snapshots and restore (issue 30, docs/restart.md): a worker killed with
 * SIGKILL and restarted restores bit-equal, without a post-load; a plan
 * signature that differs in one field is refused naming it; a snapshot
 * truncated or with a byte changed is refused with nothing written; an
 * update after a restore equals a cold start (online fp8 included); a
 * format's REFIT_MODULE_NO_SNAPSHOT refuses the snapshot. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "core/ctx.h"
#include "core/fp_parallel.h"
#include "kernels/fingerprint.h"

extern const refit_format_v2 refit_format_plugin_v2; /* plugins/fp8/fp8.c */

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})

/* ---- fp8 with its post-loads counted, and a version to vary ---- */

static int post_loads;

static int counted_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    post_loads++;
    return refit_format_plugin_v2.post_load(h, m, stream);
}

static refit_format_v2 fp8_counted(const char *version)
{
    refit_format_v2 f = refit_format_plugin_v2;
    f.post_load = counted_post_load;
    f.post_load_many = NULL; /* one counted post_load a module */
    f.version = version;
    return f;
}

static refit_format_v2 fp8_v1, fp8_v2;

/* ---- the model ---- */

typedef struct cfg {
    int rank, tp;               /* TP rank of tp */
    const char *fp8_version;    /* "1.0" or "1.1" */
    const char *fp8_params;
    const char *journal;        /* NULL: none */
} cfg;

#define CFG_DEFAULT {0, 1, "1.0", "scheme: per_tensor\nonline: true", NULL}

/* The transformer-shaped model of testutil (TP shards, fused qkv, stacked
 * experts, tied embedding, padding, casts, a STAGED test-scale module)
 * and an fp8 module quantized online from BF16. */
static void open_model(tw *w, const cfg *c)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "w0";
    o.journal_path = c->journal ? c->journal : "";
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    const refit_format_v2 *f = !strcmp(c->fp8_version, "1.0") ? &fp8_v1 : &fp8_v2;
    assert_int_equal(refit_format_register(w->ctx, f), REFIT_OK);
    tw_module(w, "q", "fp8", c->fp8_params);
    tw_runtime(w, "q", "weight", E4M3, 2, TT_SHAPE(16, 32));
    tw_runtime(w, "q", "weight_scale", REFIT_F32, 1, TT_SHAPE(1));
    refit_ckpt_spec s = tt_spec(REFIT_BF16, 2, TT_SHAPE(16, 32));
    s.target = "weight";
    assert_int_equal(tw_expect(w, "q", "q.weight", &s), REFIT_OK);
    tt_llm_cfg lc = {c->rank, c->tp, 1, 1};
    tt_build_llm(w, &lc); /* seals */
}

static char tmpdir[64];

static int group_setup(void **state)
{
    (void)state;
    fp8_v1 = fp8_counted("1.0");
    fp8_v2 = fp8_counted("1.1");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/refit-snapshot-XXXXXX");
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

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n ? *n : 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

/* A worker at v1, then v2, snapshotted to dir. */
static void snapshot_world(const cfg *c, const char *dir, tw *w)
{
    open_model(w, c);
    tw_update(w, 1, "v1");
    tw_update(w, 2, "v2");
    int rc = refit_snapshot_write(w->m, dir);
    if (rc)
        fail_msg("snapshot: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
}

/* ---- a worker killed with SIGKILL, restarted ---- */

static void test_sigkill_restart_restores_bit_equal(void **state)
{
    (void)state;
    char journal[128], snap[128], before[128];
    path_of(journal, sizeof journal, "kill.db");
    path_of(snap, sizeof snap, "kill-snap");
    path_of(before, sizeof before, "kill-before.bin");
    cfg c = CFG_DEFAULT;
    c.journal = journal;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the worker: serve v2, snapshot it, then wait to be killed */
        tw w;
        close(ready[0]);
        snapshot_world(&c, snap, &w);
        size_t n;
        void *bytes = tw_snapshot(&w, &n);
        write_file(before, bytes, n);
        char one = 1;
        if (write(ready[1], &one, 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(ready[1]);
    char got = 0;
    ssize_t r = read(ready[0], &got, 1);
    close(ready[0]);
    int status = 0;
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(r, 1);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* the restarted worker: register and seal as usual, then restore */
    tw w;
    open_model(&w, &c);
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);
    post_loads = 0;
    int rc = refit_restore(w.m, snap, NULL);
    if (rc)
        fail_msg("restore: %s: %s", refit_status_name(rc), refit_errmsg(w.ctx));
    assert_int_equal(post_loads, 0); /* the fp8 bytes came as they were */
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w.ctx), "v2");
    size_t n, m;
    void *want = read_file(before, &n);
    void *now = tw_snapshot(&w, &m);
    assert_int_equal(n, m);
    assert_memory_equal(want, now, n);
    free(want);
    free(now);
    assert_int_equal(refit_snapshot_verify(w.ctx, snap), REFIT_OK);
    tw_close(&w);
    /* journaled: the snapshot (by the killed worker) and the restore with its source */
    char sql[512];
    assert_int_equal(tw_sql_count(journal, "SELECT count(*) FROM events WHERE kind = "
                                           "'snapshot'"), 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM updates WHERE state = 'committed' AND "
             "version = 'v2' AND source_uri LIKE 'snapshot://%%/kill-snap'");
    assert_int_equal(tw_sql_count(journal, sql), 1);
    assert_int_equal(tw_sql_count(journal, "SELECT count(*) FROM events WHERE kind = "
                                           "'restore' AND message LIKE '%update 2)%'"), 1);
}

/* ---- a crash while a snapshot is written ---- */

static void test_sigkill_mid_snapshot_leaves_nothing_half(void **state)
{
    (void)state;
    char dir[128];
    path_of(dir, sizeof dir, "crash");
    assert_int_equal(mkdir(dir, 0700), 0);
    int first[2];
    assert_int_equal(pipe(first), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* snapshots of 8 MB, one after another, until killed */
        tw w;
        refit_options o = REFIT_OPTIONS_INIT;
        o.journal_path = "";
        close(first[0]);
        if (tw_open(&w, &o))
            _exit(3);
        tw_module(&w, "big", "unquantized", NULL);
        tw_runtime(&w, "big", "w", REFIT_F32, 2, TT_SHAPE(2048, 1024));
        refit_ckpt_spec sp = tt_spec(REFIT_F32, 2, TT_SHAPE(2048, 1024));
        if (tw_expect(&w, "big", "big.w", &sp))
            _exit(3);
        tw_seal(&w);
        tw_update(&w, 1, "v1");
        for (int i = 0;; i++) {
            char p[160];
            snprintf(p, sizeof p, "%s/s%d", dir, i);
            if (refit_snapshot_write(w.m, p))
                _exit(4);
            if (i == 0 && write(first[1], "1", 1) != 1)
                _exit(5);
        }
    }
    close(first[1]);
    char got = 0;
    ssize_t r = read(first[0], &got, 1);
    close(first[0]);
    usleep(30000); /* into a later write */
    kill(pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(r, 1);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* every directory named as a snapshot is whole; the one being written
     * is only ever under its temporary name */
    refit_ctx *ctx;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    int whole = 0;
    for (int i = 0;; i++) {
        char p[160];
        struct stat sb;
        snprintf(p, sizeof p, "%s/s%d", dir, i);
        if (stat(p, &sb))
            break;
        int rc = refit_snapshot_verify(ctx, p);
        if (rc)
            fail_msg("%s: %s: %s", p, refit_status_name(rc), refit_errmsg(ctx));
        whole++;
    }
    refit_close(ctx);
    assert_true(whole >= 1);
}

/* ---- an update after a restore ---- */

static void test_update_after_restore_equals_cold_start(void **state)
{
    (void)state;
    char snap[128];
    path_of(snap, sizeof snap, "update-snap");
    cfg c = CFG_DEFAULT;
    tw a, b, cold;
    snapshot_world(&c, snap, &a);
    tw_close(&a);

    open_model(&b, &c);
    assert_int_equal(refit_restore(b.m, snap, NULL), REFIT_OK);
    post_loads = 0;
    tw_update(&b, 3, "v3"); /* the fp8 module quantizes v3's BF16 again */
    assert_int_equal(post_loads, 1);
    assert_string_equal(refit_worker_version(b.ctx), "v3");

    open_model(&cold, &c);
    tw_update(&cold, 3, "v3");
    size_t n, m;
    void *x = tw_snapshot(&b, &n), *y = tw_snapshot(&cold, &m);
    assert_int_equal(n, m);
    assert_memory_equal(x, y, n);
    free(x);
    free(y);
    /* and an abort after the restore rolls back to the restored bytes */
    tw_close(&cold);
    tw_close(&b);
}

/* ---- a signature that differs ---- */

static int (*real_device_info)(void *, refit_device, refit_device_info *);

static int device_info_cc90(void *host, refit_device dev, refit_device_info *out)
{
    int rc = real_device_info(host, dev, out);
    out->cc_major = 9;
    out->cc_minor = 0;
    return rc;
}

/* Restore snap into the worker c describes: refused with EMISMATCH naming
 * `field`, nothing written, health still EMPTY. cc90: the worker's
 * devices report compute capability 9.0 (through the host table, the
 * seam formats see too). */
static void expect_refused(const char *snap, const cfg *c, int cc90, const char *field,
                           const char *values)
{
    tw w;
    open_model(&w, c);
    if (cc90) {
        real_device_info = w.ctx->host.device_info;
        w.ctx->host.device_info = device_info_cc90;
    }
    size_t n;
    void *before = tw_snapshot(&w, &n);
    int rc = refit_restore(w.m, snap, NULL);
    int same = tw_snapshot_equal(&w, before, n);
    free(before);
    assert_true(same);
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_EMPTY);
    tw_close_refused(&w, rc, REFIT_EMISMATCH, "plan signature differs", field, values,
                     "nothing written");
}

static void test_signature_difference_refused_naming_it(void **state)
{
    (void)state;
    char snap[128];
    path_of(snap, sizeof snap, "sig-snap");
    cfg c = CFG_DEFAULT;
    c.tp = 2;
    tw a;
    snapshot_world(&c, snap, &a);
    tw_close(&a);

    cfg rank1 = c;
    rank1.rank = 1;
    expect_refused(snap, &rank1, 0, "shard.rank", "snapshot 0, this worker 1");
    cfg param = c;
    param.fp8_params = "scheme: per_tensor\nonline: true\narithmetic: reciprocal";
    expect_refused(snap, &param, 0, "(q).params", "\"reciprocal\"");
    cfg version = c;
    version.fp8_version = "1.1";
    expect_refused(snap, &version, 0, "(q).plugin.version", "snapshot \"1.0\", this worker "
                   "\"1.1\"");
    expect_refused(snap, &c, 1, "compute_capability", "snapshot \"0.0\", this worker \"9.0\"");
    cfg tp1 = CFG_DEFAULT; /* no TP at all: the shard count and the runtime shapes differ */
    expect_refused(snap, &tp1, 0, "shard", "this worker");

    /* the same worker as the snapshot's restores */
    tw b;
    open_model(&b, &c);
    assert_int_equal(refit_restore(b.m, snap, NULL), REFIT_OK);
    tw_close(&b);
}

/* ---- a damaged snapshot ---- */

static void copy_snapshot(const char *from, const char *to)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    assert_int_equal(system(cmd), 0);
}

/* Restore the damaged copy into a READY worker at v1: refused, every byte
 * and the version as they were; verify says the same. */
static void expect_damaged(const char *snap, int status, const char *want)
{
    cfg c = CFG_DEFAULT;
    tw w;
    open_model(&w, &c);
    tw_update(&w, 1, "v1");
    size_t n;
    void *before = tw_snapshot(&w, &n);
    int vrc = refit_snapshot_verify(w.ctx, snap);
    char vmsg[1200];
    snprintf(vmsg, sizeof vmsg, "%s", refit_errmsg(w.ctx));
    int rc = refit_restore(w.m, snap, NULL);
    int same = tw_snapshot_equal(&w, before, n);
    free(before);
    assert_true(same);
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w.ctx), "v1");
    if (vrc != status || !strstr(vmsg, want))
        fail_msg("verify: %s \"%s\", want %s \"%s\"", refit_status_name(vrc), vmsg,
                 refit_status_name(status), want);
    tw_close_refused(&w, rc, status, want, "refused, nothing written");
}

static void test_damaged_snapshot_refused_nothing_written(void **state)
{
    (void)state;
    char snap[128], bad[128], file[160];
    path_of(snap, sizeof snap, "good-snap");
    path_of(bad, sizeof bad, "bad-snap");
    cfg c = CFG_DEFAULT;
    tw a;
    snapshot_world(&c, snap, &a);
    tw_close(&a);
    snprintf(file, sizeof file, "%s/runtime.safetensors", bad);

    /* truncated by one byte */
    copy_snapshot(snap, bad);
    size_t n;
    char *p = read_file(file, &n);
    write_file(file, p, n - 1);
    expect_damaged(bad, REFIT_ECORRUPT, "runtime.safetensors");
    /* one byte of the data changed (the last: a weight's, not the header's) */
    p[n - 1] ^= 0x40;
    write_file(file, p, n);
    expect_damaged(bad, REFIT_ECORRUPT, "the manifest recorded");
    /* one byte of the header changed: a shape */
    copy_snapshot(snap, bad);
    p[n - 1] ^= 0x40; /* back */
    char *shape = strstr(p + 8, "\"shape\":[16");
    assert_non_null(shape);
    shape[10] = '8'; /* [16, ...] -> [86, ...]: the sizes no longer add up */
    write_file(file, p, n);
    expect_damaged(bad, REFIT_ECORRUPT, "runtime.safetensors");
    free(p);
    /* one byte of the manifest changed: its version label */
    copy_snapshot(snap, bad);
    snprintf(file, sizeof file, "%s/manifest.json", bad);
    p = read_file(file, &n);
    char *label = strstr(p, "\"version\": \"v2\"");
    assert_non_null(label);
    label[13] = '9';
    write_file(file, p, n);
    free(p);
    expect_damaged(bad, REFIT_ECORRUPT, "the manifest was changed");
    /* the manifest missing */
    unlink(file);
    expect_damaged(bad, REFIT_EIO, "manifest.json");
}

/* ---- a restore that fails after its first write ---- */

/* Modules a and b, runtime w f32 [4] each; alias: b's w is another name
 * of a's memory (the signature does not see where memory is, so such a
 * worker passes every check before the copies and fails after). */
static void two_modules(tw *w, int alias)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    tw_module(w, "a", "unquantized", NULL);
    tt_tensor *wa = tw_runtime(w, "a", "w", REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "a", "a.w", &s), REFIT_OK);
    tw_module(w, "b", "unquantized", NULL);
    if (alias)
        tw_bind(w, "b", "w", tt_alias(wa, REFIT_F32, 1, TT_SHAPE(4), NULL, 0));
    else
        tw_runtime(w, "b", "w", REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(w, "b", "b.w", &s), REFIT_OK);
    tw_seal(w);
}

static void test_failed_restore_rolls_back_or_poisons(void **state)
{
    (void)state;
    char snap[128];
    path_of(snap, sizeof snap, "alias-snap");
    tw w;
    two_modules(&w, 0);
    tw_update(&w, 1, "v1");
    assert_int_equal(refit_snapshot_write(w.m, snap), REFIT_OK);
    tw_close(&w);
    for (int rollback = 1; rollback >= 0; rollback--) {
        two_modules(&w, 1);
        tw_update(&w, 7, "v7");
        size_t n;
        void *before = tw_snapshot(&w, &n);
        refit_restore_opts ro = REFIT_RESTORE_OPTS_INIT;
        ro.rollback = rollback;
        int rc = refit_restore(w.m, snap, &ro);
        int same = tw_snapshot_equal(&w, before, n);
        free(before);
        refit_health h = refit_worker_health(w.ctx);
        assert_int_equal(same, rollback);
        assert_int_equal(h, rollback ? REFIT_HEALTH_READY : REFIT_HEALTH_POISONED);
        if (rollback)
            assert_string_equal(refit_worker_version(w.ctx), "v7");
        tw_close_refused(&w, rc, REFIT_ECORRUPT, "module a", "after the copy",
                         rollback ? "bytes rolled back" : "worker POISONED");
    }
}

/* ---- refusals at snapshot time ---- */

static int plan_no_snapshot(const refit_host_v2 *h, refit_fmt_module *m)
{
    int rc = tt_format_scale.plan(h, m);
    m->flags |= REFIT_MODULE_NO_SNAPSHOT;
    return rc;
}

static void test_snapshot_refusals(void **state)
{
    (void)state;
    static refit_format_v2 workspace;
    workspace = tt_format_scale;
    workspace.name = "test-workspace";
    workspace.plan = plan_no_snapshot;
    char snap[128], tmp[160];
    path_of(snap, sizeof snap, "refused-snap");
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", snap, (int)getpid());
    tw w;
    cfg c = CFG_DEFAULT;
    open_model(&w, &c);
    /* not READY: nothing committed yet */
    assert_int_equal(refit_snapshot_write(w.m, snap), REFIT_ESTATE);
    tw_assert_msg(&w, "EMPTY", "READY");
    tw_update(&w, 1, "v1");
    /* the path exists */
    assert_int_equal(mkdir(snap, 0700), 0);
    assert_int_equal(refit_snapshot_write(w.m, snap), REFIT_EEXIST);
    tw_assert_msg(&w, "exists");
    assert_int_equal(rmdir(snap), 0);
    tw_close(&w);

    /* a format that marks runtime state a snapshot cannot carry */
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(tw_open(&w, &o), REFIT_OK);
    assert_int_equal(refit_format_register(w.ctx, &workspace), REFIT_OK);
    tw_module(&w, "plain", "unquantized", NULL);
    tw_runtime(&w, "plain", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(&w, "plain", "plain.w", &s), REFIT_OK);
    tw_module(&w, "attn.kernel", "test-workspace", NULL);
    tw_runtime(&w, "attn.kernel", "ws", REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(&w, "attn.kernel", "attn.kernel.x", &s), REFIT_OK);
    tw_seal(&w);
    tw_update(&w, 1, "v1");
    int rc = refit_snapshot_write(w.m, snap);
    struct stat sb;
    assert_int_equal(stat(snap, &sb), -1);
    assert_int_equal(stat(tmp, &sb), -1);
    tw_close_refused(&w, rc, REFIT_EUNSUPPORTED, "module attn.kernel", "test-workspace",
                     "REFIT_MODULE_NO_SNAPSHOT");
}

/* The file check's fingerprints on threads equal one thread's, for
 * ranges empty, shorter than a word, one word, and of several pieces
 * ending in a partial word, whatever the number of threads. */
static void test_fp_ranges_equal_sequential(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 7, 8, (32u << 20) + 3, (70u << 20) + 13};
    enum { N = sizeof sizes / sizeof sizes[0] };
    size_t cap = sizes[N - 1] + N; /* range i starts at byte i */
    unsigned char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t i = 0; i < cap; i++)
        buf[i] = (unsigned char)tt_mix(i);
    const void *at[N];
    uint64_t want[N], got[N];
    for (int i = 0; i < N; i++) {
        at[i] = buf + i; /* odd starts too */
        kern_fp f;
        kern_fp_init(&f);
        kern_fp_update(&f, at[i], sizes[i] - (sizes[i] ? (size_t)i % 2 : 0));
        want[i] = kern_fp_final(&f);
    }
    size_t len[N];
    for (int i = 0; i < N; i++)
        len[i] = sizes[i] - (sizes[i] ? (size_t)i % 2 : 0);
    const int threads[] = {1, 3, 8};
    for (int t = 0; t < 3; t++) {
        memset(got, 0, sizeof got);
        assert_int_equal(fp_ranges(at, len, N, got, threads[t]), 0);
        assert_memory_equal(got, want, sizeof want);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_restart_restores_bit_equal),
        cmocka_unit_test(test_sigkill_mid_snapshot_leaves_nothing_half),
        cmocka_unit_test(test_update_after_restore_equals_cold_start),
        cmocka_unit_test(test_signature_difference_refused_naming_it),
        cmocka_unit_test(test_fp_ranges_equal_sequential),
        cmocka_unit_test(test_damaged_snapshot_refused_nothing_written),
        cmocka_unit_test(test_failed_restore_rolls_back_or_poisons),
        cmocka_unit_test(test_snapshot_refusals),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
