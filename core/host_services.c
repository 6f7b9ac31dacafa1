/* The host services of format ABI 2 (core/host_services.h): nothing here
 * names a format. Views a format hands over while it works on a module are
 * checked against that module's own memory before any byte moves. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host_services.h"
#include "core/util.h"
#include "core/ctx.h"
#include "core/model.h"
#include "kernels/copy.h"

#define SCRATCH_ALIGN 256

/* A piece of scratch lent in this update (views are checked against it). */
typedef struct scratch_block {
    refit_device device;
    char *data;            /* aligned start lent out */
    size_t bytes;
} scratch_block;

/* Scratch memory kept across updates: pieces are lent from a device's
 * pools, which are emptied (not freed) when the update ends, so an update
 * allocates only when it needs more than any before it. A device that
 * needed several pools in one update gets them merged into one at its
 * end (after the update's last wait). */
typedef struct scratch_pool {
    refit_device device;
    void *base;            /* what was allocated */
    char *data;            /* aligned start */
    size_t cap, used;
} scratch_pool;

#define SCRATCH_POOL_MIN ((size_t)1 << 20)

typedef struct gpu_image {
    const void *image;     /* the plugin's pointer: one load per image */
    void *lib;
} gpu_image;

/* One entry of the update's status area, in post-load order: a device
 * word a post-load took, or a failure its post-load already reported
 * (failed: the message, held until finalize). */
typedef struct status_slot {
    const refit_fmt_module *m;     /* NULL for a post_load_many word: */
    const refit_fmt_module **mods; /*   then the module of each name */
    refit_device device;
    uint32_t array;        /* its array (host_svc.arrays) */
    uint32_t index;        /* slot index in that array */
    int at;                /* a status_word_at key (piece and element) */
    uint32_t n_names;
    char **names;
    char *what;
    int status;            /* failed: its status */
    char *failed;          /* failed: the message; NULL for a device word */
} status_slot;

/* Each slot is 8 bytes (SLOT_WORDS words), 8-byte aligned: a status_word
 * is its first 32-bit word, a status_word_at key the whole 64 bits. */
#define SLOT_WORDS 2u
typedef struct status_array {
    int device;            /* CUDA device id */
    uint32_t *words;       /* device memory, cap slots */
    uint32_t cap, used;
} status_array;

struct host_svc {
    const refit_fmt_module *cur;  /* the module in a format's hands, */
    const refit_fmt_module *const *batch; /* or the n_batch of a post_load_many */
    uint32_t n_batch;
    uint32_t last;                /* the batch module a view was last found in: a
                                     format works module by module, so looking
                                     there first keeps a batch linear, not n^2 */
    uint32_t slots_at_enter;      /* slots before the current call: a module's post-load
                                     runs once an update, so its word is among the rest */
    scratch_block *scratch;
    uint32_t n_scratch, cap_scratch;
    scratch_pool *pools;
    uint32_t n_pools, cap_pools;
    gpu_image *images;
    uint32_t n_images, cap_images;
    status_slot *slots;
    uint32_t n_slots, cap_slots;
    status_array *arrays;
    uint32_t n_arrays, cap_arrays;
};

/* ---- views and the module's memory ---- */

static int is_host_memory(refit_device d)
{
    return d.device_type == REFIT_DEVICE_CPU || d.device_type == REFIT_DEVICE_CUDA_HOST;
}

static int same_device(refit_device a, refit_device b)
{
    if (is_host_memory(a) && is_host_memory(b))
        return 1; /* one address space */
    return a.device_type == b.device_type && a.device_id == b.device_id;
}

/* The bytes [*lo, *hi) view v reaches; 0 when it reaches none (an empty
 * view), -1 when the extent overflows or the view is malformed. */
static int view_extent(const refit_view *v, uintptr_t *lo, uintptr_t *hi)
{
    if (v->ndim < 0 || v->ndim > REFIT_MAX_DIMS)
        return -1;
    __int128 min = 0, max = 0;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] < 0)
            return -1;
        if (v->shape[i] == 0)
            return 0;
        __int128 reach = (__int128)(v->shape[i] - 1) * v->strides[i];
        if (reach < 0)
            min += reach;
        else
            max += reach;
    }
    __int128 bits = (__int128)v->dtype.bits * (v->dtype.lanes ? v->dtype.lanes : 1);
    __int128 blo = min * bits / 8 - (min * bits % 8 != 0);
    __int128 bhi = ((max + 1) * bits + 7) / 8;
    __int128 base = (__int128)(uintptr_t)v->data;
    if (base + blo < 0 || base + bhi > (__int128)UINTPTR_MAX)
        return -1;
    *lo = (uintptr_t)(base + blo);
    *hi = (uintptr_t)(base + bhi);
    return 1;
}

static int within(const refit_view *v, uintptr_t lo, uintptr_t hi, const refit_view *area)
{
    uintptr_t alo, ahi;
    if (!area->data || !same_device(v->device, area->device) || view_extent(area, &alo, &ahi) != 1)
        return 0;
    return lo >= alo && hi <= ahi;
}

/* REFIT_OK when v lies inside the current module's runtime tensors, its
 * staged bytes (post_load) or the update's scratch; no module current:
 * nothing to check against. */
static int in_module(const refit_fmt_module *m, const refit_view *v, uintptr_t lo, uintptr_t hi)
{
    for (uint32_t i = 0; i < m->n_runtime; i++)
        if (within(v, lo, hi, &refit_runtime(m, i)->view))
            return 1;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        if (within(v, lo, hi, &refit_ckpt(m, i)->staged))
            return 1;
    return 0;
}

static int check_view(refit_ctx *ctx, const char *svc, const char *role, const refit_view *v)
{
    struct host_svc *s = ctx->svc;
    if (!v)
        return ctx_error(ctx, REFIT_EINVAL, "%s: the %s view is NULL", svc, role);
    const refit_fmt_module *m = s && s->n_batch ? s->batch[0] : NULL;
    if (!m)
        return REFIT_OK;
    uintptr_t lo, hi;
    int e = view_extent(v, &lo, &hi);
    if (e < 0)
        return ctx_error(ctx, REFIT_EINVAL, "%s: module %s: the %s view is malformed or its "
                         "extent overflows", svc, m->name, role);
    if (e == 0)
        return REFIT_OK;
    for (uint32_t j = 0; j < s->n_batch; j++) {
        uint32_t k = (s->last + j) % s->n_batch;
        if (in_module(s->batch[k], v, lo, hi)) {
            s->last = k;
            return REFIT_OK;
        }
    }
    for (uint32_t i = 0; i < s->n_scratch; i++) {
        const scratch_block *b = &s->scratch[i];
        if (same_device(v->device, b->device) && lo >= (uintptr_t)b->data &&
            hi <= (uintptr_t)b->data + b->bytes)
            return REFIT_OK;
    }
    return ctx_error(ctx, REFIT_EINVAL, "%s: module %s%s: the %s view (bytes %#llx..%#llx on "
                     "device type %d) lies outside the module's runtime tensors, staged bytes "
                     "and scratch; refused", svc, m->name,
                     s->n_batch > 1 ? " (and the other modules of its post_load_many)" : "",
                     role, (unsigned long long)lo, (unsigned long long)hi,
                     v->device.device_type);
}

/* ---- plain services ---- */

static int host_error(void *host, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctx_verror(host, status, fmt, ap);
    va_end(ap);
    return status;
}

/* The one way out for the library's messages (formats, the plugin loader,
 * core): the context's log_fn when it has one, else stderr with "refit: "
 * first. Debug lines (level 2) go to a log_fn always, to stderr only with
 * REFIT_DEBUG; finer ones (3: a default plugin directory missing) only
 * with REFIT_DEBUG, as level 2. */
static void host_log(void *host, int level, const char *fmt, ...)
{
    const refit_ctx *ctx = host;
    int debug = getenv("REFIT_DEBUG") != NULL;
    refit_log_fn fn = ctx ? ctx->log_fn : NULL;
    if (level > 2 ? !debug : level == 2 && !fn && !debug)
        return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (fn)
        fn(ctx->log_user, level > 2 ? 2 : level, line);
    else
        fprintf(stderr, "refit: %s\n", line);
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

static const char *host_dtype_name(void *host, refit_dtype dt)
{
    (void)host;
    return refit_dtype_name(dt);
}

static int host_copy(void *host, const refit_view *dst, const refit_view *src, void *stream)
{
    int rc = check_view(host, "copy", "destination", dst);
    if (!rc)
        rc = check_view(host, "copy", "source", src);
    if (rc)
        return rc;
    const backend *be = backend_for_device(dst->device);
    if (!be)
        return ctx_error(host, REFIT_EUNSUPPORTED, "copy: no backend for device type %d",
                         dst->device.device_type);
    rc = be->copy(dst, src, stream);
    return rc ? ctx_error(host, rc, "copy failed: %s", refit_strerror(rc)) : REFIT_OK;
}

static int host_zero(void *host, const refit_view *dst, void *stream)
{
    int rc = check_view(host, "zero", "destination", dst);
    if (rc)
        return rc;
    const backend *be = backend_for_device(dst->device);
    if (!be)
        return ctx_error(host, REFIT_EUNSUPPORTED, "zero: no backend for device type %d",
                         dst->device.device_type);
    rc = be->zero(dst, stream);
    return rc ? ctx_error(host, rc, "zero failed: %s", refit_strerror(rc)) : REFIT_OK;
}

static int host_fetch(void *host, void *dst, size_t bytes, const refit_view *src, void *stream)
{
    if (!dst || !src || !src->data)
        return ctx_error(host, REFIT_EINVAL, "fetch: no destination or source");
    int64_t numel = kern_view_numel(src), want = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        if (src->shape[i] != 1 && src->strides[i] != want)
            return ctx_error(host, REFIT_EINVAL, "fetch: the source view is not contiguous");
        want *= src->shape[i];
    }
    if (numel < 0 || bytes > (size_t)numel * kern_dtype_size(src->dtype))
        return ctx_error(host, REFIT_EINVAL, "fetch: %zu bytes past a view of %lld elements",
                         bytes, (long long)numel);
    int rc = check_view(host, "fetch", "source", src);
    if (rc)
        return rc;
    const backend *be = backend_for_device(src->device);
    if (!be)
        return ctx_error(host, REFIT_EUNSUPPORTED, "fetch: no backend for device type %d",
                         src->device.device_type);
    if (is_host_memory(src->device)) { /* host memory: queued copies first */
        rc = be->sync(stream);
        if (rc)
            return ctx_error(host, rc, "fetch: %s", be->last_error());
        memcpy(dst, src->data, bytes);
        return REFIT_OK;
    }
    rc = backend_read(be, dst, src->data, bytes, stream);
    if (rc)
        ctx_error(host, rc, "fetch: reading %zu bytes back failed: %s", bytes,
                  rc == REFIT_ENOMEM ? "no host memory" : be->last_error());
    return rc;
}

static int host_device_info(void *host, refit_device dev, refit_device_info *out)
{
    (void)host;
    if (!out || out->struct_size < offsetof(refit_device_info, backend) + sizeof out->backend)
        return REFIT_EINVAL;
    const backend *be = backend_for_device(dev);
    out->device = dev;
    out->served = be != NULL;
    out->host_access = is_host_memory(dev);
    out->cc_major = 0;
    out->cc_minor = 0;
    if (be && dev.device_type == REFIT_DEVICE_CUDA &&
        gpusvc_device_cc(dev.device_id, &out->cc_major, &out->cc_minor) != REFIT_OK)
        out->cc_major = out->cc_minor = 0;
    out->backend = be ? be->name : NULL;
    if (REFIT_ELEM_HAS(out->struct_size, refit_device_info, multiprocessors)) {
        out->multiprocessors = 0;
        if (be && dev.device_type == REFIT_DEVICE_CUDA)
            out->multiprocessors = gpusvc_device_sms(dev.device_id);
    }
    return REFIT_OK;
}

/* ---- scratch ---- */

static void *pool_mem(refit_device dev, size_t bytes, char *msg, size_t n)
{
    return is_host_memory(dev) ? malloc(bytes) : gpusvc_alloc(dev.device_id, bytes, msg, n);
}

static void pool_free(const scratch_pool *p)
{
    if (is_host_memory(p->device))
        free(p->base);
    else
        gpusvc_free(p->device.device_id, p->base);
}

/* A new pool of at least `cap` bytes on dev (NULL, message in msg, when
 * none is left). */
static scratch_pool *pool_add(struct host_svc *s, refit_device dev, size_t cap, char *msg,
                              size_t n)
{
    if (grow_array((void **)&s->pools, &s->cap_pools, s->n_pools, sizeof *s->pools))
        return NULL;
    void *base = pool_mem(dev, cap + SCRATCH_ALIGN, msg, n);
    if (!base)
        return NULL;
    uintptr_t a = ((uintptr_t)base + SCRATCH_ALIGN - 1) & ~(uintptr_t)(SCRATCH_ALIGN - 1);
    scratch_pool *p = &s->pools[s->n_pools++];
    *p = (scratch_pool){dev, base, (char *)a, cap, 0};
    return p;
}

static size_t align_up(size_t v)
{
    return (v + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);
}

static void *host_scratch(void *host, refit_device dev, size_t bytes)
{
    refit_ctx *ctx = host;
    struct host_svc *s = ctx->svc;
    if (!s)
        return ctx_error(ctx, REFIT_ENOMEM, "scratch: no service state"), NULL;
    if (!backend_for_device(dev))
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "scratch: no backend for device type %d",
                         dev.device_type), NULL;
    if (bytes > SIZE_MAX / 4 - SCRATCH_ALIGN)
        return ctx_error(ctx, REFIT_ENOMEM, "scratch: %zu bytes", bytes), NULL;
    if (grow_array((void **)&s->scratch, &s->cap_scratch, s->n_scratch, sizeof *s->scratch))
        return ctx_error(ctx, REFIT_ENOMEM, "scratch: out of memory"), NULL;
    size_t want = align_up(bytes ? bytes : 1), held = 0;
    scratch_pool *p = NULL;
    for (uint32_t i = 0; i < s->n_pools && !p; i++) {
        scratch_pool *q = &s->pools[i];
        if (!same_device(q->device, dev))
            continue;
        held += q->cap;
        if (q->cap - q->used >= want)
            p = q;
    }
    char msg[256] = "";
    if (!p) { /* grows geometrically: few pools, merged at the update's end */
        size_t cap = want > held ? want : held;
        p = pool_add(s, dev, cap > SCRATCH_POOL_MIN ? cap : SCRATCH_POOL_MIN, msg, sizeof msg);
    }
    if (!p)
        return ctx_error(ctx, REFIT_ENOMEM, "scratch: %zu bytes on device type %d id %d: %s",
                         bytes, dev.device_type, dev.device_id,
                         msg[0] ? msg : "out of memory"), NULL;
    char *at = p->data + p->used;
    p->used += want;
    s->scratch[s->n_scratch++] = (scratch_block){dev, at, bytes};
    return at;
}

/* The update ended (after its last wait): every pool empty again; a
 * device holding several is given one of their total size instead (or
 * none, when that allocation fails: the next update allocates again). */
static void scratch_free_all(struct host_svc *s)
{
    s->n_scratch = 0;
    for (uint32_t i = 0; i < s->n_pools; i++) {
        s->pools[i].used = 0;
        size_t total = 0;
        uint32_t count = 0;
        for (uint32_t j = i; j < s->n_pools; j++)
            if (same_device(s->pools[j].device, s->pools[i].device))
                total += s->pools[j].cap, count++;
        if (count < 2)
            continue;
        refit_device dev = s->pools[i].device;
        uint32_t k = 0;
        for (uint32_t j = 0; j < s->n_pools; j++) {
            if (j >= i && same_device(s->pools[j].device, dev))
                pool_free(&s->pools[j]);
            else
                s->pools[k++] = s->pools[j];
        }
        s->n_pools = k;
        char msg[256];
        pool_add(s, dev, total, msg, sizeof msg);
        i = (uint32_t)-1; /* start over: the array changed */
    }
}

static void scratch_release(struct host_svc *s)
{
    for (uint32_t i = 0; i < s->n_pools; i++)
        pool_free(&s->pools[i]);
    s->n_pools = 0;
}

/* ---- the GPU service ---- */

static int gpu_fail(refit_ctx *ctx, int rc, const char *svc, const char *msg)
{
    return ctx_error(ctx, rc, "%s: %s", svc, msg[0] ? msg : refit_strerror(rc));
}

static int host_gpu_load(void *host, const void *image, size_t size, void **module)
{
    refit_ctx *ctx = host;
    struct host_svc *s = ctx->svc;
    if (!image || !size || !module)
        return ctx_error(ctx, REFIT_EINVAL, "gpu_load: no image or no place for the module");
    if (!s)
        return ctx_error(ctx, REFIT_ENOMEM, "gpu_load: no service state");
    for (uint32_t i = 0; i < s->n_images; i++)
        if (s->images[i].image == image) {
            *module = s->images[i].lib;
            return REFIT_OK;
        }
    if (grow_array((void **)&s->images, &s->cap_images, s->n_images, sizeof *s->images))
        return ctx_error(ctx, REFIT_ENOMEM, "gpu_load: out of memory");
    char msg[512] = "";
    void *lib = NULL;
    int rc = gpusvc_load(image, size, &lib, msg, sizeof msg);
    if (rc)
        return gpu_fail(ctx, rc, "gpu_load", msg);
    s->images[s->n_images++] = (gpu_image){image, lib};
    *module = lib;
    return REFIT_OK;
}

static int host_gpu_kernel(void *host, void *module, const char *name, void **kernel)
{
    if (!module || !name || !kernel)
        return ctx_error(host, REFIT_EINVAL, "gpu_kernel: no module, name or output");
    char msg[512] = "";
    int rc = gpusvc_kernel(module, name, kernel, msg, sizeof msg);
    return rc ? gpu_fail(host, rc, "gpu_kernel", msg) : REFIT_OK;
}

static int host_gpu_launch(void *host, refit_device dev, void *kernel, const refit_gpu_launch *l,
                           void *stream)
{
    if (!kernel || !l || l->struct_size < sizeof *l)
        return ctx_error(host, REFIT_EINVAL, "gpu_launch: no kernel, or a launch struct of "
                         "%u bytes (ABI 2's is %zu)", l ? l->struct_size : 0, sizeof *l);
    if (dev.device_type != REFIT_DEVICE_CUDA || !backend_for_device(dev))
        return ctx_error(host, REFIT_EUNSUPPORTED, "gpu_launch: device type %d id %d is no CUDA "
                         "device this host serves", dev.device_type, dev.device_id);
    char msg[512] = "";
    int rc = gpusvc_launch(dev.device_id, kernel, l, stream, msg, sizeof msg);
    return rc ? gpu_fail(host, rc, "gpu_launch", msg) : REFIT_OK;
}

static int host_gpu_run(void *host, refit_device dev, void *stream,
                        int (*fn)(void *arg, void *stream), void *arg)
{
    if (!fn)
        return ctx_error(host, REFIT_EINVAL, "gpu_run: no function");
    if (dev.device_type != REFIT_DEVICE_CUDA || !backend_for_device(dev))
        return ctx_error(host, REFIT_EUNSUPPORTED, "gpu_run: device type %d id %d is no CUDA "
                         "device this host serves", dev.device_type, dev.device_id);
    char msg[512] = "";
    int rc = gpusvc_run(dev.device_id, stream, fn, arg, msg, sizeof msg);
    return rc ? gpu_fail(host, rc, "gpu_run", msg) : REFIT_OK;
}

/* ---- status words ---- */

/* An array on dev with a free slot: the first array is sized for want
 * (a word a post-load unit); a unit rebuilt again in the same update (a
 * delta patching two tensors of one unit) may need more, and a full one
 * is followed by another as large as all before it (words handed out
 * stay where they are). */
static status_array *status_array_for(struct host_svc *s, int dev, uint32_t want, char *msg,
                                      size_t n)
{
    uint32_t held = 0;
    for (uint32_t i = 0; i < s->n_arrays; i++)
        if (s->arrays[i].device == dev && s->arrays[i].used < s->arrays[i].cap)
            return &s->arrays[i];
        else if (s->arrays[i].device == dev)
            held += s->arrays[i].cap;
    if (held > UINT32_MAX / 2 ||
        grow_array((void **)&s->arrays, &s->cap_arrays, s->n_arrays, sizeof *s->arrays))
        return NULL;
    uint32_t cap = held > want ? held : want;
    uint32_t *w = gpusvc_alloc(dev, (size_t)cap * SLOT_WORDS * sizeof *w, msg, n);
    if (!w)
        return NULL;
    s->arrays[s->n_arrays] = (status_array){dev, w, cap, 0};
    return &s->arrays[s->n_arrays++];
}

static void slot_free(status_slot *sl)
{
    for (uint32_t i = 0; i < sl->n_names; i++)
        free(sl->names[i]);
    free(sl->names);
    free(sl->mods);
    free(sl->what);
    free(sl->failed);
}

static int take_word(refit_ctx *ctx, const refit_fmt_module *m,
                     const refit_fmt_module *const *mods, refit_device dev, uint32_t n,
                     const char *const *names, const char *what, void *stream, int at,
                     uint32_t **word);

/* status_word (at 0) and status_word_at (at 1): one slot per module and
 * update, the same one again for a second call of the same kind. */
static int module_word(refit_ctx *ctx, const char *fn, const refit_fmt_module *m,
                       refit_device dev, uint32_t n, const char *const *names, const char *what,
                       void *stream, int at, uint32_t **word)
{
    struct host_svc *s = ctx->svc;
    if (!m || !word || (n && !names))
        return ctx_error(ctx, REFIT_EINVAL, "%s: no module, names or output", fn);
    if (!s)
        return ctx_error(ctx, REFIT_ENOMEM, "%s: no service state", fn);
    if (dev.device_type != REFIT_DEVICE_CUDA || !backend_for_device(dev))
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "%s: module %s: device type %d id %d "
                         "is no CUDA device this host serves", fn, m->name, dev.device_type,
                         dev.device_id);
    for (uint32_t i = s->slots_at_enter; i < s->n_slots; i++)
        if (s->slots[i].m == m && !s->slots[i].failed) {
            const status_slot *sl = &s->slots[i];
            if (sl->at != at)
                return ctx_error(ctx, REFIT_EINVAL, "%s: module %s already took a %s this "
                                 "update", fn, m->name,
                                 sl->at ? "status_word_at" : "status_word");
            *word = s->arrays[sl->array].words + (size_t)sl->index * SLOT_WORDS;
            return REFIT_OK;
        }
    return take_word(ctx, m, NULL, dev, n, names, what, stream, at, word);
}

static int host_status_word(void *host, const refit_fmt_module *m, refit_device dev, uint32_t n,
                            const char *const *names, const char *what, void *stream,
                            uint32_t **word)
{
    return module_word(host, "status_word", m, dev, n, names, what, stream, 0, word);
}

static int host_status_word_at(void *host, const refit_fmt_module *m, refit_device dev,
                               uint32_t n, const char *const *names, const char *what,
                               void *stream, unsigned long long **key)
{
    uint32_t *w = NULL;
    int rc = module_word(host, "status_word_at", m, dev, n, names, what, stream, 1,
                         key ? &w : NULL);
    if (!rc)
        *key = (unsigned long long *)(void *)w; /* a slot is 8 bytes, 8-byte aligned */
    return rc;
}

/* A new word on dev for module m (mods NULL) or for the pieces of a
 * post_load_many (m NULL, mods[i] the module of names[i]). */
static int take_word(refit_ctx *ctx, const refit_fmt_module *m,
                     const refit_fmt_module *const *mods, refit_device dev, uint32_t n,
                     const char *const *names, const char *what, void *stream, int at,
                     uint32_t **word)
{
    struct host_svc *s = ctx->svc;
    const char *who = m ? m->name : mods[0]->name;
    char msg[256] = "";
    /* one word a post-load unit (a module, or an expert's slice) at most */
    uint32_t modules = ctx->model ? ctx->model->n_units : 1;
    status_array *arr = status_array_for(s, dev.device_id, modules ? modules : 1, msg,
                                         sizeof msg);
    if (!arr || arr->used == arr->cap)
        return ctx_error(ctx, REFIT_ENOMEM, "status_word: module %s: no word left on CUDA "
                         "device %d%s%s", who, dev.device_id, msg[0] ? ": " : "", msg);
    if (grow_array((void **)&s->slots, &s->cap_slots, s->n_slots, sizeof *s->slots))
        return ctx_error(ctx, REFIT_ENOMEM, "status_word: out of memory");
    status_slot sl = {.m = m, .device = dev, .array = (uint32_t)(arr - s->arrays),
                      .index = arr->used, .at = at,
                      .names = calloc(n ? n : 1, sizeof(char *)),
                      .what = xstrdup(what ? what : "refused by its post-load kernel")};
    int oom = !sl.names || !sl.what;
    if (!oom && mods) {
        sl.mods = malloc((n ? n : 1) * sizeof *sl.mods);
        oom = !sl.mods;
        for (uint32_t i = 0; i < n && !oom; i++)
            sl.mods[i] = mods[i];
    }
    for (uint32_t i = 0; i < n && !oom; i++, sl.n_names++)
        oom = !(sl.names[i] = xstrdup(names[i] ? names[i] : "?"));
    if (oom) {
        slot_free(&sl);
        return ctx_error(ctx, REFIT_ENOMEM, "status_word: out of memory");
    }
    uint32_t *w = arr->words + (size_t)arr->used * SLOT_WORDS;
    int rc = gpusvc_memset_word(dev.device_id, w, SLOT_WORDS, stream, msg, sizeof msg);
    if (rc) {
        slot_free(&sl);
        return ctx_error(ctx, rc, "status_word: module %s: %s", who, msg);
    }
    arr->used++;
    s->slots[s->n_slots++] = sl;
    *word = w;
    return REFIT_OK;
}

static int host_status_word_many(void *host, refit_device dev, uint32_t n,
                                 const refit_fmt_module *const *mods, const char *const *names,
                                 const char *what, void *stream, uint32_t **word)
{
    refit_ctx *ctx = host;
    struct host_svc *s = ctx->svc;
    if (!word || !n || !mods || !names)
        return ctx_error(ctx, REFIT_EINVAL, "status_word_many: no pieces, modules, names or "
                         "output");
    if (!s)
        return ctx_error(ctx, REFIT_ENOMEM, "status_word_many: no service state");
    for (uint32_t i = 0, k = 0; i < n; i++) {
        /* pieces come module by module: look on from the last one found */
        uint32_t j = 0;
        while (j < s->n_batch && s->batch[k] != mods[i]) {
            k = (k + 1) % s->n_batch;
            j++;
        }
        if (!mods[i] || j == s->n_batch)
            return ctx_error(ctx, REFIT_EINVAL, "status_word_many: piece %u (%s) names a "
                             "module that is not one of this post_load_many's %u", i,
                             names[i] ? names[i] : "?", s->n_batch);
    }
    if (dev.device_type != REFIT_DEVICE_CUDA || !backend_for_device(dev))
        return ctx_error(ctx, REFIT_EUNSUPPORTED, "status_word_many: module %s: device type %d "
                         "id %d is no CUDA device this host serves", mods[0]->name,
                         dev.device_type, dev.device_id);
    return take_word(ctx, NULL, mods, dev, n, names, what, stream, 0, word);
}

int host_services_post_load_failed(refit_ctx *ctx, const refit_fmt_module *m, int status,
                                   const char *msg)
{
    struct host_svc *s = ctx->svc;
    if (!s || grow_array((void **)&s->slots, &s->cap_slots, s->n_slots, sizeof *s->slots))
        return REFIT_ENOMEM;
    refit_device cpu = {REFIT_DEVICE_CPU, 0};
    status_slot sl = {.m = m, .device = cpu, .status = status,
                      .failed = xstrdup(msg ? msg : "post-load failed")};
    if (!sl.failed)
        return REFIT_ENOMEM;
    s->slots[s->n_slots++] = sl;
    return REFIT_OK;
}

/* Every device array the update used, read once (after its device's
 * last wait); got[a] NULL for an unused array. */
static int read_arrays(refit_ctx *ctx, struct host_svc *s, uint32_t **got)
{
    for (uint32_t a = 0; a < s->n_arrays; a++) {
        status_array *arr = &s->arrays[a];
        if (!arr->used)
            continue;
        size_t bytes = (size_t)arr->used * SLOT_WORDS * sizeof *got[a];
        if (!(got[a] = malloc(bytes)))
            return ctx_error(ctx, REFIT_ENOMEM, "post-load status: out of memory");
        char msg[256] = "";
        int rc = gpusvc_read(arr->device, got[a], arr->words, bytes, msg, sizeof msg);
        if (rc)
            return ctx_error(ctx, rc, "post-load status on CUDA device %d: %s", arr->device,
                             msg);
    }
    return REFIT_OK;
}

/* A slot as read back: REFIT_ECORRUPT naming the piece (and for a key the
 * element) its kernels lowered it to, or REFIT_OK. */
static int slot_check(refit_ctx *ctx, const status_slot *sl, const uint32_t *w)
{
    uint64_t key = 0;
    memcpy(&key, w, sizeof key); /* both words, in the device's (little-endian) order */
    uint32_t bad = sl->at ? (key == REFIT_STATUS_AT_NONE ? REFIT_STATUS_NONE
                                                          : (uint32_t)REFIT_STATUS_AT_PIECE(key))
                          : w[0];
    if (bad == REFIT_STATUS_NONE)
        return REFIT_OK;
    const refit_fmt_module *bm = sl->m ? sl->m : bad < sl->n_names ? sl->mods[bad] : sl->mods[0];
    const char *tensor = bad < sl->n_names ? sl->names[bad] : "?";
    if (sl->at)
        return ctx_error(ctx, REFIT_ECORRUPT, "module %s, tensor %s, element %llu: %s", bm->name,
                         tensor, (unsigned long long)REFIT_STATUS_AT_ELEMENT(key), sl->what);
    return ctx_error(ctx, REFIT_ECORRUPT, "module %s, tensor %s: %s", bm->name, tensor,
                     sl->what);
}

int host_services_check_status(refit_ctx *ctx)
{
    struct host_svc *s = ctx->svc;
    if (!s || !s->n_slots)
        return REFIT_OK;
    uint32_t **got = calloc(s->n_arrays + 1, sizeof *got);
    int rc = got ? read_arrays(ctx, s, got)
                 : ctx_error(ctx, REFIT_ENOMEM, "post-load status: out of memory");
    /* the first failure in the order the post-loads ran wins */
    for (uint32_t i = 0; i < s->n_slots && !rc; i++) {
        const status_slot *sl = &s->slots[i];
        if (sl->failed) {
            rc = ctx_error(ctx, sl->status, "%s", sl->failed);
            continue;
        }
        if (got[sl->array])
            rc = slot_check(ctx, sl, got[sl->array] + (size_t)sl->index * SLOT_WORDS);
    }
    for (uint32_t a = 0; got && a < s->n_arrays; a++)
        free(got[a]);
    free(got);
    return rc;
}

/* ---- life ---- */

void host_services_enter(refit_ctx *ctx, const refit_fmt_module *m)
{
    if (ctx->svc) {
        ctx->svc->cur = m;
        ctx->svc->batch = &ctx->svc->cur;
        ctx->svc->n_batch = m ? 1 : 0;
        ctx->svc->last = 0;
        ctx->svc->slots_at_enter = ctx->svc->n_slots;
    }
}

void host_services_enter_many(refit_ctx *ctx, const refit_fmt_module *const *m, uint32_t n)
{
    if (ctx->svc) {
        ctx->svc->cur = NULL;
        ctx->svc->batch = m;
        ctx->svc->n_batch = n;
        ctx->svc->last = 0;
        ctx->svc->slots_at_enter = ctx->svc->n_slots;
    }
}

void host_services_leave(refit_ctx *ctx)
{
    if (ctx->svc) {
        ctx->svc->cur = NULL;
        ctx->svc->batch = NULL;
        ctx->svc->n_batch = 0;
    }
}

void host_services_update_end(refit_ctx *ctx)
{
    struct host_svc *s = ctx->svc;
    if (!s)
        return;
    scratch_free_all(s);
    for (uint32_t i = 0; i < s->n_slots; i++)
        slot_free(&s->slots[i]);
    s->n_slots = s->slots_at_enter = 0;
    for (uint32_t a = 0; a < s->n_arrays; a++)
        s->arrays[a].used = 0;
}

void host_services_free(refit_ctx *ctx)
{
    struct host_svc *s = ctx->svc;
    if (!s)
        return;
    host_services_update_end(ctx);
    scratch_release(s);
    for (uint32_t a = 0; a < s->n_arrays; a++)
        gpusvc_free(s->arrays[a].device, s->arrays[a].words);
    for (uint32_t i = 0; i < s->n_images; i++)
        gpusvc_unload(s->images[i].lib);
    free(s->scratch);
    free(s->pools);
    free(s->images);
    free(s->slots);
    free(s->arrays);
    free(s);
    ctx->svc = NULL;
}

void host_services_init(refit_ctx *ctx)
{
    refit_host_v2 *h = &ctx->host;
    memset(h, 0, sizeof *h);
    h->abi_version = REFIT_FORMAT_ABI_VERSION;
    h->struct_size = sizeof *h;
    h->host = ctx;
    h->error = host_error;
    h->log = host_log;
    h->param = host_param;
    h->mem_alloc = host_alloc;
    h->mem_free = host_free;
    h->dtype_name = host_dtype_name;
    h->copy = host_copy;
    h->zero = host_zero;
    h->fetch = host_fetch;
    h->device_info = host_device_info;
    h->scratch = host_scratch;
    h->gpu_load = host_gpu_load;
    h->gpu_kernel = host_gpu_kernel;
    h->gpu_launch = host_gpu_launch;
    h->gpu_run = host_gpu_run;
    h->status_word = host_status_word;
    h->status_word_many = host_status_word_many;
    h->status_word_at = host_status_word_at;
    ctx->svc = calloc(1, sizeof *ctx->svc);
}

/* ---- a build without CUDA ---- */

#ifndef REFIT_HAVE_CUDA
static int no_cuda(char *msg, size_t n)
{
    snprintf(msg, n, "this refit was built without CUDA");
    return REFIT_EUNSUPPORTED;
}

int gpusvc_device_cc(int dev, int *major, int *minor)
{
    (void)dev;
    *major = *minor = 0;
    return REFIT_EUNSUPPORTED;
}

int gpusvc_device_sms(int dev)
{
    (void)dev;
    return 0;
}

void *gpusvc_alloc(int dev, size_t bytes, char *msg, size_t n)
{
    (void)dev;
    (void)bytes;
    no_cuda(msg, n);
    return NULL;
}

void gpusvc_free(int dev, void *p)
{
    (void)dev;
    (void)p;
}

int gpusvc_memset_word(int dev, uint32_t *word, uint32_t count, void *stream, char *msg,
                       size_t n)
{
    (void)dev;
    (void)word;
    (void)count;
    (void)stream;
    return no_cuda(msg, n);
}

int gpusvc_read(int dev, void *host_dst, const void *src, size_t bytes, char *msg, size_t n)
{
    (void)dev;
    (void)host_dst;
    (void)src;
    (void)bytes;
    return no_cuda(msg, n);
}

int gpusvc_load(const void *image, size_t size, void **lib, char *msg, size_t n)
{
    (void)image;
    (void)size;
    *lib = NULL;
    return no_cuda(msg, n);
}

void gpusvc_unload(void *lib)
{
    (void)lib;
}

int gpusvc_kernel(void *lib, const char *name, void **kernel, char *msg, size_t n)
{
    (void)lib;
    (void)name;
    *kernel = NULL;
    return no_cuda(msg, n);
}

int gpusvc_launch(int dev, void *kernel, const refit_gpu_launch *l, void *stream, char *msg,
                  size_t n)
{
    (void)dev;
    (void)kernel;
    (void)l;
    (void)stream;
    return no_cuda(msg, n);
}

int gpusvc_run(int dev, void *stream, int (*fn)(void *arg, void *stream), void *arg, char *msg,
               size_t n)
{
    (void)dev;
    (void)stream;
    (void)fn;
    (void)arg;
    return no_cuda(msg, n);
}
#endif
