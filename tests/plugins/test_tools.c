/* refitctl formats and refitctl validate, run as an operator would. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "putil.h"

/* Run refitctl with args (shell words); stdout and stderr together into
 * *out (malloc'd); returns the exit status. */
static int refitctl(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tools/refitctl %s 2>&1", pt_env("REFIT_BUILD_ROOT"), args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (size_t got; (got = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            assert_non_null(nb);
            buf = nb;
        }
    }
    buf[n] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_formats_json_lists_found_and_refused(void **state)
{
    (void)state;
    char *dir = pt_tmpdir(), *out;
    pt_stage_fake(dir, "fakestaged", PT_DECL_STAGED);
    pt_stage_fake(dir, "badv0", PT_DECL_DIRECT);
    int rc = refitctl(pt_fmt("formats --only --plugin-dir %s --json", dir), &out);
    assert_int_equal(rc, 1); /* something was refused */
    json_error_t err;
    json_t *root = json_loads(out, 0, &err);
    if (!root)
        fail_msg("not JSON (%s): %s", err.text, out);
    json_t *fmts = json_object_get(root, "formats"), *ref = json_object_get(root, "refused");
    assert_int_equal(json_array_size(fmts), 1);
    json_t *f = json_array_get(fmts, 0);
    assert_string_equal(json_string_value(json_object_get(f, "name")), "fakestaged");
    assert_int_equal(json_integer_value(json_object_get(f, "abi")), 2);
    json_t *routes = json_object_get(f, "routes");
    assert_int_equal(json_array_size(routes), 2);
    assert_string_equal(json_string_value(json_array_get(routes, 1)), "STAGED");
    json_t *k = json_array_get(json_object_get(f, "kernels"), 0);
    assert_string_equal(json_string_value(json_object_get(k, "name")), "identity");
    assert_true(json_is_true(json_object_get(k, "idempotent")));
    assert_int_equal(json_array_size(ref), 1);
    json_t *r = json_array_get(ref, 0);
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        pt_path(dir, "refit-fmt-badv0.so"));
    PT_HAS(json_string_value(json_object_get(r, "reason")), "invalid version 0");
    json_decref(root);
    free(out);
    pt_rmtree(dir);
}

static void test_formats_text_and_exit_zero(void **state)
{
    (void)state;
    char *dir = pt_tmpdir(), *out;
    pt_stage_fake(dir, "fakedirect", PT_DECL_DIRECT);
    assert_int_equal(refitctl(pt_fmt("formats --only --plugin-dir %s", dir), &out), 0);
    PT_HAS(out, pt_fmt("  %s (plugin_dirs)", dir));
    PT_HAS(out, "fakedirect   ABI 2  ");
    PT_HAS(out, "routes DIRECT; post-load kernels: none");
    free(out);
    /* the default path, from the build tree, finds the build's unquantized */
    assert_true(refitctl("formats --json", &out) >= 0);
    PT_HAS(out, "\"origin\": \"build\"");
    PT_HAS(out, pt_fmt("\"path\": \"%s", pt_env("REFIT_BUILD_ROOT")));
    PT_HAS(out, "refit-fmt-unquantized.so\"");
    free(out);
    assert_int_equal(refitctl("formats --bogus", &out), 2);
    free(out);
    pt_rmtree(dir);
}

static void test_validate_prints_positions(void **state)
{
    (void)state;
    char *dir = pt_tmpdir(), *out;
    const char *bad = pt_path(dir, "bad.yaml");
    pt_write(bad, "kind: format\nname: x\nabi: 2\ncheckpoint:\n"
                  "  - {role: w, dtypes: [f32], route: STAGED}\n"
                  "runtime:\n  - {role: o, dtypes: [f32], colour: red}\n", 0644);
    char badp[4096];
    snprintf(badp, sizeof badp, "%s", bad);
    assert_int_equal(refitctl(pt_fmt("validate %s", badp), &out), 1);
    PT_HAS(out, pt_fmt("%s:7:30: unknown key 'colour' in runtime role (allowed: role, match, "
                       "dtypes, doc)\n", badp));
    free(out);
    const char *root = pt_env("REFIT_SOURCE_ROOT");
    assert_int_equal(refitctl(pt_fmt("validate %s/tools/demo/demo.yaml "
                                     "%s/plugins/unquantized/unquantized.yaml", root, root),
                              &out), 0);
    PT_HAS(out, "demo.yaml: valid model manifest");
    PT_HAS(out, "unquantized.yaml: valid format declaration");
    free(out);
    /* --model forces the kind: a declaration is then a poor manifest */
    assert_int_equal(refitctl(pt_fmt("validate --model %s/plugins/unquantized/unquantized.yaml",
                                     root), &out), 1);
    PT_HAS(out, "unquantized.yaml:4:7: 'format' is not one of model");
    free(out);
    assert_int_equal(refitctl("validate", &out), 2);
    free(out);
    pt_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_json_lists_found_and_refused),
        cmocka_unit_test(test_formats_text_and_exit_zero),
        cmocka_unit_test(test_validate_prints_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
