/* The launch table of pgpu.h over the host's GPU service (format.h):
 * the plugin's embedded image loaded once per context by gpu_load, its
 * kernels found by gpu_kernel and launched by gpu_launch after the host's
 * queued copies, scratch lent per update, the module's status word read
 * by the host at finalize. Nothing here waits. */
#include <string.h>

#include "plugins/common/pgpu_host.h"

static pgpu_host *of(pgpu *g)
{
    return (pgpu_host *)(void *)g;
}

/* A host service failed: its message is set (host->error), so the table's
 * stays empty and the caller keeps the host's. */
static int host_said(pgpu *g, int rc, const char *what)
{
    (void)what;
    g->msg[0] = 0;
    return rc;
}

static int hk_kernel(pgpu *g, const char *name, void **kernel)
{
    pgpu_host *p = of(g);
    int rc = p->h->gpu_kernel(p->h->host, p->module, name, kernel);
    return rc ? host_said(g, rc, name) : REFIT_OK;
}

static int hk_launch(pgpu *g, void *kernel, uint32_t grid, uint32_t block, void **args)
{
    pgpu_host *p = of(g);
    refit_gpu_launch l = {sizeof l, {grid, 1, 1}, {block, 1, 1}, 0, args};
    int rc = p->h->gpu_launch(p->h->host, p->dev, kernel, &l, p->stream);
    return rc ? host_said(g, rc, "gpu_launch") : REFIT_OK;
}

static void *hk_scratch(pgpu *g, size_t bytes)
{
    pgpu_host *p = of(g);
    void *s = p->h->scratch(p->h->host, p->dev, bytes);
    if (!s)
        host_said(g, REFIT_ENOMEM, "scratch");
    return s;
}

/* A contiguous U8 view of bytes at ptr on the table's device. */
static refit_view bytes_view(const pgpu_host *p, void *ptr, size_t bytes, refit_device dev)
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

static int hk_zero(pgpu *g, void *ptr, size_t bytes)
{
    pgpu_host *p = of(g);
    refit_view v = bytes_view(p, ptr, bytes, p->dev);
    int rc = p->h->zero(p->h->host, &v, p->stream);
    return rc ? host_said(g, rc, "zeroing scratch") : REFIT_OK;
}

/* src goes through host scratch (lent for the update, so the copy may
 * still read it after this returns). */
static int hk_upload(pgpu *g, void *dst, const void *src, size_t bytes)
{
    pgpu_host *p = of(g);
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    void *stage = p->h->scratch(p->h->host, cpu, bytes);
    if (!stage)
        return host_said(g, REFIT_ENOMEM, "host scratch for a table");
    memcpy(stage, src, bytes);
    refit_view d = bytes_view(p, dst, bytes, p->dev), s = bytes_view(p, stage, bytes, cpu);
    int rc = p->h->copy(p->h->host, &d, &s, p->stream);
    return rc ? host_said(g, rc, "uploading a table") : REFIT_OK;
}

int pgpu_host_init(pgpu_host *p, const refit_host_v2 *h, const refit_fmt_module *m,
                   refit_device dev, void *stream, const void *image, size_t image_size,
                   uint32_t n_names, const char *const *names, const char *what)
{
    memset(p, 0, sizeof *p);
    p->h = h;
    p->dev = dev;
    p->stream = stream;
    p->g.kernel = hk_kernel;
    p->g.launch = hk_launch;
    p->g.scratch = hk_scratch;
    p->g.zero = hk_zero;
    p->g.upload = hk_upload;
    refit_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    if (h->device_info(h->host, dev, &di) == REFIT_OK && REFIT_ELEM_HAS(di.struct_size,
        refit_device_info, multiprocessors))
        p->g.multiprocessors = di.multiprocessors;
    if (p->g.multiprocessors <= 0)
        p->g.multiprocessors = 1;
    int rc = h->gpu_load(h->host, image, image_size, &p->module);
    if (!rc)
        rc = h->status_word(h->host, m, dev, n_names, names, what, stream, &p->g.status);
    return rc;
}
