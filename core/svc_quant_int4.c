/* The int4 format's host services (include/refit/format.h):
 *
 *   quant_int4  pieces checked as the CPU reference checks them, then run
 *               where the views live: host memory (CPU, pinned) by
 *               kern_quant_int4, a CUDA device by kern_quant_int4_cuda
 *               (plugins/int4/quant_int4.cu) through backend_cuda_run, bit for
 *               bit the same bytes.
 *   fetch       a few bytes of a staged tensor back to host memory (the
 *               checkpoint's weight_shape, which post-load checks), through
 *               the backend's undo save and a wait for the stream.
 *
 * Wired into refit_host_v2 by ctx_init_host (core/ctx.c). */
#include <stdio.h>
#include <string.h>

#include "core/backend.h"
#include "core/internal.h"
#include "core/svc_quant.h"
#include "kernels/copy.h"
#include "plugins/int4/quant_int4.h"
#ifdef REFIT_HAVE_CUDA
#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#endif

void svc_quant_int4_install(refit_host_v2 *h);

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

static int corrupt(void *host, const char *name)
{
    return ctx_error(host, REFIT_ECORRUPT, "quant_int4: tensor %s: NaN or infinity in the "
                     "weight, or a group whose scale is past the scale dtype's range; "
                     "refusing to quantize it", name);
}

/* Piece i as kern_quant_int4 takes it, and on the call's place. */
static int check_piece(void *host, const refit_view *q, const refit_view *s, const refit_view *x,
                       int64_t group, int place, const char *name)
{
    int rc = kern_quant_int4_check(q, s, x, group);
    if (rc == REFIT_EUNSUPPORTED)
        return ctx_error(host, rc, "quant_int4: tensor %s: quantizes f32/f16/bf16 into 32-bit "
                         "words with f32/f16/bf16 scales, not %s into %s with %s scales", name,
                         refit_dtype_name(x->dtype), refit_dtype_name(q->dtype),
                         refit_dtype_name(s->dtype));
    if (rc) {
        int64_t n = x->ndim == 2 ? x->shape[0] : -1, k = x->ndim == 2 ? x->shape[1] : -1;
        return ctx_error(host, rc, "quant_int4: tensor %s: weight [%lld, %lld] needs 2-D words "
                         "[%lld, %lld] and scales [%lld, %lld] for group %lld (views are %d-, "
                         "%d- and %d-D)", name, (long long)n, (long long)k, (long long)n,
                         (long long)((k + 7) / 8), (long long)n,
                         (long long)(group > 0 ? (k + group - 1) / group : 1), (long long)group,
                         x->ndim, q->ndim, s->ndim);
    }
    if (!place || place_of(x->device) != place || place_of(q->device) != place ||
        place_of(s->device) != place)
        return ctx_error(host, REFIT_EUNSUPPORTED, "quant_int4: tensor %s: weight, words and "
                         "scales on device types %d, %d, %d: every view of a call must be in "
                         "host memory, or all on one CUDA device", name,
                         x->device.device_type, q->device.device_type, s->device.device_type);
    return REFIT_OK;
}

#ifdef REFIT_HAVE_CUDA
typedef struct dev_call {
    uint32_t n;
    const refit_view *q, *s, *x;
    int64_t group;
    int32_t bad;
} dev_call;

static int dev_launch(void *arg, void *stream)
{
    dev_call *c = arg;
    return kern_quant_int4_cuda(c->n, c->q, c->s, c->x, c->group, &c->bad, stream);
}
#endif

static int svc_quant_int4(void *host, uint32_t n, const refit_view *q, const refit_view *s,
                          const refit_view *x, const char *const *names, int64_t group,
                          void *stream)
{
    char buf[16];
    if (n == 0)
        return REFIT_OK;
    if (!q || !s || !x || group < 0)
        return ctx_error(host, REFIT_EINVAL, "quant_int4: views missing, or group %lld is "
                         "negative (0: one scale per row)", (long long)group);
    int place = place_of(x[0].device);
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_piece(host, &q[i], &s[i], &x[i], group, place,
                             piece_name(names, i, buf, sizeof buf));
        if (rc)
            return rc;
    }
    if (place == 1) {
        for (uint32_t i = 0; i < n; i++) {
            int rc = kern_quant_int4(&q[i], &s[i], &x[i], group);
            if (rc == REFIT_ECORRUPT)
                return corrupt(host, piece_name(names, i, buf, sizeof buf));
            if (rc)
                return ctx_error(host, rc, "quant_int4: tensor %s: refused: %s",
                                 piece_name(names, i, buf, sizeof buf), refit_strerror(rc));
        }
        return REFIT_OK;
    }
#ifdef REFIT_HAVE_CUDA
    if (backend_for_device(x[0].device)) {
        dev_call c = {n, q, s, x, group, -1};
        int rc = backend_cuda_run(x[0].device.device_id, stream, dev_launch, &c);
        int named = c.bad >= 0 && (uint32_t)c.bad < n;
        if (rc == REFIT_ECORRUPT && named)
            return corrupt(host, piece_name(names, (uint32_t)c.bad, buf, sizeof buf));
        if (rc)
            return ctx_error(host, rc, "quant_int4%s%s: %s", named ? ": tensor " : "",
                             named ? piece_name(names, (uint32_t)c.bad, buf, sizeof buf) : "",
                             backend_cuda_last_error());
        return REFIT_OK;
    }
#endif
    (void)stream;
    return ctx_error(host, REFIT_EUNSUPPORTED, "quant_int4: tensor %s: no kernel for CUDA device "
                     "%d here (a build without CUDA, or the runtime sees no device)",
                     piece_name(names, 0, buf, sizeof buf), x[0].device.device_id);
}

void svc_quant_int4_install(refit_host_v2 *h)
{
    h->quant_int4 = svc_quant_int4;
}
