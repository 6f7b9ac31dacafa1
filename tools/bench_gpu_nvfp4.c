/* refit-bench gpu, quant section: quant.nvfp4 (online NVFP4 quantization
 * of the bench model's linear weights on the device, the kernel of the
 * quant_nvfp4 host service; docs/cuda.md).
 *
 * One call for every weight (as the service runs it: refit_sys_cuda_run +
 * kern_quant_nvfp4_cuda) and one call per weight (what a reload's
 * post-load does, a module at a time), timed as medians; ratio_to_d2d is
 * the minimum bytes of a call (2 read per BF16 element, 1/2 written, the
 * swizzled scale bytes, 4 for alpha) per second against the d2d ceiling's
 * bytes read plus written per second. Layer 0 is checked against the CPU
 * reference. With PyTorch (tools/bench_gpu.py, its own process and spec):
 * the same quantization in PyTorch ops, timed on the same shapes, and its
 * bytes compared with ours on layer 0 (written to files in the bench
 * directory, removed afterwards). set_sweep: the one-call ratio with other
 * L2 set sizes (kern_quant_nvfp4_set_bytes), to tune the default.
 * online_reload: a whole reload of the weights as online nvfp4 modules
 * through refit and the nvfp4 plugin (staged copies from the device
 * sources, then post-load per module through the quant_nvfp4 service). */
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
#include "plugins/nvfp4/nvfp4_direct.h"
#include "plugins/nvfp4/quant_nvfp4.h"

int bench_gpu_nvfp4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                    const char *host_base, double copy_Bps, int repeat, const char *python,
                    const char *dir);

#define NVB_LAYER0 7 /* q, k, v, o, gate, up, down */

typedef struct nv_arena {
    int nw;
    refit_nvfp4_piece *p;
    char *d;                    /* device: packed, scales, alphas */
    size_t bytes, min_bytes;
    uint32_t at, count;         /* the pieces of the next call */
} nv_arena;

static size_t nvb_round(size_t v)
{
    return (v + 255) & ~(size_t)255;
}

static size_t nvb_packed(const refit_view *x)
{
    return (size_t)(x->shape[0] * ((x->shape[1] + 1) / 2));
}

static size_t nvb_scales(const refit_view *x)
{
    return (size_t)(kern_swizzle_rows(x->shape[0]) *
                    kern_swizzle_cols((x->shape[1] + KERN_NVFP4_BLOCK - 1) / KERN_NVFP4_BLOCK));
}

/* Online pieces for every weight, outputs in one device allocation. */
static int nvb_pieces(nv_arena *a, const refit_view *x)
{
    a->p = calloc((size_t)a->nw, sizeof *a->p);
    if (!a->p)
        return 1;
    a->bytes = a->min_bytes = 0;
    for (int w = 0; w < a->nw; w++) {
        size_t np = nvb_packed(&x[w]), ns = nvb_scales(&x[w]);
        a->bytes += nvb_round(np) + nvb_round(ns) + 256;
        a->min_bytes += (size_t)(x[w].shape[0] * x[w].shape[1]) * 2 + np + ns + 4;
    }
    if (cudaMalloc((void **)&a->d, a->bytes) != cudaSuccess)
        return 1;
    size_t off = 0;
    refit_device dev = {REFIT_DEVICE_CUDA, 0};
    for (int w = 0; w < a->nw; w++) {
        int64_t n = x[w].shape[0], kb = (x[w].shape[1] + 1) / 2;
        size_t np = nvb_packed(&x[w]), ns = nvb_scales(&x[w]);
        refit_nvfp4_piece *p = &a->p[w];
        p->mode = REFIT_NVFP4_ONLINE;
        p->src = x[w];
        p->packed = (refit_view){.data = a->d + off, .device = dev, .dtype = REFIT_U8,
                                 .ndim = 2, .shape = {n, kb}, .strides = {kb, 1}};
        off += nvb_round(np);
        p->scale = (refit_view){.data = a->d + off, .device = dev, .dtype = REFIT_U8,
                                .ndim = 1, .shape = {(int64_t)ns}, .strides = {1}};
        off += nvb_round(ns);
        p->alpha = (refit_view){.data = a->d + off, .device = dev, .dtype = REFIT_F32,
                                .ndim = 1, .shape = {1}, .strides = {1}};
        off += 256;
    }
    return 0;
}

static int nvb_launch(void *arg, void *stream)
{
    nv_arena *a = arg;
    int32_t bad;
    return kern_quant_nvfp4_cuda(a->count, a->p + a->at, &bad, stream);
}

/* Median seconds of one call for every weight (all), or one per weight. */
static int nvb_time(nv_arena *a, int all, int repeat, double *out)
{
    bpeer_calls c = {nvb_launch, a, &a->at, &a->count};
    return bpeer_time(&c, a->nw, all, repeat, "quant nvfp4", out);
}

/* Our bytes of weight w (packed, swizzled scales, alpha) into buf. */
static size_t nvb_fetch(const nv_arena *a, int w, uint8_t *buf)
{
    const refit_nvfp4_piece *p = &a->p[w];
    size_t np = nvb_packed(&p->src), ns = nvb_scales(&p->src);
    if (cudaMemcpy(buf, p->packed.data, np, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(buf + np, p->scale.data, ns, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(buf + np + ns, p->alpha.data, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    return np + ns + 4;
}

/* Layer 0 against the CPU reference on the host copy of the sources. */
static int nvb_check(const nv_arena *a, const char *dev_base, const char *host_base)
{
    for (int w = 0; w < a->nw && w < NVB_LAYER0; w++) {
        const refit_nvfp4_piece *p = &a->p[w];
        size_t np = nvb_packed(&p->src), ns = nvb_scales(&p->src), n = np + ns + 4;
        uint8_t *ref = malloc(n), *got = malloc(n);
        refit_view x = p->src, q = p->packed;
        x.data = (char *)host_base + ((const char *)p->src.data - dev_base);
        x.device.device_type = REFIT_DEVICE_CPU;
        q.data = ref;
        q.device.device_type = REFIT_DEVICE_CPU;
        float alpha = 0.0f;
        int rc = !ref || !got || kern_quant_nvfp4(&q, ref + np, &alpha, &x);
        if (!rc)
            memcpy(ref + np + ns, &alpha, 4);
        rc = rc || nvb_fetch(a, w, got) != n || memcmp(ref, got, n);
        free(ref);
        free(got);
        if (rc) {
            fprintf(stderr, "refit-bench gpu: quant nvfp4: weight %d differs from the CPU "
                            "reference\n", w);
            return 1;
        }
    }
    return 0;
}

/* Layer 0's sources (BF16) and our bytes, for PyTorch to compare. */
static int nvb_dump(const nv_arena *a, const char *dir, const char *host_base,
                    const char *dev_base)
{
    for (int w = 0; w < a->nw && w < NVB_LAYER0; w++) {
        const refit_nvfp4_piece *p = &a->p[w];
        size_t n = nvb_packed(&p->src) + nvb_scales(&p->src) + 4;
        uint8_t *buf = malloc(n);
        int rc = !buf || nvb_fetch(a, w, buf) != n ||
                 bpeer_dump(dir, w, "nvfp4-layer0-q.bin", buf, n, "nvfp4-layer0-x.bin", &p->src,
                            host_base, dev_base);
        free(buf);
        if (rc)
            return 1;
    }
    return 0;
}

/* PyTorch's timing and byte check, merged into o. */
static void nvb_torch(json_t *o, const refit_view *x, int nw, int repeat, const char *python,
                      const char *dir)
{
    json_t *s = bpeer_spec("nvfp4", nw, x, NVB_LAYER0, repeat, dir);
    json_t *py = bpeer_torch(s, python, dir, "nvfp4");
    bpeer_merge(o, py, "nvfp4");
    json_decref(py);
}

/* Median seconds of a reload of every weight as an online nvfp4 module
 * (runtime tensors: the arena's outputs). */
static int nvb_reload(nv_arena *a, int repeat, double *out)
{
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    refit_tensor *rt = calloc((size_t)a->nw * 3, sizeof *rt);
    int rc = rt ? refit_open(&ctx, NULL) : REFIT_ENOMEM;
    if (!rc)
        rc = refit_model_create(&m, ctx);
    for (int w = 0; w < a->nw && !rc; w++) {
        refit_nvfp4_piece *p = &a->p[w];
        char name[32], ck[40];
        snprintf(name, sizeof name, "w%d", w);
        snprintf(ck, sizeof ck, "w%d.weight", w);
        refit_tensor *t = &rt[3 * w];
        t[0] = (refit_tensor){.data = p->packed.data, .device = p->packed.device, .ndim = 2,
                              .dtype = REFIT_U8, .shape = p->packed.shape};
        t[1] = (refit_tensor){.data = p->scale.data, .device = p->scale.device, .ndim = 1,
                              .dtype = REFIT_U8, .shape = p->scale.shape};
        t[2] = (refit_tensor){.data = p->alpha.data, .device = p->alpha.device, .ndim = 1,
                              .dtype = REFIT_F32, .shape = p->alpha.shape};
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = p->src.dtype;
        s.ndim = 2;
        s.shape[0] = p->src.shape[0];
        s.shape[1] = p->src.shape[1];
        s.target = "weight";
        if (!(rc = refit_model_add_module(m, name, "nvfp4", "online: true")) &&
            !(rc = refit_module_bind_runtime(m, name, "weight", &t[0])) &&
            !(rc = refit_module_bind_runtime(m, name, "weight_scale", &t[1])) &&
            !(rc = refit_module_bind_runtime(m, name, "alpha", &t[2])))
            rc = refit_model_expect(m, name, ck, &s);
    }
    if (!rc)
        rc = refit_model_seal(m);
    double v[64];
    /* every weight in one refit_load_many, as the Python binding loads */
    char (*ck)[40] = calloc((size_t)a->nw + 1, sizeof *ck);
    const char **names = calloc((size_t)a->nw + 1, sizeof *names);
    refit_tensor *src = calloc((size_t)a->nw + 1, sizeof *src);
    if (!rc && (!ck || !names || !src))
        rc = REFIT_ENOMEM;
    for (int w = 0; w < a->nw && !rc; w++) {
        snprintf(ck[w], sizeof ck[w], "w%d.weight", w);
        names[w] = ck[w];
        src[w] = (refit_tensor){.data = a->p[w].src.data, .device = a->p[w].src.device,
                                .ndim = 2, .dtype = a->p[w].src.dtype,
                                .shape = a->p[w].src.shape};
    }
    for (int r = -1; r < repeat && !rc; r++) {
        double secs = 0;
        rc = breload_many_once(m, (size_t)a->nw, names, src, &secs);
        if (r >= 0)
            v[r] = secs;
    }
    free(ck);
    free(names);
    free(src);
    if (rc)
        fprintf(stderr, "refit-bench gpu: quant nvfp4 reload: %s: %s [%s]\n",
                refit_status_name(rc), ctx ? refit_errmsg(ctx) : "", refit_sys_cuda_last_error());
    else
        *out = bpeer_median(v, repeat);
    refit_close(ctx);
    free(rt);
    return rc != 0;
}

int bench_gpu_nvfp4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                    const char *host_base, double copy_Bps, int repeat, const char *python,
                    const char *dir)
{
    nv_arena a = {.nw = nw};
    double t_all = 0, t_each = 0;
    int rc = nvb_pieces(&a, x) || nvb_time(&a, 1, repeat, &t_all) ||
             nvb_check(&a, dev_base, host_base) || nvb_time(&a, 0, repeat, &t_each) ||
             nvb_check(&a, dev_base, host_base);
    if (!rc && python && ((mkdir(dir, 0755) && errno != EEXIST) ||
                          nvb_dump(&a, dir, host_base, dev_base)))
        python = NULL;
    if (!rc) {
        double mb = (double)a.min_bytes;
        json_t *o = bpeer_object(nw, x);
        bpeer_figures(o, mb, t_all, t_each, copy_Bps);
        bpeer_verdict(o);
        json_t *sw = json_object();
        static const int set_mb[6] = {24, 48, 64, 96, 128, 256};
        for (int i = 0; i < 6 && !rc; i++) {
            double t = 0;
            char key[16];
            kern_quant_nvfp4_set_bytes((int64_t)set_mb[i] << 20);
            rc = nvb_time(&a, 1, repeat, &t) || nvb_check(&a, dev_base, host_base);
            snprintf(key, sizeof key, "%dMB", set_mb[i]);
            bpeer_put(sw, key, mb / t / copy_Bps);
        }
        kern_quant_nvfp4_set_bytes(0);
        json_object_set_new(o, "set_sweep", sw);
        double t_reload = 0;
        if (!rc && !(rc = nvb_reload(&a, repeat, &t_reload) ||
                           nvb_check(&a, dev_base, host_base))) {
            bpeer_put(o, "online_reload_ms", t_reload * 1e3);
            bpeer_put(o, "online_reload_ratio_to_d2d", mb / t_reload / copy_Bps);
        }
        if (python)
            nvb_torch(o, x, nw, repeat, python, dir);
        json_object_set_new(quant, "nvfp4", o);
    }
    if (python) {
        bpeer_remove(dir, "nvfp4-layer0-x.bin");
        bpeer_remove(dir, "nvfp4-layer0-q.bin");
    }
    cudaFree(a.d);
    free(a.p);
    return rc;
}
