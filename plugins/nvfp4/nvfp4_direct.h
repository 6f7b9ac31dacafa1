/* NVFP4's kernels called directly, for the GPU suites and refit-bench
 * (plugins/nvfp4/nvfp4_direct.c; test-only, no plugin links it). Every
 * view device-readable; work on the current device, ordered on stream (a
 * cudaStream_t). Checkpoint pieces go in one launch per QN_BATCH pieces
 * and are never waited for; online pieces in sets, one amax and one
 * encode launch per set, then the call waits for stream once (to report
 * non-finite input). Returns REFIT_OK; REFIT_ECORRUPT with *bad the
 * lowest online piece holding a NaN or infinity (that piece's outputs
 * unwritten, others' written); REFIT_EUNSUPPORTED / EMISMATCH / EINVAL
 * (views; *bad the piece), ENOMEM, EINTERNAL; kern_cuda_last_error()
 * says what failed. */
#ifndef REFIT_PLUGINS_NVFP4_DIRECT_H
#define REFIT_PLUGINS_NVFP4_DIRECT_H

#include "plugins/nvfp4/nvfp4_piece.h"

#ifdef __cplusplus
extern "C" {
#endif
int kern_quant_nvfp4_cuda(uint32_t n, const refit_nvfp4_piece *pieces, int32_t *bad,
                          void *stream);
/* Input bytes of an online set (<= 0: the launcher's default, 96 MB), for
 * benchmarks; not thread-safe. */
void kern_quant_nvfp4_set_bytes(int64_t bytes);
#ifdef __cplusplus
}
#endif
#endif
