/* The host service quant_nvfp4 (include/refit/format.h): NVFP4 post-load
 * pieces checked as the CPU reference checks them, then run where the
 * views live: host memory (CPU, pinned) by kern_quant_nvfp4 / kern_swizzle
 * / kern_nvfp4_fuse, a CUDA device by kern_quant_nvfp4_cuda
 * (kernels/quant_nvfp4.cu) through backend_cuda_run, bit for bit the same
 * bytes. Wired into refit_host_v2 by ctx_init_host (core/ctx.c). */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/copy.h"
#include "kernels/quant_fp8.h"
#include "kernels/quant_nvfp4.h"
#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#endif

int svc_quant_nvfp4(void *host, uint32_t n, const refit_nvfp4_piece *p, void *stream);

static const char *piece_name(const refit_nvfp4_piece *p, uint32_t i, char *buf, size_t n)
{
    if (p[i].name)
        return p[i].name;
    snprintf(buf, n, "#%u", i);
    return buf;
}

static int64_t numel(const refit_view *v)
{
    int64_t e = 1;
    for (int i = 0; i < v->ndim; i++)
        e *= v->shape[i];
    return e;
}

static int is_f32(refit_dtype d)
{
    return d.code == REFIT_DTYPE_FLOAT && d.bits == 32 && d.lanes == 1;
}

static int one_f32(const refit_view *v)
{
    return v->data && is_f32(v->dtype) && numel(v) == 1;
}

static int contiguous(const refit_view *v)
{
    int64_t want = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] != 1 && v->strides[i] != want)
            return 0;
        want *= v->shape[i];
    }
    return 1;
}

/* 1 host memory, 2 + id a CUDA device, 0 none we run on. */
static int place_of(const refit_view *v)
{
    refit_device d = v->device;
    if (d.device_type == REFIT_DEVICE_CPU || d.device_type == REFIT_DEVICE_CUDA_HOST)
        return 1;
    return d.device_type == REFIT_DEVICE_CUDA && d.device_id >= 0 ? 2 + d.device_id : 0;
}

/* The views piece p uses, as the references take them. */
static int check_piece(void *host, const refit_nvfp4_piece *p, const char *name)
{
    int online = p->mode == REFIT_NVFP4_ONLINE;
    if (p->mode < REFIT_NVFP4_ONLINE || p->mode > REFIT_NVFP4_CT)
        return ctx_error(host, REFIT_EINVAL, "quant_nvfp4: tensor %s: mode %d is not online (0), "
                         "ModelOpt (1) or compressed-tensors (2)", name, p->mode);
    const refit_view *s = &p->src;
    if (s->ndim != 2 || s->shape[0] < 0 || s->shape[1] < 0)
        return ctx_error(host, REFIT_EMISMATCH, "quant_nvfp4: tensor %s: the source is 2-D, not "
                         "%d-D", name, s->ndim);
    if (online ? !kern_is_float_dtype(s->dtype) : kern_dtype_size(s->dtype) != 1)
        return ctx_error(host, REFIT_EUNSUPPORTED, "quant_nvfp4: tensor %s: %s source is %s; "
                         "it takes %s", name, online ? "an online" : "a checkpoint",
                         refit_dtype_name(s->dtype), online ? "f32/f16/bf16" : "8-bit scales");
    int64_t rows = s->shape[0];
    int64_t blocks = online ? (s->shape[1] + KERN_NVFP4_BLOCK - 1) / KERN_NVFP4_BLOCK
                            : s->shape[1];
    int64_t want = kern_swizzle_rows(rows) * kern_swizzle_cols(blocks);
    if (kern_dtype_size(p->scale.dtype) != 1 || numel(&p->scale) != want ||
        !contiguous(&p->scale) || !p->scale.data)
        return ctx_error(host, REFIT_EMISMATCH, "quant_nvfp4: tensor %s: the swizzled scale "
                         "must be %lld contiguous 8-bit elements (%lld rows, %lld blocks)", name,
                         (long long)want, (long long)rows, (long long)blocks);
    if (!one_f32(&p->alpha))
        return ctx_error(host, REFIT_EMISMATCH, "quant_nvfp4: tensor %s: alpha must be one f32",
                         name);
    if (online) {
        const refit_view *q = &p->packed;
        if (kern_dtype_size(q->dtype) != 1 || q->ndim != 2 || q->shape[0] != rows ||
            q->shape[1] != (s->shape[1] + 1) / 2 || !q->data)
            return ctx_error(host, REFIT_EMISMATCH, "quant_nvfp4: tensor %s: weight [%lld, "
                             "%lld] packs into 8-bit [%lld, %lld]", name, (long long)rows,
                             (long long)s->shape[1], (long long)rows,
                             (long long)(s->shape[1] + 1) / 2);
        return REFIT_OK;
    }
    if (!one_f32(&p->weight_factor) || (p->input_factor.data && !one_f32(&p->input_factor)) ||
        (p->input_scale_inv.data && (!one_f32(&p->input_scale_inv) || !p->input_factor.data)))
        return ctx_error(host, REFIT_EMISMATCH, "quant_nvfp4: tensor %s: the factors and "
                         "input_scale_inv are one f32 each (input_scale_inv needs an input "
                         "factor)", name);
    return REFIT_OK;
}

/* Every view of piece p in one place (place_of); 0 when they differ. */
static int piece_place(const refit_nvfp4_piece *p)
{
    const refit_view *v[7] = {&p->src, &p->packed, &p->scale, &p->alpha, &p->input_scale_inv,
                              &p->weight_factor, &p->input_factor};
    int at = place_of(&p->src);
    for (int i = 1; i < 7; i++)
        if (v[i]->data && place_of(v[i]) != at)
            return 0;
    return at;
}

static float f32_at(const refit_view *v)
{
    float f;
    memcpy(&f, v->data, sizeof f);
    return f;
}

/* The references on host memory. */
static int run_host(void *host, uint32_t n, const refit_nvfp4_piece *p)
{
    char buf[16];
    for (uint32_t i = 0; i < n; i++) {
        if (p[i].mode != REFIT_NVFP4_ONLINE) {
            kern_swizzle(p[i].scale.data, &p[i].src);
            float in = p[i].input_factor.data ? f32_at(&p[i].input_factor) : 0.0f;
            float alpha, inv = 0.0f;
            kern_nvfp4_fuse(p[i].mode == REFIT_NVFP4_CT ? KERN_NVFP4_CT : KERN_NVFP4_MODELOPT,
                            f32_at(&p[i].weight_factor), p[i].input_factor.data ? &in : NULL,
                            &alpha, &inv);
            memcpy(p[i].alpha.data, &alpha, sizeof alpha);
            if (p[i].input_scale_inv.data)
                memcpy(p[i].input_scale_inv.data, &inv, sizeof inv);
            continue;
        }
        int rc = kern_quant_nvfp4(&p[i].packed, p[i].scale.data, p[i].alpha.data, &p[i].src);
        if (rc == REFIT_ECORRUPT)
            return ctx_error(host, rc, "quant_nvfp4: tensor %s: NaN or infinity in the weight; "
                             "refusing to quantize it", piece_name(p, i, buf, sizeof buf));
        if (rc)
            return ctx_error(host, rc, "quant_nvfp4: tensor %s: refused: %s",
                             piece_name(p, i, buf, sizeof buf), refit_strerror(rc));
    }
    return REFIT_OK;
}

#ifdef REFIT_HAVE_CUDA
typedef struct dev_call {
    uint32_t n;
    const refit_nvfp4_piece *p;
    int32_t bad;
} dev_call;

static int dev_launch(void *arg, void *stream)
{
    dev_call *c = arg;
    return kern_quant_nvfp4_cuda(c->n, c->p, &c->bad, stream);
}
#endif

int svc_quant_nvfp4(void *host, uint32_t n, const refit_nvfp4_piece *p, void *stream)
{
    char buf[16];
    if (n == 0)
        return REFIT_OK;
    if (!p)
        return ctx_error(host, REFIT_EINVAL, "quant_nvfp4: no pieces");
    int place = piece_place(&p[0]);
    for (uint32_t i = 0; i < n; i++) {
        const char *name = piece_name(p, i, buf, sizeof buf);
        int rc = check_piece(host, &p[i], name);
        if (rc)
            return rc;
        if (!place || piece_place(&p[i]) != place)
            return ctx_error(host, REFIT_EUNSUPPORTED, "quant_nvfp4: tensor %s: its views are "
                             "on device types %d (source), %d (scale): every view of a call "
                             "must be in host memory, or all on one CUDA device", name,
                             p[i].src.device.device_type, p[i].scale.device.device_type);
    }
    if (place == 1)
        return run_host(host, n, p);
#ifdef REFIT_HAVE_CUDA
    if (backend_for_device(p[0].src.device)) {
        dev_call c = {n, p, -1};
        int rc = backend_cuda_run(p[0].src.device.device_id, stream, dev_launch, &c);
        const char *bad = c.bad >= 0 && (uint32_t)c.bad < n
                              ? piece_name(p, (uint32_t)c.bad, buf, sizeof buf) : NULL;
        if (rc == REFIT_ECORRUPT && bad)
            return ctx_error(host, rc, "quant_nvfp4: tensor %s: NaN or infinity in the weight; "
                             "refusing to quantize it", bad);
        if (rc)
            return ctx_error(host, rc, "quant_nvfp4%s%s: %s", bad ? ": tensor " : "",
                             bad ? bad : "", backend_cuda_last_error());
        return REFIT_OK;
    }
#endif
    (void)stream;
    return ctx_error(host, REFIT_EUNSUPPORTED, "quant_nvfp4: tensor %s: no kernel for CUDA "
                     "device %d here (a build without CUDA, or the runtime sees no device)",
                     piece_name(p, 0, buf, sizeof buf), p[0].src.device.device_id);
}
