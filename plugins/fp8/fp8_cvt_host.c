/* fp8_cvt_host.h: the conversion check through the host's GPU service. */
#include <stdlib.h>
#include <string.h>

#include <refit/sdk/pgpu_host.h>
#include "plugins/fp8/fp8_cvt_host.h"
#include "plugins/fp8/fp8_launch.h"

#ifdef REFIT_FP8_DEVICE_CODE
extern const unsigned char fp8_image[];
extern const size_t fp8_image_size;

#define FC_DEVICES 64
static signed char fc_state[FC_DEVICES]; /* 0 unchecked, 1 hardware, 2 encoder */

static int fc_check(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev,
                    void *stream, uint32_t n, const char *const *names, const char *what)
{
    refit_pgpu_host p;
    int rc = refit_pgpu_host_init(&p, h, m, dev, stream, fp8_image, fp8_image_size, n, names,
                                  what);
    qf_cvt_result r = {0, 0xffffffffu, 0};
    qf_cvt_result *d = rc ? NULL : p.g.scratch(&p.g, sizeof r);
    if (!d)
        return 2;
    if (p.g.upload(&p.g, d, &r, sizeof r) || fp8_cvt_launch(&p.g, d))
        return 2;
    refit_view v = refit_pgpu_host_bytes_view(&p, d, sizeof r, dev);
    if (h->fetch(h->host, &r, sizeof r, &v, stream))
        return 2;
    if (r.count)
        h->log(h->host, 2, "fp8: CUDA device %d: the hardware E4M3 conversion differs from the "
               "encoder on %llu inputs (first 0x%08x); using the encoder", dev.device_id,
               r.count, r.first);
    return r.count ? 2 : 1;
}

#endif

int fp8_cvt_host(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev,
                 void *stream, uint32_t n, const char *const *names, const char *what)
{
#ifndef REFIT_FP8_DEVICE_CODE
    (void)h, (void)m, (void)dev, (void)stream, (void)n, (void)names, (void)what;
    return 0; /* no device code: no device to encode on */
#else
    if (dev.device_type != REFIT_DEVICE_CUDA || dev.device_id < 0 ||
        dev.device_id >= FC_DEVICES)
        return 0;
    int s = __atomic_load_n(&fc_state[dev.device_id], __ATOMIC_ACQUIRE);
    if (s == 0) {
        const char *env = getenv("REFIT_CUDA_FP8_CVT");
        s = env && !strcmp(env, "0") ? 2 : fc_check(h, m, dev, stream, n, names, what);
        __atomic_store_n(&fc_state[dev.device_id], (signed char)s, __ATOMIC_RELEASE);
    }
    return s == 1;
#endif
}
