/* See f4util.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/pyref.h"
#include "tests/formats4/f4util.h"

st_set *f4_ref(const char *cmd, const char *args)
{
    return pyref_run("tests/formats4/ref4.py", cmd, args);
}

const st_tensor *f4_get(const st_set *s, const char *name)
{
    return pyref_get(s, name);
}

refit_dtype f4_dtype(const st_tensor *t)
{
    return st_dtype_to_refit(t->dtype);
}

refit_tensor f4_desc(const st_tensor *t)
{
    refit_tensor d;
    memset(&d, 0, sizeof d);
    d.data = (void *)t->data;
    d.device.device_type = REFIT_DEVICE_CPU;
    d.ndim = t->ndim;
    d.dtype = f4_dtype(t);
    d.shape = (int64_t *)t->shape;
    return d;
}

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
        refit_ckpt_spec spec = tt_spec(f4_dtype(t), t->ndim, t->shape);
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
        refit_tensor d = f4_desc(x);
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

const char *f4_suffix(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

void f4_assert_block_eq(const float *want, int64_t cols, int64_t lo, int64_t hi, int64_t c0,
                        int64_t c1, const float *got)
{
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = c0; j < c1; j++) {
            float a = want[i * cols + j], b = got[(i - lo) * (c1 - c0) + (j - c0)];
            if (memcmp(&a, &b, sizeof a))
                fail_msg("element (%lld, %lld): want %.9g, got %.9g", (long long)i,
                         (long long)j, a, b);
        }
}
