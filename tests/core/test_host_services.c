/* The host services of format ABI 2 (core/host_services.c): every view a
 * format hands to copy/zero/fetch is checked against the module's own
 * runtime tensors, staged bytes and scratch; a plan that fails silently is
 * still named; device_info, scratch and the GPU service on a host without
 * a device; element strides; a format's least compute capability
 * (min_compute_capability), refused at seal below it by format, module
 * and both capabilities, on a device_info faked over the host backend's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "testutil.h"

#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)

/* Where the escaping formats aim: another module's runtime tensor. */
static float *escape_target;

static int staged_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_STAGED;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD;
    return REFIT_OK;
}

/* The staged weight copied where it belongs: what a correct post-load does. */
static int copy_home(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int rc = h->copy(h->host, &refit_ckpt(m, i)->place, &refit_ckpt(m, i)->staged, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* 0 until a test turns the escapes on: the formats then behave. */
static int escape_on;

/* Copies its staged weight over escape_target, a tensor of another module. */
static int escape_copy_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    int rc = copy_home(h, m, stream);
    if (rc || !escape_on)
        return rc;
    refit_view v = refit_ckpt(m, 0)->staged;
    v.data = escape_target;
    v.device = (refit_device){REFIT_DEVICE_CPU, 0};
    return h->copy(h->host, &v, &refit_ckpt(m, 0)->staged, stream);
}

/* Zeroes a view twice its runtime tensor's length: past its end. */
static int escape_zero_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    int rc = copy_home(h, m, stream);
    if (rc || !escape_on)
        return rc;
    refit_view v = refit_runtime(m, 0)->view;
    v.shape[0] *= 2;
    return h->zero(h->host, &v, stream);
}

/* Reads another module's bytes back. */
static int escape_fetch_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    int rc = copy_home(h, m, stream);
    if (rc || !escape_on)
        return rc;
    refit_view v = refit_runtime(m, 0)->view;
    v.data = escape_target;
    float got[4];
    return h->fetch(h->host, got, sizeof got, &v, stream);
}

/* Builds its runtime through scratch on the host: staged -> scratch ->
 * place, so scratch is memory the services accept. */
static int scratch_post(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        refit_view tmp = c->staged;
        int64_t n = 1;
        for (int d = 0; d < tmp.ndim; d++)
            n *= tmp.shape[d];
        tmp.data = h->scratch(h->host, c->staged.device, (size_t)n * sizeof(float));
        if (!tmp.data)
            return REFIT_ENOMEM;
        if (((uintptr_t)tmp.data & 255) != 0)
            return h->error(h->host, REFIT_EINTERNAL, "scratch is not 256-byte aligned");
        int64_t st = 1;
        for (int d = tmp.ndim - 1; d >= 0; d--) {
            tmp.strides[d] = st;
            st *= tmp.shape[d];
        }
        int rc = h->copy(h->host, &tmp, &c->staged, stream);
        if (!rc)
            rc = h->copy(h->host, &c->place, &tmp, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* Refuses every module without saying why. */
static int silent_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    (void)m;
    return REFIT_EUNSUPPORTED;
}

/* Records what the plan saw of the host and the arrays. */
static uint32_t seen_ckpt_stride, seen_runtime_stride;
static refit_device_info seen_info;
static int seen_gpu_load, seen_status;
static char seen_gpu_msg[256];
static int probe_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    seen_ckpt_stride = m->ckpt_stride;
    seen_runtime_stride = m->runtime_stride;
    seen_info = (refit_device_info){.struct_size = sizeof seen_info};
    h->device_info(h->host, refit_runtime(m, 0)->view.device, &seen_info);
    static const unsigned char junk[16] = {1, 2, 3};
    void *mod = NULL;
    seen_gpu_load = h->gpu_load(h->host, junk, sizeof junk, &mod);
    snprintf(seen_gpu_msg, sizeof seen_gpu_msg, "%s", refit_errmsg(h->host));
    uint32_t *word = NULL;
    seen_status = h->status_word(h->host, m, refit_runtime(m, 0)->view.device, 0, NULL, NULL,
                                 NULL, &word);
    return staged_plan(h, m);
}

#define FMT(nm, pl, post)                                                                    \
    {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2), nm, pl, post, NULL, 0, NULL, NULL}
static const refit_format_v2 fmt_escape_copy = FMT("t-escape-copy", staged_plan, escape_copy_post);
static const refit_format_v2 fmt_escape_zero = FMT("t-escape-zero", staged_plan, escape_zero_post);
static const refit_format_v2 fmt_escape_fetch = FMT("t-escape-fetch", staged_plan,
                                                    escape_fetch_post);
static const refit_format_v2 fmt_scratch = FMT("t-scratch", staged_plan, scratch_post);
static const refit_format_v2 fmt_silent = FMT("t-silent", silent_plan, NULL);
static const refit_format_v2 fmt_probe = FMT("t-probe", probe_plan, copy_home);

/* Module "a" of format fmt (a.w [4] -> w, staged) and module "b" of
 * test-scale (b.w [4] -> w), whose bytes a's format aims at; b's tensor is
 * allocated right after a's (one buffer), so a view past a's end is b's. */
static void two_modules(tw *w, const refit_format_v2 *fmt)
{
    escape_on = 0;
    tw_register_test_formats(w);
    assert_int_equal(refit_format_register(w->ctx, fmt), REFIT_OK);
    tw_module(w, "a", fmt->name, NULL);
    tw_module(w, "b", "test-scale", NULL);
    tt_tensor *both = tw_tmp(w, REFIT_F32, 1, TT_SHAPE(8));
    memset(both->buf, 0, both->bytes);
    tw_bind(w, "a", "w", tt_alias(both, REFIT_F32, 1, TT_SHAPE(4), NULL, 0));
    tw_bind(w, "b", "w", tt_alias(both, REFIT_F32, 1, TT_SHAPE(4), NULL, 4));
    escape_target = (float *)both->buf + 4;
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    s.target = "w";
    assert_int_equal(tw_expect(w, "b", "b.w", &s), REFIT_OK);
    assert_int_equal(tw_expect(w, "a", "a.w", &s), REFIT_OK);
    tw_seal(w);
}

/* A READY worker at v1; an update to v2 whose post-load of a escapes is
 * refused before any byte of b moves, and rolled back: every byte and the
 * health as they were, twice in a row. */
static void refused_escape(tw *w, const refit_format_v2 *fmt, const char *service)
{
    two_modules(w, fmt);
    tw_update(w, 1, "v1");
    float b_v1[4];
    memcpy(b_v1, escape_target, sizeof b_v1);
    escape_on = 1;
    for (int round = 0; round < 2; round++) {
        refit_txn *t = tw_begin(w, "v2", 1);
        assert_int_equal(tw_load(w, t, "b.w", 2), REFIT_OK);
        float b_v2[4];
        memcpy(b_v2, escape_target, sizeof b_v2);
        assert_int_equal(tw_load(w, t, "a.w", 2), REFIT_EINVAL);
        tw_assert_msg(w, service, "module a", "outside the module's runtime tensors, staged "
                      "bytes and scratch; refused");
        int b_kept = !memcmp(escape_target, b_v2, sizeof b_v2); /* nothing of a reached b */
        refit_abort(t);
        int b_back = !memcmp(escape_target, b_v1, sizeof b_v1);
        assert_true(b_kept);
        assert_true(b_back);
        assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
        assert_string_equal(refit_worker_version(w->ctx), "v1");
    }
}

static void test_copy_outside_the_module_is_refused(void **state)
{
    refused_escape(*state, &fmt_escape_copy, "copy: module a: the destination view");
}

static void test_zero_past_the_runtime_tensor_is_refused(void **state)
{
    refused_escape(*state, &fmt_escape_zero, "zero: module a: the destination view");
}

static void test_fetch_of_another_module_is_refused(void **state)
{
    refused_escape(*state, &fmt_escape_fetch, "fetch: module a: the source view");
}

/* Scratch is memory the services accept: staged -> scratch -> place gives
 * the checkpoint's bytes, update after update. */
static void test_scratch_is_lent_for_the_update(void **state)
{
    tw *w = *state;
    two_modules(w, &fmt_scratch);
    for (uint64_t v = 1; v <= 2; v++) {
        tw_update(w, v, v == 1 ? "v1" : "v2");
        tt_tensor *ca = tw_ckpt_tensor(w, "a.w", v);
        int built = !memcmp(tw_rt(w, "a", "w")->t.data, ca->buf, 4 * sizeof(float));
        assert_true(built);
    }
}

static void test_silent_plan_failure_names_format_and_module(void **state)
{
    tw *w = *state;
    assert_int_equal(refit_format_register(w->ctx, &fmt_silent), REFIT_OK);
    tw_module(w, "quiet", "t-silent", NULL);
    tw_runtime(w, "quiet", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    s.target = "w";
    assert_int_equal(tw_expect(w, "quiet", "quiet.w", &s), REFIT_OK);
    assert_int_equal(refit_model_seal(w->m), REFIT_EUNSUPPORTED);
    tw_assert_msg(w, "module quiet", "plan() of format t-silent", "without a message",
                  "REFIT_EUNSUPPORTED");
}

static void test_plan_sees_strides_device_info_and_no_gpu(void **state)
{
    tw *w = *state;
    two_modules(w, &fmt_probe);
    assert_int_equal(seen_ckpt_stride, sizeof(refit_fmt_ckpt));
    assert_int_equal(seen_runtime_stride, sizeof(refit_fmt_runtime));
    assert_int_equal(seen_info.served, 1);
    assert_int_equal(seen_info.host_access, 1);
    assert_int_equal(seen_info.cc_major, 0);
    assert_string_equal(seen_info.backend, "host");
    /* no GPU here (a build without CUDA, or host memory): refused, named */
    assert_int_equal(seen_gpu_load, REFIT_EUNSUPPORTED);
    assert_non_null(strstr(seen_gpu_msg, "gpu_load: "));
    assert_int_equal(seen_status, REFIT_EUNSUPPORTED);
    tw_update(w, 1, "v1"); /* and the probe's copy post-load commits */
}

/* refit_ckpt/refit_runtime walk at the host's stride, not the plugin's
 * sizeof: elements of a newer host with appended members still read right. */
static void test_elements_are_read_at_their_stride(void **state)
{
    (void)state;
    enum { PAD = 40 };
    struct wide {
        refit_fmt_ckpt c;
        char appended[PAD];
    } cw[3];
    struct wider {
        refit_fmt_runtime r;
        char appended[PAD];
    } rw[2];
    memset(cw, 0xab, sizeof cw);
    memset(rw, 0xab, sizeof rw);
    const char *names[3] = {"x", "y", "z"};
    for (int i = 0; i < 3; i++)
        cw[i].c.name = names[i];
    rw[0].r.name = "r0";
    rw[1].r.name = "r1";
    refit_fmt_module m = {.name = "m", .n_ckpt = 3, .ckpt_stride = sizeof cw[0],
                          .ckpt = &cw[0].c, .n_runtime = 2, .runtime_stride = sizeof rw[0],
                          .runtime = &rw[0].r};
    for (uint32_t i = 0; i < 3; i++)
        assert_string_equal(refit_ckpt(&m, i)->name, names[i]);
    assert_string_equal(refit_runtime(&m, 1)->name, "r1");
    assert_true(REFIT_ELEM_HAS(m.ckpt_stride, refit_fmt_ckpt, dst_offset));
    assert_false(REFIT_ELEM_HAS(offsetof(refit_fmt_ckpt, expert), refit_fmt_ckpt, expert));
}

/* ---- the least compute capability ---- */

/* The capability the fake reports for every device; 0.0: the host's own
 * answer (host memory). */
static int fake_major, fake_minor;
static int (*real_device_info)(void *host, refit_device dev, refit_device_info *out);

static int fake_device_info(void *host, refit_device dev, refit_device_info *out)
{
    int rc = real_device_info(host, dev, out);
    if (!rc && fake_major) {
        out->cc_major = fake_major;
        out->cc_minor = fake_minor;
    }
    return rc;
}

static int direct_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_DIRECT;
    return REFIT_OK;
}

static const refit_format_v2 fmt_sm90 = {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2),
                                         "t-sm90", staged_plan, copy_home, NULL, 90, NULL,
                                         NULL};
static const refit_format_v2 fmt_sm90_direct = {REFIT_FORMAT_ABI_VERSION,
                                                sizeof(refit_format_v2), "t-sm90-direct",
                                                direct_plan, NULL, NULL, 90, NULL, NULL};
/* built against a header without the member: its struct ends before it */
static const refit_format_v2 fmt_sm90_short = {REFIT_FORMAT_ABI_VERSION,
                                               offsetof(refit_format_v2, min_compute_capability),
                                               "t-sm90-short", staged_plan, copy_home, NULL, 90, NULL,
                                               NULL};

/* Module "a" of fmt (a.w [4] -> w) on the host backend's device, which
 * reports compute capability major.minor (0.0: host memory); the seal's
 * status. */
static int seal_on(tw *w, const refit_format_v2 *fmt, int major, int minor)
{
    real_device_info = w->ctx->host.device_info;
    w->ctx->host.device_info = fake_device_info;
    fake_major = major;
    fake_minor = minor;
    assert_int_equal(refit_format_register(w->ctx, fmt), REFIT_OK);
    tw_module(w, "a", fmt->name, NULL);
    tw_runtime(w, "a", "w", REFIT_F32, 1, TT_SHAPE(4));
    refit_ckpt_spec s = tt_spec(REFIT_F32, 1, TT_SHAPE(4));
    s.target = "w";
    assert_int_equal(tw_expect(w, "a", "a.w", &s), REFIT_OK);
    return refit_model_seal(w->m);
}

static void test_below_the_least_capability_is_refused_by_name(void **state)
{
    tw *w = *state;
    assert_int_equal(seal_on(w, &fmt_sm90, 8, 9), REFIT_EUNSUPPORTED);
    tw_assert_msg(w, "module a: format t-sm90 needs compute capability 9.0",
                  "runtime w is on device 0 (host), of compute capability 8.9");
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_EMPTY);
}

static void test_at_the_least_capability_seals_and_updates(void **state)
{
    tw *w = *state;
    assert_int_equal(seal_on(w, &fmt_sm90, 9, 0), REFIT_OK);
    tw_update(w, 1, "v1");
    tt_tensor *c = tw_ckpt_tensor(w, "a.w", 1);
    int built = !memcmp(tw_rt(w, "a", "w")->t.data, c->buf, 4 * sizeof(float));
    assert_true(built);
}

static void test_above_it_seals(void **state)
{
    assert_int_equal(seal_on(*state, &fmt_sm90, 10, 0), REFIT_OK);
}

static void test_host_memory_runs_the_reference(void **state)
{
    assert_int_equal(seal_on(*state, &fmt_sm90, 0, 0), REFIT_OK);
}

static void test_no_post_load_needs_no_capability(void **state)
{
    assert_int_equal(seal_on(*state, &fmt_sm90_direct, 7, 5), REFIT_OK);
}

static void test_a_struct_without_the_member_is_not_read_past(void **state)
{
    assert_int_equal(seal_on(*state, &fmt_sm90_short, 7, 5), REFIT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_copy_outside_the_module_is_refused),
        T(test_zero_past_the_runtime_tensor_is_refused),
        T(test_fetch_of_another_module_is_refused),
        T(test_scratch_is_lent_for_the_update),
        T(test_silent_plan_failure_names_format_and_module),
        T(test_plan_sees_strides_device_info_and_no_gpu),
        cmocka_unit_test(test_elements_are_read_at_their_stride),
        T(test_below_the_least_capability_is_refused_by_name),
        T(test_at_the_least_capability_seals_and_updates),
        T(test_above_it_seals),
        T(test_host_memory_runs_the_reference),
        T(test_no_post_load_needs_no_capability),
        T(test_a_struct_without_the_member_is_not_read_past),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
