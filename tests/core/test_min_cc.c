/* A format's least compute capability (format.h, min_compute_capability):
 * at seal, a module with a post-load step on a device below it is refused,
 * naming format, module and both capabilities; at or above it, or on host
 * memory, or without a post-load step, or from a format struct too short
 * to hold the member, the module seals and updates. The device is the host
 * backend's, its capability set by a device_info that wraps the host's. */
#include <string.h>

#include "core/internal.h"
#include "testutil.h"

#define T(f) cmocka_unit_test_setup_teardown(f, tw_setup, tw_teardown)

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

static int staged_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_STAGED;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD;
    return REFIT_OK;
}

static int direct_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    (void)h;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = REFIT_ROUTE_DIRECT;
    return REFIT_OK;
}

static int copy_home(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int rc = h->copy(h->host, &refit_ckpt(m, i)->place, &refit_ckpt(m, i)->staged, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 fmt_sm90 = {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2),
                                         "t-sm90", staged_plan, copy_home, NULL, 90};
static const refit_format_v2 fmt_sm90_direct = {REFIT_FORMAT_ABI_VERSION,
                                                sizeof(refit_format_v2), "t-sm90-direct",
                                                direct_plan, NULL, NULL, 90};
/* built against a header without the member: its struct ends before it */
static const refit_format_v2 fmt_sm90_short = {REFIT_FORMAT_ABI_VERSION,
                                               offsetof(refit_format_v2, min_compute_capability),
                                               "t-sm90-short", staged_plan, copy_home, NULL, 90};

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
        T(test_below_the_least_capability_is_refused_by_name),
        T(test_at_the_least_capability_seals_and_updates),
        T(test_above_it_seals),
        T(test_host_memory_runs_the_reference),
        T(test_no_post_load_needs_no_capability),
        T(test_a_struct_without_the_member_is_not_read_past),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
