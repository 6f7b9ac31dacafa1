/* A real Hugging Face checkpoint (tests/data/hf-tiny-llama-sharded, seven
 * shards) loaded into both ranks of a TP-2 host worker through the manifest
 * `refitctl manifest llama` writes, and every runtime tensor compared with
 * what safetensors + numpy compute on their own (llama_expected.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <refit/refit.h>

#include "core/safetensors.h"
#include "tests/common/pyref.h"

#define TP 2

typedef struct paths {
    char src[1024], build[1024], python[1100], dir[64];
} paths;

static int setup(void **state)
{
    paths *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    const char *src = getenv("REFIT_SOURCE_ROOT"), *build = getenv("REFIT_BUILD_ROOT");
    const char *venv = getenv("REFIT_VENV");
    snprintf(p->src, sizeof p->src, "%s", src ? src : "..");
    snprintf(p->build, sizeof p->build, "%s", build ? build : ".");
    if (venv)
        snprintf(p->python, sizeof p->python, "%s/bin/python", venv);
    else
        snprintf(p->python, sizeof p->python, "%s/venv/bin/python", p->build);
    snprintf(p->dir, sizeof p->dir, "/tmp/refit-llama-XXXXXX");
    if (!mkdtemp(p->dir))
        return -1;
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    paths *p = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p->dir);
    int rc = system(cmd);
    free(p);
    return rc == 0 ? 0 : -1;
}

static void run(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("command failed (%d): %s", rc, cmd);
}

/* One rank: a worker from the manifest, loaded from the checkpoint. */
typedef struct rank_world {
    refit_ctx *ctx;
    refit_model *model;
    st_set *expected;
    size_t n;
    void **buf;
    int64_t (*shape)[ST_MAX_DIMS];
    refit_tensor *desc;
} rank_world;

static void rank_free(rank_world *w)
{
    refit_close(w->ctx);
    for (size_t i = 0; i < w->n; i++)
        free(w->buf[i]);
    free(w->buf);
    free(w->shape);
    free(w->desc);
    st_close(w->expected);
}

/* Bind one runtime tensor per expected "<module>/<runtime>" entry. */
static void bind_all(rank_world *w)
{
    w->n = st_count(w->expected);
    w->buf = calloc(w->n, sizeof *w->buf);
    w->shape = calloc(w->n, sizeof *w->shape);
    w->desc = calloc(w->n, sizeof *w->desc);
    assert_non_null(w->buf);
    assert_non_null(w->shape);
    assert_non_null(w->desc);
    for (size_t i = 0; i < w->n; i++) {
        const st_tensor *t = st_tensor_at(w->expected, i);
        char module[256];
        snprintf(module, sizeof module, "%s", t->name);
        char *slash = strchr(module, '/');
        assert_non_null(slash);
        *slash = '\0';
        w->buf[i] = malloc(t->nbytes);
        assert_non_null(w->buf[i]);
        memset(w->buf[i], 0xa5, t->nbytes); /* junk: every byte must be written */
        memcpy(w->shape[i], t->shape, sizeof w->shape[i]);
        w->desc[i] = (refit_tensor){.data = w->buf[i], .device = {REFIT_DEVICE_CPU, 0},
                                    .ndim = t->ndim, .dtype = REFIT_BF16, .shape = w->shape[i]};
        int rc = refit_module_bind_runtime(w->model, module, slash + 1, &w->desc[i]);
        if (rc)
            fail_msg("bind %s: %s", t->name, refit_errmsg(w->ctx));
    }
}

static void load_checkpoint(rank_world *w, const char *ckpt)
{
    refit_source *src;
    refit_txn *t;
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "fixture";
    assert_int_equal(refit_source_open(&src, w->ctx, ckpt), REFIT_OK);
    assert_int_equal(refit_source_count(src), 21);
    assert_int_equal(refit_begin(&t, w->model, &uo), REFIT_OK);
    int rc = refit_load_source(t, src, NULL, NULL, NULL);
    if (rc)
        fail_msg("load: %s", refit_errmsg(w->ctx));
    rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize: %s", refit_errmsg(w->ctx));
    refit_source_close(src);
}

static void check_rank(paths *p, int rank, const char *manifest)
{
    char ckpt[1100], cmd[8192], expected[128];
    snprintf(ckpt, sizeof ckpt, "%s/tests/data/hf-tiny-llama-sharded", p->src);
    snprintf(expected, sizeof expected, "%s/expected-%d.safetensors", p->dir, rank);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/integration/llama_expected.py' '%s' "
             "'%s/config.json' %d %d '%s'", p->python, p->src, ckpt, ckpt, TP, rank, expected);
    run(cmd);

    rank_world w;
    memset(&w, 0, sizeof w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.rank = rank;
    o.journal_path = "";
    st_error err;
    assert_int_equal(st_open(&w.expected, expected, &err), REFIT_OK);
    assert_int_equal(refit_open(&w.ctx, &o), REFIT_OK);
    assert_int_equal(refit_model_create(&w.model, w.ctx), REFIT_OK);
    if (refit_model_load_manifest(w.model, manifest))
        fail_msg("manifest: %s", refit_errmsg(w.ctx));
    bind_all(&w);
    if (refit_model_seal(w.model))
        fail_msg("seal: %s", refit_errmsg(w.ctx));
    load_checkpoint(&w, ckpt);
    for (int round = 0; round < 2; round++) { /* and again: reload equals load */
        for (size_t i = 0; i < w.n; i++) {
            const st_tensor *t = st_tensor_at(w.expected, i);
            if (memcmp(w.buf[i], t->data, t->nbytes))
                fail_msg("rank %d: runtime %s differs from numpy's", rank, t->name);
        }
        if (round == 0)
            load_checkpoint(&w, ckpt);
    }
    assert_int_equal(refit_worker_health(w.ctx), REFIT_HEALTH_READY);
    rank_free(&w);
}

static void test_llama_fixture_tp2(void **state)
{
    paths *p = *state;
    if (access(p->python, X_OK) != 0)
        fail_msg("no Python venv at %s (scripts/deps.sh creates it; `make test` runs it)",
                 p->python);
    char manifest[128], cmd[8192];
    snprintf(manifest, sizeof manifest, "%s/llama.yaml", p->dir);
    snprintf(cmd, sizeof cmd, "'%s/tools/refitctl' manifest llama "
             "'%s/tests/data/hf-tiny-llama-sharded/config.json' --tp %d > '%s'",
             p->build, p->src, TP, manifest);
    run(cmd);
    for (int rank = 0; rank < TP; rank++)
        check_rank(p, rank, manifest);
}

/* A config the manifest cannot split evenly is refused, naming the field. */
static void test_manifest_refuses_uneven(void **state)
{
    paths *p = *state;
    char cfg[128], out[128], cmd[8192];
    snprintf(cfg, sizeof cfg, "%s/config.json", p->dir);
    snprintf(out, sizeof out, "%s/err.txt", p->dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1,"
          " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"vocab_size\": 100}", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s/tools/refitctl' manifest llama '%s' --tp 2 2> '%s' >/dev/null",
             p->build, cfg, out);
    assert_int_not_equal(system(cmd), 0);
    char msg[512] = {0};
    f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    assert_true(n > 0);
    assert_non_null(strstr(msg, "num_key_value_heads"));
}

int main(void)
{
    pyref_skip_without_venv();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_llama_fixture_tp2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manifest_refuses_uneven, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
