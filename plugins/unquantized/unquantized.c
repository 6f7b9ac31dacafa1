/* Format "unquantized": F32/F16/BF16 checkpoint tensors copied straight
 * into runtime tensors of the same layout. A dtype change (e.g. a BF16
 * checkpoint into an F32 runtime) is allowed only when the module says
 * "cast: true"; the copy then rounds to nearest even. No post-load step:
 * every route is DIRECT, so the module never needs to arrive whole.
 *
 * Built as the plugin refit-fmt-unquantized.so; its declaration is
 * unquantized.yaml beside it. It exports one symbol and links nothing of
 * the core: the dtype name in messages comes from a local table. */
#include <refit/format.h>

static int is_float(refit_dtype d)
{
    return d.lanes == 1 && ((d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16));
}

static int same(refit_dtype a, refit_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static const char *dtype_name(refit_dtype d)
{
    if (d.code == REFIT_DTYPE_BFLOAT && d.bits == 16)
        return "bf16";
    if (d.code == REFIT_DTYPE_FLOAT)
        return d.bits == 32 ? "f32" : d.bits == 16 ? "f16" : d.bits == 64 ? "f64" : "float";
    if (d.code == REFIT_DTYPE_INT)
        return "int";
    if (d.code == REFIT_DTYPE_UINT)
        return "uint";
    return "a non-float dtype";
}

static int unq_plan(const refit_host_v2 *host, refit_fmt_module *m)
{
    const char *cast = host->param(host->host, m, "cast");
    /* the values params take as true: true/yes/on/1, any case */
    int allow_cast = cast && (cast[0] == 't' || cast[0] == 'T' || cast[0] == 'y' ||
                              cast[0] == 'Y' || cast[0] == '1' ||
                              ((cast[0] == 'o' || cast[0] == 'O') &&
                               (cast[1] == 'n' || cast[1] == 'N')));
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        refit_dtype rt = refit_runtime(m, c->target_index)->view.dtype;
        if (!is_float(c->dtype))
            return host->error(host->host, REFIT_EFORMAT,
                               "module %s, tensor %s: format unquantized takes f32/f16/bf16, "
                               "not %s", m->name, c->name, dtype_name(c->dtype));
        if (!same(c->dtype, rt)) {
            if (!allow_cast || !is_float(rt))
                return host->error(host->host, REFIT_EMISMATCH,
                                   "module %s, tensor %s: checkpoint %s, runtime %s is %s; "
                                   "set 'cast: true' on the module to allow the cast",
                                   m->name, c->name, dtype_name(c->dtype), c->target,
                                   dtype_name(rt));
            c->flags |= REFIT_CKPT_CAST;
        }
        c->route = REFIT_ROUTE_DIRECT;
    }
    m->flags = 0;
    return REFIT_OK;
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "unquantized",
    .plan = unq_plan,
    .post_load = NULL,
    .release = NULL,
};
