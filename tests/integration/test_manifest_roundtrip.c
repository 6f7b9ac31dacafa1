/* `refitctl manifest llama` writes its YAML through libyaml's emitter: a
 * model name and a config path with quotes, colons, '#', leading dashes,
 * unicode or a newline read back exactly as given, and the manifest loads
 * through refit's own loader (refit_model_load_manifest) into the modules
 * the config says. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <refit/refit.h>

#include "core/model.h"
#include "schemas/ydoc.h"

static const char *const odd[] = {
    "llama",
    "say \"hi\" and 'bye'",
    "key: value",
    "- leading dash",
    "ünïcødé ✓ 模型",
    "not # a comment",
    "#starts with hash",
    "123",
    "true",
    "two\nlines\tand a tab",
    "{flow: [x]}",
    "back\\slash",
    " spaces around ",
    "&anchor *alias !tag %directive @at `tick`",
};

/* Run refitctl with argv as given (no shell), stdout into out. */
static int refitctl(const char *out, char *const *args)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0)
            _exit(127);
        execv(args[0], args);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_config(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 3,"
          " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100,"
          " \"tie_word_embeddings\": true}", f);
    fclose(f);
}

/* The manifest's name and doc, as libyaml reads them back. */
static void check_strings(const char *yaml, const char *name, const char *config)
{
    ydoc y;
    sdiags d = {0};
    if (ydoc_load_file(&y, yaml, &d))
        fail_msg("%s: %s", yaml, sdiags_first(&d));
    yaml_node_t *root = ydoc_root(&y);
    const char *got = ydoc_str(ydoc_get(&y, root, "name"));
    assert_non_null(got);
    assert_string_equal(got, name);
    const char *doc = ydoc_str(ydoc_get(&y, root, "doc"));
    assert_non_null(doc);
    assert_non_null(strstr(doc, config));
    ydoc_free(&y);
    sdiags_free(&d);
}

/* refit's loader takes it: embed (lm_head tied to it), 3 x 3 layer modules,
 * norm, in order. */
static void check_loads(const char *yaml)
{
    refit_ctx *ctx;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    refit_model *m;
    assert_int_equal(refit_model_create(&m, ctx), REFIT_OK);
    if (refit_model_load_manifest(m, yaml))
        fail_msg("%s: %s", yaml, refit_errmsg(ctx));
    static const char *const names[] = {
        "embed", "layers.0.attn", "layers.0.mlp", "layers.0.norms", "layers.1.attn",
        "layers.1.mlp", "layers.1.norms", "layers.2.attn", "layers.2.mlp", "layers.2.norms",
        "norm"};
    assert_int_equal(m->n_modules, sizeof names / sizeof *names);
    for (uint32_t i = 0; i < m->n_modules; i++)
        assert_string_equal(m->modules[i].name, names[i]);
    refit_model_destroy(m);
    refit_close(ctx);
}

static void test_odd_names_round_trip(void **state)
{
    (void)state;
    const char *build = getenv("REFIT_BUILD_ROOT");
    assert_non_null(build);
    char ctl[4096], dir[] = "/tmp/refit-mrt-XXXXXX";
    snprintf(ctl, sizeof ctl, "%s/tools/refitctl", build);
    assert_non_null(mkdtemp(dir));
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        /* the config's directory carries the odd text too (a newline is a
         * valid byte of a file name) */
        char sub[512], config[600], yaml[600];
        snprintf(sub, sizeof sub, "%s/%zu %s", dir, i, strchr(odd[i], '/') ? "x" : odd[i]);
        assert_int_equal(mkdir(sub, 0700), 0);
        snprintf(config, sizeof config, "%s/config.json", sub);
        snprintf(yaml, sizeof yaml, "%s/out.yaml", dir);
        write_config(config);
        char *args[] = {ctl, "manifest", "llama", config, "--name", (char *)odd[i], NULL};
        assert_int_equal(refitctl(yaml, args), 0);
        check_strings(yaml, odd[i], config);
        check_loads(yaml);
        printf("# %zu: round trip ok\n", i);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Text that is not UTF-8 cannot be written as YAML: refused, naming it. */
static void test_not_utf8_refused(void **state)
{
    (void)state;
    const char *build = getenv("REFIT_BUILD_ROOT");
    char ctl[4096], dir[] = "/tmp/refit-mrt-XXXXXX", config[64], yaml[64];
    snprintf(ctl, sizeof ctl, "%s/tools/refitctl", build);
    assert_non_null(mkdtemp(dir));
    snprintf(config, sizeof config, "%s/config.json", dir);
    snprintf(yaml, sizeof yaml, "%s/out.yaml", dir);
    write_config(config);
    char *args[] = {ctl, "manifest", "llama", config, "--name", "bad\xff", NULL};
    assert_int_equal(refitctl(yaml, args), 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_odd_names_round_trip),
        cmocka_unit_test(test_not_utf8_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
