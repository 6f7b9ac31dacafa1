/* OCP MX's kernels called directly, for the GPU suites and refit-bench
 * (plugins/mxfp8/mx_direct.c; test-only, no plugin links it): the
 * launcher (mx_launch.h) and MXFP8's embedded device code over the CUDA
 * runtime, on the current device, ordered on stream, then one wait for
 * stream (to report non-finite input). Returns REFIT_OK; REFIT_ECORRUPT
 * with *bad the lowest piece holding a NaN or infinity (its blocks
 * holding one unwritten, the rest written); REFIT_EUNSUPPORTED / EMISMATCH
 * (views; *bad the piece), REFIT_EINVAL, ENOMEM, EINTERNAL;
 * kern_cuda_last_error() says what failed. */
#ifndef REFIT_PLUGINS_MX_DIRECT_H
#define REFIT_PLUGINS_MX_DIRECT_H

#include <stdint.h>

#include <refit/format.h>

#ifdef __cplusplus
extern "C" {
#endif
int kern_quant_mx_cuda(uint32_t n, const refit_view *q, const refit_view *scales,
                       const refit_view *x, int elem_bits, int hw, int32_t *bad, void *stream);
#ifdef __cplusplus
}
#endif
#endif
