/* The core with its journal and its sources: what a transaction records,
 * journal=required and best-effort, replay from a durable source, and an
 * update interrupted by a real SIGKILL. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <refit/refit.h>

#include "core/safetensors_write.h"
#include "journal/journal.h"
#include "tests/integration/three_modules.h"

/* A worker of three modules, one f32 [8, 16] tensor each. */
typedef struct world {
    char dir[64], db[96], ckpt[96];
    refit_ctx *ctx;
    refit_model *model;
    float rt[N_MOD][ROWS * COLS];
    int64_t shape[2];
    refit_tensor desc[N_MOD];
    float ck[N_MOD][ROWS * COLS]; /* the checkpoint being sent */
} world;

static void make_version(world *w, int version)
{
    for (int i = 0; i < N_MOD; i++)
        for (int k = 0; k < ROWS * COLS; k++)
            w->ck[i][k] = (float)(version * 1000 + i * 100) + (float)k / 8.0f;
}

static int world_open(world *w, const char *journal, int best_effort)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "w0";
    o.journal_path = journal ? journal : "";
    o.journal_best_effort = best_effort;
    int rc = refit_open(&w->ctx, &o);
    if (rc || (rc = refit_model_create(&w->model, w->ctx)) ||
        (rc = three_modules_add(w->model, w->rt, w->shape, w->desc)))
        return rc;
    return refit_model_seal(w->model);
}

static int setup(void **state)
{
    world *w = calloc(1, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "/tmp/refit-jr-XXXXXX");
    if (!w || !mkdtemp(w->dir))
        return -1;
    snprintf(w->db, sizeof w->db, "%s/j.db", w->dir);
    snprintf(w->ckpt, sizeof w->ckpt, "%s/model.safetensors", w->dir);
    w->shape[0] = ROWS; /* checkpoints can be written before the model exists */
    w->shape[1] = COLS;
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    refit_close(w->ctx);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", w->dir);
    if (system(cmd) != 0)
        return -1;
    free(w);
    return 0;
}

static void write_ckpt(world *w, const char *path)
{
    st_out_tensor t[N_MOD];
    for (int i = 0; i < N_MOD; i++)
        t[i] = (st_out_tensor){three_modules_name(i), ST_F32, 2, w->shape, w->ck[i]};
    st_error err;
    assert_int_equal(st_write_file(path, t, N_MOD, NULL, 0, &err), REFIT_OK);
}

/* Send the first n tensors of w->ck from memory; finalize when n == all. */
static int send_memory(world *w, const char *version, int n, int rollback, int64_t *jid)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    uo.source_uri = "memory://test";
    uo.rollback = rollback;
    uo.fingerprint = 1;
    refit_txn *t;
    int rc = refit_begin(&t, w->model, &uo);
    if (rc)
        return rc;
    if (jid)
        *jid = refit_txn_journal_id(t);
    for (int i = 0; i < n; i++) {
        refit_tensor src = {.data = w->ck[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                            .dtype = REFIT_F32, .shape = w->shape};
        assert_int_equal(refit_load(t, three_modules_name(i), &src, NULL), REFIT_OK);
    }
    return n == N_MOD ? refit_finalize(t) : refit_abort(t);
}

/* Send from a file source, stopping after n tensors (abort) or finalizing. */
static int stop_after(void *user, const char *name)
{
    (void)name;
    int *left = user;
    return (*left)-- > 0;
}

/* Like stop_after, over the names this worker expects only (a loader
 * that skips the rest, as Python's strict=False or an expert-parallel
 * rank's skipping of other ranks' experts does). */
static int mine_first(void *user, const char *name)
{
    for (int i = 0; i < N_MOD; i++)
        if (!strcmp(name, three_modules_name(i)))
            return stop_after(user, name);
    return 0;
}

/* n of the file's modules through filter; by_id: journal the files'
 * identity, not the SHA-256 */
static int send_file_with(world *w, const char *version, int n, int rollback, int by_id,
                          refit_filter_fn filter, int64_t *jid)
{
    refit_source *src;
    char digest[REFIT_SOURCE_ID_SIZE];
    int rc = refit_source_open(&src, w->ctx, w->ckpt);
    assert_int_equal(rc, REFIT_OK);
    assert_int_equal(by_id ? refit_source_identity(src, digest) : refit_source_digest(src, digest),
                     REFIT_OK);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    uo.source_uri = refit_source_uri(src);
    uo.source_digest = digest;
    uo.rollback = rollback;
    refit_txn *t;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    *jid = refit_txn_journal_id(t);
    int left = n;
    assert_int_equal(refit_load_source_filtered(t, src, filter, &left, NULL, NULL, NULL), REFIT_OK);
    rc = n >= N_MOD ? refit_finalize(t) : refit_abort(t);
    refit_source_close(src);
    return rc;
}

static int send_file_as(world *w, const char *version, int n, int rollback, int by_id,
                        int64_t *jid)
{
    return send_file_with(w, version, n, rollback, by_id, stop_after, jid);
}

static int send_file(world *w, const char *version, int n, int rollback, int64_t *jid)
{
    return send_file_as(w, version, n, rollback, 0, jid);
}

typedef struct urow {
    char state[32], mode[16], version[32], digest[80];
    int64_t replay_of;
    uint64_t tensors;
} urow;

static int get_row(void *user, const journal_update_row *r)
{
    urow *u = user;
    snprintf(u->state, sizeof u->state, "%s", r->state);
    snprintf(u->mode, sizeof u->mode, "%s", r->mode);
    snprintf(u->version, sizeof u->version, "%s", r->version ? r->version : "");
    u->replay_of = r->replay_of;
    u->tensors = r->tensors;
    snprintf(u->digest, sizeof u->digest, "%s", r->source_digest ? r->source_digest : "");
    return 0;
}

static urow read_update(const char *db, int64_t id)
{
    journal *j;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    urow u;
    memset(&u, 0, sizeof u);
    assert_int_equal(journal_open(&j, db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_update_get(j, id, get_row, &u), REFIT_OK);
    journal_close(j);
    return u;
}

typedef struct mrow {
    int n, committed, fingerprints, poisoned;
} mrow;

static int count_module(void *user, const journal_module_row *r)
{
    mrow *m = user;
    m->n++;
    m->committed += !strcmp(r->state, "committed");
    m->poisoned += !strcmp(r->state, "poisoned");
    m->fingerprints += r->fingerprint != NULL && r->fingerprint[0] != '\0';
    return 0;
}

static mrow read_modules(const char *db, int64_t id)
{
    journal *j;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    mrow m = {0, 0, 0, 0};
    assert_int_equal(journal_open(&j, db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_modules_list(j, id, 0, count_module, &m), REFIT_OK);
    journal_close(j);
    return m;
}

static void test_commit_recorded(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    int64_t id = 0;
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, &id), REFIT_OK);
    assert_true(id > 0);
    urow u = read_update(w->db, id);
    assert_string_equal(u.state, "committed");
    assert_string_equal(u.version, "v1");
    assert_int_equal(u.tensors, N_MOD);
    mrow m = read_modules(w->db, id);
    assert_int_equal(m.n, N_MOD);
    assert_int_equal(m.committed, N_MOD);
    assert_int_equal(m.fingerprints, N_MOD);
}

static void test_abort_states_recorded(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, NULL), REFIT_OK);
    make_version(w, 2);
    int64_t a = 0, b = 0, c = 0;
    assert_int_equal(send_memory(w, "v2", 0, 1, &a), REFIT_OK);
    assert_int_equal(send_memory(w, "v2", 1, 1, &b), REFIT_OK);
    assert_int_equal(send_memory(w, "v2", 2, 0, &c), REFIT_EPOISONED);
    assert_string_equal(read_update(w->db, a).state, "aborted");
    assert_string_equal(read_update(w->db, b).state, "rolled_back");
    assert_string_equal(read_update(w->db, c).state, "failed");
    assert_int_equal(read_modules(w->db, c).poisoned, 2);
}

static void test_required_refuses_untouched(void **state)
{
    world *w = *state;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/j.db", w->dir);
    assert_int_equal(world_open(w, bad, 0), REFIT_OK); /* open keeps going */
    memset(w->rt, 0x5a, sizeof w->rt);
    float before[N_MOD][ROWS * COLS];
    memcpy(before, w->rt, sizeof before);
    make_version(w, 1);
    refit_txn *t = NULL;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_EJOURNAL);
    assert_null(t);
    assert_non_null(strstr(refit_errmsg(w->ctx), "journal"));
    assert_non_null(strstr(refit_errmsg(w->ctx), bad));
    assert_memory_equal(before, w->rt, sizeof before);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

static void test_best_effort_goes_on(void **state)
{
    world *w = *state;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/j.db", w->dir);
    assert_int_equal(world_open(w, bad, 1), REFIT_OK);
    make_version(w, 1);
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, NULL), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
}

/* A journaled world READY at v1 (from memory), v2 written to its file. */
static void ready_at_v1_with_v2_file(world *w)
{
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, NULL), REFIT_OK);
    make_version(w, 2);
    write_ckpt(w, w->ckpt);
}

static void test_replay_from_file(void **state)
{
    world *w = *state;
    ready_at_v1_with_v2_file(w);
    int64_t id = 0;
    assert_int_equal(send_file(w, "v2", 1, 0, &id), REFIT_EPOISONED);
    assert_int_equal(refit_check_serving(w->ctx), REFIT_EPOISONED);
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    assert_int_equal(refit_replay(w->model, id, &ro), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
    /* the replay is journaled as a replay of id */
    urow u = read_update(w->db, id + 1);
    assert_string_equal(u.mode, "replay");
    assert_int_equal(u.replay_of, id);
    assert_string_equal(u.state, "committed");
    /* a committed update is not replayed */
    assert_int_equal(refit_replay(w->model, id + 1, &ro), REFIT_ESTATE);
}

/* An update journaled with the files' identity replays while the file is
 * the one loaded; the same bytes with a new mtime are refused, naming
 * the file and what changed, and nothing is written. */
static void test_replay_by_identity(void **state)
{
    world *w = *state;
    ready_at_v1_with_v2_file(w);
    refit_source *src;
    char a[REFIT_SOURCE_ID_SIZE], b[REFIT_SOURCE_ID_SIZE];
    assert_int_equal(refit_source_open(&src, w->ctx, w->ckpt), REFIT_OK);
    assert_int_equal(refit_source_identity(src, a), REFIT_OK);
    assert_int_equal(strlen(a), REFIT_SOURCE_ID_SIZE - 1);
    assert_memory_equal(a, REFIT_SOURCE_ID_PREFIX, strlen(REFIT_SOURCE_ID_PREFIX));
    assert_int_equal(refit_source_identity(src, b), REFIT_OK);
    assert_string_equal(a, b);
    refit_source_close(src);

    int64_t id = 0;
    assert_int_equal(send_file_as(w, "v2", 1, 1, 1, &id), REFIT_OK); /* aborted, rolled back */
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    assert_int_equal(refit_replay(w->model, id, &ro), REFIT_OK);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);

    make_version(w, 3);
    write_ckpt(w, w->ckpt);
    assert_int_equal(send_file_as(w, "v3", 1, 1, 1, &id), REFIT_OK);
    float before[N_MOD][ROWS * COLS];
    memcpy(before, w->rt, sizeof before);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567, 0}}; /* same bytes, touched */
    assert_int_equal(utimensat(AT_FDCWD, w->ckpt, ts, 0), 0);
    assert_int_equal(refit_replay(w->model, id, &ro), REFIT_ECORRUPT);
    assert_non_null(strstr(refit_errmsg(w->ctx), "identity"));
    assert_non_null(strstr(refit_errmsg(w->ctx), "model.safetensors"));
    assert_memory_equal(w->rt, before, sizeof before);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);

    /* a memory source has no file to identify */
    FILE *f = fopen(w->ckpt, "rb");
    assert_non_null(f);
    static char mem[1 << 16];
    size_t len = fread(mem, 1, sizeof mem, f);
    fclose(f);
    assert_true(len > 8 && len < sizeof mem);
    assert_int_equal(refit_source_open_memory(&src, w->ctx, mem, len, "m"), REFIT_OK);
    assert_int_equal(refit_source_identity(src, a), REFIT_EUNSUPPORTED);
    assert_non_null(strstr(refit_errmsg(w->ctx), "memory"));
    refit_source_close(src);
}

static void test_replay_refusals(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    int64_t mem = 0, file = 0;
    assert_int_equal(send_memory(w, "v1", 1, 1, &mem), REFIT_OK);
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    assert_int_equal(refit_replay(w->model, mem, &ro), REFIT_EUNSUPPORTED);
    assert_non_null(strstr(refit_errmsg(w->ctx), "not durable"));
    assert_int_equal(refit_replay(w->model, 999, &ro), REFIT_ENOTFOUND);
    write_ckpt(w, w->ckpt);
    assert_int_equal(send_file(w, "v1", 1, 1, &file), REFIT_OK);
    make_version(w, 7); /* the file now holds other bytes */
    write_ckpt(w, w->ckpt);
    assert_int_equal(refit_replay(w->model, file, &ro), REFIT_ECORRUPT);
    assert_non_null(strstr(refit_errmsg(w->ctx), "changed"));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

/* w->ck as the file, less tensor `missing` and with tensor `narrow` half
 * as wide (-1: neither), among tensors this worker does not expect:
 * another expert-parallel rank's experts, first and last. */
static void write_ckpt_foreign(world *w, int missing, int narrow)
{
    static const int64_t half[2] = {ROWS, COLS / 2};
    st_out_tensor t[N_MOD + 2];
    size_t n = 0;
    t[n++] = (st_out_tensor){"model.experts.0.weight", ST_F32, 2, w->shape, w->ck[0]};
    for (int i = 0; i < N_MOD; i++)
        if (i != missing)
            t[n++] = (st_out_tensor){three_modules_name(i), ST_F32, 2, i == narrow ? half : w->shape,
                                     w->ck[i]};
    t[n++] = (st_out_tensor){"model.experts.9.weight", ST_F32, 2, w->shape, w->ck[1]};
    st_error err;
    assert_int_equal(st_write_file(w->ckpt, t, n, NULL, 0, &err), REFIT_OK);
}

/* A failed update that loaded only this worker's tensors of a file
 * holding more (every EP rank's experts) replays from that file: the
 * tensors no module expects are skipped as the update skipped them, and
 * the file's bytes are committed. A file lacking an expected tensor, or
 * holding one of the wrong shape, is still refused, the worker left as
 * it was. */
static void test_replay_skips_names_not_expected(void **state)
{
    world *w = *state;
    ready_at_v1_with_v2_file(w);
    write_ckpt_foreign(w, -1, -1);
    int64_t id = 0;
    assert_int_equal(send_file_with(w, "v2", 1, 0, 0, mine_first, &id), REFIT_EPOISONED);
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    int rc = refit_replay(w->model, id, &ro);
    if (rc)
        fail_msg("replay refused (%d): %s", rc, refit_errmsg(w->ctx));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v2");
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
    assert_string_equal(read_update(w->db, id + 1).state, "committed");

    float v2[N_MOD][ROWS * COLS];
    memcpy(v2, w->rt, sizeof v2);
    make_version(w, 3);
    for (int narrow = 0; narrow < 2; narrow++) {
        write_ckpt_foreign(w, narrow ? -1 : 2, narrow ? 2 : -1);
        assert_int_equal(send_file_with(w, "v3", 1, 1, 0, mine_first, &id), REFIT_OK);
        ro.full = narrow; /* the modules the journal lacks, then all */
        rc = refit_replay(w->model, id, &ro);
        assert_int_equal(rc, narrow ? REFIT_EMISMATCH : REFIT_EINCOMPLETE);
        const char *want = narrow ? "model.c.weight" : "module m2";
        if (!strstr(refit_errmsg(w->ctx), want))
            fail_msg("\"%s\" not in \"%s\"", want, refit_errmsg(w->ctx));
        assert_memory_equal(w->rt, v2, sizeof v2);
        assert_string_equal(refit_worker_version(w->ctx), "v2");
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    }
}

static const char *id_text(int64_t id)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "update %lld", (long long)id);
    return buf;
}

/* Begin with a file:// URI and no digest, one tensor, abort (rolled back). */
static int64_t send_uri_only(world *w, const char *uri, const char *version)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = version;
    uo.source_uri = uri;
    refit_txn *t;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    int64_t id = refit_txn_journal_id(t);
    refit_tensor src = {.data = w->ck[0], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                        .dtype = REFIT_F32, .shape = w->shape};
    assert_int_equal(refit_load(t, three_modules_name(0), &src, NULL), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    return id;
}

/* R1 (issue 29): an update begun with a file:// source_uri and neither
 * digest nor identity. begin records the files' identity itself, so a
 * replay after the file was replaced is refused; a row with neither (the
 * path could not be identified at begin) is refused by replay, naming the
 * update, instead of committing what the path holds now under its label. */
static void test_replay_unverifiable_source(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    write_ckpt(w, w->ckpt);
    char uri[160], later[160];
    snprintf(uri, sizeof uri, "file://%s", w->ckpt);
    int64_t id = send_uri_only(w, uri, "v1");
    urow u = read_update(w->db, id);
    if (strncmp(u.digest, REFIT_SOURCE_ID_PREFIX, strlen(REFIT_SOURCE_ID_PREFIX)))
        fail_msg("begin recorded no identity for %s (source_digest '%s')", uri, u.digest);
    float before[N_MOD][ROWS * COLS];
    memcpy(before, w->rt, sizeof before);
    make_version(w, 7); /* other bytes at the path */
    write_ckpt(w, w->ckpt);
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    int rc = refit_replay(w->model, id, &ro);
    if (rc != REFIT_ECORRUPT)
        fail_msg("replay of a replaced file = %s, want ECORRUPT (worker now '%s')",
                 refit_status_name(rc), refit_worker_version(w->ctx));
    assert_memory_equal(w->rt, before, sizeof before);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);

    /* nothing to identify at begin (written later): recorded with neither */
    snprintf(later, sizeof later, "file://%s/later.safetensors", w->dir);
    id = send_uri_only(w, later, "v2");
    u = read_update(w->db, id);
    assert_string_equal(u.digest, "");
    write_ckpt(w, later + 7);
    assert_int_equal(refit_replay(w->model, id, &ro), REFIT_ESTATE);
    assert_non_null(strstr(refit_errmsg(w->ctx), "neither a digest nor a file identity"));
    assert_non_null(strstr(refit_errmsg(w->ctx), id_text(id)));
    assert_memory_equal(w->rt, before, sizeof before);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

/* C1 (issue 29): begin bounds the strings the journal records and shows:
 * a longer label or URI is REFIT_EINVAL naming the member and its length,
 * and nothing is begun; the maximum itself is accepted. */
static void test_begin_bounds_strings(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    char *big = malloc(REFIT_SOURCE_URI_MAX + 2);
    assert_non_null(big);
    memset(big, 'a', REFIT_SOURCE_URI_MAX + 1);
    big[REFIT_SOURCE_URI_MAX + 1] = '\0';
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    refit_txn *t = NULL;
    uo.version_label = big + (REFIT_SOURCE_URI_MAX - REFIT_VERSION_LABEL_MAX); /* 257 bytes */
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_EINVAL);
    assert_null(t);
    assert_non_null(strstr(refit_errmsg(w->ctx), "version_label is 257 bytes"));
    assert_non_null(strstr(refit_errmsg(w->ctx), "at most 256"));
    uo.version_label = "v1";
    uo.source_uri = big; /* 4097 bytes */
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w->ctx), "source_uri is 4097 bytes"));
    uo.source_uri = "memory://x";
    uo.source_digest = big;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w->ctx), "source_digest is 4097 bytes"));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
    /* nothing was journaled */
    journal *j;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    assert_int_equal(journal_open(&j, w->db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_update_get(j, 1, NULL, NULL), REFIT_ENOTFOUND);
    journal_close(j);
    /* the maxima themselves */
    uo.source_digest = NULL;
    uo.source_uri = big + 1;
    uo.version_label = big + (REFIT_SOURCE_URI_MAX + 1 - REFIT_VERSION_LABEL_MAX);
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    free(big);
}

/* A child begins an update, sends one tensor, and is SIGKILLed. */
static void test_interrupted_then_replayed(void **state)
{
    world *w = *state;
    make_version(w, 3);
    write_ckpt(w, w->ckpt);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        world c;
        memset(&c, 0, sizeof c);
        memcpy(c.ckpt, w->ckpt, sizeof c.ckpt);
        memcpy(c.shape, w->shape, sizeof c.shape);
        if (world_open(&c, w->db, 0))
            _exit(3);
        refit_source *src;
        refit_txn *t;
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        char digest[65];
        if (refit_source_open(&src, c.ctx, c.ckpt) || refit_source_digest(src, digest))
            _exit(4);
        uo.version_label = "v3";
        uo.source_uri = refit_source_uri(src);
        uo.source_digest = digest;
        if (refit_begin(&t, c.model, &uo))
            _exit(5);
        int left = 1;
        refit_load_source_filtered(t, src, stop_after, &left, NULL, NULL, NULL);
        raise(SIGKILL);
        _exit(6);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* a new worker process: the journal says interrupted; replay recovers */
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    urow u = read_update(w->db, 1);
    assert_string_equal(u.state, "interrupted");
    refit_replay_opts ro = REFIT_REPLAY_OPTS_INIT;
    assert_int_equal(refit_replay(w->model, 1, &ro), REFIT_OK);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v3");
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
}

static void test_source_changed_refused(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, NULL, 0), REFIT_OK);
    make_version(w, 1);
    write_ckpt(w, w->ckpt);
    memset(w->rt, 0, sizeof w->rt);
    refit_source *src;
    assert_int_equal(refit_source_open(&src, w->ctx, w->ckpt), REFIT_OK);
    assert_int_equal(refit_source_count(src), N_MOD);
    assert_int_equal(truncate(w->ckpt, 100), 0); /* someone cuts the file short */
    refit_txn *t;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    int rc = refit_load_source(t, src, NULL, NULL, NULL);
    assert_int_not_equal(rc, REFIT_OK);
    assert_non_null(strstr(refit_errmsg(w->ctx), "model.safetensors"));
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.tensors_loaded, 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    refit_source_close(src);
    float zero[N_MOD][ROWS * COLS];
    memset(zero, 0, sizeof zero);
    assert_memory_equal(w->rt, zero, sizeof zero);
}

static void test_source_unexpected_and_filter(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, NULL, 0), REFIT_OK);
    make_version(w, 1);
    st_out_tensor t[N_MOD + 1];
    for (int i = 0; i < N_MOD; i++)
        t[i] = (st_out_tensor){three_modules_name(i), ST_F32, 2, w->shape, w->ck[i]};
    t[N_MOD] = (st_out_tensor){"rotary.inv_freq", ST_F32, 2, w->shape, w->ck[0]};
    st_error err;
    assert_int_equal(st_write_file(w->ckpt, t, N_MOD + 1, NULL, 0, &err), REFIT_OK);
    refit_source *src;
    assert_int_equal(refit_source_open(&src, w->ctx, w->ckpt), REFIT_OK);
    refit_txn *x;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    assert_int_equal(refit_begin(&x, w->model, &uo), REFIT_OK);
    assert_int_equal(refit_load_source(x, src, NULL, NULL, NULL), REFIT_EUNEXPECTED);
    assert_non_null(strstr(refit_errmsg(w->ctx), "rotary.inv_freq"));
    assert_int_equal(refit_abort(x), REFIT_OK);
    assert_int_equal(refit_begin(&x, w->model, &uo), REFIT_OK);
    int left = N_MOD; /* the unexpected tensor comes last in the file */
    assert_int_equal(refit_load_source_filtered(x, src, stop_after, &left, NULL, NULL, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(x), REFIT_OK);
    assert_memory_equal(w->rt, w->ck, sizeof w->rt);
    refit_source_close(src);
}

/* A worker of n one-tensor modules, for progress records. */
static int wide_open(refit_ctx **ctx, refit_model **m, const char *db, float *rt, int n,
                     int64_t *shape)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "wide";
    o.journal_path = db;
    int rc = refit_open(ctx, &o);
    if (rc || (rc = refit_model_create(m, *ctx)))
        return rc;
    static refit_tensor desc[1024];
    for (int i = 0; i < n && !rc; i++) {
        char mod[32], name[48];
        snprintf(mod, sizeof mod, "m%d", i);
        snprintf(name, sizeof name, "model.w%d", i);
        desc[i] = (refit_tensor){.data = rt + i * 4, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                                 .dtype = REFIT_F32, .shape = shape};
        refit_ckpt_spec sp = REFIT_CKPT_SPEC_INIT;
        sp.dtype = REFIT_F32;
        sp.ndim = 1;
        sp.shape[0] = 4;
        if (!(rc = refit_model_add_module(*m, mod, "unquantized", NULL)) &&
            !(rc = refit_module_bind_runtime(*m, mod, "w", &desc[i])))
            rc = refit_model_expect(*m, mod, name, &sp);
    }
    return rc ? rc : refit_model_seal(*m);
}

static int count_complete(void *user, const journal_module_row *r)
{
    int *n = user;
    *n += !strcmp(r->state, "complete");
    return 0;
}

/* A worker dies mid-update: the journal already shows the modules that
 * arrived (with a progress interval of 0 every completion is written at
 * once), so an operator sees how far it got. */
static void test_progress_survives_a_crash(void **state)
{
    world *w = *state;
    enum { N = 600, SENT = 300 };
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("REFIT_JOURNAL_PROGRESS_S", "0", 1);
        static float rt[N * 4], src[4] = {1, 2, 3, 4};
        int64_t shape[1] = {4};
        refit_ctx *ctx;
        refit_model *m;
        refit_txn *t;
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        if (wide_open(&ctx, &m, w->db, rt, N, shape) || refit_begin(&t, m, &uo))
            _exit(3);
        refit_tensor s = {.data = src, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                          .dtype = REFIT_F32, .shape = shape};
        for (int i = 0; i < SENT; i++) {
            char name[48];
            snprintf(name, sizeof name, "model.w%d", i);
            if (refit_load(t, name, &s, NULL))
                _exit(4);
        }
        raise(SIGKILL);
        _exit(5);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_string_equal(read_update(w->db, 1).state, "interrupted");
    journal *j;
    journal_opts o = JOURNAL_OPTS_INIT;
    o.readonly = 1;
    char err[256];
    int complete = 0;
    assert_int_equal(journal_open(&j, w->db, &o, err, sizeof err), REFIT_OK);
    assert_int_equal(journal_modules_list(j, 1, 0, count_complete, &complete), REFIT_OK);
    journal_close(j);
    assert_int_equal(complete, SENT);
}

static int count_verify(void *user, const char *problem)
{
    int *n = user;
    print_message("# problem: %s\n", problem);
    (*n)++;
    return 0;
}

/* A journal written by schema 1 (the demo, before chunk rows became lazy)
 * is migrated forward on its first writable open, and reads as before. */
static void test_schema1_journal_migrates(void **state)
{
    world *w = *state;
    const char *src = getenv("REFIT_SOURCE_ROOT");
    char from[1024], cmd[2300];
    snprintf(from, sizeof from, "%s/tests/data/journal-v1.db", src ? src : "..");
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, w->db);
    assert_int_equal(system(cmd), 0);
    journal *j;
    char err[256];
    assert_int_equal(journal_open(&j, w->db, NULL, err, sizeof err), REFIT_OK);
    int problems = 0;
    size_t n = 0;
    assert_int_equal(journal_verify(j, count_verify, &problems, &n), REFIT_OK);
    assert_int_equal(n, 0);
    journal_close(j);
    urow u = read_update(w->db, 1);
    assert_string_equal(u.state, "committed");
    mrow m = read_modules(w->db, 1);
    assert_int_equal(m.n, 14);
    assert_int_equal(m.committed, 14);
    /* and a new update on the migrated file */
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    int64_t id = 0;
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, &id), REFIT_OK);
    assert_string_equal(read_update(w->db, id).state, "committed");
    assert_int_equal(read_modules(w->db, id).committed, N_MOD);
}

/* Two-phase finalize: prepared, then the group's decision. */
static void test_prepare_commit_abort(void **state)
{
    world *w = *state;
    assert_int_equal(world_open(w, w->db, 0), REFIT_OK);
    make_version(w, 1);
    assert_int_equal(send_memory(w, "v1", N_MOD, 1, NULL), REFIT_OK);
    float v1[N_MOD][ROWS * COLS];
    memcpy(v1, w->rt, sizeof v1);
    make_version(w, 2);
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "v2";
    for (int decide = 0; decide < 2; decide++) {
        refit_txn *t;
        assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
        for (int i = 0; i < N_MOD; i++) {
            refit_tensor src = {.data = w->ck[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                                .dtype = REFIT_F32, .shape = w->shape};
            assert_int_equal(refit_load(t, three_modules_name(i), &src, NULL), REFIT_OK);
        }
        assert_int_equal(refit_commit(t), REFIT_ESTATE); /* not prepared yet */
        assert_int_equal(refit_finalize_prepare(t), REFIT_OK);
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_UPDATING);
        assert_int_equal(refit_finalize_prepare(t), REFIT_ESTATE);
        if (decide == 0) { /* another rank failed: abort restores v1 */
            assert_int_equal(refit_abort(t), REFIT_OK);
            assert_memory_equal(w->rt, v1, sizeof v1);
            assert_string_equal(refit_worker_version(w->ctx), "v1");
        } else {
            assert_int_equal(refit_commit(t), REFIT_OK);
            assert_memory_equal(w->rt, w->ck, sizeof w->rt);
            assert_string_equal(refit_worker_version(w->ctx), "v2");
        }
    }
    /* a prepare that fails aborts and frees, as finalize does */
    refit_txn *t;
    uo.partial = 1; /* m0 only */
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    refit_tensor src = {.data = w->ck[0], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                        .dtype = REFIT_F32, .shape = w->shape};
    assert_int_equal(refit_load(t, three_modules_name(0), &src, NULL), REFIT_OK);
    assert_int_equal(refit_finalize_prepare(t), REFIT_OK); /* m0 whole: partial update ok */
    assert_int_equal(refit_commit(t), REFIT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_recorded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_states_recorded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_required_refuses_untouched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_best_effort_goes_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_from_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_skips_names_not_expected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_by_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_unverifiable_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_begin_bounds_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_then_replayed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_changed_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_unexpected_and_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_commit_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_survives_a_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema1_journal_migrates, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
