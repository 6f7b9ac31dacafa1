/* mx_device.h: MX's launcher through the host's GPU service. */
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

int mx_device_quant(const refit_host_v2 *h, const refit_fmt_module *m, uint32_t n,
                    const refit_view *q, const refit_view *sc, const refit_view *x,
                    const char *const *names, int elem_bits, void *stream)
{
    refit_device dev = q[0].device;
#ifdef REFIT_MX_DEVICE_CODE
    int hw = 0;
#ifdef REFIT_FP8_DEVICE_CODE
    if (elem_bits == 8)
        hw = fp8_cvt_host(h, m, dev, stream, n, names, nan_what);
#endif
    refit_pgpu_host g;
    int rc = refit_pgpu_host_init(&g, h, m, dev, stream, mx_image, mx_image_size, n, names,
                                  nan_what);
    int32_t bad = -1;
    if (!rc && (rc = mx_launch(&g.g, n, q, sc, x, elem_bits, hw, &bad)) && g.g.msg[0])
        return h->error(h->host, rc, "module %s%s%s: %s", m->name, bad >= 0 ? ", tensor " : "",
                        bad >= 0 ? names[bad] : "", g.g.msg);
    return rc;
#else
    (void)n, (void)sc, (void)x, (void)names, (void)elem_bits, (void)stream;
    return h->error(h->host, REFIT_EUNSUPPORTED, "module %s: MX was built without its device "
                    "code (no nvcc), so it cannot run on device type %d", m->name,
                    dev.device_type);
#endif
}
