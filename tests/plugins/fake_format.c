/* Test plugins, one source built into many shared modules (see
 * tests/plugins/meson.build), each with one thing wrong, or none:
 *
 *   FAKE_NAME         format name (the file is refit-fmt-FAKE_NAME.so)
 *   FAKE_STRUCT_NAME  name in the struct, when it should differ from the file
 *   FAKE_VERSION      abi_version (default REFIT_FORMAT_ABI_VERSION)
 *   FAKE_SIZE         struct_size (default sizeof(refit_format_v2))
 *   FAKE_SYMBOL       name of the exported symbol (default the right one)
 *   FAKE_PLAN         FAKE_DIRECT, FAKE_STAGED (identity through staging,
 *                     WHOLE + POST_LOAD), FAKE_STAGED_NOFLAG (staged, no
 *                     post-load step), FAKE_STAGED_NOWHOLE (post-load, not
 *                     WHOLE)
 *   FAKE_NO_POST_LOAD no post_load function even if the plan stages
 *   FAKE_CORE_SYMBOL  calls refit_dtype_name, a core symbol a plugin must
 *                     not link
 *   FAKE_SHORT        exports 8 bytes that claim to be a whole struct
 *   FAKE_CONSTRUCTOR  a constructor sets $REFIT_TEST_CONSTRUCTOR_RAN to
 *                     FAKE_NAME: proof that dlopen mapped this file
 *
 * The STAGED identity copies each staged tensor to where a plain copy
 * would land (ckpt.place) with the host's copy service, after zeroing the
 * runtime tensor with the host's zero service: it exercises the services
 * appended to ABI 1 end to end. */
#include <refit/format.h>
#ifdef FAKE_CONSTRUCTOR
#include <stdlib.h>

__attribute__((constructor)) static void fake_constructor(void)
{
    setenv("REFIT_TEST_CONSTRUCTOR_RAN", FAKE_NAME, 1);
}
#endif

#define FAKE_DIRECT 0
#define FAKE_STAGED 1
#define FAKE_STAGED_NOFLAG 2
#define FAKE_STAGED_NOWHOLE 3

#ifndef FAKE_NAME
#error "FAKE_NAME is required"
#endif
#ifndef FAKE_STRUCT_NAME
#define FAKE_STRUCT_NAME FAKE_NAME
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION REFIT_FORMAT_ABI_VERSION
#endif
#ifndef FAKE_SIZE
#define FAKE_SIZE sizeof(refit_format_v2)
#endif
#ifndef FAKE_SYMBOL
#define FAKE_SYMBOL refit_format_plugin_v2
#endif
#ifndef FAKE_PLAN
#define FAKE_PLAN FAKE_DIRECT
#endif

/* unused in the FAKE_SHORT build, which exports no struct */
__attribute__((unused)) static int fake_plan(const refit_host_v2 *host, refit_fmt_module *m)
{
#ifdef FAKE_CORE_SYMBOL
    host->log(host->host, 3, "%s", refit_dtype_name(refit_ckpt(m, 0)->dtype));
#endif
    if (!REFIT_HOST_HAS(host, dtype_name))
        return host->error(host->host, REFIT_EUNSUPPORTED, "host services too old");
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        refit_dtype rt = refit_runtime(m, c->target_index)->view.dtype;
        if (c->dtype.code != rt.code || c->dtype.bits != rt.bits)
            return host->error(host->host, REFIT_EMISMATCH, "module %s, tensor %s: %s into %s",
                               m->name, c->name, host->dtype_name(host->host, c->dtype),
                               host->dtype_name(host->host, rt));
        c->route = FAKE_PLAN == FAKE_DIRECT ? REFIT_ROUTE_DIRECT : REFIT_ROUTE_STAGED;
        if (FAKE_PLAN == FAKE_STAGED_NOFLAG && i == 0)
            c->route = REFIT_ROUTE_DIRECT; /* covers the target, so only the
                                              declaration check can object */
    }
    m->flags = FAKE_PLAN == FAKE_STAGED          ? REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD
             : FAKE_PLAN == FAKE_STAGED_NOWHOLE ? REFIT_MODULE_POST_LOAD
                                                : 0;
    return REFIT_OK;
}

#if FAKE_PLAN != FAKE_DIRECT && !defined(FAKE_NO_POST_LOAD)
__attribute__((unused)) static int fake_post_load(const refit_host_v2 *host,
                                                 const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_runtime; i++) {
        refit_device_info info = {.struct_size = sizeof info};
        int rc = host->device_info(host->host, refit_runtime(m, i)->view.device, &info);
        if (rc || !info.served)
            return host->error(host->host, REFIT_EUNSUPPORTED, "module %s: device not served",
                               m->name);
        rc = host->zero(host->host, &refit_runtime(m, i)->view, stream);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int rc = host->copy(host->host, &refit_ckpt(m, i)->place, &refit_ckpt(m, i)->staged, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}
#define FAKE_POST_LOAD fake_post_load
#else
#define FAKE_POST_LOAD NULL
#endif

#ifdef FAKE_SHORT
REFIT_PLUGIN_EXPORT const struct {
    uint32_t abi_version, struct_size;
} refit_format_plugin_v2 = {REFIT_FORMAT_ABI_VERSION, sizeof(refit_format_v2)};
#else
REFIT_PLUGIN_EXPORT const refit_format_v2 FAKE_SYMBOL = {
    .abi_version = FAKE_VERSION,
    .struct_size = FAKE_SIZE,
    .name = FAKE_STRUCT_NAME,
    .plan = fake_plan,
    .post_load = FAKE_POST_LOAD,
    .release = NULL,
};
#endif
