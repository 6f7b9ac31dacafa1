/* The direct entries of fp8_direct.h: the plugin's launcher and embedded
 * device code over the CUDA runtime (sdk/pgpu_cudart.h).
 * Test-only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "sdk/pgpu_cudart.h"
#include "plugins/fp8/fp8_direct.h"
#include "plugins/fp8/fp8_launch.h"

extern const unsigned char fp8_image[];

/* timing: events per device, recorded before the first launch of a call
 * and after its last (calls are serialized by pgpu_cudart's lock) */
#define FD_DEVICES 64
static int fd_timing;
static double fd_last_ms = -1.0;
static cudaEvent_t fd_ev[FD_DEVICES][2];
static int fd_have_ev[FD_DEVICES];
static int (*fd_launch_cudart)(refit_pgpu *, void *, uint32_t, uint32_t, void **);
static int fd_started;

static int fd_launch_timed(refit_pgpu *g, void *k, uint32_t grid, uint32_t block, void **args)
{
    pgpu_cudart *p = (pgpu_cudart *)(void *)g;
    if (!fd_started) {
        cudaEventRecord(fd_ev[p->dev][0], (cudaStream_t)p->stream);
        fd_started = 1;
    }
    return fd_launch_cudart(g, k, grid, block, args);
}

void kern_quant_fp8_cuda_timing(int on)
{
    fd_timing = on != 0;
    fd_last_ms = -1.0;
}

double kern_quant_fp8_cuda_kernel_ms(void)
{
    return fd_last_ms;
}

int kern_quant_fp8_cuda(uint32_t n, const refit_view *q, const refit_view *scale,
                        const refit_view *x, int scheme, int hw, int32_t *bad, void *stream)
{
    static const char fn[] = "kern_quant_fp8_cuda";
    *bad = -1;
    if (scheme < 0 || scheme > 2 || n > 0x7fffffffu) {
        kern_cuda_set_error("kern_quant_fp8_cuda: scheme must be 0, 1 or 2, pieces < 2^31");
        return REFIT_EINVAL;
    }
    if (n == 0)
        return REFIT_OK;
    pgpu_cudart p;
    int rc = pgpu_cudart_begin(&p, fn, fp8_image, stream);
    if (rc)
        return rc;
    int timed = fd_timing && p.dev >= 0 && p.dev < FD_DEVICES;
    if (timed && !fd_have_ev[p.dev]) {
        if (cudaEventCreate(&fd_ev[p.dev][0]) == cudaSuccess &&
            cudaEventCreate(&fd_ev[p.dev][1]) == cudaSuccess)
            fd_have_ev[p.dev] = 1;
        else
            timed = 0;
    }
    if (timed) {
        fd_launch_cudart = p.g.launch;
        p.g.launch = fd_launch_timed;
        fd_started = 0;
    }
    rc = fp8_launch(&p.g, n, q, scale, x, scheme, hw, bad);
    int started = timed && fd_started;
    if (started)
        cudaEventRecord(fd_ev[p.dev][1], (cudaStream_t)stream);
    uint32_t word;
    rc = pgpu_cudart_end(&p, fn, rc, 1, &word);
    if (!rc && timed) {
        float ms = -1.0f;
        if (!started || cudaEventElapsedTime(&ms, fd_ev[p.dev][0], fd_ev[p.dev][1]) !=
                            cudaSuccess)
            ms = -1.0f;
        fd_last_ms = ms;
    }
    if (!rc && word != REFIT_STATUS_NONE) {
        *bad = (int32_t)word;
        char m[128];
        snprintf(m, sizeof m, "%s: piece %u: NaN or infinity in the weight", fn, word);
        kern_cuda_set_error(m);
        rc = REFIT_ECORRUPT;
    }
    return rc;
}

int kern_fp8_cvt_check_cuda(uint64_t *mismatches, uint32_t *first, void *stream)
{
    static const char fn[] = "kern_fp8_cvt_check_cuda";
    pgpu_cudart p;
    int rc = pgpu_cudart_begin(&p, fn, fp8_image, stream);
    if (rc)
        return rc;
    qf_cvt_result h = {0, 0xffffffffu, 0};
    qf_cvt_result *d = p.g.scratch(&p.g, sizeof h);
    rc = d ? p.g.upload(&p.g, d, &h, sizeof h) : REFIT_ENOMEM;
    if (!rc)
        rc = fp8_cvt_launch(&p.g, d);
    if (!rc && cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, (cudaStream_t)stream))
        rc = refit_pgpu_fail(&p.g, REFIT_EINTERNAL, "copying the check's result back");
    uint32_t word;
    rc = pgpu_cudart_end(&p, fn, rc, 1, &word);
    if (rc)
        return rc;
    *mismatches = h.count;
    *first = h.first;
    return REFIT_OK;
}

static signed char fd_cvt[FD_DEVICES];    /* 0 unchecked, 1 hardware, 2 encoder, 3 failed */
static uint64_t fd_cvt_bad[FD_DEVICES];

int kern_fp8_encoder(int dev, uint64_t *mismatches, void *stream)
{
    if (dev < 0 || dev >= FD_DEVICES) {
        kern_cuda_set_error("kern_fp8_encoder: no such device");
        return -1;
    }
    if (fd_cvt[dev] == 0) {
        const char *env = getenv("REFIT_CUDA_FP8_CVT");
        uint64_t bad = 0;
        uint32_t first = 0;
        int cur = 0;
        if (env && !strcmp(env, "0"))
            fd_cvt[dev] = 2;
        else if (cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess)
            fd_cvt[dev] = 3;
        else {
            fd_cvt[dev] = kern_fp8_cvt_check_cuda(&bad, &first, stream) ? 3 : bad ? 2 : 1;
            cudaSetDevice(cur);
        }
        fd_cvt_bad[dev] = bad;
    }
    if (mismatches)
        *mismatches = fd_cvt_bad[dev];
    return fd_cvt[dev] == 3 ? -1 : fd_cvt[dev] == 1;
}
