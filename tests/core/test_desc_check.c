/* Every descriptor and spec a caller hands in is checked before any member
 * is used (core/desc_check.c): NULL members, each dimension's reach
 * (overflow-checked), byte_offset, the whole range inside the buffer. A
 * refusal names what is wrong and writes nothing; nothing computes an
 * overflow on the way (UBSan halts the sanitized build on one). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/desc_check.h"
#include "testutil.h"

typedef struct fixture {
    tt_raw r;
    refit_txn *t;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f || tt_raw_open(&f->r))
        return -1;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v1";
    o.keep_going = 1; /* each case refuses, then tries the next */
    if (refit_begin(&f->t, f->r.m, &o))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f->t)
        refit_abort(f->t);
    refit_close(f->r.ctx);
    free(f);
    return 0;
}

/* A refusal that wrote nothing: the runtime still holds its -1s. */
static void assert_untouched(const fixture *f)
{
    for (int i = 0; i < 4; i++)
        assert_true(f->r.buf[i] == -1.0f);
}

static void assert_msg(const fixture *f, const char *want)
{
    const char *msg = refit_errmsg(f->r.ctx);
    if (!strstr(msg, want))
        fail_msg("message \"%s\" lacks \"%s\"", msg, want);
}

static void test_load_null_shape(void **state)
{
    fixture *f = *state;
    refit_tensor s = f->r.s;
    s.shape = NULL;
    assert_int_equal(refit_load(f->t, "x", &s, NULL), REFIT_EINVAL);
    assert_msg(f, "load x (module m): shape is NULL (ndim 1)");
    assert_untouched(f);
}

static void test_load_wrapping_byte_offset(void **state)
{
    fixture *f = *state;
    refit_tensor s = f->r.s;
    s.byte_offset = (uint64_t)0 - 16; /* data - 16 once it wraps */
    assert_int_equal(refit_load(f->t, "x", &s, NULL), REFIT_EINVAL);
    assert_msg(f, "byte_offset");
    assert_msg(f, "beyond the address space");
    assert_untouched(f);
}

static void test_load_huge_strides(void **state)
{
    fixture *f = *state;
    int64_t shape[2] = {2, 2}, strides[2] = {INT64_MAX, 1};
    float src[4] = {0};
    refit_tensor s = {src, {REFIT_DEVICE_CPU, 0}, 2, REFIT_F32, shape, strides, 0};
    /* the model expects [4]: make one that expects [2, 2] */
    refit_abort(f->t);
    f->t = NULL;
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tw_module(&w, "m", "unquantized", NULL);
    tt_tensor *rt = tw_runtime(&w, "m", "w", REFIT_F32, 2, TT_SHAPE(2, 2));
    refit_ckpt_spec spec = tt_spec(REFIT_F32, 2, TT_SHAPE(2, 2));
    assert_int_equal(tw_expect(&w, "m", "x", &spec), REFIT_OK);
    tw_seal(&w);
    w.keep_going = 1;
    refit_txn *t = tw_begin(&w, "v1", 1);
    unsigned char before[16];
    memcpy(before, rt->buf, sizeof before);
    int rc = refit_load(t, "x", &s, NULL);
    assert_int_equal(rc, REFIT_EINVAL);
    tw_assert_msg(&w, "load x (module m)", "stride", "dim 0");
    /* strides whose reach overflows int64 once scaled by the element size */
    strides[0] = INT64_MAX / 6;
    assert_int_equal(refit_load(t, "x", &s, NULL), REFIT_EINVAL);
    tw_assert_msg(&w, "bytes from byte_offset 0 are beyond the address space");
    /* a negative stride reaching below address 0 */
    strides[0] = -2;
    s.data = (void *)(uintptr_t)4;
    assert_int_equal(refit_load(t, "x", &s, NULL), REFIT_EINVAL);
    tw_assert_msg(&w, "below data + byte_offset", "below address 0");
    assert_memory_equal(rt->buf, before, sizeof before);
    /* the same stride inside the buffer is a valid view, as DLPack has it
     * (data the buffer, byte_offset the first element) and as numpy's
     * __dlpack__ hands it (data the first element, byte_offset 0) */
    s.data = src;
    s.byte_offset = 2 * sizeof(float);
    assert_int_equal(refit_load(t, "x", &s, NULL), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    t = tw_begin(&w, "v1", 1);
    s.data = src + 2;
    s.byte_offset = 0;
    assert_int_equal(refit_load(t, "x", &s, NULL), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    tw_close(&w);
}

static void test_load_part_offset_extreme(void **state)
{
    fixture *f = *state;
    int64_t shape[1] = {2};
    refit_tensor s = f->r.s;
    s.shape = shape;
    assert_int_equal(refit_load_part(f->t, "x", INT64_MAX - 1, &s, NULL), REFIT_EMISMATCH);
    assert_msg(f, "part rows [9223372036854775806, 9223372036854775806 + 2) outside [0, 4) of dim 0");
    assert_int_equal(refit_load_part(f->t, "x", INT64_MIN, &s, NULL), REFIT_EMISMATCH);
    assert_untouched(f);
}

static void test_bind_wrapping_byte_offset(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tw_module(&w, "m", "unquantized", NULL);
    float buf[4];
    int64_t shape[1] = {4};
    refit_tensor t = {buf, {REFIT_DEVICE_CPU, 0}, 1, REFIT_F32, shape, NULL, (uint64_t)0 - 4};
    assert_int_equal(refit_module_bind_runtime(w.m, "m", "w", &t), REFIT_EINVAL);
    tw_assert_msg(&w, "runtime tensor w", "byte_offset");
    t.byte_offset = 0;
    t.shape = NULL;
    assert_int_equal(refit_model_add_side(w.m, "ws", &t), REFIT_EINVAL);
    tw_assert_msg(&w, "side tensor ws", "shape is NULL");
    tw_close(&w);
}

/* Changed after bind: seal and begin read the descriptor again. */
static void test_seal_rechecks_descriptor(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tw_module(&w, "m", "unquantized", NULL);
    tt_tensor *rt = tw_runtime(&w, "m", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec spec = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    assert_int_equal(tw_expect(&w, "m", "x", &spec), REFIT_OK);
    rt->t.byte_offset = (uint64_t)0 - 4;
    assert_int_equal(refit_model_seal(w.m), REFIT_EINVAL);
    tw_assert_msg(&w, "runtime tensor w", "invalid descriptor", "byte_offset");
    rt->t.byte_offset = 0;
    tw_seal(&w);
    rt->t.shape = NULL;
    refit_txn *t = NULL;
    assert_int_equal(refit_begin(&t, w.m, NULL), REFIT_EMOVED);
    assert_null(t);
    rt->t.shape = rt->shape;
    tw_close(&w);
}

static void test_extreme_specs(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tw_module(&w, "m", "unquantized", NULL);
    refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(INT64_MAX, 4));
    assert_int_equal(refit_model_expect(w.m, "m", "a", &s), REFIT_EINVAL);
    tw_assert_msg(&w, "module m, tensor a", "element count overflows at dim 1");
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(INT64_MAX / 8));
    assert_int_equal(refit_model_expect(w.m, "m", "b", &s), REFIT_EINVAL);
    tw_assert_msg(&w, "tensor b", "overflow a size");
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    s.dst_offset[0] = INT64_MAX - 1;
    assert_int_equal(refit_model_expect(w.m, "m", "c", &s), REFIT_EINVAL);
    tw_assert_msg(&w, "tensor c", "dst_offset");
    s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    s.pad_to = INT64_MAX;
    s.shape[0] = 4;
    refit_ckpt_spec s2 = s;
    s2.ndim = 2;
    s2.shape[1] = 3;
    assert_int_equal(refit_model_expect(w.m, "m", "d", &s2), REFIT_EINVAL);
    tw_assert_msg(&w, "tensor d", "overflows");
    s.expert = -5;
    s.pad_to = 0;
    assert_int_equal(refit_model_expect(w.m, "m", "e", &s), REFIT_EINVAL);
    tw_assert_msg(&w, "tensor e", "expert -5");
    tw_close(&w);
}

/* Y4 (issue 29): a runtime tensor whose elements alias one another (stride
 * 0, rows closer than their length) is refused at bind and at seal, naming
 * the tensor, its shape and strides; a side tensor (never written) may. */
static void test_self_overlapping_runtime_refused(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(tw_open(&w, NULL), REFIT_OK);
    tw_module(&w, "m", "unquantized", NULL);
    float buf[64];
    int64_t shape[2] = {4, 8}, bcast[2] = {0, 1}, close_rows[2] = {4, 1}, ok[2] = {8, 1};
    refit_tensor t = {buf, {REFIT_DEVICE_CPU, 0}, 2, REFIT_F32, shape, bcast, 0};
    assert_int_equal(refit_module_bind_runtime(w.m, "m", "w", &t), REFIT_EINVAL);
    tw_assert_msg(&w, "runtime tensor w", "overlap", "shape [4, 8]", "strides [0, 1]");
    t.strides = close_rows; /* row i + 1 starts inside row i */
    assert_int_equal(refit_module_bind_runtime(w.m, "m", "w", &t), REFIT_EINVAL);
    tw_assert_msg(&w, "runtime tensor w", "overlap", "strides [4, 1]");
    /* read-only side tensors may broadcast */
    t.strides = bcast;
    assert_int_equal(refit_model_add_side(w.m, "ws", &t), REFIT_OK);
    /* fine at bind, aliased by seal: seal reads the descriptor again */
    t.strides = ok;
    assert_int_equal(refit_module_bind_runtime(w.m, "m", "w", &t), REFIT_OK);
    refit_ckpt_spec spec = tt_spec(REFIT_F32, 2, TT_SHAPE(4, 8));
    assert_int_equal(tw_expect(&w, "m", "x", &spec), REFIT_OK);
    t.strides = close_rows;
    assert_int_equal(refit_model_seal(w.m), REFIT_EINVAL);
    tw_assert_msg(&w, "runtime tensor w", "overlap", "strides [4, 1]");
    t.strides = ok;
    tw_close(&w);
}

/* desc_check_written on its own: layouts that alias and ones that do not
 * (transposed, negative strides, gaps, size-1 dims with any stride). */
static void test_written_alias_rules(void **state)
{
    (void)state;
    char msg[512];
    float buf[256];
    int64_t shape[3] = {4, 3, 2}, st[3];
    refit_tensor t = {buf + 100, {REFIT_DEVICE_CPU, 0}, 3, REFIT_F32, shape, st, 0};
    static const struct { int64_t s[3]; int ok; } cases[] = {
        {{6, 2, 1}, 1},    /* row-major */
        {{1, 4, 12}, 1},   /* column-major */
        {{8, 2, 1}, 1},    /* padded rows */
        {{-6, -2, -1}, 1}, /* reversed */
        {{6, 2, 0}, 0},    /* broadcast innermost */
        {{0, 2, 1}, 0},    /* broadcast outer */
        {{5, 2, 1}, 0},    /* rows closer than their 6 elements */
        {{6, 1, 1}, 0},    /* two dims stepping alike */
        {{2, 1, 12}, 0},   /* interleaved into one another */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(st, cases[i].s, sizeof st);
        int rc = desc_check_written(&t, msg, sizeof msg);
        if (rc != (cases[i].ok ? REFIT_OK : REFIT_EINVAL))
            fail_msg("strides [%lld, %lld, %lld]: %s (%s)", (long long)st[0], (long long)st[1],
                     (long long)st[2], refit_status_name(rc), msg);
        /* a read-only tensor may alias */
        assert_int_equal(desc_check(&t, NULL, NULL, msg, sizeof msg), REFIT_OK);
    }
    /* a dim of extent 1 steps nowhere: any stride */
    shape[1] = 1;
    int64_t one[3] = {2, 0, 1};
    t.strides = one;
    assert_int_equal(desc_check_written(&t, msg, sizeof msg), REFIT_OK);
    /* empty: nothing to alias */
    shape[1] = 0;
    int64_t zero[3] = {0, 0, 0};
    t.strides = zero;
    assert_int_equal(desc_check_written(&t, msg, sizeof msg), REFIT_OK);
    shape[1] = 3;
    assert_int_equal(desc_check_written(&t, msg, sizeof msg), REFIT_EINVAL);
    assert_non_null(strstr(msg, "shape [4, 3, 2], strides [0, 0, 0]"));
}

/* The pure check on its own: each rule, and what a valid descriptor spans. */
static void test_desc_check_rules(void **state)
{
    (void)state;
    char msg[256];
    float buf[16];
    int64_t shape[2] = {2, 3}, strides[2] = {4, 1};
    refit_tensor t = {buf, {REFIT_DEVICE_CPU, 0}, 2, REFIT_F32, shape, strides, 4};
    desc_extent e;
    assert_int_equal(desc_check(&t, NULL, &e, msg, sizeof msg), REFIT_OK);
    assert_int_equal(e.numel, 6);
    assert_int_equal(e.lo, 0);
    assert_int_equal(e.hi, (4 + 2 + 1) * 4);
    desc_expect lim = {2, REFIT_F32, false, sizeof buf};
    assert_int_equal(desc_check(&t, &lim, NULL, msg, sizeof msg), REFIT_OK);
    lim.limit = 4 + 7 * 4 - 1; /* one byte short */
    assert_int_equal(desc_check(&t, &lim, NULL, msg, sizeof msg), REFIT_EINVAL);
    assert_non_null(strstr(msg, "beyond the buffer passed"));
    desc_expect other = {3, REFIT_F32, false, 0};
    assert_int_equal(desc_check(&t, &other, NULL, msg, sizeof msg), REFIT_EMISMATCH);
    assert_string_equal(msg, "2 dims delivered, 3 expected");
    other = (desc_expect){2, REFIT_BF16, false, 0};
    assert_int_equal(desc_check(&t, &other, NULL, msg, sizeof msg), REFIT_EMISMATCH);
    t.data = NULL;
    assert_int_equal(desc_check(&t, NULL, NULL, msg, sizeof msg), REFIT_EINVAL);
    assert_string_equal(msg, "data is NULL");
    other = (desc_expect){-1, {0, 0, 0}, true, 0};
    assert_int_equal(desc_check(&t, &other, NULL, msg, sizeof msg), REFIT_OK);
    t.data = buf;
    t.ndim = 9;
    assert_int_equal(desc_check(&t, NULL, NULL, msg, sizeof msg), REFIT_EINVAL);
    t.ndim = 2;
    shape[0] = -1;
    assert_int_equal(desc_check(&t, NULL, NULL, msg, sizeof msg), REFIT_EINVAL);
    assert_string_equal(msg, "negative extent -1 on dim 0");
    shape[0] = 0; /* empty: nothing is reached, any stride will do */
    strides[0] = INT64_MAX;
    assert_int_equal(desc_check(&t, NULL, &e, msg, sizeof msg), REFIT_OK);
    assert_int_equal(e.hi, 0);
    assert_int_equal(desc_check(NULL, NULL, NULL, msg, sizeof msg), REFIT_EINVAL);
    /* 4-bit elements: whole bytes, row-major only */
    int64_t s4[1] = {5};
    refit_tensor f4 = {buf, {REFIT_DEVICE_CPU, 0}, 1, {REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1}, s4,
                       NULL, 0};
    assert_int_equal(desc_check(&f4, NULL, &e, msg, sizeof msg), REFIT_OK);
    assert_int_equal(e.hi, 3);
    int64_t st4[1] = {2};
    f4.strides = st4;
    assert_int_equal(desc_check(&f4, NULL, NULL, msg, sizeof msg), REFIT_EINVAL);
    /* a NULL message buffer is fine */
    assert_int_equal(desc_check(&f4, NULL, NULL, NULL, 0), REFIT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_null_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_wrapping_byte_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_huge_strides, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_part_offset_extreme, setup, teardown),
        cmocka_unit_test(test_bind_wrapping_byte_offset),
        cmocka_unit_test(test_seal_rechecks_descriptor),
        cmocka_unit_test(test_self_overlapping_runtime_refused),
        cmocka_unit_test(test_extreme_specs),
        cmocka_unit_test(test_desc_check_rules),
        cmocka_unit_test(test_written_alias_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
