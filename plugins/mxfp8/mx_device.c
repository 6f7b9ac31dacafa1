/* mx_device.h: MX's launcher through the host's GPU service. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <refit/sdk/group.h>
#include <refit/sdk/pgpu_host.h>
#include "plugins/mxfp8/mx_device.h"
#include "plugins/mxfp8/mx_launch.h"
#ifdef REFIT_FP8_DEVICE_CODE
#include "plugins/fp8/fp8_cvt_host.h"
#endif

#ifdef REFIT_MX_DEVICE_CODE
extern const unsigned char mx_image[];
extern const size_t mx_image_size;
#endif

#ifdef REFIT_MX_DEVICE_CODE
static const char nan_what[] = "NaN or infinity in the weight; refusing to quantize it";
#endif

int mx_device_code(void)
{
#ifdef REFIT_MX_DEVICE_CODE
    return 1;
#else
    return 0;
#endif
}

int mx_device_quant(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                    const refit_view *q, const refit_view *sc, const refit_view *x,
                    const char *const *names, int elem_bits, void *stream)
{
    refit_device dev = q[0].device;
#ifdef REFIT_MX_DEVICE_CODE
    int one = 1;
    for (uint32_t i = 1; i < n; i++)
        one = one && mods[i] == mods[0];
    int hw = 0;
#ifdef REFIT_FP8_DEVICE_CODE
    if (elem_bits == 8)
        hw = fp8_cvt_host(h, mods[0], dev, stream, n, names, nan_what);
#endif
    refit_pgpu_host g;
    int rc = one ? refit_pgpu_host_init(&g, h, mods[0], dev, stream, mx_image, mx_image_size, n,
                                        names, nan_what)
                 : refit_pgpu_host_init_many(&g, h, dev, stream, mx_image, mx_image_size, n,
                                             mods, names, nan_what);
    int32_t bad = -1;
    if (!rc && (rc = mx_launch(&g.g, n, q, sc, x, elem_bits, hw, &bad)) && g.g.msg[0])
        return h->error(h->host, rc, "module %s%s%s: %s", mods[bad >= 0 ? bad : 0]->name,
                        bad >= 0 ? ", tensor " : "", bad >= 0 ? names[bad] : "", g.g.msg);
    return rc;
#else
    (void)n, (void)sc, (void)x, (void)names, (void)elem_bits, (void)stream;
    return h->error(h->host, REFIT_EUNSUPPORTED, "module %s: MX was built without its device "
                    "code (no nvcc), so it cannot run on device type %d", mods[0]->name,
                    dev.device_type);
#endif
}

const char *mx_call_name(mx_call *c, const char *fmt, const char *name, long long arg)
{
    size_t left = c->text_cap - c->text_used;
    int len = snprintf(c->text + c->text_used, left, fmt, name, arg);
    if (len < 0 || (size_t)len >= left)
        return NULL;
    const char *at = c->text + c->text_used;
    c->text_used += (size_t)len + 1;
    return at;
}

static int call_alloc(const refit_host_v2 *h, mx_call *c, uint32_t cap, size_t text)
{
    size_t n = cap ? cap : 1, per = sizeof *c->q * 3 + sizeof(char *) + sizeof(void *);
    memset(c, 0, sizeof *c);
    if (n > (SIZE_MAX - text) / per)
        return REFIT_ENOMEM;
    c->q = h->mem_alloc(h->host, per * n + text);
    if (!c->q)
        return REFIT_ENOMEM;
    c->cap = (uint32_t)n;
    c->sc = c->q + n;
    c->x = c->q + 2 * n;
    c->names = (const char **)(void *)(c->q + 3 * n);
    c->mods = (const refit_fmt_module **)(void *)(c->names + n);
    c->text = (char *)(c->mods + n);
    c->text_cap = text;
    return REFIT_OK;
}

static int same_device(refit_device a, refit_device b)
{
    return a.device_type == b.device_type && a.device_id == b.device_id;
}

/* The device modules of mods[lead .. n) on mods[lead]'s device in one
 * launcher call; done[] marks them. */
static int device_group(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                        uint32_t lead, unsigned char *done, void *stream, void *arg)
{
    const mx_ops *ops = arg;
    refit_device dev, d;
    ops->where(mods[lead], &dev);
    uint64_t cap = 0;
    size_t text = 0;
    for (uint32_t k = lead; k < n; k++)
        if (!done[k] && ops->where(mods[k], &d) == 1 && same_device(d, dev)) {
            size_t t = 0;
            done[k] = 2; /* this group's */
            cap += ops->count(mods[k], &t);
            text += t;
        }
    mx_call c;
    int rc = cap > 0x7fffffffu ? REFIT_ENOMEM : call_alloc(h, &c, (uint32_t)cap, text);
    if (rc)
        return h->error(h->host, rc, "module %s: out of memory for %llu pieces",
                        mods[lead]->name, (unsigned long long)cap);
    for (uint32_t k = lead; k < n && !rc; k++)
        if (done[k] == 2) {
            done[k] = 1;
            rc = ops->add(h, mods[k], &c);
        }
    if (!rc && c.n)
        rc = mx_device_quant(h, c.mods, c.n, c.q, c.sc, c.x, c.names, ops->elem_bits, stream);
    h->mem_free(h->host, c.q);
    return rc;
}

/* ops->where's 1, 0 and -1 are REFIT_SDK_GROUP_LEAD, _ONE and _SKIP. */
static int mx_where(const refit_fmt_module *m, void *arg)
{
    refit_device dev;
    return ((const mx_ops *)arg)->where(m, &dev);
}

static int mx_one(const refit_host_v2 *h, const refit_fmt_module *m, void *stream, void *arg)
{
    (void)stream;
    return ((const mx_ops *)arg)->host(h, m);
}

static const refit_sdk_group_ops mx_groups = {mx_where, device_group, mx_one};

int mx_post_load_many(const refit_host_v2 *h, const refit_fmt_module *const *mods, uint32_t n,
                      void *stream, const mx_ops *ops)
{
    return refit_sdk_post_load_groups(h, mods, n, stream, &mx_groups, (void *)ops);
}
