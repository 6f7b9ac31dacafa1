/* See qutil.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/pyref.h"
#include "tests/formats/common/qutil.h"

st_set *q_ref(const char *script, const char *args)
{
    char path[512];
    snprintf(path, sizeof path, "tests/formats/common/%s", script);
    return pyref_run(path, NULL, args);
}

const st_tensor *q_get(const st_set *s, const char *name)
{
    return pyref_get(s, name);
}

refit_view q_view(const st_tensor *t)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = (void *)t->data;
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = st_dtype_to_refit(t->dtype);
    v.ndim = t->ndim;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        v.shape[i] = t->shape[i];
        v.strides[i] = s;
        s *= t->shape[i];
    }
    return v;
}

refit_tensor q_desc(const st_tensor *t)
{
    refit_tensor d;
    memset(&d, 0, sizeof d);
    d.data = (void *)t->data;
    d.device.device_type = REFIT_DEVICE_CPU;
    d.ndim = t->ndim;
    d.dtype = st_dtype_to_refit(t->dtype);
    d.shape = (int64_t *)t->shape;
    return d;
}

refit_view q_buf_view(void *data, refit_dtype dt, int64_t rows, int64_t cols)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = data;
    v.device.device_type = REFIT_DEVICE_CPU;
    v.dtype = dt;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.strides[0] = cols;
    v.strides[1] = 1;
    return v;
}

void q_assert_bytes_(const void *want, const void *got, size_t n, const char *what,
                     const char *file, int line)
{
    const unsigned char *a = want, *b = got;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            fail_msg("%s:%d: %s: byte %zu: want 0x%02x, got 0x%02x", file, line, what, i,
                     a[i], b[i]);
}

void q_shard(int64_t n, int tp, int rank, int64_t *lo, int64_t *hi)
{
    int64_t base = n / tp, extra = n % tp;
    *lo = rank * base + (rank < extra ? rank : extra);
    *hi = *lo + base + (rank < extra ? 1 : 0);
}

/* The descriptor of an entry's full (unsharded) checkpoint tensor. */
refit_tensor q_ent_desc(const st_set *s, const q_ent *e, int64_t *shape)
{
    const st_tensor *t = q_get(s, e->src);
    refit_tensor d = q_desc(t);
    size_t row_bytes = t->ndim ? (size_t)t->nbytes / (size_t)(t->shape[0] ? t->shape[0] : 1) : 0;
    d.ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        shape[i] = t->shape[i];
    if (e->rows) {
        d.data = (char *)d.data + (size_t)e->row0 * row_bytes;
        shape[0] = e->rows;
    }
    if (e->flat) {
        int64_t n = 1;
        for (int i = 0; i < d.ndim; i++)
            n *= shape[i];
        shape[0] = n;
        d.ndim = 1;
    }
    d.shape = shape;
    if (e->as == 1)
        d.dtype = Q_E4M3;
    else if (e->as == 2)
        d.dtype = Q_E8M0;
    return d;
}

int q_expect(tw *w, const char *mod, const st_set *s, const q_ent *e, int n, const q_tp *tp)
{
    for (int i = 0; i < n; i++) {
        int64_t shape[REFIT_MAX_DIMS];
        refit_tensor d = q_ent_desc(s, &e[i], shape);
        refit_ckpt_spec sp = tt_spec(d.dtype, d.ndim, shape);
        sp.target = e[i].target;
        sp.dst_offset[0] = e[i].dst_row;
        sp.expert = e[i].expert;
        if (tp && tp->tp > 1 && e[i].shard_dim >= 0) {
            sp.shard_dim = e[i].shard_dim;
            sp.shard_rank = tp->rank;
            sp.shard_count = tp->tp;
        }
        int rc = tw_expect(w, mod, e[i].name, &sp);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

/* begin, load every entry, finalize; returns the first failure. */
int q_try_update(tw *w, const st_set *s, const q_ent *e, int n, const char *label)
{
    refit_txn *t = tw_begin(w, label, 1);
    for (int i = 0; i < n; i++) {
        int64_t shape[REFIT_MAX_DIMS];
        refit_tensor d = q_ent_desc(s, &e[i], shape);
        int rc = refit_load(t, e[i].name, &d, NULL);
        if (rc) {
            refit_abort(t);
            return rc;
        }
    }
    return refit_finalize(t);
}

void q_update(tw *w, const st_set *s, const q_ent *e, int n, const char *label)
{
    int rc = q_try_update(w, s, e, n, label);
    if (rc)
        fail_msg("update %s: %s: %s", label, refit_status_name(rc), refit_errmsg(w->ctx));
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

void q_assert_rt(tw *w, const char *mod, const char *name, const void *want, size_t bytes)
{
    tt_tensor *t = tw_rt(w, mod, name);
    assert_true(t->bytes >= bytes);
    char what[160];
    snprintf(what, sizeof what, "runtime %s/%s", mod, name);
    q_assert_bytes(want, t->buf, bytes, what);
}

void q_assert_seal_refused(tw *w, const char *mod, const st_set *s, const q_ent *e, int n,
                           const char *what, const char *msg)
{
    int rc = q_expect(w, mod, s, e, n, NULL);
    if (!rc)
        rc = refit_model_seal(w->m);
    if (rc == REFIT_OK)
        fail_msg("%s: seal accepted it", what);
    if (!strstr(refit_errmsg(w->ctx), msg) || !strstr(refit_errmsg(w->ctx), mod))
        fail_msg("%s: message \"%s\" lacks \"%s\" or the module", what, refit_errmsg(w->ctx),
                 msg);
}

void q_assert_nonfinite_refused(tw *w, const char *mod, const char *name,
                                const refit_tensor *bad)
{
    q_kept k = q_keep(w);
    refit_txn *t = tw_begin(w, "v2", 1);
    int rc = refit_load(t, name, bad, NULL);
    if (rc == REFIT_OK)
        rc = refit_finalize(t);
    assert_int_equal(rc, REFIT_ECORRUPT);
    tw_assert_msg(w, mod, name, "NaN or infinity");
    if (refit_worker_health(w->ctx) == REFIT_HEALTH_UPDATING)
        refit_abort(t);
    q_assert_kept(w, &k);
}

/* ---- steps every format suite repeats ---- */

void q_world(tw *w, const refit_format_v2 *plugin)
{
    assert_int_equal(tw_open(w, NULL), REFIT_OK);
    if (plugin)
        assert_int_equal(refit_format_register(w->ctx, plugin), REFIT_OK);
}

int q_expect_seal(tw *w, const char *mod, const st_set *s, const q_ent *e, int n,
                  const q_tp *tp)
{
    int rc = q_expect(w, mod, s, e, n, tp);
    return rc ? rc : refit_model_seal(w->m);
}

static void module_update(const q_module *m, tw *w, const st_set *s, const char *label)
{
    if (m->update)
        m->update(w, s, label);
    else
        q_update(w, s, m->e, m->n, label);
}

q_module q_entries_module(const refit_format_v2 *plugin,
                          int (*build)(tw *w, const st_set *s, const q_module *m), q_ent *e,
                          int n, const void *arg)
{
    return (q_module){.plugin = plugin, .build = build, .e = e, .n = n, .arg = arg,
                      .ref = q_ref, .ref_cmd = "quant_ref.py"};
}

void q_assert_reload_equals_cold(const q_module *m, const char *args_a, const char *args_b,
                                 uint64_t fp[2])
{
    st_set *a = m->ref(m->ref_cmd, args_a), *b = m->ref(m->ref_cmd, args_b);
    tw cold, hot;
    q_world(&cold, m->plugin);
    q_world(&hot, m->plugin);
    assert_int_equal(m->build(&cold, b, m), REFIT_OK);
    assert_int_equal(m->build(&hot, a, m), REFIT_OK);
    module_update(m, &cold, b, "B");
    module_update(m, &hot, a, "A");
    uint64_t after_a = tw_fp(&hot);
    module_update(m, &hot, b, "B");
    assert_int_equal(tw_fp(&hot), tw_fp(&cold));
    if (fp) {
        fp[0] = after_a;
        fp[1] = tw_fp(&hot);
    }
    q_kept k = q_keep(&hot);
    module_update(m, &hot, b, "B again");
    q_assert_kept(&hot, &k);
    tw_close(&cold);
    tw_close(&hot);
    st_close(a);
    st_close(b);
}

void q_assert_file_equals_linked(tw *file, tw *linked, const q_module *file_m,
                                 const q_module *linked_m, const st_set *s, const char *what)
{
    q_world(file, NULL);
    q_world(linked, linked_m->plugin);
    if (file_m->build(file, s, file_m))
        fail_msg("%s through the plugin file: %s", what, refit_errmsg(file->ctx));
    assert_int_equal(linked_m->build(linked, s, linked_m), REFIT_OK);
    module_update(file_m, file, s, "v1");
    module_update(linked_m, linked, s, "v1");
    assert_int_equal(tw_fp(file), tw_fp(linked));
}

q_kept q_keep(tw *w)
{
    q_kept k;
    k.bytes = tw_snapshot(w, &k.n);
    k.health = refit_worker_health(w->ctx);
    return k;
}

void q_assert_kept(tw *w, q_kept *k)
{
    size_t n;
    void *now = tw_snapshot(w, &n);
    assert_int_equal(refit_worker_health(w->ctx), k->health);
    assert_int_equal(n, k->n);
    assert_memory_equal(k->bytes, now, n);
    free(now);
    free(k->bytes);
    k->bytes = NULL;
}
