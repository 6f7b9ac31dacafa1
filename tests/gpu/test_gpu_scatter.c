/* Plain patches on the CUDA backend (kernels/scatter.cu, core/cuda/scatter.c,
 * docs/core.md "Delta updates"): the scatter kernel against the host
 * reference, bit for bit (elements and runs, skipped values, strided runs
 * and values, casts, the old bytes gathered); and delta updates through
 * the backend into device tensors (a tensor held as it is, a TP shard of
 * dim 1 whose indices are mapped, a BF16 checkpoint cast to F32), values
 * on the device, pinned and pageable, indices in order and not, in runs:
 * the runtime bytes equal a full reload of the patched checkpoint into a
 * second model, and an abort restores every byte, with the undo log in
 * host memory and in device memory. Skips without a device. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"
#include "core/cuda/backend_cuda.h"
#include "core/cuda/kern_cuda.h"
#include "kernels/cast.h"
#include "kernels/scatter.h"

#define U16 ((refit_dtype){REFIT_DTYPE_UINT, 16, 1})

/* ---- the kernel against the host reference ---- */

/* s on the host and on the device (copies of dst, values, old and the
 * arrays): the same dst and old bytes. */
static void kernel_vs_host(const kern_scatter *s, size_t dst_bytes, size_t val_bytes)
{
    size_t old_bytes = (size_t)s->elements * (s->dst_dtype.bits / 8);
    char *hd = malloc(dst_bytes), *ho = calloc(1, old_bytes ? old_bytes : 1);
    char *dd, *dv, *dold;
    int64_t *doff, *dcnt = NULL, *dvs = NULL;
    assert_non_null(hd);
    assert_non_null(ho);
    memcpy(hd, s->dst, dst_bytes);
    kern_scatter h = *s;
    h.dst = hd;
    h.old = ho;
    assert_int_equal(kern_scatter_host(&h), REFIT_OK);
    CU(cudaMalloc((void **)&dd, dst_bytes));
    CU(cudaMalloc((void **)&dv, val_bytes));
    CU(cudaMalloc((void **)&dold, old_bytes ? old_bytes : 1));
    CU(cudaMalloc((void **)&doff, s->n * 8));
    CU(cudaMemcpy(dd, s->dst, dst_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, s->values, val_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemset(dold, 0, old_bytes ? old_bytes : 1));
    CU(cudaMemcpy(doff, s->off, s->n * 8, cudaMemcpyHostToDevice));
    kern_scatter d = *s;
    d.dst = dd;
    d.values = dv;
    d.old = dold;
    d.off = doff;
    if (s->counts) {
        int64_t *vs = malloc(s->n * 8), j = 0;
        assert_non_null(vs);
        for (size_t i = 0; i < s->n; i++) {
            vs[i] = j;
            j += s->counts[i];
        }
        CU(cudaMalloc((void **)&dcnt, s->n * 8));
        CU(cudaMalloc((void **)&dvs, s->n * 8));
        CU(cudaMemcpy(dcnt, s->counts, s->n * 8, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dvs, vs, s->n * 8, cudaMemcpyHostToDevice));
        d.counts = dcnt;
        free(vs);
    }
    assert_int_equal(kern_scatter_cuda(&d, dvs, NULL), REFIT_OK);
    CU(cudaDeviceSynchronize());
    char *got = malloc(dst_bytes), *gold = malloc(old_bytes ? old_bytes : 1);
    assert_non_null(got);
    assert_non_null(gold);
    CU(cudaMemcpy(got, dd, dst_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gold, dold, old_bytes ? old_bytes : 1, cudaMemcpyDeviceToHost));
    assert_memory_equal(got, hd, dst_bytes);
    assert_memory_equal(gold, ho, old_bytes);
    cudaFree(dd);
    cudaFree(dv);
    cudaFree(dold);
    cudaFree(doff);
    cudaFree(dcnt);
    cudaFree(dvs);
    free(hd);
    free(ho);
    free(got);
    free(gold);
}

static char *junk(size_t n)
{
    char *p = malloc(n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)twin_rnd();
    return p;
}

static void test_kernel_elements(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    refit_dtype dts[] = {{REFIT_DTYPE_UINT, 8, 1}, U16, {REFIT_DTYPE_UINT, 32, 1},
                         {REFIT_DTYPE_INT, 64, 1}, {REFIT_DTYPE_UINT, 24, 1}};
    size_t numel = 1 << 20, n = 40000;
    int64_t *off = malloc(n * 8);
    assert_non_null(off);
    for (size_t i = 0; i < n; i++) /* distinct, out of order, some skipped */
        off[i] = i % 11 == 5 ? -1 : (int64_t)((i * 2654435761u) % numel);
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        size_t e = dts[k].bits / 8;
        char *dst = junk(numel * e), *vals = junk(2 * n * e);
        kern_scatter s = {.dst = dst, .dst_dtype = dts[k], .off = off, .n = n,
                          .run_stride = 1, .elements = (int64_t)n, .values = vals,
                          .values_dtype = dts[k], .values_stride = 2};
        kernel_vs_host(&s, numel * e, 2 * n * e);
        s.values_stride = 1;
        kernel_vs_host(&s, numel * e, 2 * n * e);
        free(dst);
        free(vals);
    }
    /* BF16 values into F32 elements, and F32 into F16 */
    float *f = malloc(numel * 4);
    uint16_t *b = malloc(n * 2);
    assert_non_null(f);
    assert_non_null(b);
    for (size_t i = 0; i < numel; i++)
        f[i] = twin_uniform();
    for (size_t i = 0; i < n; i++)
        b[i] = kern_f32_to_bf16(twin_uniform() * 1e3f);
    kern_scatter c = {.dst = (char *)f, .dst_dtype = F32, .off = off, .n = n, .run_stride = 1,
                      .elements = (int64_t)n, .values = b, .values_dtype = BF16,
                      .values_stride = 1};
    kernel_vs_host(&c, numel * 4, n * 2);
    uint16_t *h = (uint16_t *)junk(numel * 2);
    kern_scatter c2 = {.dst = (char *)h, .dst_dtype = F16, .off = off, .n = n / 2,
                       .run_stride = 1, .elements = (int64_t)n / 2, .values = f,
                       .values_dtype = F32, .values_stride = 1};
    kernel_vs_host(&c2, numel * 2, numel * 4);
    free(f);
    free(b);
    free(h);
    free(off);
}

static void test_kernel_runs(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    size_t n = 3000, numel = 3 * 1000 * 1000;
    int64_t *off = malloc(n * 8), *cnt = malloc(n * 8), el = 0;
    assert_non_null(off);
    assert_non_null(cnt);
    for (size_t i = 0; i < n; i++) { /* runs of 1..700 elements, stride 3, disjoint */
        off[i] = i % 13 == 7 ? -1 : (int64_t)(((i * 7919) % n) * 333);
        cnt[i] = 1 + (int64_t)(twin_rnd() % 110);
        el += cnt[i];
    }
    char *dst = junk(numel * 2), *vals = junk((size_t)el * 4);
    kern_scatter s = {.dst = dst, .dst_dtype = U16, .off = off, .counts = cnt, .n = n,
                      .run_stride = 3, .elements = el, .values = vals, .values_dtype = U16,
                      .values_stride = 1};
    kernel_vs_host(&s, numel * 2, (size_t)el * 4);
    s.run_stride = 1;
    kernel_vs_host(&s, numel * 2, (size_t)el * 4);
    float *f = malloc((size_t)el * 4);
    assert_non_null(f);
    for (int64_t i = 0; i < el; i++)
        f[i] = twin_uniform();
    s.values = f;
    s.values_dtype = F32;
    s.dst_dtype = BF16;
    s.run_stride = 3;
    kernel_vs_host(&s, numel * 2, (size_t)el * 4);
    free(f);
    free(dst);
    free(vals);
    free(off);
    free(cnt);
}

/* ---- delta updates through the backend ---- */

#define R 256
#define C 512
#define SR 64  /* the shard's checkpoint rows */
#define SC 128 /* and columns; this rank holds columns [64, 128) */
#define NN 3000 /* the norm's elements */

typedef struct world {
    refit_ctx *ctx;
    refit_model *m;
    void *w, *s, *n;            /* runtime: BF16 [R, C], BF16 [SR, SC/2], F32 [NN] */
    int64_t ws[2], ss[2], ns[1];
    refit_tensor tw, ts, tn;
    cudaStream_t st;
} world;

static void world_open(world *w, uint64_t undo_budget)
{
    memset(w, 0, sizeof *w);
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.undo_device_budget = undo_budget;
    assert_int_equal(refit_open(&w->ctx, &o), REFIT_OK);
    OK(w, refit_model_create(&w->m, w->ctx));
    CU(cudaStreamCreateWithFlags(&w->st, cudaStreamNonBlocking));
    CU(cudaMalloc(&w->w, R * C * 2));
    CU(cudaMalloc(&w->s, SR * SC));
    CU(cudaMalloc(&w->n, NN * 4));
    w->ws[0] = R, w->ws[1] = C, w->ss[0] = SR, w->ss[1] = SC / 2, w->ns[0] = NN;
    w->tw = (refit_tensor){.data = w->w, .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 2,
                           .dtype = BF16, .shape = w->ws};
    w->ts = (refit_tensor){.data = w->s, .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 2,
                           .dtype = BF16, .shape = w->ss};
    w->tn = (refit_tensor){.data = w->n, .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 1,
                           .dtype = F32, .shape = w->ns};
    OK(w, refit_model_add_module(w->m, "w", "unquantized", NULL));
    OK(w, refit_module_bind_runtime(w->m, "w", "w", &w->tw));
    OK(w, refit_model_add_module(w->m, "s", "unquantized", NULL));
    OK(w, refit_module_bind_runtime(w->m, "s", "w", &w->ts));
    OK(w, refit_model_add_module(w->m, "n", "unquantized", "cast: true"));
    OK(w, refit_module_bind_runtime(w->m, "n", "w", &w->tn));
    refit_ckpt_spec a = REFIT_CKPT_SPEC_INIT, b = REFIT_CKPT_SPEC_INIT, c = REFIT_CKPT_SPEC_INIT;
    a.dtype = BF16, a.ndim = 2, a.shape[0] = R, a.shape[1] = C;
    OK(w, refit_model_expect(w->m, "w", "w.weight", &a));
    b.dtype = BF16, b.ndim = 2, b.shape[0] = SR, b.shape[1] = SC;
    b.shard_dim = 1, b.shard_rank = 1, b.shard_count = 2;
    OK(w, refit_model_expect(w->m, "s", "s.weight", &b));
    c.dtype = BF16, c.ndim = 1, c.shape[0] = NN;
    OK(w, refit_model_expect(w->m, "n", "n.weight", &c));
    OK(w, refit_model_seal(w->m));
}

static void world_close(world *w)
{
    refit_close(w->ctx);
    cudaFree(w->w);
    cudaFree(w->s);
    cudaFree(w->n);
    cudaStreamDestroy(w->st);
}

static const char *const names[3] = {"w.weight", "s.weight", "n.weight"};
static const int64_t numels[3] = {R * C, SR * SC, NN};

/* The checkpoint of version v: BF16 host arrays. */
static uint16_t *ckpt(int i, uint64_t v)
{
    uint16_t *p = malloc((size_t)numels[i] * 2);
    assert_non_null(p);
    for (int64_t k = 0; k < numels[i]; k++)
        p[k] = kern_f32_to_bf16((float)((int)(twin_mix(v * 7919 + (uint64_t)i * 104729 +
                                                        (uint64_t)k) % 2001) - 1000) / 64.0f);
    return p;
}

static void full_update(world *w, const char *label, uint16_t *const ck[3])
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    refit_txn *t = NULL;
    OK(w, refit_begin(&t, w->m, &o));
    for (int i = 0; i < 3; i++) {
        int64_t shape[2] = {i == 0 ? R : i == 1 ? SR : NN, i == 0 ? C : SC};
        refit_tensor s = {.data = ck[i], .device = {REFIT_DEVICE_CPU, 0}, .ndim = i == 2 ? 1 : 2,
                          .dtype = BF16, .shape = shape};
        OK(w, refit_load(t, names[i], &s, w->st));
    }
    OK(w, refit_finalize(t));
}

static char *snapshot(world *w, size_t *n)
{
    *n = R * C * 2 + SR * SC + NN * 4;
    char *p = malloc(*n);
    assert_non_null(p);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(p, w->w, R * C * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(p + R * C * 2, w->s, SR * SC, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(p + R * C * 2 + SR * SC, w->n, NN * 4, cudaMemcpyDeviceToHost));
    return p;
}

/* A 3% patch of tensor i: indices (shuffled when asked), their new values
 * from version 2, written into patched[i] too. */
typedef struct patch {
    int64_t *idx, *cnt;
    size_t n;
    int64_t elements;
    uint16_t *vals;
} patch;

static patch make_patch(int i, uint16_t *patched, const uint16_t *v2, int shuffled, int runs)
{
    patch p = {0};
    p.idx = malloc((size_t)numels[i] * 8);
    p.cnt = malloc((size_t)numels[i] * 8);
    p.vals = malloc((size_t)numels[i] * 2);
    assert_non_null(p.idx);
    assert_non_null(p.cnt);
    assert_non_null(p.vals);
    for (int64_t k = 0; k < numels[i];) {
        int64_t len = runs ? 1 + (int64_t)(twin_rnd() % 40) : 1;
        if (k + len > numels[i])
            len = numels[i] - k;
        if (twin_rnd() % 100 < 3) {
            p.idx[p.n] = k;
            p.cnt[p.n++] = len;
        }
        k += len + (runs ? (int64_t)(twin_rnd() % 300) : 0);
    }
    for (size_t a = 0; shuffled && a + 1 < p.n; a++) {
        size_t b = a + (size_t)(twin_rnd() % (p.n - a));
        int64_t x = p.idx[a], y = p.cnt[a];
        p.idx[a] = p.idx[b], p.cnt[a] = p.cnt[b];
        p.idx[b] = x, p.cnt[b] = y;
    }
    for (size_t r = 0; r < p.n; r++)
        for (int64_t k = 0; k < p.cnt[r]; k++) {
            p.vals[p.elements++] = v2[p.idx[r] + k];
            patched[p.idx[r] + k] = v2[p.idx[r] + k];
        }
    return p;
}

/* values: 0 device, 1 pinned, 2 pageable */
static void delta_round(uint64_t undo_budget, int where)
{
    world a, b;
    world_open(&a, undo_budget);
    world_open(&b, 0);
    uint16_t *v1[3], *v2[3], *patched[3];
    for (int i = 0; i < 3; i++) {
        v1[i] = ckpt(i, 1);
        v2[i] = ckpt(i, 2);
        patched[i] = malloc((size_t)numels[i] * 2);
        assert_non_null(patched[i]);
        memcpy(patched[i], v1[i], (size_t)numels[i] * 2);
    }
    full_update(&a, "v1", v1);
    size_t nb;
    char *before = snapshot(&a, &nb);
    patch p[3];
    void *buf[3];
    for (int i = 0; i < 3; i++) {
        p[i] = make_patch(i, patched[i], v2[i], i != 1, i == 1);
        size_t vb = (size_t)p[i].elements * 2;
        if (where == 0) {
            CU(cudaMalloc(&buf[i], vb ? vb : 2));
            CU(cudaMemcpy(buf[i], p[i].vals, vb, cudaMemcpyHostToDevice));
        } else if (where == 1) {
            CU(cudaHostAlloc(&buf[i], vb ? vb : 2, cudaHostAllocDefault));
            memcpy(buf[i], p[i].vals, vb);
        } else {
            buf[i] = p[i].vals;
        }
    }
    for (int round = 0; round < 2; round++) { /* aborted, then committed */
        refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
        o.version_label = "v2";
        o.rollback = 1;
        o.base_version = "v1";
        o.others_unchanged = 1;
        refit_txn *t = NULL;
        OK(&a, refit_begin(&t, a.m, &o));
        for (int i = 0; i < 3; i++) {
            int64_t vshape[1] = {p[i].elements};
            refit_tensor v = {.data = buf[i], .ndim = 1, .dtype = BF16, .shape = vshape,
                              .device = {where == 0 ? REFIT_DEVICE_CUDA
                                         : where == 1 ? REFIT_DEVICE_CUDA_HOST
                                                      : REFIT_DEVICE_CPU, 0}};
            if (i == 1)
                OK(&a, refit_load_delta_runs(t, names[i], p[i].n, p[i].idx, p[i].cnt, &v,
                                             a.st));
            else
                OK(&a, refit_load_delta(t, names[i], p[i].n, p[i].idx, &v, a.st));
        }
        refit_txn_stats st;
        OK(&a, refit_txn_stats_get(t, &st));
        if (undo_budget)
            assert_true(st.undo_device_bytes > 0);
        else
            assert_true(st.undo_host_bytes > 0 && st.undo_device_bytes == 0);
        if (round == 0) {
            OK(&a, refit_abort(t));
            size_t n2;
            char *now = snapshot(&a, &n2);
            int same = !memcmp(now, before, nb);
            free(now);
            if (!same)
                fail_msg("abort did not restore every byte (values %d, budget %llu)", where,
                         (unsigned long long)undo_budget);
            assert_string_equal(refit_worker_version(a.ctx), "v1");
        } else {
            OK(&a, refit_finalize(t));
        }
    }
    full_update(&b, "v2", patched);
    size_t na, nb2;
    char *da = snapshot(&a, &na), *db = snapshot(&b, &nb2);
    int same = na == nb2 && !memcmp(da, db, na);
    free(da);
    free(db);
    free(before);
    for (int i = 0; i < 3; i++) {
        if (where == 0)
            cudaFree(buf[i]);
        else if (where == 1)
            cudaFreeHost(buf[i]);
        free(p[i].idx);
        free(p[i].cnt);
        free(p[i].vals);
        free(v1[i]);
        free(v2[i]);
        free(patched[i]);
    }
    world_close(&a);
    world_close(&b);
    if (!same)
        fail_msg("delta (values %d, budget %llu) != full reload of the patched checkpoint",
                 where, (unsigned long long)undo_budget);
}

static void test_delta_values_on_device(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    delta_round(0, 0);
    delta_round(64u << 20, 0);
}

static void test_delta_values_pinned(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    delta_round(0, 1);
}

static void test_delta_values_pageable(void **state)
{
    (void)state;
    SKIP_WITHOUT_DEVICE();
    delta_round(0, 2);
    delta_round(64u << 20, 2);
}

int main(void)
{
    if (twin_skip_suite_without_device())
        return 0;
    twin_seed(31);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_elements),
        cmocka_unit_test(test_kernel_runs),
        cmocka_unit_test(test_delta_values_on_device),
        cmocka_unit_test(test_delta_values_pinned),
        cmocka_unit_test(test_delta_values_pageable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
