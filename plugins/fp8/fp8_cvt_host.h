/* Whether a plugin encodes E4M3 with the hardware conversion on a CUDA
 * device (plugins/fp8/fp8_cvt_host.c; fp8 and mxfp8 link it with FP8's
 * device image): once per device and process, the conversion check of
 * quant_fp8.cu runs through the host's GPU service (scratch, one launch,
 * one fetch: the one wait, a few milliseconds), and the hardware is used
 * only where it equals the integer encoder on every finite f32.
 * REFIT_CUDA_FP8_CVT=0 keeps the encoder. */
#ifndef REFIT_PLUGINS_FP8_CVT_HOST_H
#define REFIT_PLUGINS_FP8_CVT_HOST_H

#include <refit/format.h>

/* 1 hardware, 0 the integer encoder (also when the check cannot run: it
 * is not retried, and the encoder gives the same bytes). m, names, what:
 * the module's status word, as refit_pgpu_host_init takes them. */
int fp8_cvt_host(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev,
                 void *stream, uint32_t n, const char *const *names, const char *what);

#endif
