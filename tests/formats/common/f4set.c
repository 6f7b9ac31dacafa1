/* See f4set.h. */
#include <string.h>

#include "tests/formats/common/f4set.h"
#include "tests/formats/common/f4util.h"

static int is_ckpt(const char *name)
{
    return strncmp(name, "expect.", 7) != 0;
}

int f4_expect_all(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user)
{
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_tensor_at(s, i);
        if (!is_ckpt(t->name))
            continue;
        refit_ckpt_spec spec = tt_spec(st_dtype_to_refit(t->dtype), t->ndim, t->shape);
        if (fn)
            fn(t->name, &spec, user);
        int rc = tw_expect(w, module, t->name, &spec);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

int f4_expect_seal(tw *w, const char *module, const st_set *s, f4_spec_fn fn, void *user)
{
    int rc = f4_expect_all(w, module, s, fn, user);
    return rc ? rc : refit_model_seal(w->m);
}

void f4_load_all(tw *w, refit_txn *t, const st_set *s)
{
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *x = st_tensor_at(s, i);
        if (!is_ckpt(x->name))
            continue;
        refit_tensor d = q_desc(x);
        int rc = refit_load(t, x->name, &d, NULL);
        if (rc)
            fail_msg("load %s: %s: %s", x->name, refit_status_name(rc), refit_errmsg(w->ctx));
    }
}

void f4_update(tw *w, const st_set *s, const char *label)
{
    refit_txn *t = tw_begin(w, label, 1);
    f4_load_all(w, t, s);
    int rc = refit_finalize(t);
    if (rc)
        fail_msg("finalize %s: %s: %s", label, refit_status_name(rc), refit_errmsg(w->ctx));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

q_module f4_module(const refit_format_v2 *plugin,
                   int (*build)(tw *w, const st_set *s, const q_module *m), const void *arg,
                   const char *cmd)
{
    return (q_module){.plugin = plugin, .build = build, .update = f4_update, .arg = arg,
                      .ref = f4_ref, .ref_cmd = cmd};
}
