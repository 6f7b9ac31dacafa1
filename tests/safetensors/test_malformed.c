/* Malformed input: one case per validation rule (most rules several ways),
 * each generated here into a temp dir. Every case must be refused with the
 * rule's status, rule id, the right file and tensor, a message naming what
 * was wrong, no set returned, and no leak (ASan). File-level cases also go
 * through st_open_memory, and through the reference reader (Python
 * safetensors), which must refuse them too, except where docs/safetensors.md
 * says refit is stricter. Finally: every rule of ST_RULE_TABLE is covered
 * and distinct rules never share a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "util.h"

/* Reference verdicts. */
enum { REF_REFUSES, REF_ACCEPTS /* refit is stricter, by design */ };

struct fcase {
    const char *id;
    const char *header;     /* header text; NULL: `raw` is the whole file */
    size_t data_len;
    uint64_t len_field;     /* 0: the header's real length */
    st_rule rule;
    const char *tensor;     /* "" when the error names none */
    const char *needle;     /* must appear in the message */
    int ref;
};

#define T(name, body) "\"" name "\":{" body "}"
#define U8_1 "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]"

static const struct fcase fcases[] = {
    {"too-small", NULL, 0, 0, ST_R_HEADER_TOO_SMALL, "", "fewer than the 8-byte", REF_REFUSES},
    {"too-large", "{}", 0, 100000001, ST_R_HEADER_TOO_LARGE, "", "exceeds the limit",
     REF_REFUSES},
    {"past-eof", "{}", 0, 64, ST_R_HEADER_PAST_EOF, "", "past the end", REF_REFUSES},
    {"utf8", "{\"\xff\xfe\":1}", 0, 0, ST_R_JSON_UTF8, "", "UTF-8", REF_REFUSES},
    {"syntax", "{\"a\":", 0, 0, ST_R_JSON_SYNTAX, "", "not valid JSON", REF_REFUSES},
    {"trailing", "{} x", 0, 0, ST_R_JSON_SYNTAX, "", "not valid JSON", REF_REFUSES},
    {"empty-header", "", 0, 0, ST_R_JSON_SYNTAX, "", "not valid JSON", REF_REFUSES},
    {"big-int", "{" T("a", "\"dtype\":\"U8\",\"shape\":[18446744073709551615,0],"
                           "\"data_offsets\":[0,0]") "}",
     0, 0, ST_R_JSON_SYNTAX, "", "integer", REF_ACCEPTS},
    {"nul-name", "{" T("a\\u0000b", U8_1) "}", 1, 0, ST_R_JSON_SYNTAX, "", "NUL", REF_ACCEPTS},
    {"dup-key", "{" T("a", U8_1) "," T("a", U8_1) "}", 1, 0, ST_R_DUPLICATE_KEY, "",
     "duplicate", REF_ACCEPTS},
    {"not-object", "[]", 0, 0, ST_R_HEADER_NOT_OBJECT, "", "array, not an object",
     REF_REFUSES},
    {"meta-type", "{\"__metadata__\":[1]}", 0, 0, ST_R_METADATA_TYPE, "", "'__metadata__' is",
     REF_REFUSES},
    {"meta-value", "{\"__metadata__\":{\"k\":1}}", 0, 0, ST_R_METADATA_VALUE, "",
     "key 'k' is a JSON integer", REF_REFUSES},
    {"entry-type", "{\"t\":5}", 0, 0, ST_R_ENTRY_TYPE, "t", "not an object", REF_REFUSES},
    {"no-dtype", "{" T("t", "\"shape\":[1],\"data_offsets\":[0,1]") "}", 1, 0,
     ST_R_MISSING_FIELD, "t", "missing field 'dtype'", REF_REFUSES},
    {"no-shape", "{" T("t", "\"dtype\":\"U8\",\"data_offsets\":[0,1]") "}", 1, 0,
     ST_R_MISSING_FIELD, "t", "missing field 'shape'", REF_REFUSES},
    {"no-offsets", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1]") "}", 1, 0, ST_R_MISSING_FIELD,
     "t", "missing field 'data_offsets'", REF_REFUSES},
    {"dtype-type", "{" T("t", "\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]") "}", 1, 0,
     ST_R_DTYPE_TYPE, "t", "'dtype' is a JSON integer", REF_REFUSES},
    {"dtype-unknown", "{" T("t", "\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,1]") "}",
     1, 0, ST_R_DTYPE_UNKNOWN, "t", "unknown dtype 'F128'", REF_REFUSES},
    {"dtype-case", "{" T("t", "\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]") "}", 2,
     0, ST_R_DTYPE_UNKNOWN, "t", "'bf16'", REF_REFUSES},
    {"shape-type", "{" T("t", "\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]") "}", 1,
     0, ST_R_SHAPE_TYPE, "t", "'shape' is a JSON string", REF_REFUSES},
    {"shape-neg", "{" T("t", "\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]") "}", 1, 0,
     ST_R_SHAPE_DIM, "t", "shape[0]", REF_REFUSES},
    {"shape-real", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1,1.0],\"data_offsets\":[0,1]") "}",
     1, 0, ST_R_SHAPE_DIM, "t", "shape[1]", REF_REFUSES},
    {"shape-str", "{" T("t", "\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]") "}", 1,
     0, ST_R_SHAPE_DIM, "t", "non-negative integer", REF_REFUSES},
    {"shape-rank", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                              "\"data_offsets\":[0,1]") "}",
     1, 0, ST_R_SHAPE_RANK, "t", "9 dimensions", REF_ACCEPTS},
    {"offsets-short", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]") "}", 1,
     0, ST_R_OFFSETS_TYPE, "t", "two integers", REF_REFUSES},
    {"offsets-long", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]") "}", 1,
     0, ST_R_OFFSETS_TYPE, "t", "two integers", REF_REFUSES},
    {"offsets-obj", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}") "}", 1, 0,
     ST_R_OFFSETS_TYPE, "t", "'data_offsets'", REF_REFUSES},
    {"offset-neg", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]") "}", 1, 0,
     ST_R_OFFSET_VALUE, "t", "data_offsets[0]", REF_REFUSES},
    {"offset-real", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]") "}", 1,
     0, ST_R_OFFSET_VALUE, "t", "data_offsets[1]", REF_REFUSES},
    {"offset-order", "{" T("t", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]") "}", 1,
     0, ST_R_OFFSET_ORDER, "t", "end before they begin", REF_REFUSES},
    {"gap-first", "{" T("t", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]") "}", 3, 0,
     ST_R_OFFSET_GAP, "t", "bytes [0, 2) unused", REF_REFUSES},
    {"gap-middle", "{" T("a", U8_1) "," T("b", "\"dtype\":\"U8\",\"shape\":[1],"
                                              "\"data_offsets\":[2,3]") "}",
     3, 0, ST_R_OFFSET_GAP, "b", "bytes [1, 2) unused", REF_REFUSES},
    {"overlap", "{" T("b", "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]") ","
                T("a", "\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]") "}",
     3, 0, ST_R_OFFSET_OVERLAP, "b", "overlaps tensor 'a'", REF_REFUSES},
    {"overlap-same", "{" T("a", U8_1) "," T("b", U8_1) "}", 1, 0, ST_R_OFFSET_OVERLAP, "b",
     "overlaps", REF_REFUSES},
    {"elems-overflow", "{" T("t", "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],"
                                  "\"data_offsets\":[0,0]") "}",
     0, 0, ST_R_SIZE_OVERFLOW, "t", "element count", REF_REFUSES},
    {"bits-overflow", "{" T("t", "\"dtype\":\"U64\",\"shape\":[2305843009213693952],"
                                 "\"data_offsets\":[0,0]") "}",
     0, 0, ST_R_SIZE_OVERFLOW, "t", "size in bits", REF_REFUSES},
    {"partial-f4", "{" T("t", "\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]") "}", 2, 0,
     ST_R_SIZE_PARTIAL_BYTE, "t", "12 bits", REF_REFUSES},
    {"partial-f6", "{" T("t", "\"dtype\":\"F6_E3M2\",\"shape\":[1,2],\"data_offsets\":[0,2]")
     "}", 2, 0, ST_R_SIZE_PARTIAL_BYTE, "t", "F6_E3M2", REF_REFUSES},
    {"size-mismatch", "{" T("t", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]") "}", 4,
     0, ST_R_SIZE_MISMATCH, "t", "span 4 bytes but dtype F32 and shape need 8", REF_REFUSES},
    {"data-trailing", "{" T("t", U8_1) "}", 2, 0, ST_R_DATA_SIZE, "t",
     "cover 1 bytes but the data section holds 2", REF_REFUSES},
    {"data-short", "{" T("t", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]") "}", 2, 0,
     ST_R_DATA_SIZE, "t", "holds 2", REF_REFUSES},
    {"data-no-tensors", "{}", 1, 0, ST_R_DATA_SIZE, "", "cover 0 bytes", REF_REFUSES},
};
#define NFCASES (sizeof fcases / sizeof fcases[0])

/* Rules seen refused, and one message per rule, for the final checks. */
struct seen {
    int hit[ST_RULE_COUNT];
    char msg[ST_RULE_COUNT][512];
};
static struct seen seen;

static void note(const st_error *e)
{
    seen.hit[e->rule] = 1;
    snprintf(seen.msg[e->rule], sizeof seen.msg[e->rule], "%s", e->message);
}

/* The common contract of a refusal. */
static void expect_refused(int rc, const st_set *s, const st_error *e, int status, st_rule rule,
                           const char *file, const char *tensor, const char *needle)
{
    char line[2048];
    st_error_line(e, line, sizeof line);
    if (rc != status || e->rule != rule)
        print_error("got %s (%d), want [%s] (%d)\n", line, rc, st_rule_name(rule), status);
    assert_int_equal(rc, status);
    assert_int_equal(e->status, status);
    assert_int_equal(e->rule, rule);
    assert_null(s);
    assert_string_equal(e->file, file);
    assert_string_equal(e->tensor, tensor);
    if (!strstr(e->message, needle))
        print_error("message '%s' lacks '%s'\n", e->message, needle);
    assert_non_null(strstr(e->message, needle));
    assert_null(strchr(line, '\n'));
    assert_non_null(strstr(line, st_rule_name(rule)));
    note(e);
}

static void write_case(const struct fcase *c, const char *path)
{
    if (!c->header)
        tu_write(path, "\x01\x00\x00", 3);
    else
        tu_write_st_len(path, c->len_field ? c->len_field : strlen(c->header), c->header,
                        c->data_len);
}

static void run_file_case(const struct fcase *c, const char *path)
{
    st_set *s = (st_set *)1;
    st_error e;
    write_case(c, path);
    int rc = st_open(&s, path, &e);
    expect_refused(rc, s, &e, REFIT_ECORRUPT, c->rule, path, c->tensor, c->needle);

    /* Same verdict for the same bytes in memory. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    st_error m;
    s = (st_set *)1;
    rc = st_open_memory(&s, buf, n, "mem", &m);
    expect_refused(rc, s, &m, REFIT_ECORRUPT, c->rule, "mem", c->tensor, c->needle);
    assert_string_equal(m.message, e.message);
}

static void test_file_rules(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    size_t cap = 64, len = 0;
    char *args = malloc(cap);
    assert_non_null(args);
    strcpy(args, "verdict");
    len = strlen(args);
    for (size_t i = 0; i < NFCASES; i++) {
        char name[80];
        snprintf(name, sizeof name, "%s.safetensors", fcases[i].id);
        char *path = tu_path(dir, name);
        run_file_case(&fcases[i], path);
        size_t need = len + strlen(path) + 4;
        if (need > cap) {
            args = realloc(args, cap = need * 2);
            assert_non_null(args);
        }
        len += (size_t)sprintf(args + len, " '%s'", path);
        free(path);
    }
    /* The reference reader refuses the same files, except where refit is
     * stricter on purpose. */
    if (tu_python()) {
        char *out = tu_crosscheck(args), *line = out;
        for (size_t i = 0; i < NFCASES; i++) {
            char *nl = strchr(line, '\n');
            assert_non_null(nl);
            *nl = '\0';
            int accepts = !strncmp(line, "ok", 2);
            if (accepts != (fcases[i].ref == REF_ACCEPTS))
                print_error("case %s: reference says '%s'\n", fcases[i].id, line);
            assert_int_equal(accepts, fcases[i].ref == REF_ACCEPTS);
            line = nl + 1;
        }
        free(out);
    }
    free(args);
    tu_rmtree(dir);
    free(dir);
}

/* ---- sharded directories --------------------------------------------- */

static const char S_A[] = "{" T("a", U8_1) "}";
static const char S_B[] = "{" T("b", "\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]") "}";

struct dircase {
    const char *id;
    const char *index;          /* NULL: no index file */
    const char *s1, *s2;        /* headers of s1/s2.safetensors; NULL: absent */
    size_t d1, d2;              /* their data sizes */
    st_rule rule;
    const char *file;           /* expected file, relative to the case dir; "" = dir */
    const char *tensor;
    const char *needle;
};

#define WM(x) "{\"weight_map\":{" x "}}"
#define A1 "\"a\":\"s1.safetensors\""
#define B2 "\"b\":\"s2.safetensors\""

static const struct dircase dcases[] = {
    {"ix-syntax", "{", S_A, NULL, 1, 0, ST_R_JSON_SYNTAX, ST_INDEX_NAME, "", "index is not"},
    {"ix-utf8", "{\"\xc3\x28\":1}", S_A, NULL, 1, 0, ST_R_JSON_UTF8, ST_INDEX_NAME, "",
     "index is not valid UTF-8"},
    {"ix-dup", "{\"weight_map\":{" A1 "," A1 "}}", S_A, NULL, 1, 0, ST_R_DUPLICATE_KEY,
     ST_INDEX_NAME, "", "index has a duplicate key"},
    {"ix-not-object", "[]", S_A, NULL, 1, 0, ST_R_INDEX_NOT_OBJECT, ST_INDEX_NAME, "",
     "index is a JSON array"},
    {"ix-no-map", "{\"metadata\":{}}", S_A, NULL, 1, 0, ST_R_INDEX_WEIGHT_MAP, ST_INDEX_NAME,
     "", "missing 'weight_map'"},
    {"ix-map-type", "{\"weight_map\":[]}", S_A, NULL, 1, 0, ST_R_INDEX_WEIGHT_MAP,
     ST_INDEX_NAME, "", "'weight_map' is not an object"},
    {"ix-shard-type", WM("\"a\":1"), S_A, NULL, 1, 0, ST_R_INDEX_SHARD_NAME, ST_INDEX_NAME, "a",
     "not a file name"},
    {"ix-shard-escape", WM("\"a\":\"../s1.safetensors\""), S_A, NULL, 1, 0,
     ST_R_INDEX_SHARD_NAME, ST_INDEX_NAME, "a", "not a plain file name"},
    {"ix-meta-type", "{\"metadata\":5," "\"weight_map\":{" A1 "}}", S_A, NULL, 1, 0,
     ST_R_INDEX_METADATA, ST_INDEX_NAME, "", "'metadata' is a JSON integer"},
    {"ix-total-type", "{\"metadata\":{\"total_size\":\"1\"},\"weight_map\":{" A1 "}}", S_A, NULL,
     1, 0, ST_R_INDEX_TOTAL_SIZE_TYPE, ST_INDEX_NAME, "", "total_size' is not"},
    {"ix-total", "{\"metadata\":{\"total_size\":6},\"weight_map\":{" A1 "," B2 "}}", S_A, S_B, 1,
     4, ST_R_INDEX_TOTAL_SIZE, ST_INDEX_NAME, "", "is 6 but the shards' tensors hold 5"},
    {"shard-missing", WM(A1 "," B2), S_A, NULL, 1, 0, ST_R_SHARD_MISSING, "s2.safetensors", "",
     "does not exist"},
    {"shard-bad", WM(A1 "," B2), S_A, "{" T("b", "\"dtype\":\"F16\",\"shape\":[2],"
                                                 "\"data_offsets\":[0,2]") "}",
     1, 2, ST_R_SIZE_MISMATCH, "s2.safetensors", "b", "need 4"},
    {"shard-extra", WM(A1), "{" T("a", U8_1) "," T("z", "\"dtype\":\"U8\",\"shape\":[1],"
                                                        "\"data_offsets\":[1,2]") "}",
     NULL, 2, 0, ST_R_SHARD_EXTRA_TENSOR, "s1.safetensors", "z", "does not list"},
    {"shard-misplaced", WM(A1 ",\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\""),
     "{" T("a", U8_1) "," T("c", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]") "}",
     S_B, 2, 4, ST_R_SHARD_MISPLACED_TENSOR, "s1.safetensors", "c", "in 's2.safetensors'"},
    {"shard-lacks", WM(A1 ",\"q\":\"s1.safetensors\""), S_A, NULL, 1, 0,
     ST_R_SHARD_MISSING_TENSOR, "s1.safetensors", "q", "shard lacks it"},
    {"dup-tensor", WM(A1 "," B2), S_A, "{" T("a", U8_1) "," T("b", "\"dtype\":\"F16\","
                                                                  "\"shape\":[2],\"data_offsets\":[1,5]") "}",
     1, 5, ST_R_DUPLICATE_TENSOR, "s2.safetensors", "a", "also present in"},
    {"dir-empty", NULL, NULL, NULL, 0, 0, ST_R_DIR_EMPTY, "", "", "no .safetensors file"},
    {"dir-ambiguous", NULL, S_A, S_B, 1, 4, ST_R_DIR_AMBIGUOUS, "", "", "2 .safetensors files"},
};

static void run_dir_case(const struct dircase *c, const char *dir)
{
    assert_int_equal(mkdir(dir, 0755), 0);
    char *p;
    if (c->index) {
        tu_write(p = tu_path(dir, ST_INDEX_NAME), c->index, strlen(c->index));
        free(p);
    }
    if (c->s1) {
        tu_write_st(p = tu_path(dir, "s1.safetensors"), c->s1, c->d1);
        free(p);
    }
    if (c->s2) {
        tu_write_st(p = tu_path(dir, "s2.safetensors"), c->s2, c->d2);
        free(p);
    }
    char *file = c->file[0] ? tu_path(dir, c->file) : strdup(dir);
    st_set *s = (st_set *)1;
    st_error e;
    int rc = st_open(&s, dir, &e);
    expect_refused(rc, s, &e, REFIT_ECORRUPT, c->rule, file, c->tensor, c->needle);
    free(file);
}

static void test_directory_rules(void **state)
{
    (void)state;
    char *root = tu_tmpdir();
    for (size_t i = 0; i < sizeof dcases / sizeof dcases[0]; i++) {
        char *dir = tu_path(root, dcases[i].id);
        run_dir_case(&dcases[i], dir);
        free(dir);
    }
    tu_rmtree(root);
    free(root);
}

/* An index over the size limit: a sparse file, so the test stays cheap. */
static void test_index_too_large(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *ix = tu_path(dir, ST_INDEX_NAME);
    int fd = open(ix, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)ST_MAX_HEADER + 1), 0);
    close(fd);
    st_set *s = (st_set *)1;
    st_error e;
    int rc = st_open(&s, dir, &e);
    expect_refused(rc, s, &e, REFIT_ECORRUPT, ST_R_INDEX_TOO_LARGE, ix, "", "limit");
    tu_rmtree(dir);
    free(ix);
    free(dir);
}

static void test_io_rules(void **state)
{
    (void)state;
    st_set *s = (st_set *)1;
    st_error e;
    char *dir = tu_tmpdir(), *missing = tu_path(dir, "absent.safetensors");
    int rc = st_open(&s, missing, &e);
    expect_refused(rc, s, &e, REFIT_EIO, ST_R_IO, missing, "", "cannot stat");
    s = (st_set *)1;
    rc = st_open(&s, "/dev/null", &e);
    expect_refused(rc, s, &e, REFIT_EIO, ST_R_NOT_REGULAR, "/dev/null", "",
                   "not a regular file");
    assert_int_equal(st_open(&s, NULL, &e), REFIT_EINVAL);
    assert_int_equal(e.rule, ST_R_INVALID_ARG);
    note(&e);
    tu_rmtree(dir);
    free(missing);
    free(dir);
}

/* Runs last: every rule was refused somewhere in this file (ENOMEM in
 * test_alloc_failures, a changed file in test_reader), and no two rules
 * share a message. */
static void test_rules_covered_and_distinct(void **state)
{
    (void)state;
    for (int r = 0; r < ST_RULE_COUNT; r++) {
        if (r == ST_R_OK || r == ST_R_NOMEM || r == ST_R_FILE_CHANGED)
            continue;
        if (!seen.hit[r])
            print_error("rule %s never exercised\n", st_rule_name((st_rule)r));
        assert_true(seen.hit[r]);
        for (int q = 0; q < r; q++)
            if (seen.hit[q])
                assert_string_not_equal(seen.msg[q], seen.msg[r]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_rules),
        cmocka_unit_test(test_directory_rules),
        cmocka_unit_test(test_index_too_large),
        cmocka_unit_test(test_io_rules),
        cmocka_unit_test(test_rules_covered_and_distinct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
