/* The conformance kit's own test plugins (tests/formats/kit/meson.build):
 * runtime = 2 * checkpoint, F32, every tensor STAGED, like
 * examples/example_format. Built once right (KF_NAME alone) and once per
 * way of getting a check wrong, each of which one kit check must catch:
 *   KF_ACCUM     post_load adds into the runtime bytes (rule 4): reload,
 *                twice and cold-start fail
 *   KF_NAN_BLIND no NaN check: nan fails
 *   KF_SHARD     starts its slice at element slice_lo (a row index taken
 *                for an element index), wrapping around: tp fails
 *   KF_ROW       never writes a tensor's last element: cold-start fails
 *   KF_MANY_FIRST its post_load_many builds only the first module: many fails
 *   KF_SCRIBBLE  reads its staged views in place (REFIT_MODULE_STAGED_IN_PLACE,
 *                as every variant does) but writes them, i.e. the caller's
 *                source: many fails
 *   KF_REFUSE    refuses every update at post_load: every check that needs a
 *                cold start fails (and the kit must still say so, not crash)
 * (a declaration that lists another route is the liar test: declaration
 * fails.) */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

static int64_t numel(const refit_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

static int kf_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        const refit_view *rt = &refit_runtime(m, (uint32_t)c->target_index)->view;
        int64_t n = 1;
        for (int d = 0; d < c->ndim; d++)
            n *= c->shape[d];
        if (c->dtype.code != REFIT_DTYPE_FLOAT || c->dtype.bits != 32 ||
            rt->dtype.code != REFIT_DTYPE_FLOAT || rt->dtype.bits != 32 ||
            numel(rt) != n)
            return h->error(h->host, REFIT_EMISMATCH, "module %s, tensor %s: f32 into a whole "
                            "f32 runtime tensor", m->name, c->name);
        c->route = REFIT_ROUTE_STAGED;
    }
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
    return REFIT_OK;
}

static int kf_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    (void)stream;
    (void)h;
#ifdef KF_REFUSE
    return h->error(h->host, REFIT_ECORRUPT, "module %s: this build refuses every update",
                    m->name);
#endif
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        const float *in = c->staged.data;
        float *out = refit_runtime(m, (uint32_t)c->target_index)->view.data;
        int64_t n = numel(&c->staged), shift = 0;
#ifndef KF_NAN_BLIND
        for (int64_t e = 0; e < n; e++)
            if (!isfinite(in[e]))
                return h->error(h->host, REFIT_ECORRUPT, "module %s, tensor %s: NaN or "
                                "infinity in the weight", m->name, c->name);
#endif
#ifdef KF_SHARD
        if (c->split_dim >= 0)
            shift = c->slice_lo; /* rows taken for elements */
#endif
#ifdef KF_ROW
        n -= 1;
#endif
        for (int64_t e = 0; e < n; e++)
#ifdef KF_ACCUM
            out[e] += 2.0f * in[(e + shift) % n];
#else
            out[e] = 2.0f * in[(e + shift) % n];
#endif
#ifdef KF_SCRIBBLE
        ((float *)c->staged.data)[0] = -1.0f;
#endif
    }
    return REFIT_OK;
}

static int kf_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *m,
                             uint32_t n, void *stream)
{
#ifdef KF_MANY_FIRST
    n = n ? 1 : 0;
#endif
    for (uint32_t k = 0; k < n; k++) {
        int rc = kf_post_load(h, m[k], stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = KF_NAME,
    .plan = kf_plan,
    .post_load = kf_post_load,
    .release = NULL,
    .post_load_many = kf_post_load_many,
};
