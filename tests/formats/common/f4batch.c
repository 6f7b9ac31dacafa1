/* See f4batch.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/formats/common/f4batch.h"
#include "tests/formats/common/f4util.h"
#include "tests/formats/common/qutil.h"

f4b_watch f4b_seen;

static const refit_format_v2 *watched_plugin;
static refit_format_v2 watched_fmt;

void f4b_watch_reset(void)
{
    memset(&f4b_seen, 0, sizeof f4b_seen);
}

static int watch_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    int rc = watched_plugin->plan(h, m);
    f4b_seen.plans++;
    if (!rc && (m->flags & REFIT_MODULE_STAGED_IN_PLACE))
        f4b_seen.plans_in_place++;
    return rc;
}

static void watch_staged(const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        if (c->route != REFIT_ROUTE_STAGED || f4b_seen.n_staged == F4B_MAX)
            continue;
        int at = f4b_seen.n_staged++;
        snprintf(f4b_seen.staged_name[at], sizeof f4b_seen.staged_name[at], "%s", c->name);
        f4b_seen.staged_at[at] = c->staged.data;
    }
}

static int watch_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    f4b_seen.one_calls++;
    watch_staged(m);
    return watched_plugin->post_load(h, m, stream);
}

static int watch_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *m,
                                uint32_t n, void *stream)
{
    f4b_seen.many_calls++;
    f4b_seen.many_modules += (int)n;
    for (uint32_t k = 0; k < n; k++)
        watch_staged(m[k]);
    if (!REFIT_STRUCT_HAS(watched_plugin, refit_format_v2, post_load_many) ||
        !watched_plugin->post_load_many)
        fail_msg("format %s has no post_load_many: %u modules of one call would take a "
                 "post_load each", watched_plugin->name, n);
    return watched_plugin->post_load_many(h, m, n, stream);
}

const refit_format_v2 *f4b_watched(const refit_format_v2 *plugin)
{
    watched_plugin = plugin;
    watched_fmt = *plugin;
    watched_fmt.plan = watch_plan;
    watched_fmt.post_load = watch_post_load;
    watched_fmt.post_load_many = watch_post_load_many;
    f4b_watch_reset();
    return &watched_fmt;
}

void f4b_name(char *out, size_t size, int k, const char *name)
{
    snprintf(out, size, "l%d.%s", k, name);
}

static int is_ckpt(const char *name)
{
    return strncmp(name, "expect.", 7) != 0;
}

int f4b_expect(tw *w, const char *mod, int k, const st_set *s, f4_spec_fn fn, void *user)
{
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        if (!is_ckpt(t->name))
            continue;
        char name[128];
        f4b_name(name, sizeof name, k, t->name);
        refit_ckpt_spec spec = tt_spec(st_dtype_to_refit(t->dtype), t->ndim, t->shape);
        if (fn)
            fn(name, &spec, user);
        int rc = tw_expect(w, mod, name, &spec);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

void f4b_sources_make(f4b_sources *src, st_set *const *s, int n, int misaligned)
{
    memset(src, 0, sizeof *src);
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < st_count(s[k]); i++) {
            const st_tensor *x = st_tensor_at(s[k], i);
            if (!is_ckpt(x->name))
                continue;
            assert_true(src->n < F4B_MAX);
            int at = src->n++;
            size_t bytes = (size_t)x->nbytes;
            src->buf[at] = aligned_alloc(64, (bytes + 16 + 63) / 64 * 64);
            assert_non_null(src->buf[at]);
            char *data = (char *)src->buf[at] + (misaligned ? 16 : 0);
            memcpy(data, x->data, bytes);
            f4b_name(src->name[at], sizeof src->name[at], k, x->name);
            src->names[at] = src->name[at];
            src->t[at] = q_desc(x);
            src->t[at].data = data;
        }
}

void f4b_sources_free(f4b_sources *src)
{
    for (int i = 0; i < src->n; i++)
        free(src->buf[i]);
    memset(src, 0, sizeof *src);
}

void *f4b_bytes(f4b_sources *src, int k, const char *name)
{
    char want[128];
    f4b_name(want, sizeof want, k, name);
    for (int i = 0; i < src->n; i++)
        if (!strcmp(src->name[i], want))
            return src->t[i].data;
    fail_msg("no source %s", want);
    return NULL;
}

void f4b_load(tw *w, refit_txn *t, const f4b_sources *src, int many)
{
    if (many) {
        int rc = refit_load_many(t, (size_t)src->n, src->names, src->t, NULL);
        if (rc)
            fail_msg("load_many of %d tensors: %s: %s", src->n, refit_status_name(rc),
                     refit_errmsg(w->ctx));
        return;
    }
    for (int i = 0; i < src->n; i++) {
        int rc = refit_load(t, src->names[i], &src->t[i], NULL);
        if (rc)
            fail_msg("load %s: %s: %s", src->names[i], refit_status_name(rc),
                     refit_errmsg(w->ctx));
    }
}

int f4b_update(tw *w, const f4b_sources *src, int many, const char *label)
{
    refit_txn *t = tw_begin(w, label, 1);
    f4b_load(w, t, src, many);
    return refit_finalize(t);
}

int f4b_assert_read(const f4b_sources *src, int in_place)
{
    assert_true(f4b_seen.n_staged > 0);
    for (int j = 0; j < f4b_seen.n_staged; j++) {
        int i = 0;
        while (i < src->n && strcmp(src->name[i], f4b_seen.staged_name[j]))
            i++;
        if (i == src->n)
            fail_msg("post-load read %s, which the batch does not hold", f4b_seen.staged_name[j]);
        int there = f4b_seen.staged_at[j] == src->t[i].data;
        if (there != in_place)
            fail_msg("post-load read %s %s", src->name[i],
                     in_place ? "from a staged copy, not from the caller's aligned source"
                              : "from the caller's unaligned source, not a staged copy");
    }
    return f4b_seen.n_staged;
}

void f4b_assert_same_bytes(const tw *a, const tw *b, const char *what)
{
    size_t na, nb;
    void *x = tw_snapshot(a, &na), *y = tw_snapshot(b, &nb);
    if (na != nb || memcmp(x, y, na))
        fail_msg("%s: the runtime bytes differ", what);
    free(x);
    free(y);
}

void f4b_check_load_many(const refit_format_v2 *plugin, const f4b_batch *bt)
{
    st_set *a[F4B_MAX], *b[F4B_MAX];
    int n = bt->n;
    bt->sets(a, 60);
    bt->sets(b, 70);
    f4b_sources sa, sb, sb_off;
    f4b_sources_make(&sa, a, n, 0);
    f4b_sources_make(&sb, b, n, 0);
    f4b_sources_make(&sb_off, b, n, 1);
    const refit_format_v2 *fmt = f4b_watched(plugin);

    tw cold, each, hot;
    q_world(&cold, fmt);
    bt->build(&cold, b);
    assert_int_equal(f4b_seen.plans, n);
    assert_int_equal(f4b_seen.plans_in_place, n);
    f4b_watch_reset();
    if (bt->spoil)
        bt->spoil(&cold);
    assert_int_equal(f4b_update(&cold, &sb, 1, "B"), REFIT_OK);
    assert_int_equal(f4b_seen.many_calls, 1);
    assert_int_equal(f4b_seen.many_modules, n);
    assert_int_equal(f4b_seen.one_calls, 0);
    assert_int_equal(f4b_assert_read(&sb, 1), bt->staged_in_place);
    bt->check(&cold, b);

    q_world(&each, fmt);
    bt->build(&each, b);
    f4b_watch_reset();
    assert_int_equal(f4b_update(&each, &sb, 0, "B"), REFIT_OK);
    assert_int_equal(f4b_seen.one_calls, n);
    assert_int_equal(f4b_seen.many_calls, 0);
    f4b_assert_same_bytes(&cold, &each, "refit_load a tensor against refit_load_many");

    q_world(&hot, fmt);
    bt->build(&hot, a);
    assert_int_equal(f4b_update(&hot, &sa, 1, "A"), REFIT_OK);
    assert_true(tw_fp(&hot) != tw_fp(&cold));
    f4b_watch_reset();
    assert_int_equal(f4b_update(&hot, &sb_off, 1, "B"), REFIT_OK);
    assert_int_equal(f4b_seen.many_calls, 1);
    f4b_assert_read(&sb_off, 0);
    f4b_assert_same_bytes(&cold, &hot, "B over A, staged, against a cold start in place");
    q_kept kept = q_keep(&hot);
    assert_int_equal(f4b_update(&hot, &sb, 1, "B again"), REFIT_OK);
    q_assert_kept(&hot, &kept);

    tw_close(&cold);
    tw_close(&each);
    tw_close(&hot);
    f4b_sources_free(&sa);
    f4b_sources_free(&sb);
    f4b_sources_free(&sb_off);
    bt->close(a);
    bt->close(b);
}
