/* refit format SDK: refit/sdk/pgpu.h's table over the host's GPU service
 * (refit/format.h), for one module's post-load on one CUDA device: the
 * plugin's embedded image loaded once per context by gpu_load, its kernels
 * found by gpu_kernel and launched by gpu_launch after the host's queued
 * copies, scratch lent per update, the module's status word read by the
 * host at finalize. Nothing here waits. Header-only. */
#ifndef REFIT_SDK_PGPU_HOST_H
#define REFIT_SDK_PGPU_HOST_H

#include <string.h>

#include <refit/sdk/pgpu.h>

typedef struct refit_pgpu_host {
    refit_pgpu g;            /* first: a refit_pgpu_host is passed as its refit_pgpu */
    const refit_host_v2 *h;
    refit_device dev;
    void *stream;
    void *module;            /* the loaded image */
} refit_pgpu_host;

static inline refit_pgpu_host *refit_pgpu_host_of(refit_pgpu *g)
{
    return (refit_pgpu_host *)(void *)g;
}

/* A host service failed: its message is set (host->error), so the table's
 * stays empty and the caller keeps the host's. */
static inline int refit_pgpu_host_said(refit_pgpu *g, int rc, const char *what)
{
    (void)what;
    g->msg[0] = 0;
    return rc;
}

static inline int refit_pgpu_host_kernel(refit_pgpu *g, const char *name, void **kernel)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    int rc = p->h->gpu_kernel(p->h->host, p->module, name, kernel);
    return rc ? refit_pgpu_host_said(g, rc, name) : REFIT_OK;
}

static inline int refit_pgpu_host_launch(refit_pgpu *g, void *kernel, uint32_t grid,
                                         uint32_t block, void **args)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    refit_gpu_launch l = {sizeof l, {grid, 1, 1}, {block, 1, 1}, 0, args};
    int rc = p->h->gpu_launch(p->h->host, p->dev, kernel, &l, p->stream);
    return rc ? refit_pgpu_host_said(g, rc, "gpu_launch") : REFIT_OK;
}

static inline int refit_pgpu_host_launch_dims(refit_pgpu *g, void *kernel,
                                              const refit_gpu_launch *l)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    int rc = p->h->gpu_launch(p->h->host, p->dev, kernel, l, p->stream);
    return rc ? refit_pgpu_host_said(g, rc, "gpu_launch") : REFIT_OK;
}

static inline void *refit_pgpu_host_scratch(refit_pgpu *g, size_t bytes)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    void *s = p->h->scratch(p->h->host, p->dev, bytes);
    if (!s)
        refit_pgpu_host_said(g, REFIT_ENOMEM, "scratch");
    return s;
}

/* A contiguous U8 view of `bytes` at ptr on dev (the table's device, or the
 * CPU for host scratch). */
static inline refit_view refit_pgpu_host_bytes_view(const refit_pgpu_host *p, void *ptr,
                                                    size_t bytes, refit_device dev)
{
    refit_view v;
    memset(&v, 0, sizeof v);
    v.data = ptr;
    v.device = dev;
    v.dtype.code = REFIT_DTYPE_UINT;
    v.dtype.bits = 8;
    v.dtype.lanes = 1;
    v.ndim = 1;
    v.shape[0] = (int64_t)bytes;
    v.strides[0] = 1;
    (void)p;
    return v;
}

static inline int refit_pgpu_host_zero(refit_pgpu *g, void *ptr, size_t bytes)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    refit_view v = refit_pgpu_host_bytes_view(p, ptr, bytes, p->dev);
    int rc = p->h->zero(p->h->host, &v, p->stream);
    return rc ? refit_pgpu_host_said(g, rc, "zeroing scratch") : REFIT_OK;
}

/* src goes through host scratch (lent for the update, so the copy may
 * still read it after this returns). */
static inline int refit_pgpu_host_upload(refit_pgpu *g, void *dst, const void *src, size_t bytes)
{
    refit_pgpu_host *p = refit_pgpu_host_of(g);
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    void *stage = p->h->scratch(p->h->host, cpu, bytes);
    if (!stage)
        return refit_pgpu_host_said(g, REFIT_ENOMEM, "host scratch for a table");
    memcpy(stage, src, bytes);
    refit_view d = refit_pgpu_host_bytes_view(p, dst, bytes, p->dev);
    refit_view s = refit_pgpu_host_bytes_view(p, stage, bytes, cpu);
    int rc = p->h->copy(p->h->host, &d, &s, p->stream);
    return rc ? refit_pgpu_host_said(g, rc, "uploading a table") : REFIT_OK;
}

/* The table without a status word (refit_pgpu_host_init and _init_many
 * take one): the image loaded, the device's multiprocessors read. */
static inline int refit_pgpu_host_setup(refit_pgpu_host *p, const refit_host_v2 *h,
                                        refit_device dev, void *stream, const void *image,
                                        size_t image_size)
{
    memset(p, 0, sizeof *p);
    p->h = h;
    p->dev = dev;
    p->stream = stream;
    p->g.kernel = refit_pgpu_host_kernel;
    p->g.launch = refit_pgpu_host_launch;
    p->g.scratch = refit_pgpu_host_scratch;
    p->g.zero = refit_pgpu_host_zero;
    p->g.upload = refit_pgpu_host_upload;
    p->g.launch_dims = refit_pgpu_host_launch_dims;
    refit_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    if (h->device_info(h->host, dev, &di) == REFIT_OK && REFIT_ELEM_HAS(di.struct_size,
        refit_device_info, multiprocessors))
        p->g.multiprocessors = di.multiprocessors;
    if (p->g.multiprocessors <= 0)
        p->g.multiprocessors = 1;
    return h->gpu_load(h->host, image, image_size, &p->module);
}

/* Load the plugin's image (once per context: the host keeps it) and take
 * module m's status word on dev: its kernels lower it to a piece index,
 * and the host fails the update at finalize naming m and names[index]
 * with `what`. Returns REFIT_OK or the host's status (message set through
 * host->error). */
static inline int refit_pgpu_host_init(refit_pgpu_host *p, const refit_host_v2 *h,
                                       const refit_fmt_module *m, refit_device dev, void *stream,
                                       const void *image, size_t image_size, uint32_t n_names,
                                       const char *const *names, const char *what)
{
    int rc = refit_pgpu_host_setup(p, h, dev, stream, image, image_size);
    if (!rc)
        rc = h->status_word(h->host, m, dev, n_names, names, what, stream, &p->g.status);
    return rc;
}

/* As refit_pgpu_host_init, with the element too where the host has
 * status_word_at: p->g.status_at is then the module's key and the host's
 * message names the element; a host without it gives p->g.status (and
 * status_at NULL), so kernels lower whichever is set. */
static inline int refit_pgpu_host_init_at(refit_pgpu_host *p, const refit_host_v2 *h,
                                          const refit_fmt_module *m, refit_device dev,
                                          void *stream, const void *image, size_t image_size,
                                          uint32_t n_names, const char *const *names,
                                          const char *what)
{
    if (!REFIT_HOST_HAS(h, status_word_at))
        return refit_pgpu_host_init(p, h, m, dev, stream, image, image_size, n_names, names,
                                    what);
    int rc = refit_pgpu_host_setup(p, h, dev, stream, image, image_size);
    if (!rc)
        rc = h->status_word_at(h->host, m, dev, n_names, names, what, stream, &p->g.status_at);
    return rc;
}

/* For a post_load_many: one status word over the pieces of several
 * modules, piece i being tensor names[i] of module mods[i] (the host's
 * status_word_many); the host then names the right module. A host that
 * predates status_word_many: REFIT_EUNSUPPORTED (post_load each module). */
static inline int refit_pgpu_host_init_many(refit_pgpu_host *p, const refit_host_v2 *h,
                                            refit_device dev, void *stream, const void *image,
                                            size_t image_size, uint32_t n,
                                            const refit_fmt_module *const *mods,
                                            const char *const *names, const char *what)
{
    if (!REFIT_HOST_HAS(h, status_word_many))
        return h->error(h->host, REFIT_EUNSUPPORTED, "the host has no status_word_many");
    int rc = refit_pgpu_host_setup(p, h, dev, stream, image, image_size);
    if (!rc)
        rc = h->status_word_many(h->host, dev, n, mods, names, what, stream, &p->g.status);
    return rc;
}

#endif
