/* The CUDA backend through the public API: the same transformer-shaped
 * model is registered twice, once in host memory (the host backend, the
 * reference) and once in device memory, and every update goes to both.
 * After each commit the device bytes must equal the host bytes and the
 * fingerprints must agree; sources come from pageable host memory, pinned
 * host memory, device memory and a caller's stream; rollback, poisoning and
 * a STAGED format with a post-load step are exercised. The structure: a
 * padded, TP-sharded, tied embedding with a cast; a fused qkv; 300 stacked
 * experts (the batched path); a 24 MB tensor (the pinned ring's pipeline);
 * a transposed F16 runtime fed from F32 (strided cast). Skipped without a
 * CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include <refit/format.h>
#include <refit/refit.h>

#include "core/cuda/backend_cuda.h"
#include "gpu_twin.h"
#include "core/safetensors_write.h"

enum { N_EXPERTS = 300, MAX_RT = 8, MAX_CK = N_EXPERTS + 16 };

/* ---- the test format: STAGED, post-load copies (and casts) into place ---- */

static int gs_plan(const refit_host_v2 *host, refit_fmt_module *m)
{
    (void)host;
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        m->ckpt[i].route = REFIT_ROUTE_STAGED;
    m->flags = REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD;
    return REFIT_OK;
}

static int gs_post(const refit_host_v2 *host, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        int rc = host->copy(host->host, &m->ckpt[i].place, &m->ckpt[i].staged, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 gpu_stage_format = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-gpu-stage",
    .plan = gs_plan,
    .post_load = gs_post,
};

/* The fetch format: post-load copies each staged tensor into a device
 * scratch and reads the scratch back with fetch, which must see the copy
 * just queued (small pieces wait in a batch table whose saves run before
 * its copies), then copies into place as test-gpu-stage does. */
static int gf_post(const refit_host_v2 *host, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_view *st = &m->ckpt[i].staged;
        size_t n = (size_t)st->shape[0] * (size_t)(st->dtype.bits / 8);
        refit_view sc = *st;
        sc.data = host->scratch(host->host, st->device, n);
        unsigned char *a = malloc(n), *b = malloc(n);
        int rc = sc.data && a && b ? REFIT_OK : REFIT_ENOMEM;
        if (!rc)
            rc = host->copy(host->host, &sc, st, stream);
        if (!rc)
            rc = host->fetch(host->host, a, n, &sc, stream);
        if (!rc)
            rc = host->fetch(host->host, b, n, st, stream);
        if (!rc && memcmp(a, b, n))
            rc = host->error(host->host, REFIT_ECORRUPT, "fetch of %s's scratch: not the "
                             "bytes just copied there", m->ckpt[i].name);
        free(a);
        free(b);
        if (!rc)
            rc = host->copy(host->host, &m->ckpt[i].place, st, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 gpu_fetch_format = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "test-gpu-fetch",
    .plan = gs_plan,
    .post_load = gf_post,
};

/* ---- a world: the model on one device type ---- */

typedef struct rt {
    refit_tensor t;
    int64_t shape[4], strides[4];
    void *data;
    size_t bytes;               /* of the allocation */
} rt;

typedef struct ck {
    char name[64];
    refit_dtype dtype;
    int ndim;
    int64_t shape[4];
} ck;

typedef struct world {
    refit_ctx *ctx;
    refit_model *m;
    int device;                 /* 1: runtime tensors in device memory */
    rt rt[MAX_RT];
    int n_rt;
    ck ck[MAX_CK];
    int n_ck;
} world;

static rt *add_rt(world *w, const char *module, refit_dtype dt, int nd, const int64_t *shape,
                  int transposed)
{
    rt *r = &w->rt[w->n_rt++];
    memset(r, 0, sizeof *r);
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        r->shape[i] = shape[i];
        numel *= shape[i];
    }
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        r->strides[transposed ? nd - 1 - i : i] = s;
        s *= shape[transposed ? nd - 1 - i : i];
    }
    r->bytes = (size_t)numel * (dt.bits / 8);
    if (w->device) {
        CU(cudaMalloc(&r->data, r->bytes));
        CU(cudaMemset(r->data, 0x5a, r->bytes));
    } else {
        r->data = malloc(r->bytes);
        assert_non_null(r->data);
        memset(r->data, 0x5a, r->bytes);
    }
    r->t = (refit_tensor){.data = r->data,
                          .device = {w->device ? REFIT_DEVICE_CUDA : REFIT_DEVICE_CPU, 0},
                          .ndim = nd, .dtype = dt, .shape = r->shape, .strides = r->strides};
    OK(w, refit_module_bind_runtime(w->m, module, "w", &r->t));
    return r;
}

static refit_ckpt_spec spec(refit_dtype dt, int nd, const int64_t *shape)
{
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = dt;
    s.ndim = nd;
    for (int i = 0; i < nd; i++)
        s.shape[i] = shape[i];
    return s;
}

static void expect(world *w, const char *module, const char *name, const refit_ckpt_spec *s)
{
    OK(w, refit_model_expect(w->m, module, name, s));
    if (s->tie_of)
        return; /* delivered under its primary name */
    ck *c = &w->ck[w->n_ck++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->dtype = s->dtype;
    c->ndim = s->ndim;
    memcpy(c->shape, s->shape, sizeof c->shape);
}

static void world_open(world *w, int device)
{
    memset(w, 0, sizeof *w);
    w->device = device;
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = device ? "gpu-test" : "host-ref";
    o.staging_budget = 1u << 20;
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    OK(w, refit_format_register(w->ctx, &gpu_stage_format));
    OK(w, refit_model_create(&w->m, w->ctx));

    /* embedding: BF16 [10, 8] padded to 12 rows, rank 1 of 2, cast to F32, tied */
    OK(w, refit_model_add_module(w->m, "emb", "unquantized", "cast: true"));
    add_rt(w, "emb", F32, 2, (int64_t[]){6, 8}, 0);
    refit_ckpt_spec s = spec(BF16, 2, (int64_t[]){10, 8});
    s.shard_dim = 0;
    s.shard_rank = 1;
    s.shard_count = 2;
    s.pad_to = 12;
    expect(w, "emb", "model.embed_tokens.weight", &s);
    s.tie_of = "model.embed_tokens.weight";
    expect(w, "emb", "lm_head.weight", &s);

    /* fused qkv */
    OK(w, refit_model_add_module(w->m, "qkv", "unquantized", NULL));
    add_rt(w, "qkv", BF16, 2, (int64_t[]){16, 32}, 0);
    const char *names[3] = {"q_proj.weight", "k_proj.weight", "v_proj.weight"};
    int64_t rows[3] = {8, 4, 4}, off = 0;
    for (int i = 0; i < 3; i++) {
        s = spec(BF16, 2, (int64_t[]){rows[i], 32});
        s.dst_offset[0] = off;
        off += rows[i];
        expect(w, "qkv", names[i], &s);
    }

    /* stacked experts: many small tensors */
    OK(w, refit_model_add_module(w->m, "experts", "unquantized", NULL));
    add_rt(w, "experts", BF16, 3, (int64_t[]){N_EXPERTS, 4, 8}, 0);
    for (int e = 0; e < N_EXPERTS; e++) {
        char n[64];
        snprintf(n, sizeof n, "experts.%d.w", e);
        s = spec(BF16, 2, (int64_t[]){4, 8});
        s.expert = e;
        expect(w, "experts", n, &s);
    }

    /* one large tensor: several pinned chunks */
    OK(w, refit_model_add_module(w->m, "big", "unquantized", NULL));
    add_rt(w, "big", BF16, 2, (int64_t[]){4096, 3001}, 0);
    s = spec(BF16, 2, (int64_t[]){4096, 3001});
    expect(w, "big", "big.weight", &s);

    /* transposed F16 runtime from an F32 checkpoint */
    OK(w, refit_model_add_module(w->m, "strided", "unquantized", "cast: true"));
    add_rt(w, "strided", F16, 2, (int64_t[]){65, 47}, 1);
    s = spec(F32, 2, (int64_t[]){65, 47});
    expect(w, "strided", "strided.weight", &s);

    /* STAGED with a post-load step (device staging memory) */
    OK(w, refit_model_add_module(w->m, "staged", "test-gpu-stage", NULL));
    add_rt(w, "staged", F32, 2, (int64_t[]){33, 17}, 0);
    s = spec(BF16, 2, (int64_t[]){33, 17});
    expect(w, "staged", "staged.weight", &s);

    OK(w, refit_model_seal(w->m));
}

static void world_close(world *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++) {
        if (w->device)
            cudaFree(w->rt[i].data);
        else
            free(w->rt[i].data);
    }
}

/* ---- checkpoint data and sources ---- */

enum src_kind { SRC_PAGEABLE, SRC_PINNED, SRC_DEVICE, SRC_PAGEABLE_STRIDED };

typedef struct src {
    refit_tensor t;
    int64_t shape[4], strides[4];
    void *buf;
    enum src_kind kind;
} src;

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Checkpoint tensor c of version v, contiguous in host memory: random bits
 * (so casts meet NaNs, infinities and subnormals). */
static void *ckpt_bytes(const ck *c, int v, size_t *bytes)
{
    size_t n = c->dtype.bits / 8;
    for (int i = 0; i < c->ndim; i++)
        n *= (size_t)c->shape[i];
    uint64_t seed = (uint64_t)v * 0x100000001b3ull;
    for (const char *p = c->name; *p; p++)
        seed = (seed ^ (unsigned char)*p) * 0x100000001b3ull;
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = mix(seed + i);
        memcpy(b + i, &r, n - i < 8 ? n - i : 8);
    }
    *bytes = n;
    return b;
}

static void src_make(src *s, const ck *c, int v, enum src_kind kind)
{
    memset(s, 0, sizeof *s);
    size_t n;
    void *h = ckpt_bytes(c, v, &n);
    s->kind = kind;
    s->t = (refit_tensor){.device = {REFIT_DEVICE_CPU, 0}, .ndim = c->ndim, .dtype = c->dtype,
                          .shape = s->shape, .strides = NULL};
    memcpy(s->shape, c->shape, sizeof s->shape);
    if (kind == SRC_PINNED) {
        CU(cudaHostAlloc(&s->buf, n ? n : 1, cudaHostAllocDefault));
        memcpy(s->buf, h, n);
        s->t.device.device_type = REFIT_DEVICE_CUDA_HOST;
    } else if (kind == SRC_DEVICE) {
        CU(cudaMalloc(&s->buf, n ? n : 1));
        CU(cudaMemcpy(s->buf, h, n, cudaMemcpyHostToDevice));
        s->t.device.device_type = REFIT_DEVICE_CUDA;
    } else if (kind == SRC_PAGEABLE_STRIDED && c->ndim == 2) {
        /* the same logical tensor stored transposed */
        size_t e = c->dtype.bits / 8;
        int64_t r = c->shape[0], k = c->shape[1];
        s->buf = malloc(n ? n : 1);
        assert_non_null(s->buf);
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < k; j++)
                memcpy((char *)s->buf + (j * r + i) * e, (char *)h + (i * k + j) * e, e);
        s->strides[0] = 1;
        s->strides[1] = r;
        s->t.strides = s->strides;
    } else {
        s->buf = h;
        h = NULL;
    }
    s->t.data = s->buf;
    free(h);
}

/* Release a source once the txn that read it has ended. */
static void src_free(src *s)
{
    if (s->kind == SRC_PINNED)
        cudaFreeHost(s->buf);
    else if (s->kind == SRC_DEVICE)
        cudaFree(s->buf);
    else
        free(s->buf);
}

/* Deliver every checkpoint tensor of version v; src_out keeps them alive
 * until the caller ends the txn. count: deliver only the first count. */
static void deliver(world *w, refit_txn *t, int v, enum src_kind kind, void *stream,
                    src *keep, int count)
{
    for (int i = 0; i < w->n_ck && i < count; i++) {
        src_make(&keep[i], &w->ck[i], v, kind);
        int rc = refit_load(t, w->ck[i].name, &keep[i].t, stream);
        if (rc)
            fail_msg("load %s: %s: %s [%s]", w->ck[i].name, refit_status_name(rc),
                     refit_errmsg(w->ctx), backend_cuda_last_error());
    }
}

static void update(world *w, int v, enum src_kind kind, void *stream, int rollback)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    char label[32];
    snprintf(label, sizeof label, "v%d", v);
    o.version_label = label;
    o.rollback = rollback;
    refit_txn *t;
    OK(w, refit_begin(&t, w->m, &o));
    src *keep = calloc(MAX_CK, sizeof *keep);
    assert_non_null(keep);
    deliver(w, t, v, kind, stream, keep, w->n_ck);
    OK(w, refit_finalize(t));
    for (int i = 0; i < w->n_ck; i++)
        src_free(&keep[i]);
    free(keep);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* Every runtime allocation of w, as host bytes (malloc'd, concatenated). */
static char *snapshot(world *w, size_t *bytes)
{
    size_t n = 0;
    for (int i = 0; i < w->n_rt; i++)
        n += w->rt[i].bytes;
    char *out = malloc(n), *p = out;
    assert_non_null(out);
    for (int i = 0; i < w->n_rt; i++) {
        if (w->device)
            CU(cudaMemcpy(p, w->rt[i].data, w->rt[i].bytes, cudaMemcpyDeviceToHost));
        else
            memcpy(p, w->rt[i].data, w->rt[i].bytes);
        p += w->rt[i].bytes;
    }
    *bytes = n;
    return out;
}

static void assert_same(world *dev, world *host, const char *what)
{
    size_t nd, nh;
    char *a = snapshot(dev, &nd), *b = snapshot(host, &nh);
    assert_int_equal(nd, nh);
    for (size_t i = 0; i < nd; i++)
        if (a[i] != b[i]) {
            size_t at = i;
            free(a);
            free(b);
            fail_msg("%s: device byte %zu differs from the host backend's", what, at);
        }
    free(a);
    free(b);
    uint64_t fd, fh;
    OK(dev, refit_model_fingerprint(dev->m, &fd));
    OK(host, refit_model_fingerprint(host->m, &fh));
    if (fd != fh)
        fail_msg("%s: fingerprints differ: device %016llx, host %016llx", what,
                 (unsigned long long)fd, (unsigned long long)fh);
}

static int setup(void **state)
{
    if (backend_cuda_device_count() == 0) {
        *state = NULL;
        return 0;
    }
    world *w = calloc(2, sizeof *w);
    if (!w)
        return -1;
    world_open(&w[0], 1);
    world_open(&w[1], 0);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    if (w) {
        world_close(&w[0]);
        world_close(&w[1]);
        free(w);
    }
    return 0;
}

#define WORLDS(state, d, h)                                                   \
    if (!*(state)) {                                                          \
        print_message("# no CUDA device: %s\n", backend_cuda_unavailable());  \
        skip();                                                               \
    }                                                                         \
    world *d = &((world *)*(state))[0], *h = &((world *)*(state))[1]

static void check_kind(void **state, enum src_kind kind, void *stream)
{
    WORLDS(state, d, h);
    for (int v = 1; v <= 2; v++) {
        update(h, v, SRC_PAGEABLE, NULL, 1);
        update(d, v, kind, stream, v == 2);
        char what[64];
        snprintf(what, sizeof what, "source kind %d, version %d", (int)kind, v);
        assert_same(d, h, what);
    }
}

static void test_from_pageable(void **state)
{
    check_kind(state, SRC_PAGEABLE, NULL);
}

static void test_from_pageable_strided(void **state)
{
    check_kind(state, SRC_PAGEABLE_STRIDED, NULL);
}

static void test_from_pinned(void **state)
{
    check_kind(state, SRC_PINNED, NULL);
}

static void test_from_device(void **state)
{
    check_kind(state, SRC_DEVICE, NULL);
}

static void test_on_user_stream(void **state)
{
    if (!*state) {
        print_message("# no CUDA device: %s\n", backend_cuda_unavailable());
        skip();
    }
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    check_kind(state, SRC_DEVICE, st);
    check_kind(state, SRC_PAGEABLE, st);
    CU(cudaStreamDestroy(st));
}

/* A safetensors checkpoint of version v with every checkpoint tensor. */
static void write_ckpt_file(world *w, int v, const char *path)
{
    st_out_tensor *o = calloc((size_t)w->n_ck, sizeof *o);
    void **bufs = calloc((size_t)w->n_ck, sizeof *bufs);
    assert_non_null(o);
    assert_non_null(bufs);
    for (int i = 0; i < w->n_ck; i++) {
        const ck *c = &w->ck[i];
        const char *name = c->dtype.code == REFIT_DTYPE_BFLOAT ? "BF16"
                           : c->dtype.code == REFIT_DTYPE_FLOAT
                               ? (c->dtype.bits == 32 ? "F32" : "F16")
                               : NULL;
        assert_non_null(name);
        size_t n;
        bufs[i] = ckpt_bytes(c, v, &n);
        st_dtype dt;
        assert_int_equal(st_dtype_from_name(name, &dt), 0);
        o[i] = (st_out_tensor){c->name, dt, c->ndim, c->shape, bufs[i]};
    }
    st_error err;
    if (st_write_file(path, o, (size_t)w->n_ck, NULL, 0, &err))
        fail_msg("writing %s: %s", path, err.message);
    for (int i = 0; i < w->n_ck; i++)
        free(bufs[i]);
    free(bufs);
    free(o);
}

/* refit_load_source on the caller's (non-blocking) stream: the device
 * bytes equal the host model's, the work went to that stream (a queue for
 * it appears), and the mapped file may go before finalize. */
static void test_from_safetensors_on_stream(void **state)
{
    WORLDS(state, d, h);
    char path[] = "/tmp/refit-gpu-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int v = 11; v <= 12; v++) {
        write_ckpt_file(d, v, path);
        update(h, v, SRC_PAGEABLE, NULL, 1);
        backend_cuda_stats a, b;
        backend_cuda_stats_get(&a);
        refit_txn *t;
        refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
        o.rollback = v == 12;
        OK(d, refit_begin(&t, d->m, &o));
        refit_source *src;
        OK(d, refit_source_open(&src, d->ctx, path));
        OK(d, refit_load_source(t, src, NULL, NULL, st));
        refit_source_close(src);
        assert_int_equal(unlink(path), 0); /* consumed: nothing reads it later */
        backend_cuda_stats_get(&b);
        OK(d, refit_finalize(t));
        if (v == 11)
            assert_int_equal(b.queues, a.queues + 1);
        assert_true(b.pageable_bytes > a.pageable_bytes);
        char what[64];
        snprintf(what, sizeof what, "safetensors on a stream, version %d", v);
        assert_same(d, h, what);
    }
    /* an update from a file, aborted with rollback: every save must have
     * read its region before the deferred copy wrote it */
    size_t n0, n1;
    char *before = snapshot(d, &n0);
    write_ckpt_file(d, 13, path);
    refit_txn *t;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 1;
    OK(d, refit_begin(&t, d->m, &o));
    refit_source *src;
    OK(d, refit_source_open(&src, d->ctx, path));
    OK(d, refit_load_source(t, src, NULL, NULL, st));
    refit_source_close(src);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(refit_abort(t), REFIT_OK);
    assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_READY);
    char *after = snapshot(d, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    assert_same(d, h, "safetensors update aborted with rollback");
    CU(cudaStreamDestroy(st));
}

/* Many small device tensors leave in a few kernel launches. */
static void test_batched(void **state)
{
    WORLDS(state, d, h);
    update(h, 3, SRC_PAGEABLE, NULL, 0);
    backend_cuda_stats a, b;
    backend_cuda_stats_get(&a);
    update(d, 3, SRC_DEVICE, NULL, 0);
    backend_cuda_stats_get(&b);
    assert_same(d, h, "batched");
    print_message("# %d tensors: %llu batch launches, %llu rows, %llu memcpys, %llu kernels\n",
                  d->n_ck, (unsigned long long)(b.batch_launches - a.batch_launches),
                  (unsigned long long)(b.batch_rows - a.batch_rows),
                  (unsigned long long)(b.memcpy_calls - a.memcpy_calls),
                  (unsigned long long)(b.kernel_copies - a.kernel_copies));
    assert_true(b.batch_launches - a.batch_launches <= 4);
    assert_true(b.batch_rows - a.batch_rows >= N_EXPERTS);
}

/* A plugin's fetch after its own copy into device memory reads the copied
 * bytes: 16-byte pieces (batch rows) into a scratch, read back at once. */
static void test_fetch_after_copy(void **state)
{
    (void)state;
    refit_ctx *ctx;
    refit_model *m;
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = "gpu-fetch";
    assert_int_equal(refit_open(&ctx, &o), REFIT_OK);
    struct { refit_ctx *ctx; } w = {ctx};
    OK(&w, refit_format_register(ctx, &gpu_fetch_format));
    OK(&w, refit_model_create(&m, ctx));
    enum { N = 8 };
    void *rt[N];
    refit_tensor rts[N]; /* bound by address: they live as long as the model */
    int64_t shape[1] = {4};
    for (int i = 0; i < N; i++) {
        char mod[16], name[32];
        snprintf(mod, sizeof mod, "f%d", i);
        snprintf(name, sizeof name, "f%d.w", i);
        CU(cudaMalloc(&rt[i], 16));
        rts[i] = (refit_tensor){.data = rt[i], .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 1,
                                .dtype = F32, .shape = shape};
        OK(&w, refit_model_add_module(m, mod, "test-gpu-fetch", NULL));
        OK(&w, refit_module_bind_runtime(m, mod, "w", &rts[i]));
        refit_ckpt_spec s = spec(F32, 1, shape);
        OK(&w, refit_model_expect(m, mod, name, &s));
    }
    OK(&w, refit_model_seal(m));
    for (int v = 1; v <= 3; v++) {
        refit_txn *t;
        refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
        uo.rollback = 0;
        OK(&w, refit_begin(&t, m, &uo));
        float vals[N][4];
        for (int i = 0; i < N; i++) {
            char name[32];
            snprintf(name, sizeof name, "f%d.w", i);
            for (int j = 0; j < 4; j++)
                vals[i][j] = (float)(v * 100 + i * 4 + j);
            refit_tensor src = {.data = vals[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = 1,
                                .dtype = F32, .shape = shape};
            OK(&w, refit_load(t, name, &src, NULL));
        }
        OK(&w, refit_finalize(t));
        for (int i = 0; i < N; i++) {
            float got[4];
            CU(cudaMemcpy(got, rt[i], 16, cudaMemcpyDeviceToHost));
            assert_memory_equal(got, vals[i], 16);
        }
    }
    refit_close(ctx);
    for (int i = 0; i < N; i++)
        cudaFree(rt[i]);
}

/* Abort with rollback puts every byte back; without, the worker is poisoned
 * until a whole update succeeds. */
static void test_abort(void **state)
{
    WORLDS(state, d, h);
    update(h, 4, SRC_PAGEABLE, NULL, 0);
    update(d, 4, SRC_DEVICE, NULL, 0);
    size_t n0, n1;
    char *before = snapshot(d, &n0);
    enum src_kind kinds[3] = {SRC_DEVICE, SRC_PAGEABLE, SRC_PINNED};
    for (int k = 0; k < 3; k++) {
        refit_txn *t;
        refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
        o.rollback = 1;
        OK(d, refit_begin(&t, d->m, &o));
        src *keep = calloc(MAX_CK, sizeof *keep);
        deliver(d, t, 5 + k, kinds[k], NULL, keep, d->n_ck);
        assert_int_equal(refit_abort(t), REFIT_OK);
        for (int i = 0; i < d->n_ck; i++)
            src_free(&keep[i]);
        free(keep);
        assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_READY);
        char *after = snapshot(d, &n1);
        assert_int_equal(n0, n1);
        assert_memory_equal(before, after, n0);
        free(after);
    }
    free(before);
    assert_same(d, h, "after rollbacks");

    refit_txn *t;
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 0;
    OK(d, refit_begin(&t, d->m, &o));
    src *keep = calloc(MAX_CK, sizeof *keep);
    deliver(d, t, 9, SRC_DEVICE, NULL, keep, 4);
    assert_int_equal(refit_abort(t), REFIT_EPOISONED);
    for (int i = 0; i < 4; i++)
        src_free(&keep[i]);
    free(keep);
    assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_POISONED);
    update(d, 4, SRC_PINNED, NULL, 1);
    assert_same(d, h, "after poison and retry");
}

int main(void)
{
    if (twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_pageable),
        cmocka_unit_test(test_from_pageable_strided),
        cmocka_unit_test(test_from_pinned),
        cmocka_unit_test(test_from_device),
        cmocka_unit_test(test_on_user_stream),
        cmocka_unit_test(test_from_safetensors_on_stream),
        cmocka_unit_test(test_batched),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_fetch_after_copy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
