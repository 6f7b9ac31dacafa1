/* Format "int8": W8A8 INT8 weights in the compressed-tensors convention
 * (docs/formats-fp8.md), serialized, every route DIRECT.
 *
 * Checkpoint tensors of a module (several weights may fuse into one
 * runtime weight; each W.* pairs with the W.weight of its prefix):
 *   W.weight             I8 [N, K], symmetric (q * scale)
 *   W.weight_scale       F32/BF16/F16, [N, 1] or [N] (per-channel, the
 *                        compressed-tensors W8A8 default) or one element
 *                        (per-tensor)
 *   W.input_scale        static activation scale (float), optional
 *   W.input_zero_point   static asymmetric activation zero point (int),
 *                        optional
 * Runtime tensors: weight (I8), weight_scale (float; a bf16/f16 checkpoint
 * scale is cast on the copy), input_scale, input_zero_point.
 *
 * Nothing runs at load: the core places weights and scales (shards, fused
 * offsets, experts); a per-channel scale shards with the weight's rows.
 * The module is WHOLE: a weight without its scale means nothing.
 *
 * Params: scheme (per_tensor | per_channel), optional: inferred from the
 * scales, an explicit value must agree. */
#include <stdio.h>
#include <string.h>

#include <refit/format.h>

#include "plugins/fp8/quant_fp8.h"
#include "plugins/fp8/qplug.h"

enum { R_WEIGHT, R_SCALE, R_INPUT_SCALE, R_INPUT_ZP, R_COUNT };
static const char *const role_suffix[R_COUNT] = {"weight", "weight_scale", "input_scale",
                                                 "input_zero_point"};

static int role_of(const char *name)
{
    const char *s = suffix(name);
    for (int r = 0; r < R_COUNT; r++)
        if (!strcmp(s, role_suffix[r]))
            return r;
    return -1;
}

static int is_int(refit_dtype d)
{
    return (d.code == REFIT_DTYPE_INT || d.code == REFIT_DTYPE_UINT) && d.lanes == 1;
}

/* -1 when the param is absent; 0 per-tensor, 1 per-channel. */
static int scheme_param(const refit_host_v2 *h, const refit_fmt_module *m, int *out)
{
    const char *v = h->param(h->host, m, "scheme");
    *out = !v ? -1 : !strcmp(v, "per_tensor") ? 0 : !strcmp(v, "per_channel") ? 1 : -2;
    if (*out == -2)
        return ERR(h, REFIT_EINVAL, "module %s: param scheme is '%s'; format int8 takes "
                   "per_tensor or per_channel", m->name, v);
    return REFIT_OK;
}

/* Weight w's scale: per-tensor (0) or per-channel (1), or an error. */
static int scale_kind(const refit_host_v2 *h, const refit_fmt_module *m,
                      const refit_fmt_ckpt *w, const refit_fmt_ckpt *sc, int *kind)
{
    int64_t n = w->shape[0];
    if (!kern_is_float_dtype(sc->dtype))
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: scales are f32/bf16/f16, not %s",
                   m->name, sc->name, dt_name(sc->dtype));
    if (sc->ndim <= 2 && numel(sc->ndim, sc->shape) == 1)
        *kind = 0;
    else if ((sc->ndim == 1 && sc->shape[0] == n) ||
             (sc->ndim == 2 && sc->shape[0] == n && sc->shape[1] == 1))
        *kind = 1;
    else
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: weight_scale is [%lld, 1] / "
                   "[%lld] (per-channel) or one element (per-tensor) for weight %s", m->name,
                   sc->name, (long long)n, (long long)n, w->name);
    return REFIT_OK;
}

/* Every weight has exactly one scale of one scheme; returns it in *kind. */
static int check_weights(const refit_host_v2 *h, const refit_fmt_module *m, int *kind)
{
    int n_w = 0;
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *w = refit_ckpt(m, i);
        if (role_of(w->name) != R_WEIGHT)
            continue;
        if (!(w->dtype.code == REFIT_DTYPE_INT && w->dtype.bits == 8) || w->ndim != 2)
            return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: an int8 weight is i8 [N, K] "
                       "(it is %s, %d-D)", m->name, w->name, dt_name(w->dtype), w->ndim);
        int si = -1, k = -1;
        for (uint32_t j = 0; j < m->n_ckpt; j++)
            if (role_of(refit_ckpt(m, j)->name) == R_SCALE && same_prefix(refit_ckpt(m, j)->name, w->name))
                si = (int)j;
        if (si < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: an int8 weight needs its "
                       "%.*s.weight_scale", m->name, w->name, (int)prefix_len(w->name), w->name);
        int rc = scale_kind(h, m, w, refit_ckpt(m, si), &k);
        if (rc)
            return rc;
        if (n_w++ && k != *kind)
            return ERR(h, REFIT_EMISMATCH, "module %s: weight %s's scale is %s, another's is "
                       "not; one scheme per module", m->name, w->name,
                       k ? "per-channel" : "per-tensor");
        *kind = k;
    }
    if (n_w == 0)
        return ERR(h, REFIT_EFORMAT, "module %s: format int8 needs a W.weight", m->name);
    return REFIT_OK;
}

/* A DIRECT route for c, its runtime target's dtype checked. */
static int route(const refit_host_v2 *h, const refit_fmt_module *m, refit_fmt_ckpt *c, int r)
{
    refit_dtype rt = refit_runtime(m, c->target_index)->view.dtype;
    int same = rt.code == c->dtype.code && rt.bits == c->dtype.bits;
    int ok = r == R_WEIGHT || r == R_INPUT_ZP ? same
                                              : kern_is_float_dtype(rt) &&
                                                    kern_is_float_dtype(c->dtype);
    if (r == R_INPUT_ZP && !is_int(c->dtype))
        ok = 0;
    if (!ok)
        return ERR(h, REFIT_EMISMATCH, "module %s, tensor %s: checkpoint %s, runtime %s is %s; "
                   "format int8 copies %s", m->name, c->name, dt_name(c->dtype), c->target,
                   dt_name(rt), r == R_WEIGHT || r == R_INPUT_ZP ? "it as is" : "float scales");
    if (!same)
        c->flags |= REFIT_CKPT_CAST; /* bf16/f16 -> f32 scales: exact */
    c->route = REFIT_ROUTE_DIRECT;
    return REFIT_OK;
}

/* Every tensor has a known role and belongs to a weight of the module. */
static int check_roles(const refit_host_v2 *h, const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        int r = role_of(c->name), has_weight = 0;
        if (r < 0)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: format int8 takes W.weight, "
                       "W.weight_scale, W.input_scale and W.input_zero_point", m->name,
                       c->name);
        for (uint32_t j = 0; j < m->n_ckpt && r != R_WEIGHT; j++)
            has_weight |= role_of(refit_ckpt(m, j)->name) == R_WEIGHT &&
                          same_prefix(refit_ckpt(m, j)->name, c->name);
        if (r != R_WEIGHT && !has_weight)
            return ERR(h, REFIT_EFORMAT, "module %s, tensor %s: no %.*s.weight in the module",
                       m->name, c->name, (int)prefix_len(c->name), c->name);
    }
    return REFIT_OK;
}

static int int8_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    int want, kind = 1;
    int rc = scheme_param(h, m, &want);
    if (!rc)
        rc = check_roles(h, m);
    if (!rc)
        rc = check_weights(h, m, &kind);
    for (uint32_t i = 0; i < m->n_ckpt && !rc; i++)
        rc = route(h, m, refit_ckpt(m, i), role_of(refit_ckpt(m, i)->name));
    if (!rc && want >= 0 && want != kind)
        rc = ERR(h, REFIT_EMISMATCH, "module %s: param scheme is %s but the checkpoint's scales "
                 "are %s", m->name, want ? "per_channel" : "per_tensor",
                 kind ? "per-channel" : "per-tensor");
    m->flags = REFIT_MODULE_WHOLE;
    return rc;
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "int8",
    .plan = int8_plan,
    .post_load = NULL,
    .release = NULL,
};
