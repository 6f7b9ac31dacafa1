/* An out-of-tree format on refit's format ABI 2 (pkg-config refit-format):
 * runtime = 2 * checkpoint, F32. Host memory: the reference below. A CUDA
 * device: its own kernel (scale2.cu), embedded as scale2_image
 * (scale2_image.c, made by refit-embed at build time), loaded, found and
 * launched through the host's GPU service (the SDK's refit/sdk/pgpu_host.h),
 * NaN reported through the module's status word; the post-load never
 * waits. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <refit/format.h>

#ifdef SCALE2_HAVE_DEVICE_CODE
#include <refit/sdk/pgpu_host.h>

extern const unsigned char scale2_image[];
extern const size_t scale2_image_size;
#endif

static int64_t numel(const refit_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

static int contiguous(const refit_view *v)
{
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->strides[d] != want)
            return 0;
        want *= v->shape[d];
    }
    return 1;
}

static int is_f32(refit_dtype d)
{
    return d.code == REFIT_DTYPE_FLOAT && d.bits == 32 && d.lanes == 1;
}

static int scale2_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        refit_fmt_ckpt *c = refit_ckpt(m, i);
        const refit_view *rt = &refit_runtime(m, (uint32_t)c->target_index)->view;
        if (!is_f32(c->dtype) || !is_f32(rt->dtype))
            return h->error(h->host, REFIT_EUNSUPPORTED, "module %s, tensor %s: scale2 takes "
                            "f32 into f32, not %s into %s", m->name, c->name,
                            h->dtype_name(h->host, c->dtype), h->dtype_name(h->host, rt->dtype));
        int64_t n = 1;
        for (int d = 0; d < c->ndim; d++)
            n *= c->shape[d];
        if (!contiguous(rt) || numel(rt) != n)
            return h->error(h->host, REFIT_EMISMATCH, "module %s, tensor %s: scale2 fills a "
                            "whole contiguous runtime tensor", m->name, c->name);
        c->route = REFIT_ROUTE_STAGED;
    }
    /* post_load only reads its staged views: the host may hand it the
     * caller's source bytes instead of a staged copy */
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_STAGED_IN_PLACE;
    return REFIT_OK;
}

static int post_host(const refit_host_v2 *h, const refit_fmt_module *m)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        const float *in = c->staged.data;
        float *out = refit_runtime(m, (uint32_t)c->target_index)->view.data;
        int64_t n = numel(&c->staged);
        for (int64_t e = 0; e < n; e++)
            if (!isfinite(in[e])) /* as the device's message: the flat element */
                return h->error(h->host, REFIT_ECORRUPT, "module %s, tensor %s, element %lld: "
                                "NaN or infinity in the weight", m->name, c->name,
                                (long long)e);
        for (int64_t e = 0; e < n; e++)
            out[e] = 2.0f * in[e];
    }
    return REFIT_OK;
}

static int post_device(const refit_host_v2 *h, const refit_fmt_module *m, refit_device dev,
                       void *stream)
{
#ifdef SCALE2_HAVE_DEVICE_CODE
    /* piece i is checkpoint tensor i: every one named, however many (the
     * host copies the names, so the table goes once the word is taken) */
    const char **names = h->mem_alloc(h->host, (size_t)m->n_ckpt * sizeof *names);
    if (!names)
        return h->error(h->host, REFIT_ENOMEM, "module %s: no memory for %u tensor names",
                        m->name, m->n_ckpt);
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        names[i] = refit_ckpt(m, i)->name;
    /* the SDK's launch table over the host's GPU service: the image loaded
     * (once per context), the module's status key taken (piece and
     * element; a status word from a host without status_word_at) */
    refit_pgpu_host g;
    int rc = refit_pgpu_host_init_at(&g, h, m, dev, stream, scale2_image, scale2_image_size,
                                     m->n_ckpt, names, "NaN or infinity in the weight");
    h->mem_free(h->host, names);
    void *kern = NULL;
    if (!rc)
        rc = g.g.kernel(&g.g, "scale2_f32", &kern);
    uint32_t *word = g.g.status;
    unsigned long long *key = g.g.status_at;
    for (uint32_t i = 0; i < m->n_ckpt && !rc; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        float *out = refit_runtime(m, (uint32_t)c->target_index)->view.data;
        const float *in = c->staged.data;
        long long count = (long long)numel(&c->staged);
        unsigned int piece = i;
        void *args[] = {&out, &in, &count, &piece, &word, &key};
        uint32_t blocks = (uint32_t)((count + 255) / 256);
        rc = g.g.launch(&g.g, kern, blocks ? (blocks < 4096 ? blocks : 4096) : 1, 256, args);
    }
    return rc;
#else
    (void)stream;
    return h->error(h->host, REFIT_EUNSUPPORTED, "module %s: scale2 was built without its "
                    "device code (no nvcc), so it cannot run on device type %d", m->name,
                    dev.device_type);
#endif
}

static int scale2_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    if (m->n_ckpt == 0)
        return REFIT_OK;
    refit_device dev = refit_ckpt(m, 0)->staged.device;
    refit_device_info di = {.struct_size = sizeof di};
    if (h->device_info(h->host, dev, &di) || !di.served)
        return h->error(h->host, REFIT_EUNSUPPORTED, "module %s: no backend serves device type "
                        "%d", m->name, dev.device_type);
    return di.host_access ? post_host(h, m) : post_device(h, m, dev, stream);
}

REFIT_PLUGIN_EXPORT const refit_format_v2 refit_format_plugin_v2 = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "scale2",
    .plan = scale2_plan,
    .post_load = scale2_post_load,
    .release = NULL,
#ifdef SCALE2_MIN_CC /* refit refuses an older GPU at seal, naming it */
    .min_compute_capability = SCALE2_MIN_CC,
#endif
};
