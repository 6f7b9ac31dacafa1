/* The validator: each mistake is reported as file:line:column: message, at
 * the node it is about. Every case is one small file and the exact line
 * expected among the diagnostics; good files (the shipped declarations and
 * the demo manifest) validate clean. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "putil.h"
#include "schemas/format_decl.h"
#include "schemas/model_doc.h"
#include "schemas/validate.h"

typedef struct vcase {
    const char *title;
    schema_kind kind;           /* UNKNOWN: let the validator tell */
    const char *text;
    const char *want;           /* "L:C: message", after "file:" */
} vcase;

#define FMT_HEAD "name: f\nabi: 2\n"
#define RT_OK "runtime:\n  - {role: o, dtypes: [f32]}\n"
#define MOD_HEAD "kind: model\nmodules:\n  - name: m\n    format: unquantized\n"

static const vcase cases[] = {
    /* format declarations: the schema */
    {"misspelt key", SCHEMA_KIND_FORMAT,
     FMT_HEAD "chekpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n" RT_OK,
     "3:1: unknown key 'chekpoint' in format declaration; did you mean 'checkpoint'?"},
    {"missing required key", SCHEMA_KIND_FORMAT, FMT_HEAD RT_OK,
     "1:1: format declaration: missing required key 'checkpoint'"},
    {"route not a route", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - {role: w, dtypes: [f32], route: DIRCT}\n" RT_OK,
     "4:37: 'DIRCT' is not one of DIRECT, VIEW, STAGED; did you mean 'DIRECT'?"},
    {"scalar for a list", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - role: w\n    dtypes: f32\n    route: DIRECT\n" RT_OK,
     "5:13: expected a list, got a scalar"},
    {"abi out of range", SCHEMA_KIND_FORMAT,
     "name: f\nabi: 7\ncheckpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n" RT_OK,
     "2:6: 7 is above the maximum 2"},
    {"name not an identifier", SCHEMA_KIND_FORMAT,
     "name: FP8\nabi: 2\ncheckpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n" RT_OK,
     "1:7: 'FP8' is not a lowercase identifier ([a-z][a-z0-9_]*)"},
    {"duplicate key", SCHEMA_KIND_FORMAT,
     FMT_HEAD "abi: 2\ncheckpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n" RT_OK,
     "3:1: duplicate key 'abi' (first at line 2, column 1)"},
    {"not a boolean", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - {role: w, dtypes: [f32], route: STAGED}\n" RT_OK
     "post_load:\n  - {kernel: k, idempotent: maybe}\n",
     "8:29: expected true or false, got 'maybe'"},
    {"unknown dtype", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - {role: w, dtypes: [bf61], route: DIRECT}\n" RT_OK,
     "4:24: 'bf61' is not one of f64, f32, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64, "
     "bool, f8_e4m3, f8_e5m2, f8_e8m0, f4_e2m1; did you mean 'bf16'?"},
    {"empty list", SCHEMA_KIND_FORMAT, FMT_HEAD "checkpoint: []\n" RT_OK,
     "3:13: checkpoint roles: at least 1 item expected, got 0"},
    /* format declarations: across nodes */
    {"STAGED without a kernel", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - role: w\n    dtypes: [f32]\n    route: [DIRECT, STAGED]\n" RT_OK,
     "6:12: checkpoint role 'w' may be STAGED, but no post-load kernel is declared to build "
     "runtime tensors from staging"},
    {"role declared twice", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n"
     "  - {role: w, dtypes: [f16], route: DIRECT}\n" RT_OK,
     "5:12: checkpoint role 'w' is declared twice (first at line 4, column 5)"},
    {"kernel reads an undeclared role", SCHEMA_KIND_FORMAT,
     FMT_HEAD "checkpoint:\n  - {role: w, dtypes: [f32], route: STAGED}\n" RT_OK
     "post_load:\n  - {kernel: k, idempotent: true, reads: [scale]}\n",
     "8:43: post-load kernel reads 'scale', which is not a declared checkpoint role"},
    {"default of the wrong type", SCHEMA_KIND_FORMAT,
     FMT_HEAD "params:\n  cast: {type: bool, default: 3}\n"
     "checkpoint:\n  - {role: w, dtypes: [f32], route: DIRECT}\n" RT_OK,
     "4:31: default of parameter 'cast': expected true or false"},
    /* model manifests: the schema */
    {"not YAML", SCHEMA_KIND_UNKNOWN, "kind: model\nmodules: [a, b\n",
     "3:1: did not find expected ',' or ']' while parsing a flow sequence"},
    {"empty file", SCHEMA_KIND_UNKNOWN, "# nothing\n", "1:1: the document is empty"},
    {"two documents", SCHEMA_KIND_UNKNOWN, "kind: model\n---\nkind: model\n",
     "2:1: a second YAML document; a file holds exactly one"},
    {"kind unknown", SCHEMA_KIND_UNKNOWN, "name: x\n",
     "1:1: cannot tell a format declaration from a model manifest: add 'kind: format' or "
     "'kind: model'"},
    {"negative extent", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4, -1]}]\n"
     "    checkpoint: [{name: a, dtype: f32, shape: [4, 1]}]\n",
     "5:48: -1 is below the minimum 0"},
    {"extra key on a tie", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [4]}\n"
     "      - {name: b, tie: a, dtype: f32}\n",
     "8:27: unknown key 'dtype' in tied checkpoint tensor (allowed: name, tie, doc)"},
    {"module of the wrong kind", SCHEMA_KIND_UNKNOWN, "kind: model\nmodules:\n  - embed\n",
     "3:5: expected a module or a repeat group, got a scalar"},
    /* model manifests: across nodes */
    {"shape beyond int64", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4611686018427387904, 4]}]\n"
     "    checkpoint: [{name: a, dtype: f32, shape: [4]}]\n",
     "5:15: runtime tensor t: the shape is too large"},
    {"target that is not there", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4]}, {name: u, dtype: f32, shape: [4]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [4], target: v}\n",
     "7:9: target 'v' is not a runtime tensor of module m"},
    {"two runtime tensors, no target", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4]}, {name: u, dtype: f32, shape: [4]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [4]}\n",
     "7:9: module m has 2 runtime tensors: name a target"},
    {"checkpoint name twice", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [8]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [4]}\n"
     "      - {name: a, dtype: f32, shape: [4], fuse: {dst_offset: [4]}}\n",
     "8:9: checkpoint tensor a is listed twice (first at line 7, column 9)"},
    {"shard that does not fit", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [3, 8]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [8, 8], shard: {dim: 0, count: 2}}\n",
     "7:9: checkpoint tensor a: dim 0: rows [0, 4) do not fit runtime t's extent 3"},
    {"shard dim beyond the tensor", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [4], shard: {dim: 1, count: 2}}\n",
     "7:50: shard dim 1, but a has 1 dims"},
    {"pad_to below the extent", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [8]}]\n"
     "    checkpoint:\n      - {name: a, dtype: f32, shape: [6], padding: {pad_to: 5}}\n",
     "7:9: pad_to 5 is smaller than the extent 6"},
    {"tie across modules", SCHEMA_KIND_UNKNOWN,
     MOD_HEAD "    runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "    checkpoint: [{name: a, dtype: f32, shape: [4]}]\n"
     "  - name: n\n    format: unquantized\n    runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "    checkpoint: [{name: c, dtype: f32, shape: [4]}, {name: b, tie: a}]\n",
     "10:53: tied to a of module m; ties stay in one module"},
    {"undefined repeat variable", SCHEMA_KIND_UNKNOWN,
     "kind: model\nmodules:\n  - repeat: {var: l, count: 2}\n    modules:\n"
     "      - name: layer.${k}\n        format: unquantized\n"
     "        runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "        checkpoint: [{name: \"a.${l}\", dtype: f32, shape: [4]}]\n",
     "5:15: 'k' is not a repeat variable here (with l=0)"},
    {"module name twice after expansion", SCHEMA_KIND_UNKNOWN,
     "kind: model\nmodules:\n  - repeat: {var: l, count: 2}\n    modules:\n"
     "      - name: layer\n        format: unquantized\n"
     "        runtime: [{name: t, dtype: f32, shape: [4]}]\n"
     "        checkpoint: [{name: \"a.${l}\", dtype: f32, shape: [4]}]\n",
     "5:9: module layer is listed twice (first at line 5, column 9) (with l=1)"},
};

static void run_case(const vcase *c, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/case.yaml", dir);
    pt_write(path, c->text, 0644);
    sdiags d = {.max = 64};
    int rc = schema_validate_file(path, c->kind, NULL, &d);
    char want[8192];
    snprintf(want, sizeof want, "%s:%s", path, c->want);
    int found = 0;
    for (size_t i = 0; i < d.n; i++)
        found |= !strcmp(d.lines[i], want);
    if (getenv("PT_SHOW")) { /* for writing new cases: print, do not judge */
        for (size_t i = 0; i < d.n; i++)
            print_message("%s => %s\n", c->title, strchr(d.lines[i] + strlen(path), ':') + 1);
        sdiags_free(&d);
        return;
    }
    if (rc != REFIT_ECORRUPT || !found) {
        for (size_t i = 0; i < d.n; i++)
            print_error("  got: %s\n", d.lines[i]);
        fail_msg("case '%s': rc %s, want the line\n  %s", c->title, refit_status_name(rc), want);
    }
    sdiags_free(&d);
}

static void test_each_mistake_at_its_place(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], dir);
    pt_rmtree(dir);
}

/* Every mistake of a file is listed, not only the first. */
static void test_all_mistakes_listed(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    const char *path = pt_path(dir, "many.yaml");
    pt_write(path, "kind: format\nname: F\nabi: 0\nchekpoint: []\nruntime: 3\n", 0644);
    sdiags d = {.max = 64};
    schema_kind found;
    assert_int_equal(schema_validate_file(path, SCHEMA_KIND_UNKNOWN, &found, &d), REFIT_ECORRUPT);
    assert_int_equal(found, SCHEMA_KIND_FORMAT);
    assert_int_equal(d.n, 5); /* name, abi, chekpoint, runtime, missing checkpoint */
    sdiags_free(&d);
    pt_rmtree(dir);
}

static void test_unreadable_file(void **state)
{
    (void)state;
    sdiags d = {0};
    assert_int_equal(schema_validate_file("/nonexistent/x.yaml", SCHEMA_KIND_UNKNOWN, NULL, &d),
                     REFIT_EIO);
    assert_string_equal(sdiags_first(&d), "/nonexistent/x.yaml: cannot read: No such file or "
                                          "directory");
    sdiags_free(&d);
}

/* Anchors that expand exponentially are cut off, not walked for ever. */
static void test_alias_expansion_is_bounded(void **state)
{
    (void)state;
    char *dir = pt_tmpdir();
    const char *path = pt_path(dir, "bomb.yaml");
    char text[4096] = "kind: model\na: &a [x, x, x, x, x, x, x, x]\n";
    char prev = 'a';
    for (char c = 'b'; c <= 'j'; c++, prev++) {
        char line[128];
        snprintf(line, sizeof line, "%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n", c, c,
                 prev, prev, prev, prev, prev, prev, prev, prev);
        strcat(text, line);
    }
    strcat(text, "modules: [*j]\n");
    pt_write(path, text, 0644);
    sdiags d = {.max = 8};
    assert_int_equal(schema_validate_file(path, SCHEMA_KIND_MODEL, NULL, &d), REFIT_ECORRUPT);
    sdiags_free(&d);
    pt_rmtree(dir);
}

static void test_shipped_files_are_valid(void **state)
{
    (void)state;
    const char *root = pt_env("REFIT_SOURCE_ROOT");
    const char *files[] = {"plugins/unquantized/unquantized.yaml", "tools/demo/demo.yaml"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        sdiags d = {0};
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root, files[i]);
        int rc = schema_validate_file(path, SCHEMA_KIND_UNKNOWN, NULL, &d);
        if (rc)
            fail_msg("%s: %s", files[i], sdiags_first(&d));
        sdiags_free(&d);
    }
}

/* The demo manifest expands to what refit-demo builds: 14 modules, 39
 * checkpoint names, ranks left to the context. */
static void test_demo_manifest_expands(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tools/demo/demo.yaml", pt_env("REFIT_SOURCE_ROOT"));
    sdiags d = {0};
    mdoc *m = NULL;
    assert_int_equal(mdoc_load_file(&m, path, &d), REFIT_OK);
    assert_int_equal(m->n_mods, 14);
    assert_int_equal(m->n_ck, 39);
    assert_string_equal(m->mods[4].name, "layers.1.attn");
    assert_string_equal(m->mods[4].ck[1].name, "model.layers.1.self_attn.k_proj.weight");
    assert_int_equal(m->mods[4].ck[1].dst_offset[0], 128);
    assert_int_equal(m->mods[4].ck[1].shard_rank, -1);
    assert_string_equal(m->mods[4].ck[1].iter, "l=1");
    assert_string_equal(m->mods[0].ck[1].tie, "model.embed_tokens.weight");
    mdoc_free(m);
    sdiags_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_mistake_at_its_place),
        cmocka_unit_test(test_all_mistakes_listed),
        cmocka_unit_test(test_unreadable_file),
        cmocka_unit_test(test_alias_expansion_is_bounded),
        cmocka_unit_test(test_shipped_files_are_valid),
        cmocka_unit_test(test_demo_manifest_expands),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
