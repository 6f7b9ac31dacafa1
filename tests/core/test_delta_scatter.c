/* The scatter under delta updates (kernels/scatter.c, backend.h .scatter,
 * core/undo.c undo_scatter): the host op against a plain reference loop
 * (element and run forms, every element size, skipped values, strided
 * runs and values, casts, the old bytes gathered), the undo log's scatter
 * entries restored exactly when split across chunks, a scattered patch
 * holding undo memory for its elements only, and a pass over millions of
 * indices in parts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "core/backend.h"
#include "core/undo.h"
#include "kernels/cast.h"
#include "testutil.h"

#define I64 ((refit_dtype){REFIT_DTYPE_INT, 64, 1})
#define U32 ((refit_dtype){REFIT_DTYPE_UINT, 32, 1})
#define U16 ((refit_dtype){REFIT_DTYPE_UINT, 16, 1})

static unsigned char *bytes_new(size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)tt_mix(seed + i);
    return p;
}

static backend_scatter sc_of(void *dst, refit_dtype dt, const int64_t *off, size_t n,
                             const void *vals, void *old)
{
    return (backend_scatter){.dst = dst, .dst_device = {REFIT_DEVICE_CPU, 0}, .dst_dtype = dt,
                             .off = off, .n = n, .run_stride = 1, .elements = (int64_t)n,
                             .values = vals, .values_dtype = dt,
                             .values_device = {REFIT_DEVICE_CPU, 0}, .values_stride = 1,
                             .old = old};
}

/* Element form, each size: offsets in any order, -1 skipped; old holds
 * what each written element held, a skipped value's slot untouched. */
static void test_host_elements(void **state)
{
    (void)state;
    refit_dtype dts[] = {REFIT_U8, U16, U32, I64, {REFIT_DTYPE_UINT, 24, 1}};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        size_t e = dts[d].bits / 8, numel = 1000, n = 40;
        unsigned char *dst = bytes_new(numel * e, d), *ref = malloc(numel * e);
        unsigned char *vals = bytes_new(2 * n * e, 100 + d), *old = malloc(n * e);
        assert_non_null(ref);
        assert_non_null(old);
        memcpy(ref, dst, numel * e);
        memset(old, 0xa5, n * e);
        int64_t off[40];
        for (size_t i = 0; i < n; i++)
            off[i] = i % 7 == 3 ? -1 : (int64_t)((i * 379 + 11) % numel); /* unsorted */
        backend_scatter s = sc_of(dst, dts[d], off, n, vals, old);
        s.values_stride = 2; /* every other value */
        assert_int_equal(backend_host.scatter(&s, NULL), REFIT_OK);
        for (size_t i = 0; i < n; i++) {
            if (off[i] < 0) {
                for (size_t b = 0; b < e; b++)
                    assert_int_equal(old[i * e + b], 0xa5);
                continue;
            }
            assert_memory_equal(old + i * e, ref + off[i] * e, e);
            memcpy(ref + off[i] * e, vals + 2 * i * e, e);
        }
        assert_memory_equal(dst, ref, numel * e);
        free(dst);
        free(ref);
        free(vals);
        free(old);
    }
}

/* Runs, strided in the target, one skipped, BF16 values cast to F32. */
static void test_host_runs_cast(void **state)
{
    (void)state;
    float dst[64], ref[64], old[12];
    uint16_t vals[12];
    for (int i = 0; i < 64; i++)
        dst[i] = ref[i] = (float)i;
    for (int i = 0; i < 12; i++)
        vals[i] = kern_f32_to_bf16(100.5f + (float)i);
    int64_t off[] = {40, 1, -1, 10}, counts[] = {3, 4, 2, 3}; /* stride 3 */
    memset(old, 0, sizeof old);
    backend_scatter s = sc_of(dst, REFIT_F32, off, 4, vals, old);
    s.counts = counts;
    s.elements = 12;
    s.run_stride = 3;
    s.values_dtype = REFIT_BF16;
    assert_int_equal(backend_host.scatter(&s, NULL), REFIT_OK);
    int64_t j = 0;
    for (int r = 0; r < 4; j += counts[r], r++)
        for (int64_t k = 0; off[r] >= 0 && k < counts[r]; k++) {
            int64_t o = off[r] + 3 * k;
            assert_true(old[j + k] == ref[o]);
            ref[o] = kern_bf16_to_f32(vals[j + k]);
        }
    assert_memory_equal(dst, ref, sizeof dst);
    /* and back: F32 values into BF16 runs, contiguous */
    uint16_t d16[8] = {0}, want[8] = {0};
    float f[3] = {1.5f, -2.25f, 3.0e-3f};
    int64_t o1[] = {5}, c1[] = {3};
    backend_scatter t = sc_of(d16, REFIT_BF16, o1, 1, f, NULL);
    t.counts = c1;
    t.elements = 3;
    t.values_dtype = REFIT_F32;
    assert_int_equal(backend_host.scatter(&t, NULL), REFIT_OK);
    for (int i = 0; i < 3; i++)
        want[5 + i] = kern_f32_to_bf16(f[i]);
    assert_memory_equal(d16, want, sizeof d16);
    /* no cast between an integer and a float */
    t.values_dtype = U32;
    assert_int_equal(backend_host.scatter(&t, NULL), REFIT_EUNSUPPORTED);
}

#define MIB ((size_t)1 << 20)

/* undo_scatter: more old bytes and offsets than a 4 MiB chunk holds, so
 * the scatter goes as several pieces (entries); every written byte is
 * the value's, and the restore puts every byte back. Elements, then runs
 * (one run longer than a chunk). */
static void test_undo_scatter_split_restored(void **state)
{
    (void)state;
    size_t numel = 12 * MIB, n = 1500000; /* u16: 24 MiB tensor; 12 MiB offsets */
    unsigned char *dst = bytes_new(numel * 2, 7), *orig = malloc(numel * 2);
    assert_non_null(orig);
    memcpy(orig, dst, numel * 2);
    int64_t *off = malloc(n * sizeof *off);
    assert_non_null(off);
    for (size_t i = 0; i < n; i++)
        off[i] = (int64_t)(i * 8 + (i % 5)); /* increasing, every ~8th */
    unsigned char *vals = bytes_new(12 * MIB, 9); /* the elements' and the runs' values */
    undo_pool *pool = NULL;
    undo_log u;
    undo_init(&u, &pool, 0);
    backend_scatter s = sc_of(dst, U16, off, n, vals, NULL);
    assert_int_equal(undo_scatter(&u, &backend_host, 0, &s, NULL), REFIT_OK);
    assert_true(u.n_entries > 1);
    assert_int_equal(u.n, 1);
    assert_int_equal(u.bytes, n * 2);
    for (size_t i = 0; i < n; i += 997)
        assert_memory_equal(dst + off[i] * 2, vals + i * 2, 2);
    /* runs: 1000 runs of 3 elements, then one of 5 Mi elements */
    int64_t starts[1001], counts[1001];
    for (int i = 0; i < 1000; i++) {
        starts[i] = 1 + 8 * i;
        counts[i] = 3;
    }
    starts[1000] = (int64_t)(6 * MIB);
    counts[1000] = (int64_t)(5 * MIB);
    backend_scatter r = sc_of(dst, U16, starts, 1001, vals, NULL);
    r.counts = counts;
    r.elements = 3000 + (int64_t)(5 * MIB);
    uint32_t before = u.n_entries;
    assert_int_equal(undo_scatter(&u, &backend_host, 0, &r, NULL), REFIT_OK);
    assert_true(u.n_entries > before);
    assert_memory_equal(dst + 6 * MIB * 2, vals + 3000 * 2, 5 * MIB * 2);
    assert_memory_equal(dst + 2, vals, 6);
    assert_int_equal(undo_restore_all(&u, NULL), REFIT_OK);
    int same = !memcmp(dst, orig, numel * 2);
    undo_free(&u);
    undo_pool_free(&pool);
    free(dst);
    free(orig);
    free(off);
    free(vals);
    assert_true(same);
}

/* A 3% scattered patch of a 4 MiB BF16 tensor with rollback: the undo
 * log saves its elements' bytes and holds room for them and their
 * offsets, not a chunk slot per element: the memory the model holds for
 * undo does not grow past what seal reserved for a full update. */
static void test_scattered_patch_undo_memory(void **state)
{
    tw *w = *state;
    int64_t numel = 2 * (int64_t)MIB;
    tw_module(w, "m", "unquantized", NULL);
    tw_runtime(w, "m", "w", REFIT_BF16, 2, TT_SHAPE(numel / 1024, 1024));
    refit_ckpt_spec spec = tt_spec(REFIT_BF16, 2, TT_SHAPE(numel / 1024, 1024));
    assert_int_equal(tw_expect(w, "m", "m.w", &spec), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
    uint64_t dev0, host0;
    assert_int_equal(refit_sys_undo_held(w->m, 1, &dev0, &host0), REFIT_OK);
    size_t n = (size_t)numel / 33;
    int64_t *idx = malloc(n * sizeof *idx);
    assert_non_null(idx);
    for (size_t i = 0; i < n; i++)
        idx[i] = (int64_t)i * 33 + (int64_t)(tt_mix(i) % 33);
    tt_tensor *vals = tw_tmp(w, REFIT_BF16, 1, TT_SHAPE((int64_t)n));
    tt_fill(vals, 5);
    size_t nb;
    void *before = tw_snapshot(w, &nb);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.rollback = 1;
    o.base_version = "v1";
    o.others_unchanged = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    assert_int_equal(refit_load_delta(t, "m.w", n, idx, &vals->t, NULL), REFIT_OK);
    refit_txn_stats st;
    assert_int_equal(refit_txn_stats_get(t, &st), REFIT_OK);
    assert_int_equal(st.undo_host_bytes + st.undo_device_bytes, n * 2);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_true(tw_snapshot_equal(w, before, nb));
    uint64_t dev1, host1;
    assert_int_equal(refit_sys_undo_held(w->m, 1, &dev1, &host1), REFIT_OK);
    print_message("# undo held: %llu bytes after the full update, %llu after the delta\n",
                  (unsigned long long)(dev0 + host0), (unsigned long long)(dev1 + host1));
    assert_true(dev1 + host1 <= dev0 + host0);
    free(before);
    free(idx);
}

/* Eight million indices: the pass over them runs in parts (on threads
 * where the machine has several CPUs); an index out of range in a later
 * part, and one given twice across the parts' boundary, are refused with
 * nothing written, then the whole patch lands. */
static void test_many_indices_checked_in_parts(void **state)
{
    tw *w = *state;
    int64_t numel = (int64_t)1 << 24;
    size_t n = (size_t)1 << 23;
    tw_module(w, "m", "unquantized", NULL);
    tt_tensor *rt = tw_runtime(w, "m", "w", REFIT_BF16, 1, TT_SHAPE(numel));
    refit_ckpt_spec spec = tt_spec(REFIT_BF16, 1, TT_SHAPE(numel));
    assert_int_equal(tw_expect(w, "m", "m.w", &spec), REFIT_OK);
    tw_seal(w);
    tw_update(w, 1, "v1");
    int64_t *idx = malloc(n * sizeof *idx);
    assert_non_null(idx);
    for (size_t i = 0; i < n; i++)
        idx[i] = 2 * (int64_t)i + 1;
    tt_tensor *vals = tw_tmp(w, REFIT_BF16, 1, TT_SHAPE((int64_t)n));
    tt_fill(vals, 9);
    size_t nb;
    void *before = tw_snapshot(w, &nb);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.rollback = 1;
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.keep_going = 1;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w->m, &o), REFIT_OK);
    idx[n - 5] = numel; /* out of range, in the last part */
    assert_int_equal(refit_load_delta(t, "m.w", n, idx, &vals->t, NULL), REFIT_EINVAL);
    assert_non_null(strstr(refit_errmsg(w->ctx), "index 8388603"));
    idx[n - 5] = 2 * (int64_t)(n - 5) + 1;
    idx[n / 2] = idx[n / 2 - 1]; /* twice, across the boundary of two parts */
    assert_int_equal(refit_load_delta(t, "m.w", n, idx, &vals->t, NULL), REFIT_EDUPLICATE);
    assert_true(tw_snapshot_equal(w, before, nb));
    idx[n / 2] = 2 * (int64_t)(n / 2) + 1;
    assert_int_equal(refit_load_delta(t, "m.w", n, idx, &vals->t, NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    const uint16_t *got = rt->buf, *v = vals->buf, *old = before;
    for (size_t i = 0; i < n; i += 4099) {
        assert_int_equal(got[2 * i + 1], v[i]);
        assert_int_equal(got[2 * i], old[2 * i]);
    }
    free(before);
    free(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_elements),
        cmocka_unit_test(test_host_runs_cast),
        cmocka_unit_test(test_undo_scatter_split_restored),
        cmocka_unit_test_setup_teardown(test_scattered_patch_undo_memory, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_many_indices_checked_in_parts, tw_setup,
                                        tw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
