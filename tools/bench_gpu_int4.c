/* refit-bench gpu, quant section: quant.int4 (online INT4 quantization of
 * the bench model's linear weights on the device: round-to-nearest,
 * symmetric, groups of 128 columns, BF16 scales, the compressed-tensors
 * convention of plugins/int4/quant_int4.h; the kernel of the quant_int4 host
 * service; docs/cuda.md).
 *
 * Layout gptq (the words transposed, I32 [K/8, N], scales [G, N]: what
 * the plugin writes for GPTQ/Marlin engines) timed as one call for every
 * weight (refit_sys_cuda_run + kern_quant_int4_cuda, as the service runs it)
 * and one call per weight (a reload's post-load, a module at a time);
 * layout u8 (rows of bytes, scales [N, G]) as one call. Medians.
 * ratio_to_d2d is the minimum bytes of a call (2 read per BF16 element,
 * the packed words and the scales written) per second against the d2d
 * ceiling's bytes read plus written per second. Layer 0 is checked against
 * the CPU reference. With PyTorch (tools/bench_gpu.py, its own process and
 * spec): the same quantization in PyTorch ops (int4_quant), timed on the
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
#include "plugins/int4/int4_direct.h"
#include "plugins/int4/quant_int4.h"

int bench_gpu_int4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                   const char *host_base, double copy_Bps, int repeat, const char *python,
                   const char *dir);

#define I4B_GROUP 128
#define I4B_LAYER0 7 /* q, k, v, o, gate, up, down */

typedef struct i4_arena {
    int nw;
    refit_view *q, *s;          /* per weight, the current layout's views */
    const refit_view *x;
    char *d;                    /* device: words and scales */
    size_t *qoff, *soff, bytes, min_bytes;
    uint32_t at, count;         /* the pieces of the next call */
} i4_arena;

static int64_t i4b_words(const refit_view *x)
{
    return (x->shape[1] + 7) / 8;
}

static int64_t i4b_groups(const refit_view *x)
{
    return (x->shape[1] + I4B_GROUP - 1) / I4B_GROUP;
}

/* Room for every weight's words and scales in one device allocation. */
static int i4b_alloc(i4_arena *a)
{
    a->q = calloc((size_t)a->nw * 2, sizeof *a->q);
    a->qoff = calloc((size_t)a->nw * 2, sizeof *a->qoff);
    if (!a->q || !a->qoff)
        return 1;
    a->s = a->q + a->nw;
    a->soff = a->qoff + a->nw;
    a->bytes = a->min_bytes = 0;
    for (int w = 0; w < a->nw; w++) {
        int64_t n = a->x[w].shape[0], k = a->x[w].shape[1];
        size_t nq = (size_t)(n * i4b_words(&a->x[w])) * 4, ns = (size_t)(n * i4b_groups(&a->x[w])) * 2;
        a->qoff[w] = a->bytes;
        a->bytes += (nq + 255) & ~(size_t)255;
        a->soff[w] = a->bytes;
        a->bytes += (ns + 255) & ~(size_t)255;
        a->min_bytes += (size_t)(n * k) * (a->x[w].dtype.bits / 8) + nq + ns;
    }
    return cudaMalloc((void **)&a->d, a->bytes) != cudaSuccess;
}

/* The views of layout gptq (words and scales transposed) or u8 (rows). */
static void i4b_views(i4_arena *a, int u8)
{
    refit_device dev = {REFIT_DEVICE_CUDA, 0};
    for (int w = 0; w < a->nw; w++) {
        int64_t n = a->x[w].shape[0], nwd = i4b_words(&a->x[w]), g = i4b_groups(&a->x[w]);
        a->q[w] = (refit_view){.data = a->d + a->qoff[w], .device = dev, .dtype = REFIT_I32,
                               .ndim = 2, .shape = {n, nwd},
                               .strides = {u8 ? nwd : 1, u8 ? 1 : n}};
        a->s[w] = (refit_view){.data = a->d + a->soff[w], .device = dev, .dtype = REFIT_BF16,
                               .ndim = 2, .shape = {n, g}, .strides = {u8 ? g : 1, u8 ? 1 : n}};
    }
}

static int i4b_launch(void *arg, void *stream)
{
    i4_arena *a = arg;
    int32_t bad;
    return kern_quant_int4_cuda(a->count, a->q + a->at, a->s + a->at, a->x + a->at, I4B_GROUP,
                                &bad, stream);
}

/* Median seconds of one call for every weight (all), or one per weight. */
static int i4b_time(i4_arena *a, int all, int repeat, double *out)
{
    bpeer_calls c = {i4b_launch, a, &a->at, &a->count};
    return bpeer_time(&c, a->nw, all, repeat, "quant int4", out);
}

/* Our bytes of weight w (words, then scales, as laid out) into buf. */
static size_t i4b_fetch(const i4_arena *a, int w, uint8_t *buf)
{
    int64_t n = a->x[w].shape[0];
    size_t nq = (size_t)(n * i4b_words(&a->x[w])) * 4, ns = (size_t)(n * i4b_groups(&a->x[w])) * 2;
    if (cudaMemcpy(buf, a->d + a->qoff[w], nq, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(buf + nq, a->d + a->soff[w], ns, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    return nq + ns;
}

/* Layer 0 against the CPU reference on the host copy of the sources. */
static int i4b_check(const i4_arena *a, const char *dev_base, const char *host_base,
                     const char *layout)
{
    for (int w = 0; w < a->nw && w < I4B_LAYER0; w++) {
        int64_t n = a->x[w].shape[0];
        size_t nq = (size_t)(n * i4b_words(&a->x[w])) * 4;
        size_t len = nq + (size_t)(n * i4b_groups(&a->x[w])) * 2;
        uint8_t *ref = malloc(len), *got = malloc(len);
        refit_view x = a->x[w], q = a->q[w], s = a->s[w];
        x.data = (char *)host_base + ((const char *)a->x[w].data - dev_base);
        q.data = ref;
        s.data = ref + nq;
        x.device.device_type = q.device.device_type = s.device.device_type = REFIT_DEVICE_CPU;
        int rc = !ref || !got || kern_quant_int4(&q, &s, &x, I4B_GROUP) ||
                 i4b_fetch(a, w, got) != len || memcmp(ref, got, len);
        free(ref);
        free(got);
        if (rc) {
            fprintf(stderr, "refit-bench gpu: quant int4 (%s): weight %d differs from the CPU "
                            "reference\n", layout, w);
            return 1;
        }
    }
    return 0;
}

/* Layer 0's sources (BF16) and our gptq bytes, for PyTorch to compare. */
static int i4b_dump(const i4_arena *a, const char *dir, const char *host_base,
                    const char *dev_base)
{
    for (int w = 0; w < a->nw && w < I4B_LAYER0; w++) {
        int64_t n = a->x[w].shape[0];
        size_t len = (size_t)(n * i4b_words(&a->x[w])) * 4 + (size_t)(n * i4b_groups(&a->x[w])) * 2;
        uint8_t *buf = malloc(len);
        int rc = !buf || i4b_fetch(a, w, buf) != len ||
                 bpeer_dump(dir, w, "int4-layer0-q.bin", buf, len, "int4-layer0-x.bin", &a->x[w],
                            host_base, dev_base);
        free(buf);
        if (rc)
            return 1;
    }
    return 0;
}

/* PyTorch's timing and byte check, merged into o. */
static void i4b_torch(json_t *o, const refit_view *x, int nw, int repeat, const char *python,
                      const char *dir)
{
    json_t *s = bpeer_spec("int4", nw, x, I4B_LAYER0, repeat, dir);
    json_object_set_new(s, "int4_group", json_integer(I4B_GROUP));
    json_t *py = bpeer_torch(s, python, dir, "int4");
    bpeer_merge(o, py, "int4");
    json_decref(py);
}

/* Median seconds of a reload of every weight as an online int4 module,
 * layout gptq (runtime tensors: the arena's words I32 [K/8, N] and scales
 * BF16 [G, N], as i4b_views(a, 0) lays them). */
static int i4b_reload(i4_arena *a, int repeat, double *out)
{
    static const char *const names[2] = {"weight", "weight_scale"};
    refit_tensor *rt = calloc((size_t)a->nw * 2, sizeof *rt);
    int64_t *shapes = calloc((size_t)a->nw * 4, sizeof *shapes);
    int rc = !rt || !shapes;
    for (int w = 0; w < a->nw && !rc; w++) {
        int64_t *sh = shapes + 4 * w;
        sh[0] = i4b_words(&a->x[w]);
        sh[1] = sh[3] = a->x[w].shape[0];
        sh[2] = i4b_groups(&a->x[w]);
        refit_device dev = a->x[w].device;
        rt[2 * w] = (refit_tensor){.data = a->d + a->qoff[w], .device = dev, .ndim = 2,
                                   .dtype = REFIT_I32, .shape = sh};
        rt[2 * w + 1] = (refit_tensor){.data = a->d + a->soff[w], .device = dev, .ndim = 2,
                                       .dtype = REFIT_BF16, .shape = sh + 2};
    }
    char params[32];
    snprintf(params, sizeof params, "group_size: %d", I4B_GROUP);
    breload_spec sp = {"quant int4", "int4", params, 2, names, rt};
    if (!rc)
        rc = breload_time(&sp, a->nw, a->x, repeat, out);
    free(rt);
    free(shapes);
    return rc;
}

int bench_gpu_int4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                   const char *host_base, double copy_Bps, int repeat, const char *python,
                   const char *dir)
{
    i4_arena a = {.nw = nw, .x = x};
    double t_all = 0, t_each = 0, t_u8 = 0;
    int rc = i4b_alloc(&a);
    if (!rc) {
        i4b_views(&a, 1);
        rc = i4b_time(&a, 1, repeat, &t_u8) || i4b_check(&a, dev_base, host_base, "u8");
    }
    if (!rc) {
        i4b_views(&a, 0);
        rc = i4b_time(&a, 0, repeat, &t_each) || i4b_check(&a, dev_base, host_base, "gptq") ||
             i4b_time(&a, 1, repeat, &t_all) || i4b_check(&a, dev_base, host_base, "gptq");
    }
    if (!rc && python && ((mkdir(dir, 0755) && errno != EEXIST) ||
                          i4b_dump(&a, dir, host_base, dev_base)))
        python = NULL;
    if (!rc) {
        double mb = (double)a.min_bytes;
        json_t *o = bpeer_object(nw, x);
        json_object_set_new(o, "group", json_integer(I4B_GROUP));
        json_object_set_new(o, "layout", json_string("gptq"));
        bpeer_figures(o, mb, t_all, t_each, copy_Bps);
        bpeer_put(o, "u8_refit_ms", t_u8 * 1e3);
        bpeer_put(o, "u8_ratio_to_d2d", mb / t_u8 / copy_Bps);
        bpeer_verdict(o);
        double t_reload = 0;
        if (!(rc = i4b_reload(&a, repeat, &t_reload))) {
            bpeer_put(o, "online_reload_ms", t_reload * 1e3);
            bpeer_put(o, "online_reload_ratio_to_d2d", mb / t_reload / copy_Bps);
            json_object_set_new(o, "online_reload_equals_cpu_reference",
                                json_boolean(!i4b_check(&a, dev_base, host_base, "gptq")));
        }
        if (python)
            i4b_torch(o, x, nw, repeat, python, dir);
        json_object_set_new(quant, "int4", o);
    }
    if (python) {
        bpeer_remove(dir, "int4-layer0-x.bin");
        bpeer_remove(dir, "int4-layer0-q.bin");
    }
    cudaFree(a.d);
    free(a.q);
    free(a.qoff);
    return rc;
}
