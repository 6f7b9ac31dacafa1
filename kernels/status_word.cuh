/* A post-load kernel's per-device status word (plugins/mxfp8/quant_mx.cu,
 * quant_int4.cu): a device word the kernel lowers to the index of the
 * first bad piece, and its pinned host copy, both made by a device's first call and kept. The word
 * holds KC_STATUS_NONE between calls while `clean`; a call that read a
 * refusal, or could not read the word, leaves it unclean and the next call
 * sets it again in its stream before its launches. So a call costs its
 * launches, one 4-byte copy back and one stream wait. The caller
 * serializes calls (one call's word at a time). */
#ifndef REFIT_KERNELS_STATUS_WORD_CUH
#define REFIT_KERNELS_STATUS_WORD_CUH

#include <cuda_runtime.h>

#define KC_STATUS_NONE 0xffffffffu

struct kc_status {
    unsigned int *dev, *host;
    bool clean;
};

/* Make the word (first call) and set it to KC_STATUS_NONE on st when a
 * previous call left it unclean. On failure *what names the step. */
static inline cudaError_t kc_status_ready(kc_status *s, cudaStream_t st, const char **what)
{
    cudaError_t e;
    if (!s->host && (e = cudaMallocHost((void **)&s->host, sizeof *s->host)) != cudaSuccess) {
        s->host = NULL;
        *what = "the pinned status word";
        return e;
    }
    if (!s->dev) {
        if ((e = cudaMalloc((void **)&s->dev, sizeof *s->dev)) != cudaSuccess) {
            s->dev = NULL;
            *what = "the device status word";
            return e;
        }
        s->clean = false;
    }
    if (!s->clean) {
        if ((e = cudaMemsetAsync(s->dev, 0xff, sizeof *s->dev, st)) != cudaSuccess) {
            *what = "setting the status word";
            return e;
        }
        s->clean = true;
    }
    return cudaSuccess;
}

/* After the launches (launched: they were all issued): copy the word back
 * into *out and wait for st, even when the launches failed (the next call
 * rewrites the pinned word). *out is KC_STATUS_NONE unless a piece was
 * refused. Returns the first CUDA error of the copy or the work. */
static inline cudaError_t kc_status_read(kc_status *s, bool launched, unsigned int *out,
                                         cudaStream_t st)
{
    cudaError_t e = launched ? cudaMemcpyAsync(s->host, s->dev, sizeof *s->host,
                                               cudaMemcpyDeviceToHost, st)
                             : cudaSuccess;
    cudaError_t se = cudaStreamSynchronize(st);
    if (e == cudaSuccess)
        e = se;
    *out = launched && e == cudaSuccess ? *s->host : KC_STATUS_NONE;
    if (!launched || e != cudaSuccess || *out != KC_STATUS_NONE)
        s->clean = false;
    return e;
}

#endif
