/* FP8's kernels called directly, for the GPU suites and refit-bench
 * (plugins/fp8/fp8_direct.c; test-only, no plugin links it): the plugin's
 * launcher and embedded device code over the CUDA runtime. Every view
 * device-readable; work on the current device, ordered on stream (a
 * cudaStream_t; NULL the legacy default stream). Failures return a refit
 * status and kern_cuda_last_error() says what failed. */
#ifndef REFIT_PLUGINS_FP8_DIRECT_H
#define REFIT_PLUGINS_FP8_DIRECT_H

#include <stdint.h>

#include <refit/format.h>

#ifdef __cplusplus
extern "C" {
#endif
/* fp8_launch (fp8_launch.h) on the pieces, then one wait for stream (to
 * report non-finite input). Returns REFIT_OK; REFIT_ECORRUPT with *bad the
 * lowest piece holding a NaN or infinity (outputs partly written; that
 * piece's group keeps its old scale and bytes); REFIT_EUNSUPPORTED /
 * EMISMATCH (dtypes, ranks; *bad the piece); REFIT_EINVAL, ENOMEM,
 * EINTERNAL. */
int kern_quant_fp8_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                        const refit_view *x, int scheme, int hw, int32_t *bad, void *stream);
/* (hw: fp8_launch's flags, QF_HW | QF_RECIP of fp8_gpu.h; 1 is QF_HW.) */
/* Benchmarks: record events around the launches of each call from now on
 * (on: 1), and the last timed call's launches in milliseconds (-1: none). */
void kern_quant_fp8_cuda_timing(int on);
double kern_quant_fp8_cuda_kernel_ms(void);
/* The hardware conversion against kern_f32_to_e4m3_sat on every finite f32
 * (and the byte order of its pairs), on the current device: *mismatches
 * differing inputs, *first the smallest (magnitude bits) or 0xffffffff.
 * Takes a few milliseconds; waits for stream. */
int kern_fp8_cvt_check_cuda(uint64_t *mismatches, uint32_t *first, void *stream);
/* How the plugins encode E4M3 on CUDA device dev (fp8.c and mxfp8.c decide
 * the same way): 1 with the hardware conversion, 0 with the integer
 * encoder (REFIT_CUDA_FP8_CVT=0, or the check found a difference), -1
 * when the check failed to run. Checked once per device (a few ms);
 * *mismatches (may be NULL) the differing inputs found. */
int kern_fp8_encoder(int dev, uint64_t *mismatches, void *stream);
#ifdef __cplusplus
}
#endif
#endif
