/* The safetensors reader on valid input: the tiny-Llama fixture against the
 * reference reader (Python safetensors), every dtype, rank-0, zero-size and
 * unaligned tensors, metadata, memory sets, change detection, file digests,
 * and a 100k-tensor header. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/sha256.h"
#include "util.h"

#define FIXTURE "tests/data/hf-tiny-llama-sharded"

static char *fixture_path(void)
{
    return tu_path(tu_source_root(), FIXTURE);
}

static st_set *open_ok(const char *path)
{
    st_set *s = NULL;
    st_error e;
    int rc = st_open(&s, path, &e);
    if (rc) {
        char line[2048];
        print_error("unexpected: %s\n", st_error_line(&e, line, sizeof line));
    }
    assert_int_equal(rc, REFIT_OK);
    assert_non_null(s);
    return s;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- the fixture ---------------------------------------------------------- */

static void test_fixture_facts(void **state)
{
    (void)state;
    char *dir = fixture_path();
    st_set *s = open_ok(dir);
    assert_int_equal(st_file_count(s), 7);
    assert_int_equal(st_count(s), 21);
    for (size_t i = 0; i < 7; i++) {
        char want[64];
        snprintf(want, sizeof want, "model-%05zu-of-00007.safetensors", i + 1);
        assert_string_equal(base_name(st_file_path(s, i)), want);
        assert_string_equal(st_metadata_get(s, i, "format"), "pt");
    }
    assert_null(st_metadata_get(s, 0, "absent"));
    const st_tensor *e = st_find(s, "model.embed_tokens.weight");
    assert_non_null(e);
    assert_int_equal(e->dtype, ST_BF16);
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 256);
    assert_int_equal(e->shape[1], 64);
    assert_int_equal(e->nbytes, 32768);
    assert_int_equal(e->file, 0);
    assert_int_equal(e->offset, 8 + 120); /* header of shard 1 is 120 bytes */
    assert_int_equal(st_find(s, "lm_head.weight")->file, 6);
    assert_int_equal(st_find(s, "model.norm.weight")->shape[0], 64);
    assert_null(st_find(s, "model.embed_tokens"));
    assert_null(st_find(s, ""));
    /* Stream order: by file, then by offset; every name finds itself. */
    uint64_t total = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        assert_ptr_equal(st_find(s, t->name), t);
        if (i) {
            const st_tensor *p = st_tensor_at(s, i - 1);
            assert_true(p->file < t->file ||
                        (p->file == t->file && p->offset + p->nbytes == t->offset));
        }
        total += t->nbytes;
    }
    assert_int_equal(total, 213632); /* the index's metadata.total_size */
    assert_null(st_tensor_at(s, 21));
    st_close(s);
    free(dir);
}

/* Our listing, in crosscheck.py's line format, sorted by name. */
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *our_listing(const st_set *s)
{
    size_t n = st_count(s), cap = 1;
    char **lines = calloc(n ? n : 1, sizeof *lines);
    assert_non_null(lines);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(s, i);
        char shape[200] = "", hex[ST_SHA256_HEX];
        uint8_t d[ST_SHA256_DIGEST];
        for (int k = 0; k < t->ndim; k++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%" PRId64,
                     k ? "," : "", t->shape[k]);
        st_sha256_buf(t->data, (size_t)t->nbytes, d);
        st_sha256_hex(d, hex);
        size_t len = strlen(t->name) + strlen(shape) + 200;
        lines[i] = malloc(len);
        assert_non_null(lines[i]);
        snprintf(lines[i], len, "%s\t%s\t%s\t%" PRIu64 "\t%s\t%s\n", t->name,
                 st_dtype_name(t->dtype), shape, t->nbytes, hex,
                 base_name(st_file_path(s, t->file)));
        cap += strlen(lines[i]);
    }
    qsort(lines, n, sizeof *lines, cmp_str);
    char *out = malloc(cap);
    assert_non_null(out);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(out, lines[i]);
        free(lines[i]);
    }
    free(lines);
    return out;
}

/* Names, dtypes, shapes, sizes, shard placement and the bytes of every
 * tensor, as the reference reader sees them. Without the venv, tests whose
 * own C checks already ran just say so; test_fixture_crosscheck skips. */
static void crosscheck_listing(const char *path)
{
    if (!tu_python()) {
        print_message("# no venv with safetensors: reference cross-check not run\n");
        return;
    }
    st_set *s = open_ok(path);
    char *ours = our_listing(s);
    char args[4200];
    snprintf(args, sizeof args, "list '%s'", path);
    char *ref = tu_crosscheck(args);
    assert_string_equal(ours, ref);
    free(ref);
    free(ours);
    st_close(s);
}

static void test_fixture_crosscheck(void **state)
{
    (void)state;
    if (!tu_python())
        skip();
    char *dir = fixture_path();
    crosscheck_listing(dir);
    free(dir);
}

static void test_fixture_sha256(void **state)
{
    (void)state;
    char *dir = fixture_path();
    st_set *s = open_ok(dir);
    char hex[65], again[65];
    st_error e;
    assert_int_equal(st_file_sha256(s, 0, hex, &e), REFIT_OK);
    /* sha256sum of model-00001-of-00007.safetensors, as the hub lists it */
    assert_string_equal(hex, "99bfe8b5a0c34c67a71bcf4a1d3d7262428f3c585bff19eee38787f55688b942");
    assert_int_equal(st_file_sha256(s, 0, again, &e), REFIT_OK); /* cached */
    assert_string_equal(again, hex);
    assert_int_equal(st_file_sha256(s, 7, hex, &e), REFIT_EINVAL);
    if (tu_python()) {
        char args[4200], ours[8192] = "";
        for (size_t i = 0; i < st_file_count(s); i++) {
            assert_int_equal(st_file_sha256(s, i, hex, &e), REFIT_OK);
            snprintf(ours + strlen(ours), sizeof ours - strlen(ours), "%s\t%s\n",
                     base_name(st_file_path(s, i)), hex);
        }
        snprintf(args, sizeof args, "files '%s'", dir);
        char *ref = tu_crosscheck(args);
        assert_string_equal(ours, ref);
        free(ref);
    }
    st_close(s);
    free(dir);
}

static void test_index_parse_fixture(void **state)
{
    (void)state;
    char *ixpath = tu_path(tu_source_root(), FIXTURE "/" ST_INDEX_NAME);
    FILE *f = fopen(ixpath, "rb");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    st_index *ix;
    st_error e;
    assert_int_equal(st_index_parse(&ix, buf, n, ixpath, &e), REFIT_OK);
    assert_int_equal(st_index_shard_count(ix), 7);
    assert_int_equal(st_index_tensor_count(ix), 21);
    assert_int_equal(st_index_total_size(ix), 213632);
    assert_string_equal(st_index_shard(ix, 0), "model-00001-of-00007.safetensors");
    assert_int_equal(st_index_shard_of(ix, "lm_head.weight"), 6);
    assert_int_equal(st_index_shard_of(ix, "nope"), -1);
    st_index_free(ix);
    free(ixpath);
}

/* The index file itself opens the checkpoint beside it. */
static void test_open_index_path(void **state)
{
    (void)state;
    char *ixpath = tu_path(tu_source_root(), FIXTURE "/" ST_INDEX_NAME);
    st_set *s = open_ok(ixpath);
    assert_int_equal(st_file_count(s), 7);
    assert_int_equal(st_count(s), 21);
    assert_non_null(st_find(s, "lm_head.weight"));
    st_close(s);
    free(ixpath);
}

/* One shard opened as a file, and a directory holding only that shard. */
static void test_single_file_and_lone_dir(void **state)
{
    (void)state;
    char *dir = fixture_path();
    char *shard = tu_path(dir, "model-00002-of-00007.safetensors");
    st_set *s = open_ok(shard);
    assert_int_equal(st_count(s), 4);
    assert_string_equal(st_file_path(s, 0), shard);
    st_close(s);

    char *tmp = tu_tmpdir(), *copy = tu_path(tmp, "only.safetensors");
    size_t n;
    uint8_t *bytes = tu_build_st("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                 8, &n);
    tu_write(copy, bytes, n);
    s = open_ok(tmp);
    assert_int_equal(st_count(s), 1);
    assert_string_equal(st_file_path(s, 0), copy);
    assert_memory_equal(st_find(s, "w")->data, bytes + n - 8, 8);
    st_close(s);
    free(bytes);
    tu_rmtree(tmp);
    free(copy);
    free(tmp);
    free(shard);
    free(dir);
}

/* ---- formats the fixture does not exercise ------------------------------ */

static void test_dtype_table(void **state)
{
    (void)state;
    static const char *names[] = {"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2",
                                  "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",
                                  "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64",
                                  "I64", "U64"};
    static const unsigned bits[] = {8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8,
                                    16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};
    assert_int_equal(ST_DTYPE_COUNT, 22);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        st_dtype dt;
        assert_int_equal(st_dtype_from_name(names[i], &dt), 0);
        assert_int_equal(dt, i);
        assert_string_equal(st_dtype_name(dt), names[i]);
        assert_int_equal(st_dtype_bits(dt), bits[i]);
    }
    st_dtype dt;
    assert_int_equal(st_dtype_from_name("bf16", &dt), -1); /* names are exact */
    assert_int_equal(st_dtype_from_name("F8_E4M3FN", &dt), -1);
    assert_string_equal(st_dtype_name(ST_DTYPE_COUNT), "?");
    static const struct { st_dtype dt; uint8_t code, bits; } map[] = {
        {ST_F32, REFIT_DTYPE_FLOAT, 32}, {ST_F16, REFIT_DTYPE_FLOAT, 16},
        {ST_BF16, REFIT_DTYPE_BFLOAT, 16}, {ST_I8, REFIT_DTYPE_INT, 8},
        {ST_U8, REFIT_DTYPE_UINT, 8}, {ST_I32, REFIT_DTYPE_INT, 32},
        {ST_BOOL, REFIT_DTYPE_BOOL, 8}, {ST_F8_E4M3, 10, 8}, {ST_F8_E5M2, 12, 8},
        {ST_F8_E8M0, 14, 8}, {ST_F4, 17, 4}, {ST_F6_E2M3, 0xff, 6},
        {ST_F8_E4M3FNUZ, 0xff, 8}, {ST_C64, 0xff, 64},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        refit_dtype r = st_dtype_to_refit(map[i].dt);
        assert_int_equal(r.code, map[i].code);
        assert_int_equal(r.bits, map[i].bits);
        assert_int_equal(r.lanes, 1);
    }
}

static char *write_tmp_st(char **dir, const char *header, size_t data_len)
{
    *dir = tu_tmpdir();
    char *path = tu_path(*dir, "t.safetensors");
    tu_write_st(path, header, data_len);
    return path;
}

static void test_every_dtype(void **state)
{
    (void)state;
    char header[8192] = "{", *p = header + 1;
    uint64_t off = 0;
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        uint64_t nb = 8 * st_dtype_bits((st_dtype)i) / 8; /* shape [2, 4] */
        p += sprintf(p, "%s\"t.%s\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[%" PRIu64
                     ",%" PRIu64 "]}", i ? "," : "", st_dtype_name((st_dtype)i),
                     st_dtype_name((st_dtype)i), off, off + nb);
        off += nb;
    }
    strcpy(p, "}");
    char *dir, *path = write_tmp_st(&dir, header, (size_t)off);
    st_set *s = open_ok(path);
    assert_int_equal(st_count(s), ST_DTYPE_COUNT);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", st_dtype_name((st_dtype)i));
        const st_tensor *t = st_find(s, name);
        assert_non_null(t);
        assert_int_equal(t->dtype, i);
        assert_int_equal(t->nbytes, st_dtype_bits((st_dtype)i)); /* 8 elements */
    }
    assert_int_equal(st_find(s, "t.F4")->nbytes, 4);
    assert_int_equal(st_find(s, "t.F6_E3M2")->nbytes, 6);
    st_close(s);
    crosscheck_listing(path);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

/* A scalar, a zero-size tensor sharing its offset with the next one, an odd
 * header length and odd offsets: all valid, data pointers exact. */
static const char edge_header[] =
    "{\"after\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[7,11]},"
    "\"empty\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[7,7]},"
    "\"bytes\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]},"
    "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
    "\"__metadata__\":{\"format\":\"pt\",\"note\":\"edge\"}} "; /* 278 bytes: 'after' lands at odd offset 293 */

static void test_rank0_zero_size_unaligned(void **state)
{
    (void)state;
    char *dir, *path = write_tmp_st(&dir, edge_header, 11);
    st_set *s = open_ok(path);
    static const char *order[] = {"scalar", "bytes", "empty", "after"};
    for (size_t i = 0; i < 4; i++)
        assert_string_equal(st_tensor_at(s, i)->name, order[i]); /* by offset */
    const st_tensor *sc = st_find(s, "scalar"), *em = st_find(s, "empty");
    const st_tensor *af = st_find(s, "after");
    assert_int_equal(sc->ndim, 0);
    assert_int_equal(sc->nbytes, 4);
    assert_int_equal(em->ndim, 2);
    assert_int_equal(em->nbytes, 0);
    uint64_t hl = sizeof edge_header - 1;
    assert_int_equal(af->offset, 8 + hl + 7);
    assert_int_equal(af->offset % 2, 1); /* odd: alignment is not required */
    const uint8_t *d = af->data;
    for (int i = 0; i < 4; i++)
        assert_int_equal(d[i], (uint8_t)((7 + i) * 31 + 7)); /* tu_write_st's pattern */
    assert_string_equal(st_metadata_get(s, 0, "note"), "edge");
    st_close(s);
    crosscheck_listing(path);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

static void test_null_metadata_and_extra_keys(void **state)
{
    (void)state;
    char *dir, *path = write_tmp_st(&dir,
        "{\"__metadata__\":null,\"a\":{\"dtype\":\"I8\",\"shape\":[2],"
        "\"data_offsets\":[0,2],\"extra\":[1,{\"x\":null}]}}", 2);
    st_set *s = open_ok(path);
    assert_null(st_metadata_get(s, 0, "format"));
    assert_int_equal(st_find(s, "a")->nbytes, 2);
    st_close(s);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

static void test_empty_file_set(void **state)
{
    (void)state;
    size_t n;
    uint8_t *buf = tu_build_st("{}      ", 0, &n);
    st_set *s;
    st_error e;
    assert_int_equal(st_open_memory(&s, buf, n, "empty", &e), REFIT_OK);
    assert_int_equal(st_count(s), 0);
    assert_null(st_find(s, "x"));
    st_close(s);
    free(buf);
}

static void test_memory_set(void **state)
{
    (void)state;
    size_t n;
    uint8_t *buf = tu_build_st(edge_header, 11, &n);
    st_set *s;
    st_error e;
    assert_int_equal(st_open_memory(&s, buf, n, "mem", &e), REFIT_OK);
    assert_string_equal(st_file_path(s, 0), "mem");
    assert_int_equal(st_file_size(s, 0), n);
    const st_tensor *t = st_find(s, "bytes");
    assert_ptr_equal(t->data, buf + t->offset); /* no copy: into the buffer */
    assert_int_equal(st_set_recheck(s, &e), REFIT_OK);
    char hex[65], want[65];
    uint8_t d[32];
    st_sha256_buf(buf, n, d);
    st_sha256_hex(d, want);
    assert_int_equal(st_file_sha256(s, 0, hex, &e), REFIT_OK);
    assert_string_equal(hex, want);
    st_close(s);
    free(buf);
}

/* ---- change detection ---------------------------------------------------- */

static void expect_changed(const st_set *s, const char *what)
{
    st_error e;
    assert_int_equal(st_set_recheck(s, &e), REFIT_EIO);
    assert_int_equal(e.rule, ST_R_FILE_CHANGED);
    assert_non_null(strstr(e.message, what));
}

static void test_recheck_detects_changes(void **state)
{
    (void)state;
    const char *hdr = "{\"w\":{\"dtype\":\"U8\",\"shape\":[4096],\"data_offsets\":[0,4096]}}";
    char *dir, *path = write_tmp_st(&dir, hdr, 4096);
    char *other = tu_path(dir, "other.safetensors");
    st_error e;

    st_set *s = open_ok(path); /* grows */
    assert_int_equal(st_set_recheck(s, &e), REFIT_OK);
    FILE *f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    expect_changed(s, "size changed");
    st_close(s);

    tu_write_st(path, hdr, 4096); /* truncated: an error, not SIGBUS */
    s = open_ok(path);
    assert_int_equal(truncate(path, 100), 0);
    expect_changed(s, "size changed from");
    char hex[65];
    assert_int_equal(st_file_sha256((st_set *)s, 0, hex, &e), REFIT_EIO);
    assert_int_equal(e.rule, ST_R_FILE_CHANGED);
    st_close(s);

    tu_write_st(path, hdr, 4096); /* same size, new mtime */
    s = open_ok(path);
    struct timespec t[2] = {{0, UTIME_OMIT}, {12345, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
    expect_changed(s, "mtime");
    st_close(s);

    tu_write_st(path, hdr, 4096); /* replaced by rename, then removed */
    s = open_ok(path);
    tu_write_st(other, hdr, 4096);
    assert_int_equal(rename(other, path), 0);
    expect_changed(s, "replaced");
    unlink(path);
    expect_changed(s, "no longer exists");
    st_close(s);

    tu_rmtree(dir);
    free(other);
    free(path);
    free(dir);
}

/* ---- scale ------------------------------------------------------------ */

/* MoE-shaped header of 100k tensors listed in reverse offset order: every
 * one is parsed, indexed and found by name at its index. How long that
 * takes against the tensor count is a benchmark's question
 * (bench/probes/st_open_scale.c), not this test's. */
static void test_100k_tensors(void **state)
{
    (void)state;
    enum { N = 100000 };
    size_t cap = (size_t)N * 120, len = 1;
    char *h = malloc(cap);
    assert_non_null(h);
    h[0] = '{';
    for (long i = N - 1; i >= 0; i--)
        len += (size_t)snprintf(h + len, cap - len,
                                "\"model.layers.%ld.mlp.experts.%ld.w\":{\"dtype\":\"BF16\","
                                "\"shape\":[2,2],\"data_offsets\":[%ld,%ld]}%s",
                                i / 256, i % 256, i * 8, i * 8 + 8, i ? "," : "}");
    size_t n;
    uint8_t *buf = tu_build_st(h, (size_t)N * 8, &n);
    st_set *s;
    st_error e;
    assert_int_equal(st_open_memory(&s, buf, n, "moe", &e), REFIT_OK);
    assert_int_equal(st_count(s), N);
    for (long i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%ld.mlp.experts.%ld.w", i / 256, i % 256);
        const st_tensor *t = st_find(s, name);
        assert_non_null(t);
        assert_ptr_equal(t, st_tensor_at(s, (size_t)i));
    }
    st_close(s);
    free(buf);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_facts),
        cmocka_unit_test(test_fixture_crosscheck),
        cmocka_unit_test(test_fixture_sha256),
        cmocka_unit_test(test_index_parse_fixture),
        cmocka_unit_test(test_open_index_path),
        cmocka_unit_test(test_single_file_and_lone_dir),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_every_dtype),
        cmocka_unit_test(test_rank0_zero_size_unaligned),
        cmocka_unit_test(test_null_metadata_and_extra_keys),
        cmocka_unit_test(test_empty_file_set),
        cmocka_unit_test(test_memory_set),
        cmocka_unit_test(test_recheck_detects_changes),
        cmocka_unit_test(test_100k_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
