/* refit-bench gpu, quant section: quant.mxfp8 and quant.mxfp4 (OCP MX
 * quantization of the bench model's linear weights on the device, the
 * kernel of the quant_mx host service; docs/cuda.md).
 *
 * For each format: one call for every weight (as the service runs it:
 * refit_sys_cuda_run + kern_quant_mx_cuda) and one call per weight, timed as
 * medians; ratio_to_d2d is the minimum bytes of a call (2 read per BF16
 * element, 1 or 1/2 written, one scale byte per 32) per second against
 * the d2d ceiling's bytes read plus written per second. Layer 0 is checked
 * against the CPU reference. With PyTorch (tools/bench_gpu.py, its own
 * process and spec): the same quantization in PyTorch ops, timed on the
 * same shapes, and its bytes compared with ours on layer 0 (written to
 * files in the bench directory, removed afterwards). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime_api.h>
#include <jansson.h>

#include <refit/refit.h>
#include <refit/sys/cuda.h>

#include "bench_gpu_peer.h"
#include "bench_gpu_reload.h"
#include "core/cuda/kern_cuda.h"
#include "plugins/fp8/fp8_direct.h"
#include "plugins/mxfp8/mx_direct.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"

int bench_gpu_mx(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                 const char *host_base, double copy_Bps, int repeat, const char *python,
                 const char *dir);

#define MXB_LAYER0 7 /* q, k, v, o, gate, up, down */

typedef struct mx_arena {
    int bits, nw, hw;
    const refit_view *x;
    refit_view *q, *s;
    char *qd, *sd;              /* device */
    size_t qbytes, sbytes;
    uint32_t at, count;         /* the pieces of the next call */
} mx_arena;

/* Output and scale views of every weight, in two device allocations. */
static int mxb_views(mx_arena *a)
{
    a->q = calloc((size_t)a->nw * 2, sizeof *a->q);
    if (!a->q)
        return 1;
    a->s = a->q + a->nw;
    size_t qo[512], so[512];
    a->qbytes = a->sbytes = 0;
    for (int w = 0; w < a->nw && w < 512; w++) {
        int64_t n = a->x[w].shape[0], k = a->x[w].shape[1];
        int64_t qk = a->bits == 4 ? (k + 1) / 2 : k;
        qo[w] = a->qbytes;
        so[w] = a->sbytes;
        a->qbytes += ((size_t)(n * qk) + 255) & ~(size_t)255;
        a->sbytes += ((size_t)(n * kern_mx_blocks(k)) + 255) & ~(size_t)255;
    }
    if (cudaMalloc((void **)&a->qd, a->qbytes) != cudaSuccess ||
        cudaMalloc((void **)&a->sd, a->sbytes) != cudaSuccess)
        return 1;
    for (int w = 0; w < a->nw; w++) {
        int64_t n = a->x[w].shape[0], k = a->x[w].shape[1];
        int64_t qk = a->bits == 4 ? (k + 1) / 2 : k, nb = kern_mx_blocks(k);
        a->q[w] = (refit_view){.data = a->qd + qo[w], .device = {REFIT_DEVICE_CUDA, 0},
                               .dtype = a->bits == 8 ? (refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1}
                                                     : REFIT_U8,
                               .ndim = 2, .shape = {n, qk}, .strides = {qk, 1}};
        a->s[w] = (refit_view){.data = a->sd + so[w], .device = {REFIT_DEVICE_CUDA, 0},
                               .dtype = REFIT_U8, .ndim = 2, .shape = {n, nb},
                               .strides = {nb, 1}};
    }
    return 0;
}

static int mxb_launch(void *arg, void *stream)
{
    mx_arena *a = arg;
    int32_t bad;
    return kern_quant_mx_cuda(a->count, a->q + a->at, a->s + a->at, a->x + a->at, a->bits,
                              a->hw, &bad, stream);
}

/* Median seconds of one call for every weight (all), or one per weight. */
static int mxb_time(mx_arena *a, int all, int repeat, double *out)
{
    bpeer_calls c = {mxb_launch, a, &a->at, &a->count};
    char what[32];
    snprintf(what, sizeof what, "quant mxfp%d", a->bits);
    return bpeer_time(&c, a->nw, all, repeat, what, out);
}

/* Our bytes of weight w (outputs then scales) into buf; returns the count. */
static size_t mxb_fetch(const mx_arena *a, int w, uint8_t *buf)
{
    size_t nq = (size_t)(a->q[w].shape[0] * a->q[w].shape[1]);
    size_t ns = (size_t)(a->s[w].shape[0] * a->s[w].shape[1]);
    if (cudaMemcpy(buf, a->q[w].data, nq, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(buf + nq, a->s[w].data, ns, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    return nq + ns;
}

/* Layer 0 against the CPU reference on the host copy of the sources. */
static int mxb_check(const mx_arena *a, const char *dev_base, const char *host_base)
{
    for (int w = 0; w < a->nw && w < MXB_LAYER0; w++) {
        size_t nq = (size_t)(a->q[w].shape[0] * a->q[w].shape[1]);
        size_t ns = (size_t)(a->s[w].shape[0] * a->s[w].shape[1]);
        uint8_t *ref = malloc(nq + ns), *got = malloc(nq + ns);
        refit_view x = a->x[w], q = a->q[w], s = a->s[w];
        x.data = (char *)host_base + ((const char *)a->x[w].data - dev_base);
        x.device.device_type = REFIT_DEVICE_CPU;
        q.data = ref;
        s.data = ref + nq;
        q.device.device_type = s.device.device_type = REFIT_DEVICE_CPU;
        int rc = !ref || !got ||
                 (a->bits == 8 ? kern_quant_mxfp8(&q, &s, &x) : kern_quant_mxfp4(&q, &s, &x)) ||
                 mxb_fetch(a, w, got) != nq + ns || memcmp(ref, got, nq + ns);
        free(ref);
        free(got);
        if (rc) {
            fprintf(stderr, "refit-bench gpu: quant mxfp%d: weight %d differs from the CPU "
                            "reference\n", a->bits, w);
            return 1;
        }
    }
    return 0;
}

/* Layer 0's sources (BF16) and our bytes, for PyTorch to compare. */
static int mxb_dump(const mx_arena *a, const char *dir, const char *host_base,
                    const char *dev_base, int first)
{
    char qfile[32];
    snprintf(qfile, sizeof qfile, "mx-layer0-mxfp%d.bin", a->bits);
    for (int w = 0; w < a->nw && w < MXB_LAYER0; w++) {
        size_t n = (size_t)(a->q[w].shape[0] * a->q[w].shape[1] + a->s[w].shape[0] *
                            a->s[w].shape[1]);
        uint8_t *buf = malloc(n);
        int rc = !buf || mxb_fetch(a, w, buf) != n ||
                 bpeer_dump(dir, w, qfile, buf, n, first ? "mx-layer0-x.bin" : NULL, &a->x[w],
                            host_base, dev_base);
        free(buf);
        if (rc)
            return 1;
    }
    return 0;
}

/* PyTorch's timing and byte check, merged into q8/q4. */
static void mxb_torch(json_t *q8, json_t *q4, const mx_arena *a, int repeat,
                      const char *python, const char *dir)
{
    json_t *o = bpeer_spec("mx", a->nw, a->x, MXB_LAYER0, repeat, dir);
    json_t *py = bpeer_torch(o, python, dir, "mx");
    bpeer_merge(q8, py, "mxfp8");
    bpeer_merge(q4, py, "mxfp4");
    json_decref(py);
}

/* Median seconds of a reload of every weight as an online mxfp8 or mxfp4
 * module (runtime tensors: the arena's outputs and scales). */
static int mxb_reload(mx_arena *a, int repeat, double *out)
{
    static const char *const names[2] = {"weight", "weight_scale"};
    refit_tensor *rt = calloc((size_t)a->nw * 2, sizeof *rt);
    if (!rt)
        return 1;
    for (int w = 0; w < a->nw; w++) {
        const refit_view *q = &a->q[w], *s = &a->s[w];
        rt[2 * w] = (refit_tensor){.data = q->data, .device = q->device, .ndim = 2,
                                   .dtype = q->dtype, .shape = (int64_t *)q->shape};
        rt[2 * w + 1] = (refit_tensor){.data = s->data, .device = s->device, .ndim = 2,
                                       .dtype = s->dtype, .shape = (int64_t *)s->shape};
    }
    breload_spec sp = {a->bits == 8 ? "quant mxfp8" : "quant mxfp4",
                       a->bits == 8 ? "mxfp8" : "mxfp4", NULL, 2, names, rt};
    int rc = breload_time(&sp, a->nw, a->x, repeat, out);
    free(rt);
    return rc;
}

static void mxb_free(mx_arena *a)
{
    cudaFree(a->qd);
    cudaFree(a->sd);
    free(a->q);
}

int bench_gpu_mx(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                 const char *host_base, double copy_Bps, int repeat, const char *python,
                 const char *dir)
{
    json_t *res[2] = {NULL, NULL};
    int rc = 0;
    if (python && mkdir(dir, 0755) && errno != EEXIST)
        python = NULL;
    for (int f = 0; f < 2 && !rc; f++) {
        mx_arena a = {.bits = f ? 4 : 8, .nw = nw, .x = x};
        a.hw = a.bits == 8 && kern_fp8_encoder(0, NULL, NULL) == 1;
        double t_all = 0, t_each = 0;
        rc = mxb_views(&a) || mxb_time(&a, 1, repeat, &t_all) ||
             mxb_check(&a, dev_base, host_base) || mxb_time(&a, 0, repeat, &t_each) ||
             mxb_check(&a, dev_base, host_base);
        if (rc) {
            mxb_free(&a);
            break;
        }
        if (python && mxb_dump(&a, dir, host_base, dev_base, f == 0))
            python = NULL;
        json_t *o = bpeer_object(nw, x);
        size_t elems = (size_t)json_integer_value(json_object_get(o, "elements")), scales = 0;
        for (int w = 0; w < nw; w++)
            scales += (size_t)(a.s[w].shape[0] * a.s[w].shape[1]);
        double min_bytes = (2.0 + a.bits / 8.0) * (double)elems + (double)scales;
        json_object_set_new(o, "encoder", json_string(a.bits == 4 ? "f32-add rounding"
                                                      : a.hw ? "cvt.rn.satfinite.e4m3x2.f32"
                                                             : "f32-add rounding"));
        bpeer_figures(o, min_bytes, t_all, t_each, copy_Bps);
        bpeer_verdict(o);
        res[f] = o;
        double t_reload = 0;
        if (!(rc = mxb_reload(&a, repeat, &t_reload))) {
            bpeer_put(o, "online_reload_ms", t_reload * 1e3);
            bpeer_put(o, "online_reload_ratio_to_d2d", min_bytes / t_reload / copy_Bps);
            json_object_set_new(o, "online_reload_equals_cpu_reference",
                                json_boolean(!mxb_check(&a, dev_base, host_base)));
        }
        mxb_free(&a);
    }
    if (!rc && python) {
        mx_arena a = {.nw = nw, .x = x};
        mxb_torch(res[0], res[1], &a, repeat, python, dir);
    }
    if (python) {
        bpeer_remove(dir, "mx-layer0-x.bin");
        bpeer_remove(dir, "mx-layer0-mxfp8.bin");
        bpeer_remove(dir, "mx-layer0-mxfp4.bin");
    }
    for (int f = 0; f < 2; f++)
        if (res[f])
            json_object_set_new(quant, f ? "mxfp4" : "mxfp8", res[f]);
    return rc;
}
