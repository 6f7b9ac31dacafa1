/* Manifests that cost out of proportion to their size are refused before
 * the cost: a repeat that expands beyond the limits (modules and entries,
 * iterations), nesting deeper than YAML_MAX_DEPTH, each with the limit
 * named and file:line:col; a NUL inside a quoted name; a FIFO in the
 * manifest's place (refused at once, not read). What is built takes memory
 * in proportion to what it holds. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/model.h"
#include "putil.h"
#include "schemas/model_doc.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Load text as a manifest into a fresh model: the status, the message in
 * msg, and the seconds it took. The model must be left empty. */
static int load(const char *text, char *msg, size_t n, double *secs)
{
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.yaml", dir);
    pt_write(path, text, 0644);
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    PT_RC(ctx, refit_model_create(&m, ctx), REFIT_OK);
    double t0 = now_s();
    int rc = refit_model_load_manifest(m, path);
    if (secs)
        *secs = now_s() - t0;
    const char *e = refit_errmsg(ctx);
    /* the message starts with the path: keep what follows */
    snprintf(msg, n, "%s", strncmp(e, path, strlen(path)) ? e : e + strlen(path));
    assert_int_equal(m->n_modules, rc ? 0 : m->n_modules);
    refit_close(ctx);
    pt_rmtree(dir);
    return rc;
}

/* text is refused (REFIT_ECORRUPT) with want in the message, within 2 s. */
static void refused_quickly(const char *text, const char *want)
{
    char msg[1400];
    double secs;
    assert_int_equal(load(text, msg, sizeof msg, &secs), REFIT_ECORRUPT);
    PT_HAS(msg, want);
    if (secs > 2.0)
        fail_msg("refused after %.1f s", secs);
}

static void test_repeat_bomb(void **state)
{
    (void)state;
    /* 244 bytes that used to cost 4.3 GB and 15 s */
    const char *bomb =
        "kind: model\n"
        "modules:\n"
        "  - repeat: {var: l, count: 1048576}\n"
        "    modules:\n"
        "      - name: \"m${l}\"\n"
        "        format: unquantized\n"
        "        runtime: [{name: w, dtype: f32, shape: [4]}]\n"
        "        checkpoint: [{name: \"x${l}\", dtype: f32, shape: [4]}]\n";
    refused_quickly(bomb, ":3:13: repeat (count 1048576) expands to more than 1048576 modules, "
                          "runtime tensors and checkpoint entries (the limit on manifest "
                          "expansion)");
}

static void test_nested_empty_repeats(void **state)
{
    (void)state;
    const char *bomb =
        "kind: model\n"
        "modules:\n"
        "  - repeat: {var: a, count: 1048576}\n"
        "    modules:\n"
        "      - repeat: {var: b, count: 1048576}\n"
        "        modules:\n"
        "          - repeat: {var: c, count: 0}\n"
        "            modules:\n"
        "              - name: m\n"
        "                format: unquantized\n"
        "                runtime: [{name: w, dtype: f32, shape: [4]}]\n"
        "                checkpoint: [{name: x, dtype: f32, shape: [4]}]\n";
    refused_quickly(bomb, ":3:13: repeat (count 1048576) expands to more than 4194304 "
                          "iterations (the limit on repeat expansion)");
}

static void test_deep_nesting(void **state)
{
    (void)state;
    /* 200 KB of flow nesting: quadratic in libyaml's scanner if read whole */
    size_t depth = 100000;
    char *text = malloc(2 * depth + 64);
    assert_non_null(text);
    size_t at = (size_t)sprintf(text, "kind: model\nname: ");
    memset(text + at, '[', depth);
    memset(text + at + depth, ']', depth);
    strcpy(text + at + 2 * depth, "\nmodules: []\n");
    refused_quickly(text, ":2:70: nested more than 64 levels deep (the limit on YAML nesting)");
    free(text);
}

static void test_nul_in_quoted_name(void **state)
{
    (void)state;
    const char *text =
        "kind: model\n"
        "modules:\n"
        "  - name: \"m\\0x\"\n"
        "    format: unquantized\n";
    char msg[1400];
    assert_int_equal(load(text, msg, sizeof msg, NULL), REFIT_ECORRUPT);
    PT_HAS(msg, ":3:11: a NUL character inside a scalar");
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "the manifest FIFO blocked the load\n";
    if (write(2, m, sizeof m - 1) < 0)
        _exit(3);
    _exit(2);
}

static void test_fifo_refused_at_once(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.yaml", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    PT_RC(NULL, refit_open(&ctx, &o), REFIT_OK);
    PT_RC(ctx, refit_model_create(&m, ctx), REFIT_OK);
    signal(SIGALRM, on_alarm); /* a blocked open fails the suite, it does not hang it */
    alarm(5);
    PT_RC(ctx, refit_model_load_manifest(m, path), REFIT_EIO);
    alarm(0);
    PT_HAS(refit_errmsg(ctx), "not a regular file");
    refit_close(ctx);
    pt_rmtree(dir);
}

static void test_memory_in_proportion(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/model.yaml", dir);
    pt_write(path,
             "kind: model\n"
             "modules:\n"
             "  - repeat: {var: l, count: 1000}\n"
             "    modules:\n"
             "      - name: \"m${l}\"\n"
             "        format: unquantized\n"
             "        runtime: [{name: w, dtype: f32, shape: [4]}]\n"
             "        checkpoint: [{name: \"x${l}\", dtype: f32, shape: [4]}]\n",
             0644);
    sdiags d = {0};
    mdoc *m = NULL;
    PT_RC(NULL, mdoc_load_file(&m, path, &d), REFIT_OK);
    assert_int_equal(m->n_mods, 1000);
    for (size_t i = 0; i < m->n_mods; i++) {
        assert_int_equal(m->mods[i].n_ck, 1);
        assert_int_equal(m->mods[i].cap_ck, 1); /* room for what it holds, no more */
        assert_int_equal(m->mods[i].cap_rt, 1);
    }
    mdoc_free(m);
    sdiags_free(&d);
    pt_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeat_bomb),
        cmocka_unit_test(test_nested_empty_repeats),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_nul_in_quoted_name),
        cmocka_unit_test(test_fifo_refused_at_once),
        cmocka_unit_test(test_memory_in_proportion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
