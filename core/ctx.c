/* The context: one per engine worker. Holds the error message, the format
 * registry and the model. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/txn_journal.h"
#include "kernels/quant_fp8.h"

char *xstrdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

int grow_array(void **arr, uint32_t *cap, uint32_t n, size_t es)
{
    if (n < *cap)
        return REFIT_OK;
    if (*cap > UINT32_MAX / 2)
        return REFIT_ENOMEM;
    uint32_t nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, (size_t)nc * es);
    if (!p)
        return REFIT_ENOMEM;
    memset((char *)p + (size_t)*cap * es, 0, (size_t)(nc - *cap) * es);
    *arr = p;
    *cap = nc;
    return REFIT_OK;
}

int ctx_verror(refit_ctx *ctx, int status, const char *fmt, va_list ap)
{
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    return status;
}

int ctx_error(refit_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_verror(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- services handed to formats ---- */

static int host_error(void *host, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_verror(host, status, fmt, ap);
    va_end(ap);
    return status;
}

static void host_log(void *host, int level, const char *fmt, ...)
{
    (void)host;
    if (level > 1 && !getenv("REFIT_DEBUG"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("refit: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char *host_param(void *host, const refit_fmt_module *m, const char *key)
{
    (void)host;
    return params_get(m->params, key);
}

static void *host_alloc(void *host, size_t n)
{
    (void)host;
    return malloc(n ? n : 1);
}

static void host_free(void *host, void *p)
{
    (void)host;
    free(p);
}

static int host_copy(void *host, const refit_view *dst, const refit_view *src, void *stream)
{
    const backend *be = backend_for_device(dst->device);
    if (!be)
        return ctx_error(host, REFIT_EUNSUPPORTED, "no backend for device type %d",
                         dst->device.device_type);
    int rc = be->copy(dst, src, stream);
    if (rc)
        return ctx_error(host, rc, "copy failed: %s", refit_strerror(rc));
    return REFIT_OK;
}

/* ---- post-load kernels (format.h: quant_fp8): the CPU reference on host
 * memory, its CUDA twin (kernels/quant_fp8.cu) on device memory. ---- */

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

static int host_quant_fp8(void *host, uint32_t n, const refit_view *q, const refit_view *scale,
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

static void ctx_init_host(refit_ctx *ctx)
{
    refit_host_v1 *h = &ctx->host;
    h->abi_version = REFIT_FORMAT_ABI_VERSION;
    h->struct_size = sizeof *h;
    h->host = ctx;
    h->error = host_error;
    h->log = host_log;
    h->param = host_param;
    h->mem_alloc = host_alloc;
    h->mem_free = host_free;
    h->copy = host_copy;
    h->quant_fp8 = host_quant_fp8;
    void svc_quant_int4_install(refit_host_v1 *); /* core/svc_quant_int4.c */
    svc_quant_int4_install(h);
    int svc_quant_nvfp4(void *, uint32_t, const refit_nvfp4_piece *, void *); /* core/svc_quant_nvfp4.c */
    h->quant_nvfp4 = svc_quant_nvfp4;
    int svc_quant_mx(void *, uint32_t, const refit_view *, const refit_view *, const refit_view *, const char *const *, int, void *); /* core/svc_quant_mx.c */
    h->quant_mx = svc_quant_mx;
}

/* ---- public ---- */

int refit_open(refit_ctx **out, const refit_options *opt)
{
    refit_options defaults = REFIT_OPTIONS_INIT;
    if (!out)
        return REFIT_EINVAL;
    *out = NULL;
    if (!opt)
        opt = &defaults;
    if (opt->version < 1 || opt->version > REFIT_OPTIONS_VERSION)
        return REFIT_EINVAL;
    /* A version 1 caller's struct ends at journal_best_effort: read no
     * further, the rest keeps its defaults. */
    refit_options o = defaults;
    if (opt->version == 1)
        memcpy(&o, opt, offsetof(refit_options, undo_device_budget));
    else
        o = *opt;
    o.version = REFIT_OPTIONS_VERSION;
    opt = &o;
    refit_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return REFIT_ENOMEM;
    ctx->worker_id = xstrdup(opt->worker_id ? opt->worker_id : "worker");
    ctx->rank = opt->rank;
    const char *jp = opt->journal_path ? opt->journal_path : getenv("REFIT_JOURNAL");
    if (jp && !*jp) /* "" turns the journal off, whatever the environment says */
        jp = NULL;
    ctx->journal_path = xstrdup(jp);
    ctx->plugin_dirs = xstrdup(opt->plugin_dirs);
    ctx->staging_budget = opt->staging_budget ? opt->staging_budget : (1ull << 30);
    ctx->journal_best_effort = opt->journal_best_effort != 0;
    ctx->undo_device_budget = opt->undo_device_budget;
    ctx->log_fn = opt->log_fn;
    ctx->log_user = opt->log_user;
    ctx_init_host(ctx);
    int rc = REFIT_ENOMEM;
    if (!ctx->worker_id || (jp && !ctx->journal_path) ||
        (opt->plugin_dirs && !ctx->plugin_dirs) ||
        (rc = formats_register_builtin(ctx)) != REFIT_OK) {
        refit_close(ctx);
        return rc;
    }
    txj_open(ctx); /* a failure is kept for begin to report */
    *out = ctx;
    return REFIT_OK;
}

void refit_close(refit_ctx *ctx)
{
    if (!ctx)
        return;
    refit_model_destroy(ctx->model);
    formats_unload(ctx); /* after the model: its modules may call release */
    txj_close(ctx);
    free(ctx->worker_id);
    free(ctx->journal_path);
    free(ctx->plugin_dirs);
    free(ctx);
}

const char *refit_errmsg(const refit_ctx *ctx)
{
    return ctx ? ctx->errmsg : "no context";
}

const refit_format_v1 *ctx_find_format(const refit_ctx *ctx, const char *name)
{
    for (uint32_t i = 0; i < ctx->n_formats; i++)
        if (!strcmp(ctx->formats[i]->name, name))
            return ctx->formats[i];
    return NULL;
}

int refit_format_register(refit_ctx *ctx, const refit_format_v1 *fmt)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    if (!fmt)
        return ctx_error(ctx, REFIT_EINVAL, "refit_format_register: format is NULL");
    if (fmt->abi_version == 0 || fmt->abi_version > REFIT_FORMAT_ABI_VERSION)
        return ctx_error(ctx, REFIT_EFORMAT, "invalid version %u on format '%s' (this refit knows 1..%d)",
                         fmt->abi_version, fmt->name ? fmt->name : "?", REFIT_FORMAT_ABI_VERSION);
    if (fmt->struct_size < sizeof(refit_format_v1))
        return ctx_error(ctx, REFIT_EFORMAT, "format '%s': struct_size %u is smaller than ABI %u's %zu",
                         fmt->name ? fmt->name : "?", fmt->struct_size, fmt->abi_version,
                         sizeof(refit_format_v1));
    if (!fmt->name || !*fmt->name || !fmt->plan)
        return ctx_error(ctx, REFIT_EFORMAT, "format without %s", fmt->plan ? "a name" : "a plan function");
    int yrc = formats_yield_plugin(ctx, fmt); /* in-process beats a plugin found on a path */
    if (yrc)
        return yrc;
    if (ctx_find_format(ctx, fmt->name))
        return ctx_error(ctx, REFIT_EEXIST, "format '%s' is already registered", fmt->name);
    if (ctx->model && ctx->model->sealed)
        return ctx_error(ctx, REFIT_ESTATE, "format '%s': the model is already sealed", fmt->name);
    if (ctx->n_formats == REFIT_MAX_FORMATS)
        return ctx_error(ctx, REFIT_ENOMEM, "format '%s': more than %d formats", fmt->name,
                         REFIT_MAX_FORMATS);
    ctx->formats[ctx->n_formats++] = fmt;
    return REFIT_OK;
}

refit_health refit_worker_health(const refit_ctx *ctx)
{
    if (!ctx || !ctx->model || !ctx->model->sealed)
        return REFIT_HEALTH_EMPTY;
    return model_health(ctx->model);
}

const char *refit_worker_version(const refit_ctx *ctx)
{
    if (refit_worker_health(ctx) != REFIT_HEALTH_READY)
        return NULL;
    return model_version_text(ctx->model);
}

int refit_check_serving(refit_ctx *ctx)
{
    if (!ctx)
        return REFIT_EINVAL;
    ctx_clear_error(ctx);
    refit_model *m = ctx->model;
    switch (refit_worker_health(ctx)) {
    case REFIT_HEALTH_READY:
        return REFIT_OK;
    case REFIT_HEALTH_POISONED:
        return ctx_error(ctx, REFIT_EPOISONED,
                         "worker %s is POISONED: %u module(s) hold bytes of an aborted update; "
                         "serving refused until a replay or full reload succeeds",
                         ctx->worker_id, m->n_dirty);
    case REFIT_HEALTH_UPDATING:
        return ctx_error(ctx, REFIT_ESTATE, "worker %s is UPDATING: an update is open",
                         ctx->worker_id);
    case REFIT_HEALTH_EMPTY:
    default:
        return ctx_error(ctx, REFIT_ESTATE, "worker %s is EMPTY: %s", ctx->worker_id,
                         !m || !m->sealed ? "no sealed model"
                                          : "some modules were never loaded");
    }
}
