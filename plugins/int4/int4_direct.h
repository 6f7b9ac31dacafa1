/* INT4's kernels called directly, for the GPU suites and refit-bench
 * (plugins/int4/int4_direct.c; test-only, no plugin links it): the
 * plugin's launcher (int4_launch.h) and embedded device code over the
 * CUDA runtime, on the current device, ordered on stream, then one wait
 * for stream (to report non-finite input). Returns REFIT_OK;
 * REFIT_ECORRUPT with *bad the lowest piece holding a NaN or infinity or
 * a scale past the scale dtype's range (that group unwritten, the rest
 * written); REFIT_EUNSUPPORTED / EMISMATCH (views; *bad the piece),
 * REFIT_EINVAL (group < 0), ENOMEM, EINTERNAL; kern_cuda_last_error()
 * says what failed. */
#ifndef REFIT_PLUGINS_INT4_DIRECT_H
#define REFIT_PLUGINS_INT4_DIRECT_H

#include <stdint.h>

#include <refit/format.h>

#ifdef __cplusplus
extern "C" {
#endif
int kern_quant_int4_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                         const refit_view *x, int64_t group, int32_t *bad, void *stream);
#ifdef __cplusplus
}
#endif
#endif
