/* The MX formats' host service quant_mx (include/refit/format.h): pieces
 * checked as the CPU references check them, then run where the views
 * live: host memory (CPU, pinned) by kern_quant_mxfp8 / kern_quant_mxfp4,
 * a CUDA device by kern_quant_mx_cuda (plugins/mxfp8/quant_mx.cu) through
 * backend_cuda_run, bit for bit the same bytes. Wired into refit_host_v2
 * by ctx_init_host (core/ctx.c). */
#include <stdio.h>
#include <string.h>

#include "core/backend.h"
#include "core/internal.h"
#include "core/svc_quant.h"
#include "plugins/fp8/quant_fp8.h"
#include "plugins/mxfp8/quant_mx.h"
#include "plugins/mxfp4/quant_mxfp4.h"
#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#endif

int svc_quant_mx(void *host, uint32_t n, const refit_view *q, const refit_view *scales,
                 const refit_view *x, const char *const *names, int elem_bits, void *stream);

static const char *piece_name(const char *const *names, uint32_t i, char *buf, size_t n)
{
    if (names && names[i])
        return names[i];
    snprintf(buf, n, "#%u", i);
    return buf;
}

/* 1 host memory, 2 + id a CUDA device, 0 none we run on. */
static int place_of(refit_device d)
{
    if (d.device_type == REFIT_DEVICE_CPU || d.device_type == REFIT_DEVICE_CUDA_HOST)
        return 1;
    return d.device_type == REFIT_DEVICE_CUDA && d.device_id >= 0 ? 2 + d.device_id : 0;
}

static const char *fmt_name(int elem_bits)
{
    return elem_bits == 8 ? "mxfp8" : "mxfp4";
}

static int corrupt(void *host, int elem_bits, const char *name)
{
    return ctx_error(host, REFIT_ECORRUPT, "quant_mx (%s): tensor %s: NaN or infinity in the "
                     "weight; %s", fmt_name(elem_bits), name,
                     elem_bits == 8 ? "refusing to quantize it" : "MXFP4 cannot hold it");
}

/* Piece i as the reference takes it (kern_quant_mxfp8 / kern_quant_mxfp4
 * check the same), and on the call's place. */
static int check_piece(void *host, const refit_view *q, const refit_view *s, const refit_view *x,
                       int elem_bits, int place, const char *name)
{
    if (!kern_is_float_dtype(x->dtype) || !kern_is_byte_dtype(q->dtype) ||
        !kern_is_byte_dtype(s->dtype))
        return ctx_error(host, REFIT_EUNSUPPORTED, "quant_mx (%s): tensor %s: quantizes f32/f16/"
                         "bf16 into one-byte elements and scales, not %s into %s with %s scales",
                         fmt_name(elem_bits), name, refit_dtype_name(x->dtype),
                         refit_dtype_name(q->dtype), refit_dtype_name(s->dtype));
    if (x->ndim != 2 || q->ndim != 2 || s->ndim != 2)
        return ctx_error(host, REFIT_EMISMATCH, "quant_mx (%s): tensor %s: weight, output and "
                         "scale views are 2-D (they are %d-, %d- and %d-D)", fmt_name(elem_bits),
                         name, x->ndim, q->ndim, s->ndim);
    int64_t n = x->shape[0], k = x->shape[1], qk = elem_bits == 4 ? (k + 1) / 2 : k;
    if (q->shape[0] != n || q->shape[1] != qk || s->shape[0] != n ||
        s->shape[1] != kern_mx_blocks(k))
        return ctx_error(host, REFIT_EMISMATCH, "quant_mx (%s): tensor %s: weight [%lld, %lld] "
                         "needs output [%lld, %lld] and scales [%lld, %lld]; they are [%lld, "
                         "%lld] and [%lld, %lld]", fmt_name(elem_bits), name, (long long)n,
                         (long long)k, (long long)n, (long long)qk, (long long)n,
                         (long long)kern_mx_blocks(k), (long long)q->shape[0],
                         (long long)q->shape[1], (long long)s->shape[0], (long long)s->shape[1]);
    if (elem_bits == 4 && q->shape[1] > 1 && q->strides[1] != 1)
        return ctx_error(host, REFIT_EMISMATCH, "quant_mx (mxfp4): tensor %s: the packed output's "
                         "rows must be contiguous bytes (stride 1 along K, not %lld)", name,
                         (long long)q->strides[1]);
    if (!place || place_of(x->device) != place || place_of(q->device) != place ||
        place_of(s->device) != place)
        return ctx_error(host, REFIT_EUNSUPPORTED, "quant_mx (%s): tensor %s: weight, output "
                         "and scales on device types %d, %d, %d: every view of a call must be in "
                         "host memory, or all on one CUDA device", fmt_name(elem_bits), name,
                         x->device.device_type, q->device.device_type, s->device.device_type);
    return REFIT_OK;
}

#ifdef REFIT_HAVE_CUDA
typedef struct dev_call {
    uint32_t n;
    const refit_view *q, *s, *x;
    int elem_bits, hw;
    int32_t bad;
} dev_call;

static int dev_launch(void *arg, void *stream)
{
    dev_call *c = arg;
    return kern_quant_mx_cuda(c->n, c->q, c->s, c->x, c->elem_bits, c->hw, &c->bad, stream);
}
#endif

int svc_quant_mx(void *host, uint32_t n, const refit_view *q, const refit_view *scales,
                 const refit_view *x, const char *const *names, int elem_bits, void *stream)
{
    char buf[16];
    if (n == 0)
        return REFIT_OK;
    if (!q || !scales || !x || (elem_bits != 8 && elem_bits != 4))
        return ctx_error(host, REFIT_EINVAL, "quant_mx: views missing, or elem_bits %d is not "
                         "8 (MXFP8) or 4 (MXFP4)", elem_bits);
    int place = place_of(x[0].device);
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_piece(host, &q[i], &scales[i], &x[i], elem_bits, place,
                             piece_name(names, i, buf, sizeof buf));
        if (rc)
            return rc;
    }
    if (place == 1) {
        for (uint32_t i = 0; i < n; i++) {
            int rc = elem_bits == 8 ? kern_quant_mxfp8(&q[i], &scales[i], &x[i])
                                    : kern_quant_mxfp4(&q[i], &scales[i], &x[i]);
            if (rc == REFIT_ECORRUPT)
                return corrupt(host, elem_bits, piece_name(names, i, buf, sizeof buf));
            if (rc)
                return ctx_error(host, rc, "quant_mx (%s): tensor %s: refused: %s",
                                 fmt_name(elem_bits), piece_name(names, i, buf, sizeof buf),
                                 refit_strerror(rc));
        }
        return REFIT_OK;
    }
#ifdef REFIT_HAVE_CUDA
    if (backend_for_device(x[0].device)) {
        int dev = x[0].device.device_id;
        /* E4M3 by the conversion instruction where the backend found it
         * equal to the reference on every finite f32 (checked once) */
        dev_call c = {n, q, scales, x, elem_bits,
                      elem_bits == 8 && backend_cuda_fp8_encoder(dev, NULL, stream) == 1, -1};
        int rc = backend_cuda_run(dev, stream, dev_launch, &c);
        int named = c.bad >= 0 && (uint32_t)c.bad < n;
        if (rc == REFIT_ECORRUPT && named)
            return corrupt(host, elem_bits, piece_name(names, (uint32_t)c.bad, buf, sizeof buf));
        if (rc)
            return ctx_error(host, rc, "quant_mx (%s)%s%s: %s", fmt_name(elem_bits),
                             named ? ": tensor " : "",
                             named ? piece_name(names, (uint32_t)c.bad, buf, sizeof buf) : "",
                             backend_cuda_last_error());
        return REFIT_OK;
    }
#endif
    (void)stream;
    return ctx_error(host, REFIT_EUNSUPPORTED, "quant_mx (%s): tensor %s: no kernel for CUDA "
                     "device %d here (a build without CUDA, or the runtime sees no device)",
                     fmt_name(elem_bits), piece_name(names, 0, buf, sizeof buf),
                     x[0].device.device_id);
}
