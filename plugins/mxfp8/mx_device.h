/* MX post-load on a CUDA device (plugins/mxfp8/mx_device.c, linked into
 * mxfp8 and mxfp4 with MX's device image): mx_launch (mx_launch.h) of n
 * pieces through the host's GPU service, the module's status word naming
 * names[i] at finalize; MXFP8 encodes E4M3 by the hardware conversion
 * where fp8_cvt_host found it exact. Never waits (but for that
 * once-per-device check). Returns REFIT_OK or the failure, its message
 * set through host->error naming the module. */
#ifndef REFIT_PLUGINS_MX_DEVICE_H
#define REFIT_PLUGINS_MX_DEVICE_H

#include <refit/format.h>

/* 1 when this plugin carries MX's device code. */
int mx_device_code(void);

int mx_device_quant(const refit_host_v2 *h, const refit_fmt_module *m, uint32_t n,
                    const refit_view *q, const refit_view *sc, const refit_view *x,
                    const char *const *names, int elem_bits, void *stream);

#endif
