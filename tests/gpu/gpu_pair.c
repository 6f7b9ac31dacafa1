/* The paired-world harness (gpu_pair.h): the device-only branches here are
 * the four tests' own, moved as they were; they run on the GPU machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "gpu_pair.h"
#include "gpu_twin.h"
#include "kernels/cast.h"

static const pair_format *format;
static int on_host_only;

int pair_use(const pair_format *f)
{
    format = f;
    const char *e = getenv(f->on_host_env);
    on_host_only = e && *e && strcmp(e, "0");
    return on_host_only;
}

int pair_on_host_only(void)
{
    return on_host_only;
}

/* ---- memory of a world: device, or host ---- */

void *pair_mem_alloc(int device, size_t bytes)
{
    void *p = NULL;
    if (device && !on_host_only)
        CU(cudaMalloc(&p, bytes ? bytes : 1));
    else
        p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

void pair_mem_free(int device, void *p)
{
    if (device && !on_host_only)
        cudaFree(p);
    else
        free(p);
}

void pair_mem_put(int device, void *dst, const void *src, size_t n)
{
    if (device && !on_host_only)
        CU(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    else
        memcpy(dst, src, n);
}

void pair_mem_get(int device, void *dst, const void *src, size_t n)
{
    if (device && !on_host_only)
        CU(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
    else
        memcpy(dst, src, n);
}

/* ---- checkpoint values ---- */

uint64_t pair_seed(const pair_ck *c, int v)
{
    uint64_t seed = (uint64_t)v * 0x100000001b3ull;
    for (const char *p = c->name; *p; p++)
        seed = (seed ^ (unsigned char)*p) * 0x100000001b3ull;
    return seed;
}

void pair_store_float(void *b, size_t i, refit_dtype dt, float f)
{
    if (dt.bits == 32) {
        memcpy((char *)b + i * 4, &f, 4);
        return;
    }
    uint16_t h = dt.code == REFIT_DTYPE_FLOAT ? kern_f32_to_f16(f) : kern_f32_to_bf16(f);
    memcpy((char *)b + i * 2, &h, 2);
}

void *pair_float_bytes(const pair_ck *c, int v, int64_t nan_at, size_t *bytes)
{
    size_t e = c->dtype.bits / 8, n = 1;
    for (int d = 0; d < c->ndim; d++)
        n *= (size_t)c->shape[d];
    int64_t k = c->shape[c->ndim - 1];
    uint64_t seed = pair_seed(c, v);
    char *b = malloc(n * e + 1);
    assert_non_null(b);
    int f16 = c->dtype.code == REFIT_DTYPE_FLOAT && c->dtype.bits == 16;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = twin_mix(seed + i);
        int64_t row = (int64_t)i / k;
        float f;
        uint32_t u;
        if (row % 9 == 4) {
            f = 0.0f;
        } else if (row % 7 == 2) { /* subnormal in the dtype */
            u = f16 ? 0x33800000u + (uint32_t)(r & 0xfffff) /* below f16's normals */
                    : (uint32_t)(r & 0x7fffffu) | 1u;
            memcpy(&f, &u, 4);
        } else if (row % 11 == 6) {
            f = (f16 ? 65000.0f : 3.0e38f) * ((float)((r >> 40) & 0xffff) / 65536.0f);
        } else {
            int ex = (int)(r % 24) - 12;
            f = (float)((double)((r >> 20) & 0xffff) / 32768.0 - 1.0) *
                (float)(ex < 0 ? 1.0 / (double)(1u << -ex) : (double)(1u << ex));
        }
        if (r & (1ull << 63))
            f = -f;
        if ((int64_t)i == nan_at)
            f = __builtin_nanf("");
        pair_store_float(b, i, c->dtype, f);
    }
    *bytes = n * e;
    return b;
}

void *pair_float_ckpt(const pair_ck *c, int v, int defect, size_t *bytes)
{
    return pair_float_bytes(c, v, defect ? 37 : -1, bytes);
}

/* ---- a world: the model in one kind of memory ---- */

pair_rt *pair_bind(pair_world *w, const char *module, const char *name, refit_dtype dt, int nd,
                   const int64_t *shape)
{
    assert_true(w->n_rt < PAIR_MAX_RT);
    pair_rt *r = &w->rt[w->n_rt++];
    memset(r, 0, sizeof *r);
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        r->shape[i] = shape[i];
        numel *= shape[i];
    }
    r->bytes = (size_t)numel * (dt.bits / 8);
    snprintf(r->name, sizeof r->name, "%s/%s", module, name);
    r->data = pair_mem_alloc(w->device, r->bytes);
    char *junk = malloc(r->bytes ? r->bytes : 1);
    assert_non_null(junk);
    memset(junk, 0x5a, r->bytes);
    pair_mem_put(w->device, r->data, junk, r->bytes);
    free(junk);
    refit_device dev = {w->device && !on_host_only ? REFIT_DEVICE_CUDA : REFIT_DEVICE_CPU, 0};
    r->t = (refit_tensor){.data = r->data, .device = dev, .ndim = nd, .dtype = dt,
                          .shape = r->shape, .strides = NULL};
    OK(w, refit_module_bind_runtime(w->m, module, name, &r->t));
    return r;
}

pair_ck *pair_expect(pair_world *w, const char *module, const char *name, refit_dtype dt,
                     int nd, const int64_t *shape, const char *target, int64_t dst_row,
                     int64_t expert)
{
    assert_true(w->n_ck < PAIR_MAX_CK);
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = dt;
    s.ndim = nd;
    for (int i = 0; i < nd; i++)
        s.shape[i] = shape[i];
    s.target = target;
    s.dst_offset[0] = dst_row;
    s.expert = expert;
    OK(w, refit_model_expect(w->m, module, name, &s));
    pair_ck *c = &w->ck[w->n_ck++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->module, sizeof c->module, "%s", module);
    c->dtype = dt;
    c->ndim = nd;
    for (int i = 0; i < nd; i++)
        c->shape[i] = shape[i];
    return c;
}

void pair_open(pair_world *w, int device)
{
    memset(w, 0, sizeof *w);
    w->device = device;
    char id[48];
    snprintf(id, sizeof id, "%s-%s", device ? "gpu" : "host", format->worker);
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = id;
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    OK(w, refit_model_create(&w->m, w->ctx));
    format->build(w);
    OK(w, refit_model_seal(w->m));
}

void pair_close(pair_world *w)
{
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++)
        pair_mem_free(w->device, w->rt[i].data);
}

/* ---- sources and updates ---- */

static void src_make(pair_src *s, const pair_ck *c, int v, enum src_kind kind, int defect)
{
    memset(s, 0, sizeof *s);
    size_t n;
    void *h = format->ckpt_bytes(c, v, defect, &n);
    if (on_host_only)
        kind = SRC_PAGEABLE;
    s->kind = kind;
    memcpy(s->shape, c->shape, sizeof s->shape);
    s->t = (refit_tensor){.device = {REFIT_DEVICE_CPU, 0}, .ndim = c->ndim, .dtype = c->dtype,
                          .shape = s->shape};
    if (kind == SRC_PINNED) {
        CU(cudaHostAlloc(&s->buf, n ? n : 1, cudaHostAllocDefault));
        memcpy(s->buf, h, n);
        s->t.device.device_type = REFIT_DEVICE_CUDA_HOST;
    } else if (kind == SRC_DEVICE) {
        CU(cudaMalloc(&s->buf, n ? n : 1));
        CU(cudaMemcpy(s->buf, h, n, cudaMemcpyHostToDevice));
        s->t.device.device_type = REFIT_DEVICE_CUDA;
    } else {
        s->buf = h;
        h = NULL;
    }
    s->t.data = s->buf;
    free(h);
}

static void src_free(pair_src *s)
{
    if (!s->buf)
        return; /* past a failed load: never made */
    if (s->kind == SRC_PINNED)
        cudaFreeHost(s->buf);
    else if (s->kind == SRC_DEVICE)
        cudaFree(s->buf);
    else
        free(s->buf);
}

int pair_deliver(pair_world *w, refit_txn *t, int v, enum src_kind kind, void *stream,
                 pair_src *keep, int defect_at, int defect)
{
    for (int i = 0; i < w->n_ck; i++) {
        src_make(&keep[i], &w->ck[i], v, kind, i == defect_at ? defect : 0);
        int rc = refit_load(t, w->ck[i].name, &keep[i].t, stream);
        if (rc)
            return rc; /* keep[] past i stays zeroed: nothing to free */
    }
    return REFIT_OK;
}

void pair_keep_free(pair_world *w, pair_src *keep)
{
    for (int i = 0; i < w->n_ck; i++)
        src_free(&keep[i]);
    free(keep);
}

static pair_src *keep_new(void)
{
    pair_src *keep = calloc(PAIR_MAX_CK, sizeof *keep);
    assert_non_null(keep);
    return keep;
}

void pair_update(pair_world *w, int v, enum src_kind kind, void *stream)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    char label[32];
    snprintf(label, sizeof label, "v%d", v);
    o.version_label = label;
    o.rollback = 1;
    refit_txn *t;
    OK(w, refit_begin(&t, w->m, &o));
    pair_src *keep = keep_new();
    int rc = pair_deliver(w, t, v, kind, stream, keep, -1, 0);
    if (rc)
        fail_msg("update v%d: %s: %s [%s]", v, refit_status_name(rc), refit_errmsg(w->ctx),
                 backend_cuda_last_error());
    OK(w, refit_finalize(t));
    pair_keep_free(w, keep);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
}

/* ---- comparing worlds ---- */

char *pair_snapshot(pair_world *w, size_t *bytes)
{
    size_t n = 0;
    for (int i = 0; i < w->n_rt; i++)
        n += w->rt[i].bytes;
    char *out = malloc(n ? n : 1), *p = out;
    assert_non_null(out);
    for (int i = 0; i < w->n_rt; i++) {
        pair_mem_get(w->device, p, w->rt[i].data, w->rt[i].bytes);
        p += w->rt[i].bytes;
    }
    *bytes = n;
    return out;
}

void pair_assert_snap(pair_world *w, const char *a, const char *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            size_t at = i;
            int r = 0;
            while (r < w->n_rt && at >= w->rt[r].bytes)
                at -= w->rt[r++].bytes;
            fail_msg("%s: byte %zu differs (runtime tensor #%d %s, byte %zu): %02x vs %02x",
                     what, i, r, r < w->n_rt ? w->rt[r].name : "?", at, (unsigned char)a[i],
                     (unsigned char)b[i]);
        }
}

void pair_assert_same(pair_world *d, pair_world *h, const char *what)
{
    size_t nd, nh;
    char *a = pair_snapshot(d, &nd), *b = pair_snapshot(h, &nh);
    assert_int_equal(nd, nh);
    pair_assert_snap(d, a, b, nd, what);
    free(a);
    free(b);
    uint64_t fd, fh;
    OK(d, refit_model_fingerprint(d->m, &fd));
    OK(h, refit_model_fingerprint(h->m, &fh));
    if (fd != fh)
        fail_msg("%s: fingerprints differ: device %016llx, host %016llx", what,
                 (unsigned long long)fd, (unsigned long long)fh);
}

int pair_setup(void **state)
{
    if (backend_cuda_device_count() == 0 && !on_host_only) {
        *state = NULL;
        return 0;
    }
    pair_world *w = calloc(2, sizeof *w);
    if (!w)
        return -1;
    pair_open(&w[0], 1);
    pair_open(&w[1], 0);
    *state = w;
    return 0;
}

int pair_teardown(void **state)
{
    pair_world *w = *state;
    if (w) {
        pair_close(&w[0]);
        pair_close(&w[1]);
        free(w);
    }
    return 0;
}

/* ---- the shared cases ---- */

void pair_check_matches_host(void **state)
{
    WORLDS(state, d, h);
    enum src_kind kinds[3] = {SRC_DEVICE, SRC_PINNED, SRC_PAGEABLE};
    for (int v = 1; v <= 3; v++) {
        pair_update(h, v, SRC_PAGEABLE, NULL);
        pair_update(d, v, kinds[v - 1], NULL);
        char what[64];
        snprintf(what, sizeof what, "version %d, source kind %d", v, (int)kinds[v - 1]);
        pair_assert_same(d, h, what);
    }
}

char *pair_reload_same(pair_world *d, int v, size_t *n)
{
    size_t n2;
    pair_update(d, v, SRC_DEVICE, NULL);
    char *a = pair_snapshot(d, n);
    pair_update(d, v, SRC_DEVICE, NULL);
    char *b = pair_snapshot(d, &n2);
    assert_int_equal(*n, n2);
    pair_assert_snap(d, a, b, *n, "the same weights reloaded");
    free(b);
    return a;
}

void pair_check_reload_equals_cold(void **state, int fingerprints)
{
    WORLDS(state, d, h);
    (void)h;
    size_t n1, n2, n3;
    char *a = pair_reload_same(d, 11, &n1);
    pair_update(d, 12, SRC_DEVICE, NULL);
    char *c = pair_snapshot(d, &n3);
    assert_true(memcmp(a, c, n1) != 0);
    pair_update(d, 11, SRC_PAGEABLE, NULL);
    char *b = pair_snapshot(d, &n2);
    pair_assert_snap(d, a, b, n1, "A, B, then A again");
    pair_world cold;
    pair_open(&cold, 1);
    pair_update(&cold, 11, SRC_DEVICE, NULL);
    free(c);
    c = pair_snapshot(&cold, &n3);
    assert_int_equal(n1, n3);
    pair_assert_snap(d, c, b, n1, "reload against a cold start");
    if (fingerprints) {
        uint64_t f1, f2;
        OK(d, refit_model_fingerprint(d->m, &f1));
        OK((&cold), refit_model_fingerprint(cold.m, &f2));
        assert_true(f1 == f2);
    }
    pair_close(&cold);
    free(a);
    free(b);
    free(c);
}

void pair_case_reload_equals_cold(void **state)
{
    pair_check_reload_equals_cold(state, 1);
}

void pair_case_reload_bytes_equal_cold(void **state)
{
    pair_check_reload_equals_cold(state, 0);
}

void pair_check_user_stream(void **state)
{
    WORLDS(state, d, h);
    cudaStream_t st = NULL;
    if (!on_host_only)
        CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    pair_update(h, 21, SRC_PAGEABLE, NULL);
    pair_update(d, 21, SRC_DEVICE, st);
    pair_assert_same(d, h, "on a non-blocking stream");
    pair_update(d, 22, SRC_PAGEABLE, st);
    pair_update(h, 22, SRC_PAGEABLE, NULL);
    pair_assert_same(d, h, "pageable on a non-blocking stream");
    if (st)
        CU(cudaStreamDestroy(st));
}

void pair_check_refused(pair_world *d, int at, int defect, const char *reason,
                        const char *before, size_t n, const char *what)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 1;
    refit_txn *t;
    OK(d, refit_begin(&t, d->m, &o));
    pair_src *keep = keep_new();
    int rc = pair_deliver(d, t, 32, SRC_DEVICE, NULL, keep, at, defect);
    if (rc == REFIT_OK)
        rc = refit_finalize(t);
    assert_int_equal(rc, REFIT_ECORRUPT);
    const char *msg = refit_errmsg(d->ctx);
    const pair_ck *c = &d->ck[at];
    if (!strstr(msg, c->module) || !strstr(msg, c->name) || !strstr(msg, reason))
        fail_msg("message \"%s\" lacks module %s, tensor %s or \"%s\"", msg, c->module, c->name,
                 reason);
    if (refit_worker_health(d->ctx) == REFIT_HEALTH_UPDATING)
        refit_abort(t);
    pair_keep_free(d, keep);
    assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_READY);
    size_t n1;
    char *after = pair_snapshot(d, &n1);
    assert_int_equal(n1, n);
    pair_assert_snap(d, before, after, n, what);
    free(after);
}

void pair_check_abort_restores(pair_world *d, const char *before, size_t n)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 1;
    refit_txn *t;
    OK(d, refit_begin(&t, d->m, &o));
    pair_src *keep = keep_new();
    assert_int_equal(pair_deliver(d, t, 33, SRC_DEVICE, NULL, keep, -1, 0), REFIT_OK);
    assert_int_equal(refit_abort(t), REFIT_OK);
    pair_keep_free(d, keep);
    assert_int_equal(refit_worker_health(d->ctx), REFIT_HEALTH_READY);
    size_t n1;
    char *after = pair_snapshot(d, &n1);
    assert_int_equal(n1, n);
    pair_assert_snap(d, before, after, n, "after an abort with rollback");
    free(after);
}

void pair_check_nan_and_abort(void **state, const int *bads, int n_bads)
{
    WORLDS(state, d, h);
    pair_update(h, 31, SRC_PAGEABLE, NULL);
    pair_update(d, 31, SRC_DEVICE, NULL);
    size_t n0;
    char *before = pair_snapshot(d, &n0);
    for (int k = 0; k < n_bads; k++)
        pair_check_refused(d, bads[k], 1, "NaN or infinity", before, n0, "after a refused NaN");
    pair_check_abort_restores(d, before, n0);
    free(before);
    pair_assert_same(d, h, "after the refusals");
}

/* One world: version 34 with `defect` in tensors first and second (of
 * different modules, first delivered earlier) with rollback: every load is
 * accepted (each post-load enqueued, none waited for), finalize fails
 * naming first's module and tensor and not second's; the bytes are kept;
 * then a clean version 35 commits (the status area is empty again). */
static void status_once(pair_world *w, int first, int second, int defect, const char *reason)
{
    size_t n0, n1;
    char *before = pair_snapshot(w, &n0);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 1;
    refit_txn *t;
    OK(w, refit_begin(&t, w->m, &o));
    pair_src *keep = keep_new();
    for (int i = 0; i < w->n_ck; i++) {
        /* a host world reads host sources (it refuses device memory) */
        src_make(&keep[i], &w->ck[i], 34, w->device ? SRC_DEVICE : SRC_PAGEABLE,
                 i == first || i == second ? defect : 0);
        int rc = refit_load(t, w->ck[i].name, &keep[i].t, NULL);
        if (rc)
            fail_msg("%s: load %s refused (%s: %s): a post-load's finding must wait for "
                     "finalize", w->ck[i].name, w->ck[i].name, refit_status_name(rc),
                     refit_errmsg(w->ctx));
    }
    refit_txn_stats ts;
    OK(w, refit_txn_stats_get(t, &ts));
    assert_int_equal(ts.tensors_loaded, (uint64_t)w->n_ck);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_UPDATING);
    assert_int_equal(refit_finalize(t), REFIT_ECORRUPT);
    const char *msg = refit_errmsg(w->ctx);
    const pair_ck *a = &w->ck[first], *b = &w->ck[second];
    if (!strstr(msg, a->module) || !strstr(msg, a->name) || !strstr(msg, reason) ||
        strstr(msg, b->name))
        fail_msg("message \"%s\" should name module %s, tensor %s and \"%s\", not %s", msg,
                 a->module, a->name, reason, b->name);
    pair_keep_free(w, keep);
    assert_int_equal(refit_worker_health(w->ctx), REFIT_HEALTH_READY);
    char *after = pair_snapshot(w, &n1);
    assert_int_equal(n1, n0);
    pair_assert_snap(w, before, after, n0, "after a refusal at finalize");
    free(after);
    free(before);
    pair_update(w, 35, w->device ? SRC_DEVICE : SRC_PAGEABLE, NULL);
}

void pair_check_status_at_finalize(void **state, int first, int second, const char *reason)
{
    WORLDS(state, d, h);
    pair_update(h, 31, SRC_PAGEABLE, NULL);
    pair_update(d, 31, SRC_DEVICE, NULL);
    status_once(d, first, second, 1, reason);
    status_once(h, first, second, 1, reason);
    pair_assert_same(d, h, "after the refusals at finalize");
}
