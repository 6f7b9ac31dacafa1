/* Staging an expert at a time (REFIT_MODULE_EXPERT_SLICES, docs/core.md):
 * a stacked module whose checkpoint names each expert is staged and
 * post-loaded expert by expert, so a staging budget that holds two
 * experts loads a stack that does not fit it; a format whose post-load
 * crosses experts is staged whole and refused at seal when the stack does
 * not fit; a missing expert is refused at finalize and rolled back.
 *
 * The test format "test-experts": runtime w [E, 2I, K] and s [E] f32,
 * checkpoint experts.e.gate / experts.e.up [I, K] f32, every tensor
 * STAGED; post-load writes w = x / amax and s = amax, amax over each
 * expert's two tensors, or (param cross: true) over the whole module,
 * which then does not set the flag (nor does it under param whole: 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/sys/stats.h>

#include "testutil.h"

#define E 8
#define I 4
#define K 8
#define MOD "layers.0.experts"
#define SLICE_BYTES (2 * I * K * 4)      /* one expert's gate + up, 64-aligned */
#define BUDGET (2 * SLICE_BYTES + 88)   /* two experts, not the stack */

/* What post_load saw, to tell slices from the whole module. */
static struct {
    int calls, many_calls;
    uint32_t max_ckpt, max_batch;
    int state_mismatch;
} seen;

static int param_true(const refit_host_v2 *h, const refit_fmt_module *m, const char *key)
{
    const char *v = h->param(h->host, m, key);
    return v && (!strcmp(v, "true") || !strcmp(v, "1"));
}

static int ex_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        if (strcmp(c->target, "w") || c->dtype.code != REFIT_DTYPE_FLOAT || c->dtype.bits != 32)
            return h->error(h->host, REFIT_EFORMAT, "module %s, tensor %s: test-experts takes "
                            "f32 tensors for runtime w", m->name, c->name);
        c->route = param_true(h, m, "liar") && m->n_ckpt == 2 ? REFIT_ROUTE_DIRECT
                                                               : REFIT_ROUTE_STAGED;
    }
    uint32_t *st = h->mem_alloc(h->host, sizeof *st);
    if (!st)
        return REFIT_ENOMEM;
    *st = m->n_ckpt; /* post_load checks it was planned on what it gets */
    m->state = st;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD |
               (param_true(h, m, "cross") || param_true(h, m, "whole")
                    ? 0u : REFIT_MODULE_EXPERT_SLICES);
    return REFIT_OK;
}

static void ex_release(const refit_host_v2 *h, refit_fmt_module *m)
{
    h->mem_free(h->host, m->state);
    m->state = NULL;
}

static int find_rt(const refit_fmt_module *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_runtime; i++)
        if (!strcmp(refit_runtime(m, i)->name, name))
            return (int)i;
    return -1;
}

/* The expert (index of the runtime w's dim 0, as m sees it) c lands in. */
static int64_t expert_of(const refit_fmt_module *m, const refit_fmt_ckpt *c)
{
    const refit_view *w = &refit_runtime(m, find_rt(m, "w"))->view;
    return ((const float *)c->place.data - (const float *)w->data) / w->strides[0];
}

static float amax_of(const refit_view *x)
{
    float a = 0.0f;
    for (int64_t r = 0; r < x->shape[0]; r++)
        for (int64_t k = 0; k < x->shape[1]; k++) {
            float v = ((const float *)x->data)[r * x->strides[0] + k * x->strides[1]];
            v = v < 0 ? -v : v;
            a = v > a ? v : a;
        }
    return a;
}

static int ex_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    seen.calls++;
    if (m->n_ckpt > seen.max_ckpt)
        seen.max_ckpt = m->n_ckpt;
    if (!m->state || *(const uint32_t *)m->state != m->n_ckpt)
        seen.state_mismatch = 1;
    const refit_view *w = &refit_runtime(m, find_rt(m, "w"))->view;
    float *s = refit_runtime(m, find_rt(m, "s"))->view.data;
    int cross = param_true(h, m, "cross");
    for (int64_t e = 0; e < w->shape[0]; e++) {
        float a = 0.0f;
        for (uint32_t i = 0; i < m->n_ckpt; i++) {
            const refit_fmt_ckpt *c = refit_ckpt(m, i);
            if (!c->staged.data)
                return h->error(h->host, REFIT_EINTERNAL, "module %s, tensor %s: no staged "
                                "bytes", m->name, c->name);
            float x = amax_of(&c->staged);
            if ((cross || expert_of(m, c) == e) && x > a)
                a = x;
        }
        s[e] = a;
        for (uint32_t i = 0; i < m->n_ckpt; i++) {
            const refit_fmt_ckpt *c = refit_ckpt(m, i);
            if (expert_of(m, c) != e)
                continue;
            for (int64_t r = 0; r < c->staged.shape[0]; r++)
                for (int64_t k = 0; k < c->staged.shape[1]; k++)
                    ((float *)c->place.data)[r * c->place.strides[0] + k] =
                        ((const float *)c->staged.data)[r * c->staged.strides[0] + k] / a;
        }
    }
    return REFIT_OK;
}

static int ex_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *m,
                             uint32_t n, void *stream)
{
    seen.many_calls++;
    if (n > seen.max_batch)
        seen.max_batch = n;
    for (uint32_t i = 0; i < n; i++) {
        int rc = ex_post_load(h, m[i], stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 fmt_experts = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-experts",
    .plan = ex_plan,
    .post_load = ex_post_load,
    .release = ex_release,
    .post_load_many = ex_post_load_many,
};

static void ck_name(char *out, size_t n, int e, int up)
{
    snprintf(out, n, MOD ".%d.%s", e, up ? "up" : "gate");
}

/* The stacked module, under budget (0: the default); returns seal's status. */
static int build(tw *w, uint64_t budget, const char *params)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.staging_budget = budget;
    assert_int_equal(tw_open(w, &o), REFIT_OK);
    assert_int_equal(refit_format_register(w->ctx, &fmt_experts), REFIT_OK);
    tw_module(w, MOD, "test-experts", params);
    tw_runtime(w, MOD, "w", REFIT_F32, 3, TT_SHAPE(E, 2 * I, K));
    tw_runtime(w, MOD, "s", REFIT_F32, 1, TT_SHAPE(E));
    for (int e = 0; e < E; e++)
        for (int up = 0; up < 2; up++) {
            char name[96];
            ck_name(name, sizeof name, e, up);
            refit_ckpt_spec s = tt_spec(REFIT_F32, 2, TT_SHAPE(I, K));
            s.target = "w";
            s.expert = e;
            s.dst_offset[0] = up ? I : 0;
            assert_int_equal(tw_expect(w, MOD, name, &s), REFIT_OK);
        }
    memset(&seen, 0, sizeof seen);
    return refit_model_seal(w->m);
}

/* Every expert's gate then up, in checkpoint order, one refit_load each. */
static void load_in_order(tw *w, refit_txn *t, uint64_t v, int skip_expert)
{
    for (int e = 0; e < E; e++)
        for (int up = 0; up < 2; up++) {
            char name[96];
            ck_name(name, sizeof name, e, up);
            if (e == skip_expert && up)
                continue;
            int rc = tw_load(w, t, name, v);
            if (rc)
                fail_msg("load %s: %s: %s", name, refit_status_name(rc), refit_errmsg(w->ctx));
        }
}

/* The CPU statement of the result: w = x / amax (per expert, or over the
 * module), s = amax. */
static void check_reference(tw *w, uint64_t v, int cross)
{
    tt_tensor *rw = tw_rt(w, MOD, "w"), *rs = tw_rt(w, MOD, "s");
    float amax[E], all = 0.0f;
    for (int e = 0; e < E; e++) {
        amax[e] = 0.0f;
        for (int up = 0; up < 2; up++) {
            char name[96];
            ck_name(name, sizeof name, e, up);
            refit_view x = tt_view(tw_ckpt_tensor(w, name, v));
            float a = amax_of(&x);
            amax[e] = a > amax[e] ? a : amax[e];
        }
        all = amax[e] > all ? amax[e] : all;
    }
    for (int e = 0; e < E; e++) {
        float a = cross ? all : amax[e];
        assert_true(tt_get_flat(rs, e) == a);
        for (int up = 0; up < 2; up++) {
            char name[96];
            ck_name(name, sizeof name, e, up);
            tt_tensor *x = tw_ckpt_tensor(w, name, v);
            for (int64_t r = 0; r < I; r++)
                for (int64_t k = 0; k < K; k++) {
                    int64_t at[3] = {e, up * I + r, k}, xi[2] = {r, k};
                    float want = (float)tt_get(x, xi) / a;
                    assert_true((float)tt_get(rw, at) == want);
                }
        }
    }
}

/* Expert by expert under a budget of two experts: commits, the bytes of
 * the CPU statement and of the whole-module post-load (a big budget,
 * slices off), staging never above the budget, slices' post-loads only. */
static void test_slices_fit_a_small_budget(void **state)
{
    (void)state;
    tw w, ref;
    assert_int_equal(build(&w, BUDGET, NULL), REFIT_OK);
    for (uint64_t v = 1; v <= 2; v++) {
        refit_txn *t = tw_begin(&w, v == 1 ? "v1" : "v2", (int)v - 1);
        load_in_order(&w, t, v, -1);
        size_t peak = refit_sys_txn_staging_peak(t);
        assert_true(peak >= SLICE_BYTES && peak <= BUDGET);
        assert_int_equal(refit_finalize(t), REFIT_OK);
        check_reference(&w, v, 0);
    }
    assert_int_equal(seen.max_ckpt, 2);
    assert_int_equal(seen.state_mismatch, 0);
    assert_int_equal(seen.calls, 2 * E);
    size_t n;
    void *snap = tw_snapshot(&w, &n);
    /* the whole module, staged whole (slices are the format's choice) */
    assert_int_equal(build(&ref, 0, "whole: 1"), REFIT_OK);
    refit_txn *t = tw_begin(&ref, "v2", 0);
    load_in_order(&ref, t, 2, -1);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    int same = tw_snapshot_equal(&ref, snap, n);
    tw_close(&ref);
    free(snap);
    tw_close(&w);
    assert_true(same);
}

/* The same stack through refit_load_many (one call) and a source set:
 * the forecast counts slices, post_load_many gets several at once. */
static void test_slices_in_one_call(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(build(&w, BUDGET, NULL), REFIT_OK);
    const char *names[2 * E];
    refit_tensor srcs[2 * E];
    char buf[2 * E][96];
    for (int e = 0; e < E; e++)
        for (int up = 0; up < 2; up++) {
            ck_name(buf[2 * e + up], sizeof buf[0], e, up);
            names[2 * e + up] = buf[2 * e + up];
            srcs[2 * e + up] = tw_ckpt_tensor(&w, buf[2 * e + up], 3)->t;
        }
    refit_txn *t = tw_begin(&w, "v3", 1);
    assert_int_equal(refit_load_many(t, 2 * E, names, srcs, NULL), REFIT_OK);
    assert_true(refit_sys_txn_staging_peak(t) <= BUDGET);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    check_reference(&w, 3, 0);
    assert_int_equal(seen.max_ckpt, 2);
    assert_true(seen.max_batch >= 2);
    for (int i = 0; i < 2 * E; i++)
        srcs[i] = tw_ckpt_tensor(&w, names[i], 4)->t;
    refit_source_set *set = NULL;
    assert_int_equal(refit_source_set_create(&set, w.m, 2 * E, names, srcs), REFIT_OK);
    t = tw_begin(&w, "v4", 1);
    assert_int_equal(refit_load_set(t, set, NULL), REFIT_OK);
    assert_true(refit_sys_txn_staging_peak(t) <= BUDGET);
    assert_int_equal(refit_finalize(t), REFIT_OK);
    check_reference(&w, 4, 0);
    assert_int_equal(seen.state_mismatch, 0);
    refit_source_set_destroy(set);
    tw_close(&w);
}

/* A post-load that crosses experts stages the whole stack: refused at
 * seal with the bytes it needs; fits (and crosses) under a big budget. */
static void test_crossing_refused_at_seal(void **state)
{
    (void)state;
    tw w;
    int rc = build(&w, BUDGET, "cross: true");
    char need[32];
    snprintf(need, sizeof need, "%d bytes", E * SLICE_BYTES);
    tw_close_refused(&w, rc, REFIT_EBUDGET, "module " MOD, need, "whole module", "staging budget");
    assert_int_equal(build(&w, 0, "cross: true"), REFIT_OK);
    tw_update(&w, 5, "v5");
    check_reference(&w, 5, 1);
    assert_int_equal(seen.max_ckpt, 2 * E);
    tw_close(&w);
}

/* One expert's slice larger than the budget: refused at seal, naming it. */
static void test_slice_over_budget_refused_at_seal(void **state)
{
    (void)state;
    tw w;
    int rc = build(&w, SLICE_BYTES - 1, NULL);
    char need[32];
    snprintf(need, sizeof need, "%d bytes", SLICE_BYTES);
    tw_close_refused(&w, rc, REFIT_EBUDGET, need, "expert 0's slice");
}

/* A slice planned unlike its module is refused at seal. */
static void test_slice_plan_must_agree(void **state)
{
    (void)state;
    tw w;
    int rc = build(&w, 0, "liar: true");
    tw_close_refused(&w, rc, REFIT_EFORMAT, "expert 0's slice unlike the whole module");
}

/* A missing expert: the others' post-loads ran, finalize refuses naming
 * the tensor, and rollback puts every byte back; abort the same. */
static void test_missing_expert_refused(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(build(&w, BUDGET, NULL), REFIT_OK);
    tw_update(&w, 1, "v1");
    size_t n;
    void *snap = tw_snapshot(&w, &n);
    refit_txn *t = tw_begin(&w, "v2", 1);
    load_in_order(&w, t, 2, 5);
    assert_int_equal(seen.calls, E + E - 1); /* v1's E, v2's all but expert 5 */
    int rc = refit_finalize(t);
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(w.ctx));
    int same = tw_snapshot_equal(&w, snap, n);
    refit_health h = refit_worker_health(w.ctx);
    const char *ver = refit_worker_version(w.ctx);
    int v1 = ver && !strcmp(ver, "v1");
    t = tw_begin(&w, "v3", 1);
    load_in_order(&w, t, 3, 6);
    int arc = refit_abort(t);
    int same2 = tw_snapshot_equal(&w, snap, n);
    free(snap);
    tw_close(&w);
    assert_int_equal(rc, REFIT_EINCOMPLETE);
    if (!strstr(msg, MOD ".5.up") || !strstr(msg, "module " MOD))
        fail_msg("message \"%s\"", msg);
    assert_true(same);
    assert_int_equal(h, REFIT_HEALTH_READY);
    assert_true(v1);
    assert_int_equal(arc, REFIT_OK);
    assert_true(same2);
}

/* Experts interleaved (every gate, then every up) keep all eight slices
 * open at once: over the budget mid-update, refused before writing. */
static void test_interleaved_over_budget(void **state)
{
    (void)state;
    tw w;
    assert_int_equal(build(&w, BUDGET, NULL), REFIT_OK);
    w.keep_going = 1;
    refit_txn *t = tw_begin(&w, "v1", 1);
    int rc = REFIT_OK, at = -1;
    for (int e = 0; e < E && !rc; e++) {
        char name[96];
        ck_name(name, sizeof name, e, 0);
        rc = tw_load(&w, t, name, 1);
        at = e;
    }
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", refit_errmsg(w.ctx));
    assert_int_equal(refit_abort(t), REFIT_OK);
    tw_close(&w);
    assert_int_equal(rc, REFIT_EBUDGET);
    assert_int_equal(at, 2); /* two slices fit */
    if (!strstr(msg, "staging budget"))
        fail_msg("message \"%s\"", msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_fit_a_small_budget),
        cmocka_unit_test(test_slices_in_one_call),
        cmocka_unit_test(test_crossing_refused_at_seal),
        cmocka_unit_test(test_slice_over_budget_refused_at_seal),
        cmocka_unit_test(test_slice_plan_must_agree),
        cmocka_unit_test(test_missing_expert_refused),
        cmocka_unit_test(test_interleaved_over_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
