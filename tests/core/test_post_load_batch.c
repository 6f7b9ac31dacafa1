/* Post-load in place and in batches, on the host backend: a module whose
 * format sets REFIT_MODULE_STAGED_IN_PLACE has its post-load read the
 * caller's source bytes instead of a staged copy when they allow it
 * (whole, contiguous, 64-byte aligned, staged dtype and device, delivered
 * in the call that completes the module); the modules one refit_load_many
 * completes get one post_load_many at its end; bad data one finds is
 * reported at finalize naming the module; staging pressure runs the
 * waiting post-loads early; a format with post_load_many but no post_load
 * is refused. The GPU twin is the online reload of refit-bench gpu. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define N_MOD 6
#define ROWS 4
#define COLS 16 /* 64 bytes of f32 a row */

/* What the formats saw. */
static struct {
    int post_calls, many_calls, many_modules;
    int last_many_n;
    int many_mixed;             /* a post_load_many got modules of two formats */
    const void *staged[N_MOD][2]; /* per module, per checkpoint tensor */
} seen;

static int mod_index(const refit_fmt_module *m)
{
    return m->name[1] - '0';
}

static int copy_plan(const refit_host_v2 *h, refit_fmt_module *m, uint32_t flags)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_STAGED;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | flags;
    return REFIT_OK;
}

static int plan_in_place(const refit_host_v2 *h, refit_fmt_module *m)
{
    return copy_plan(h, m, REFIT_MODULE_STAGED_IN_PLACE);
}

static int plan_staged(const refit_host_v2 *h, refit_fmt_module *m)
{
    return copy_plan(h, m, 0);
}

/* Every staged view copied to its place through the host's copy service
 * (so the views are checked against the modules in hand); a NaN refused,
 * naming module and tensor. */
static int build(const refit_host_v2 *h, const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        seen.staged[mod_index(m)][i] = c->staged.data;
        const float *x = c->staged.data;
        for (int64_t e = 0; e < c->staged.shape[0] * c->staged.shape[1]; e++)
            if (!isfinite(x[e]))
                return h->error(h->host, REFIT_ECORRUPT, "module %s, tensor %s: NaN at "
                                "element %lld", m->name, c->name, (long long)e);
        int rc = h->copy(h->host, &c->place, &c->staged, NULL);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static int post_one(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    seen.post_calls++;
    return build(h, m);
}

static int post_many(const refit_host_v2 *h, const refit_fmt_module *const *m, uint32_t n,
                     void *stream)
{
    (void)stream;
    seen.many_calls++;
    seen.many_modules += (int)n;
    seen.last_many_n = (int)n;
    for (uint32_t k = 1; k < n; k++) /* modules_of: a module's parity is its format */
        if (mod_index(m[k]) % 2 != mod_index(m[0]) % 2)
            seen.many_mixed = 1;
    for (uint32_t k = 0; k < n; k++) {
        int rc = build(h, m[k]);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 fmt_in_place = {
    .abi_version = REFIT_FORMAT_ABI_VERSION, .struct_size = sizeof(refit_format_v2),
    .name = "t-in-place", .plan = plan_in_place, .post_load = post_one,
    .post_load_many = post_many,
};
static const refit_format_v2 fmt_staged = {
    .abi_version = REFIT_FORMAT_ABI_VERSION, .struct_size = sizeof(refit_format_v2),
    .name = "t-staged", .plan = plan_staged, .post_load = post_one,
    .post_load_many = post_many,
};
static const refit_format_v2 fmt_one_by_one = {
    .abi_version = REFIT_FORMAT_ABI_VERSION, .struct_size = sizeof(refit_format_v2),
    .name = "t-one", .plan = plan_in_place, .post_load = post_one,
};

/* Sources the test owns: 64-byte aligned, one [ROWS, COLS] f32 per name. */
typedef struct srcs {
    float *buf[N_MOD][2];
    refit_tensor t[N_MOD][2];
    char name[N_MOD][2][16];
} srcs;

static const int64_t shape[2] = {ROWS, COLS};

static void srcs_fill(srcs *s, int parts, float v, int misalign)
{
    for (int k = 0; k < N_MOD; k++)
        for (int p = 0; p < parts; p++) {
            s->buf[k][p] = aligned_alloc(64, sizeof(float) * ROWS * COLS + 64);
            assert_non_null(s->buf[k][p]);
            float *x = s->buf[k][p] + (misalign ? 1 : 0);
            for (int e = 0; e < ROWS * COLS; e++)
                x[e] = v + (float)(k * 1000 + p * 100 + e);
            s->t[k][p] = (refit_tensor){.data = x, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                                        .dtype = REFIT_F32, .shape = (int64_t *)shape};
            snprintf(s->name[k][p], sizeof s->name[k][p], "m%d.%c", k, 'a' + p);
        }
}

static void srcs_free(srcs *s, int parts)
{
    for (int k = 0; k < N_MOD; k++)
        for (int p = 0; p < parts; p++)
            free(s->buf[k][p]);
}

/* N_MOD modules m0..m5, the even ones of `even`, the odd ones of `odd`,
 * each of `parts` checkpoint tensors mK.a, mK.b (f32 [ROWS, COLS]) into
 * rows of runtime w [parts * ROWS, COLS]. */
static void modules_of(tw *w, const refit_format_v2 *even, const refit_format_v2 *odd,
                       int parts)
{
    assert_int_equal(refit_format_register(w->ctx, even), REFIT_OK);
    if (odd != even)
        assert_int_equal(refit_format_register(w->ctx, odd), REFIT_OK);
    for (int k = 0; k < N_MOD; k++) {
        char mod[8], ck[16];
        snprintf(mod, sizeof mod, "m%d", k);
        tw_module(w, mod, (k % 2 ? odd : even)->name, NULL);
        tw_runtime(w, mod, "w", REFIT_F32, 2, TT_SHAPE(parts * ROWS, COLS));
        for (int p = 0; p < parts; p++) {
            snprintf(ck, sizeof ck, "m%d.%c", k, 'a' + p);
            refit_ckpt_spec s = tt_spec(REFIT_F32, 2, shape);
            s.target = "w";
            s.dst_offset[0] = p * ROWS; /* fused: part p at rows p * ROWS */
            assert_int_equal(tw_expect(w, mod, ck, &s), REFIT_OK);
        }
    }
    tw_seal(w);
    memset(&seen, 0, sizeof seen);
}

static void modules(tw *w, const refit_format_v2 *fmt, int parts)
{
    modules_of(w, fmt, fmt, parts);
}

static void assert_holds(tw *w, const srcs *s, int parts)
{
    for (int k = 0; k < N_MOD; k++) {
        char mod[8];
        snprintf(mod, sizeof mod, "m%d", k);
        const float *rt = tw_rt(w, mod, "w")->buf;
        for (int p = 0; p < parts; p++)
            if (memcmp(rt + p * ROWS * COLS, s->t[k][p].data, sizeof(float) * ROWS * COLS))
                fail_msg("module %s part %d does not hold its source", mod, p);
    }
}

static void load_many(tw *w, refit_txn *t, srcs *s, int parts)
{
    const char *names[N_MOD * 2];
    refit_tensor t_[N_MOD * 2];
    int n = 0;
    for (int k = 0; k < N_MOD; k++)
        for (int p = 0; p < parts; p++, n++) {
            names[n] = s->name[k][p];
            t_[n] = s->t[k][p];
        }
    int rc = refit_load_many(t, (size_t)n, names, t_, NULL);
    if (rc)
        fail_msg("load_many: %s: %s", refit_status_name(rc), refit_errmsg(w->ctx));
}

/* One refit_load a module: its post-load reads the caller's bytes. */
static void test_refit_load_reads_the_source_in_place(void **state)
{
    tw *w = *state;
    modules(w, &fmt_in_place, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    for (int k = 0; k < N_MOD; k++)
        assert_int_equal(refit_load(t, s.name[k][0], &s.t[k][0], NULL), REFIT_OK);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_int_equal(seen.post_calls, N_MOD);
    assert_int_equal(seen.many_calls, 0);
    for (int k = 0; k < N_MOD; k++)
        assert_ptr_equal(seen.staged[k][0], s.t[k][0].data);
    assert_holds(w, &s, 1);
    srcs_free(&s, 1);
}

/* One refit_load_many of every module: one post_load_many at its end, each
 * tensor (both of a fused module) read in place. */
static void test_load_many_runs_one_post_load_many_in_place(void **state)
{
    tw *w = *state;
    modules(w, &fmt_in_place, 2);
    srcs s;
    srcs_fill(&s, 2, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 2);
    assert_int_equal(seen.many_calls, 1);
    assert_int_equal(seen.last_many_n, N_MOD);
    assert_int_equal(seen.post_calls, 0);
    for (int k = 0; k < N_MOD; k++)
        for (int p = 0; p < 2; p++)
            assert_ptr_equal(seen.staged[k][p], s.t[k][p].data);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(w, &s, 2);
    srcs_free(&s, 2);
}

/* One refit_load_many whose modules alternate between two formats (m0 of
 * one, m1 of the other, ...): one post_load_many a format, each with its
 * own modules only, not one a module. */
static void test_interleaved_formats_get_one_post_load_many_each(void **state)
{
    tw *w = *state;
    modules_of(w, &fmt_in_place, &fmt_staged, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 1);
    assert_int_equal(seen.many_calls, 2);
    assert_int_equal(seen.many_modules, N_MOD);
    assert_int_equal(seen.post_calls, 0);
    assert_int_equal(seen.many_mixed, 0);
    for (int k = 0; k < N_MOD; k++)
        if (k % 2)
            assert_ptr_not_equal(seen.staged[k][0], s.t[k][0].data); /* t-staged */
        else
            assert_ptr_equal(seen.staged[k][0], s.t[k][0].data); /* t-in-place */
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(w, &s, 1);
    srcs_free(&s, 1);
}

/* A fused module over two loading calls: the first tensor is copied to
 * staging (the caller may reuse its buffer once the call returns), the
 * last, which completes the module, is read in place. A refused call
 * before them leaves no mark behind. */
static void test_fused_module_over_two_loads_stages_the_first(void **state)
{
    tw *w = *state;
    modules(w, &fmt_in_place, 2);
    srcs s;
    srcs_fill(&s, 2, 1, 0);
    w->keep_going = 1;
    refit_txn *t = tw_begin(w, "v1", 1);
    /* a call refused at its last row (its forecast saw every module
     * complete): nothing of it lingers */
    const char *names[2 * N_MOD + 1];
    refit_tensor all[2 * N_MOD + 1];
    for (int k = 0; k < N_MOD; k++)
        for (int p = 0; p < 2; p++) {
            names[2 * k + p] = s.name[k][p];
            all[2 * k + p] = s.t[k][p];
        }
    names[2 * N_MOD] = "nobody.expects.this";
    all[2 * N_MOD] = s.t[0][0];
    assert_int_equal(refit_load_many(t, 2 * N_MOD + 1, names, all, NULL), REFIT_EUNEXPECTED);
    assert_int_equal(seen.many_calls + seen.post_calls, 0);
    /* the first tensor of each module in one call, which completes none */
    const char *firsts[N_MOD];
    refit_tensor first_src[N_MOD];
    for (int k = 0; k < N_MOD; k++) {
        firsts[k] = s.name[k][0];
        first_src[k] = s.t[k][0];
    }
    assert_int_equal(refit_load_many(t, N_MOD, firsts, first_src, NULL), REFIT_OK);
    assert_int_equal(seen.many_calls + seen.post_calls, 0);
    for (int k = 0; k < N_MOD; k++)
        assert_int_equal(refit_load(t, s.name[k][1], &s.t[k][1], NULL), REFIT_OK);
    /* the first tensor's buffer, reused after its call: no effect */
    float keep[ROWS * COLS];
    memcpy(keep, s.t[0][0].data, sizeof keep);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    for (int k = 0; k < N_MOD; k++) {
        assert_ptr_not_equal(seen.staged[k][0], s.t[k][0].data);
        assert_ptr_equal(seen.staged[k][1], s.t[k][1].data);
    }
    assert_holds(w, &s, 2);
    srcs_free(&s, 2);
}

/* A format without the flag always gets staged copies, one post_load_many
 * for the call all the same. */
static void test_without_the_flag_post_load_reads_staging(void **state)
{
    tw *w = *state;
    modules(w, &fmt_staged, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 1);
    assert_int_equal(seen.many_calls, 1);
    for (int k = 0; k < N_MOD; k++) {
        assert_non_null(seen.staged[k][0]);
        assert_ptr_not_equal(seen.staged[k][0], s.t[k][0].data);
    }
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(w, &s, 1);
    srcs_free(&s, 1);
}

/* Bytes that are not one aligned run of the staged dtype are staged. */
static void test_unaligned_or_strided_sources_are_staged(void **state)
{
    tw *w = *state;
    modules(w, &fmt_in_place, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 1); /* every source 4 bytes past a 64-byte boundary */
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 1);
    for (int k = 0; k < N_MOD; k++)
        assert_ptr_not_equal(seen.staged[k][0], s.t[k][0].data);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(w, &s, 1);
    srcs_free(&s, 1);

    /* a transposed view of aligned memory */
    float *buf = aligned_alloc(64, sizeof(float) * ROWS * COLS);
    assert_non_null(buf);
    for (int e = 0; e < ROWS * COLS; e++)
        buf[e] = (float)e;
    int64_t tr_strides[2] = {1, ROWS};
    refit_tensor tr = {.data = buf, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                       .dtype = REFIT_F32, .shape = (int64_t *)shape, .strides = tr_strides};
    t = tw_begin(w, "v2", 1);
    memset(&seen, 0, sizeof seen);
    assert_int_equal(refit_load(t, "m0.a", &tr, NULL), REFIT_OK);
    assert_ptr_not_equal(seen.staged[0][0], buf);
    assert_int_equal(refit_abort(t), REFIT_OK);
    free(buf);
}

/* A NaN one module of the batch holds: the whole call is accepted, the
 * update fails at finalize naming that module, and rollback restores. */
static void test_bad_data_in_a_batch_fails_finalize_naming_the_module(void **state)
{
    tw *w = *state;
    modules(w, &fmt_in_place, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 1);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    size_t n;
    void *before = tw_snapshot(w, &n);
    srcs s2;
    srcs_fill(&s2, 1, 50000, 0);
    ((float *)s2.t[3][0].data)[5] = NAN;
    t = tw_begin(w, "v2", 1);
    load_many(w, t, &s2, 1);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    tw_assert_msg(w, "finalize", "module m3", "tensor m3.a", "NaN at element 5", "rolled back");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    assert_string_equal(refit_worker_version(w->ctx), "v1");
    assert_true(tw_snapshot_equal(w, before, n));
    free(before);
    srcs_free(&s, 1);
    srcs_free(&s2, 1);
}

/* Staging for two modules only, six in one call of a format without the
 * flag: the waiting post-loads run early to give staging back, in several
 * post_load_many calls covering every module once. */
static void test_staging_pressure_runs_waiting_post_loads_early(void **state)
{
    (void)state;
    tw w;
    refit_options opt = REFIT_OPTIONS_INIT;
    opt.staging_budget = 2 * sizeof(float) * ROWS * COLS;
    assert_int_equal(tw_open(&w, &opt), REFIT_OK);
    modules(&w, &fmt_staged, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(&w, "v1", 1);
    load_many(&w, t, &s, 1);
    assert_true(seen.many_calls + seen.post_calls >= 3);
    assert_int_equal(seen.many_modules + seen.post_calls, N_MOD);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(&w, &s, 1);
    srcs_free(&s, 1);
    tw_close(&w);
}

/* A format with no post_load_many: one post_load a module, in place. */
static void test_format_without_many_gets_one_call_a_module(void **state)
{
    tw *w = *state;
    modules(w, &fmt_one_by_one, 1);
    srcs s;
    srcs_fill(&s, 1, 1, 0);
    refit_txn *t = tw_begin(w, "v1", 1);
    load_many(w, t, &s, 1);
    assert_int_equal(seen.post_calls, N_MOD);
    for (int k = 0; k < N_MOD; k++)
        assert_ptr_equal(seen.staged[k][0], s.t[k][0].data);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    assert_holds(w, &s, 1);
    srcs_free(&s, 1);
}

static void test_post_load_many_without_post_load_refused(void **state)
{
    tw *w = *state;
    static const refit_format_v2 bad = {
        .abi_version = REFIT_FORMAT_ABI_VERSION, .struct_size = sizeof(refit_format_v2),
        .name = "t-bad", .plan = plan_in_place, .post_load_many = post_many,
    };
    assert_int_equal(refit_format_register(w->ctx, &bad), REFIT_EFORMAT);
    tw_assert_msg(w, "t-bad", "post_load_many but no post_load");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_refit_load_reads_the_source_in_place, tw_setup,
                                        tw_teardown),
        cmocka_unit_test_setup_teardown(test_load_many_runs_one_post_load_many_in_place,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_interleaved_formats_get_one_post_load_many_each,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_fused_module_over_two_loads_stages_the_first,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_without_the_flag_post_load_reads_staging,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_unaligned_or_strided_sources_are_staged,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_bad_data_in_a_batch_fails_finalize_naming_the_module,
                                        tw_setup, tw_teardown),
        cmocka_unit_test(test_staging_pressure_runs_waiting_post_loads_early),
        cmocka_unit_test_setup_teardown(test_format_without_many_gets_one_call_a_module,
                                        tw_setup, tw_teardown),
        cmocka_unit_test_setup_teardown(test_post_load_many_without_post_load_refused,
                                        tw_setup, tw_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
