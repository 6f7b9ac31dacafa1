/* The host service quant_fp8 (transitional, include/refit/format.h): the
 * CPU reference on host memory, its CUDA twin (plugins/fp8/quant_fp8.cu) on
 * device memory. */
#include <stdio.h>

#include "core/internal.h"
#include "core/svc_quant.h"
#include "plugins/fp8/quant_fp8.h"

int svc_quant_fp8(void *host, uint32_t n, const refit_view *q, const refit_view *scale,
                  const refit_view *x, const char *const *names, int scheme, void *stream);

/* ---- post-load kernels (format.h: quant_fp8): the CPU reference on host
 * memory, its CUDA twin (plugins/fp8/quant_fp8.cu) on device memory. ---- */

static const char *piece_name(const char *const *names, uint32_t i, char *buf, size_t n)
{
    if (names && names[i])
        return names[i];
    snprintf(buf, n, "#%u", i);
    return buf;
}

static int quant_corrupt(void *host, const char *name)
{
    return ctx_error(host, REFIT_ECORRUPT, "tensor %s: NaN or infinity in the weight; refusing "
                     "to quantize it", name);
}

/* Piece views as kern_quant_fp8 takes them. */
static int quant_fp8_check(void *host, const refit_view *q, const refit_view *s,
                           const refit_view *x, int scheme, const char *name)
{
    if (!kern_is_float_dtype(x->dtype) || !kern_is_byte_dtype(q->dtype) ||
        s->dtype.code != REFIT_DTYPE_FLOAT || s->dtype.bits != 32 || s->dtype.lanes != 1)
        return ctx_error(host, REFIT_EUNSUPPORTED, "quant_fp8: tensor %s: quantizes f32/f16/"
                         "bf16 into one-byte elements with f32 scales, not %s into %s with %s "
                         "scales", name, refit_dtype_name(x->dtype), refit_dtype_name(q->dtype),
                         refit_dtype_name(s->dtype));
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2)
        return ctx_error(host, REFIT_EMISMATCH, "quant_fp8: tensor %s: weight, output and "
                         "scale views are 2-D (they are %d-, %d- and %d-D)", name, x->ndim,
                         q->ndim, s->ndim);
    int64_t ss[2];
    kern_fp8_scale_shape((kern_fp8_scheme)scheme, x->shape[0], x->shape[1], ss);
    if (q->shape[0] != x->shape[0] || q->shape[1] != x->shape[1] || s->shape[0] != ss[0] ||
        s->shape[1] != ss[1])
        return ctx_error(host, REFIT_EMISMATCH, "quant_fp8: tensor %s: weight [%lld, %lld], "
                         "output [%lld, %lld], scale [%lld, %lld]; the scheme's scale is "
                         "[%lld, %lld]", name, (long long)x->shape[0], (long long)x->shape[1],
                         (long long)q->shape[0], (long long)q->shape[1], (long long)s->shape[0],
                         (long long)s->shape[1], (long long)ss[0], (long long)ss[1]);
    return REFIT_OK;
}

/* 1 host memory, 2 + id a CUDA device, 0 none we quantize on. */
static int quant_place(refit_device d)
{
    if (d.device_type == REFIT_DEVICE_CPU || d.device_type == REFIT_DEVICE_CUDA_HOST)
        return 1;
    return d.device_type == REFIT_DEVICE_CUDA && d.device_id >= 0 ? 2 + d.device_id : 0;
}

/* The reference on host memory; per-tensor groups share a scale. */
static int quant_fp8_host(void *host, uint32_t n, const refit_view *q, const refit_view *s,
                          const refit_view *x, const char *const *names, int scheme)
{
    char buf[16];
    for (uint32_t i = 0; i < n; i++) {
        if (scheme != KERN_FP8_PER_TENSOR) {
            int rc = kern_quant_fp8(&q[i], &s[i], &x[i], (kern_fp8_scheme)scheme);
            if (rc == REFIT_ECORRUPT)
                return quant_corrupt(host, piece_name(names, i, buf, sizeof buf));
            if (rc)
                return ctx_error(host, rc, "quant_fp8: tensor %s: refused: %s",
                                 piece_name(names, i, buf, sizeof buf), refit_strerror(rc));
            continue;
        }
        uint32_t j = 0;
        while (j < i && s[j].data != s[i].data)
            j++;
        if (j < i)
            continue; /* done with the first piece of its group */
        float amax = 0.0f;
        for (j = i; j < n; j++) {
            if (s[j].data != s[i].data)
                continue;
            float a = kern_amax_f32(&x[j], 0, x[j].shape[0], 0, x[j].shape[1]);
            if (a < 0.0f)
                return quant_corrupt(host, piece_name(names, j, buf, sizeof buf));
            amax = a > amax ? a : amax;
        }
        float sc = kern_fp8_scale(amax);
        *kern_view_f32_ptr(&s[i], 0, 0) = sc;
        for (j = i; j < n; j++)
            if (s[j].data == s[i].data)
                kern_fp8_encode_tile(&q[j], &x[j], sc, 0, x[j].shape[0], 0, x[j].shape[1]);
    }
    return REFIT_OK;
}

int svc_quant_fp8(void *host, uint32_t n, const refit_view *q, const refit_view *scale,
                          const refit_view *x, const char *const *names, int scheme,
                          void *stream)
{
    char buf[16];
    if (n == 0)
        return REFIT_OK;
    if (!q || !scale || !x || scheme < KERN_FP8_PER_TENSOR || scheme > KERN_FP8_BLOCK128)
        return ctx_error(host, REFIT_EINVAL, "quant_fp8: views missing, or scheme %d is not "
                         "0 (per-tensor), 1 (per-channel) or 2 (block-128)", scheme);
    int place = quant_place(x[0].device);
    for (uint32_t i = 0; i < n; i++) {
        const char *name = piece_name(names, i, buf, sizeof buf);
        int rc = quant_fp8_check(host, &q[i], &scale[i], &x[i], scheme, name);
        if (rc)
            return rc;
        if (!place || quant_place(x[i].device) != place || quant_place(q[i].device) != place ||
            quant_place(scale[i].device) != place)
            return ctx_error(host, REFIT_EUNSUPPORTED, "quant_fp8: tensor %s: weight, output "
                             "and scale on device types %d, %d, %d: every view of a call must "
                             "be in host memory, or all on one CUDA device", name,
                             x[i].device.device_type, q[i].device.device_type,
                             scale[i].device.device_type);
    }
    if (place == 1)
        return quant_fp8_host(host, n, q, scale, x, names, scheme);
#ifdef REFIT_HAVE_CUDA
    if (backend_for_device(x[0].device)) {
        int backend_cuda_quant_fp8(uint32_t, const refit_view *, const refit_view *,
                                   const refit_view *, int, int32_t *, void *);
        const char *backend_cuda_last_error(void); /* core/cuda/backend_cuda.h */
        int32_t bad = -1;
        int rc = backend_cuda_quant_fp8(n, q, scale, x, scheme, &bad, stream);
        if (rc == REFIT_ECORRUPT && bad >= 0 && (uint32_t)bad < n)
            return quant_corrupt(host, piece_name(names, (uint32_t)bad, buf, sizeof buf));
        if (rc)
            return ctx_error(host, rc, "quant_fp8%s%s: %s", bad >= 0 ? ": tensor " : "",
                             bad >= 0 && (uint32_t)bad < n
                                 ? piece_name(names, (uint32_t)bad, buf, sizeof buf) : "",
                             backend_cuda_last_error());
        return REFIT_OK;
    }
#endif
    (void)stream;
    return ctx_error(host, REFIT_EUNSUPPORTED, "quant_fp8: tensor %s: no kernel for CUDA device "
                     "%d here (a build without CUDA, or the runtime sees no device)",
                     piece_name(names, 0, buf, sizeof buf), x[0].device.device_id);
}

