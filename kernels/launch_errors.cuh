/* How the launchers of kernels/*.cu report: a CUDA error or a refused piece
 * becomes refit's status and a message naming the entry point (through
 * kern_cuda_set_error), and the float element kinds the quantizers take.
 * One copy here instead of one per kernel file. */
#ifndef REFIT_KERNELS_LAUNCH_ERRORS_CUH
#define REFIT_KERNELS_LAUNCH_ERRORS_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <refit/format.h>

extern "C" void kern_cuda_set_error(const char *msg);

/* fn: the entry point the message names ("kern_quant_fp8_cuda"); what: the
 * step that failed. REFIT_ENOMEM for an allocation, else REFIT_EINTERNAL. */
static inline int kc_cuda_fail(const char *fn, cudaError_t e, const char *what)
{
    char m[256];
    snprintf(m, sizeof m, "%s: %s: %s (%s)", fn, what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    kern_cuda_set_error(m);
    return e == cudaErrorMemoryAllocation ? REFIT_ENOMEM : REFIT_EINTERNAL;
}

/* Piece i of a call is refused with rc, for the reason what. */
static inline int kc_refuse(const char *fn, int rc, const char *what, uint32_t i)
{
    char m[256];
    snprintf(m, sizeof m, "%s: piece %u: %s", fn, i, what);
    kern_cuda_set_error(m);
    return rc;
}

/* 0 F32, 1 F16, 2 BF16; -1 any other element type (or several lanes). */
static inline int kc_float_kind(refit_dtype d)
{
    if (d.lanes != 1)
        return -1;
    if (d.code == REFIT_DTYPE_FLOAT && (d.bits == 32 || d.bits == 16))
        return d.bits == 32 ? 0 : 1;
    return d.code == REFIT_DTYPE_BFLOAT && d.bits == 16 ? 2 : -1;
}

#endif
