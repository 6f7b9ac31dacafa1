/* Delta updates into online-quantized modules on a CUDA device
 * (docs/core.md "Delta updates", core/delta_master.c): the masters in
 * device memory, the patch's values on the device, the touched row bands
 * (or the whole tensor) rebuilt by the plugins' own CUDA kernels. Each
 * case builds one model twice, its runtime on device 0 and in host memory
 * (the CPU references, which tests/core/test_delta_online.c holds to a
 * full reload), loads version 1, applies the same patch (about 3% of the
 * elements, scattered, and a run) and checks: the device bytes equal the
 * host's, and equal a full reload of the patched checkpoint on the
 * device. A NaN in a patched block-128 block fails finalize (the status
 * word) and rolls back: bytes, version, health and master as before. The
 * formats are the plugins on the search path, built with their device
 * code. Skips without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_twin.h"

#define E4M3 ((refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1})
#define U8 ((refit_dtype){REFIT_DTYPE_UINT, 8, 1})
#define I32 ((refit_dtype){REFIT_DTYPE_INT, 32, 1})
#define N 256
#define K 256

typedef struct rt_spec {
    const char *name;
    refit_dtype dt;
    int ndim;
    int64_t shape[2];
} rt_spec;

typedef struct fcase {
    const char *what;
    const char *format, *params;
    rt_spec rt[3];
    int n_rt;
} fcase;

static const fcase cases[] = {
    {"fp8 per-tensor", "fp8", "scheme: per_tensor\nonline: true",
     {{"weight", E4M3, 2, {N, K}}, {"weight_scale", F32, 1, {1}}}, 2},
    {"fp8 per-channel", "fp8", "scheme: per_channel\nonline: true",
     {{"weight", E4M3, 2, {N, K}}, {"weight_scale", F32, 1, {N}}}, 2},
    {"fp8 block-128", "fp8", "scheme: block128\nonline: true",
     {{"weight", E4M3, 2, {N, K}}, {"weight_scale", F32, 2, {N / 128, K / 128}}}, 2},
    {"mxfp8", "mxfp8", "online: true",
     {{"weight", E4M3, 2, {N, K}}, {"weight_scale", U8, 2, {N, K / 32}}}, 2},
    {"mxfp4", "mxfp4", NULL,
     {{"weight", U8, 2, {N, K / 2}}, {"weight_scale", U8, 2, {N, K / 32}}}, 2},
    {"nvfp4", "nvfp4", NULL,
     {{"weight", U8, 2, {N, K / 2}}, {"weight_scale", E4M3, 1, {N * (K / 16)}},
      {"alpha", F32, 1, {1}}}, 3},
    {"int4 u8", "int4", "group_size: 32\nlayout: u8\nonline: true",
     {{"weight", U8, 2, {N, K / 2}}, {"weight_scale", BF16, 2, {N, K / 32}}}, 2},
};

typedef struct world {
    refit_ctx *ctx;
    refit_model *m;
    int on_device;
    refit_tensor rt[3];
    int64_t shape[3][2];
    void *data[3];
    size_t bytes[3];
    int n_rt;
} world;

static size_t dt_bytes(refit_dtype dt) { return dt.bits / 8; }

static refit_tensor host_tensor(void *data, refit_dtype dt, int ndim, int64_t *shape)
{
    refit_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device = (refit_device){REFIT_DEVICE_CPU, 0};
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

/* split: the weight's checkpoint is two tensors, "g.weight" rows [0, N/2)
 * and "u.weight" rows [N/2, N) (a fused gate_up), else one "w.weight". */
static void open_world_as(world *w, const fcase *c, int on_device, int split)
{
    memset(w, 0, sizeof *w);
    w->on_device = on_device;
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    o.delta_master_budget = 64u << 20;
    OK(w, refit_open(&w->ctx, &o));
    OK(w, refit_model_create(&w->m, w->ctx));
    OK(w, refit_model_add_module(w->m, "lin", c->format, c->params));
    w->n_rt = c->n_rt;
    for (int i = 0; i < c->n_rt; i++) {
        const rt_spec *r = &c->rt[i];
        size_t n = dt_bytes(r->dt);
        for (int d = 0; d < r->ndim; d++)
            n *= (size_t)r->shape[d];
        memcpy(w->shape[i], r->shape, sizeof w->shape[i]);
        w->bytes[i] = n;
        if (on_device) {
            CU(cudaMalloc(&w->data[i], n));
            CU(cudaMemset(w->data[i], 0, n));
        } else {
            w->data[i] = calloc(1, n);
        }
        w->rt[i] = host_tensor(w->data[i], r->dt, r->ndim, w->shape[i]);
        if (on_device)
            w->rt[i].device = (refit_device){REFIT_DEVICE_CUDA, 0};
        OK(w, refit_module_bind_runtime(w->m, "lin", r->name, &w->rt[i]));
    }
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = BF16;
    s.ndim = 2;
    s.shape[0] = split ? N / 2 : N;
    s.shape[1] = K;
    s.target = "weight";
    if (split) {
        OK(w, refit_model_expect(w->m, "lin", "g.weight", &s));
        s.dst_offset[0] = N / 2;
        OK(w, refit_model_expect(w->m, "lin", "u.weight", &s));
    } else {
        OK(w, refit_model_expect(w->m, "lin", "w.weight", &s));
    }
    OK(w, refit_model_seal(w->m));
}

static void open_world(world *w, const fcase *c, int on_device)
{
    open_world_as(w, c, on_device, 0);
}

static void close_world(world *w)
{
    refit_model_destroy(w->m);
    refit_close(w->ctx);
    for (int i = 0; i < w->n_rt; i++) {
        if (w->on_device)
            cudaFree(w->data[i]);
        else
            free(w->data[i]);
    }
}

/* Every runtime byte, in host memory (malloc'd). */
static char *runtime_bytes(const world *w, size_t *n)
{
    size_t total = 0;
    for (int i = 0; i < w->n_rt; i++)
        total += w->bytes[i];
    char *out = malloc(total), *at = out;
    for (int i = 0; i < w->n_rt; i++, at += w->bytes[i - 1]) {
        if (w->on_device)
            CU(cudaMemcpy(at, w->data[i], w->bytes[i], cudaMemcpyDeviceToHost));
        else
            memcpy(at, w->data[i], w->bytes[i]);
    }
    *n = total;
    return out;
}

/* Version v of the bf16 weight: finite values of varied magnitude. */
static uint16_t *weight_v(int v)
{
    uint16_t *b = malloc((size_t)N * K * 2);
    for (int64_t i = 0; i < (int64_t)N * K; i++) {
        uint64_t r = twin_mix((uint64_t)v * 0x9E3779B97F4A7C15ull + (uint64_t)i);
        float f = ((float)(r >> 40) / (float)(1 << 24) - 0.5f) * ldexpf(1.0f, (int)(r % 9) - 4);
        uint32_t u;
        memcpy(&u, &f, 4);
        b[i] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
    return b;
}

static void load_weight(world *w, const char *label, uint16_t *bytes)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = 1;
    refit_txn *t = NULL;
    int64_t shape[2] = {N, K};
    refit_tensor src = host_tensor(bytes, BF16, 2, shape);
    OK(w, refit_begin(&t, w->m, &o));
    OK(w, refit_load(t, "w.weight", &src, NULL));
    OK(w, refit_finalize(t));
}

/* The patch: sorted unique indices (3% and a run of 40 at 300). */
static int64_t make_indices(int64_t *idx, uint64_t seed)
{
    int64_t n = 0, want = (int64_t)N * K * 3 / 100;
    for (int64_t i = 0; i < 40; i++)
        idx[n++] = 300 + i;
    for (int64_t i = 0; i < want; i++)
        idx[n++] = (int64_t)(twin_mix(seed + (uint64_t)i) % ((uint64_t)N * K));
    for (int64_t i = 1; i < n; i++) /* insertion sort: small */
        for (int64_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
            int64_t x = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = x;
        }
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (!u || idx[u - 1] != idx[i])
            idx[u++] = idx[i];
    return u;
}

/* Delta v1 -> v2 with values vals[0, n) at idx, on w's device. */
static int apply_delta(world *w, const int64_t *idx, int64_t n, const uint16_t *vals)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    o.rollback = 1;
    refit_txn *t = NULL;
    OK(w, refit_begin(&t, w->m, &o));
    void *v = (void *)vals;
    if (w->on_device) {
        CU(cudaMalloc(&v, (size_t)n * 2));
        CU(cudaMemcpy(v, vals, (size_t)n * 2, cudaMemcpyHostToDevice));
    }
    int64_t shape[1] = {n};
    refit_tensor src = host_tensor(v, BF16, 1, shape);
    if (w->on_device)
        src.device = (refit_device){REFIT_DEVICE_CUDA, 0};
    OK(w, refit_load_delta(t, "w.weight", (size_t)n, idx, &src, NULL));
    int rc = refit_finalize(t);
    if (w->on_device)
        CU(cudaFree(v));
    return rc;
}

static void run_case(const fcase *c)
{
    world dev, host;
    open_world(&dev, c, 1);
    open_world(&host, c, 0);
    uint16_t *w1 = weight_v(1), *w2 = weight_v(2);
    load_weight(&dev, "v1", w1);
    load_weight(&host, "v1", w1);
    int64_t *idx = malloc(sizeof *idx * ((size_t)N * K * 3 / 100 + 40));
    int64_t n = make_indices(idx, 17);
    uint16_t *vals = malloc((size_t)n * 2), *patched = malloc((size_t)N * K * 2);
    memcpy(patched, w1, (size_t)N * K * 2);
    for (int64_t i = 0; i < n; i++)
        patched[idx[i]] = vals[i] = w2[idx[i]];
    int rc = apply_delta(&dev, idx, n, vals);
    if (rc)
        fail_msg("%s: device delta: %s: %s", c->what, refit_status_name(rc),
                 refit_errmsg(dev.ctx));
    OK(&host, apply_delta(&host, idx, n, vals));
    size_t nd, nh, nf;
    char *bd = runtime_bytes(&dev, &nd), *bh = runtime_bytes(&host, &nh);
    assert_int_equal(nd, nh);
    if (memcmp(bd, bh, nd))
        fail_msg("%s: the device delta's bytes differ from the CPU reference's", c->what);
    load_weight(&dev, "v2-full", patched);
    char *bf = runtime_bytes(&dev, &nf);
    if (memcmp(bd, bf, nd))
        fail_msg("%s: the device delta's bytes differ from a full reload on the device",
                 c->what);
    free(bd), free(bh), free(bf), free(idx), free(vals), free(patched), free(w1), free(w2);
    close_world(&dev);
    close_world(&host);
}

static void test_formats(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

/* A NaN in a patched block-128 block: the status word fails finalize,
 * which rolls back; bytes, version and health as they were, and the
 * master too (a delta after it equals the CPU reference's). */
static void test_nan_in_patched_block(void **state)
{
    (void)state;
    const fcase *c = &cases[2];
    world dev;
    open_world(&dev, c, 1);
    uint16_t *w1 = weight_v(1), *w2 = weight_v(2);
    load_weight(&dev, "v1", w1);
    size_t n0, n1;
    char *before = runtime_bytes(&dev, &n0);
    int64_t idx[3] = {5, 200 * K + 7, 200 * K + 8};
    uint16_t vals[3] = {w2[5], 0x7FC0 /* NaN */, w2[200 * K + 8]};
    int rc = apply_delta(&dev, idx, 3, vals);
    assert_int_equal(rc, REFIT_ECORRUPT);
    char *after = runtime_bytes(&dev, &n1);
    assert_memory_equal(before, after, n0);
    assert_string_equal(refit_worker_version(dev.ctx), "v1");
    assert_int_equal(refit_worker_health(dev.ctx), REFIT_HEALTH_READY);
    /* the master holds version 1 again: the same patch without the NaN
     * equals a full reload of version 1 with it */
    vals[1] = w2[200 * K + 7];
    OK(&dev, apply_delta(&dev, idx, 3, vals));
    char *delta = runtime_bytes(&dev, &n1);
    for (int i = 0; i < 3; i++)
        w1[idx[i]] = vals[i];
    load_weight(&dev, "v2-full", w1);
    char *full = runtime_bytes(&dev, &n1);
    assert_memory_equal(delta, full, n0);
    free(before), free(after), free(delta), free(full), free(w1), free(w2);
    close_world(&dev);
}

static const char *const halves[2] = {"g.weight", "u.weight"};

/* A full update of open_world_as's split checkpoint from w (N x K). */
static void load_halves(world *w, const char *label, uint16_t *bytes)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    refit_txn *t = NULL;
    int64_t half[2] = {N / 2, K};
    OK(w, refit_begin(&t, w->m, &o));
    for (int h = 0; h < 2; h++) {
        refit_tensor src = host_tensor(bytes + (size_t)h * (N / 2) * K, BF16, 2, half);
        OK(w, refit_load(t, halves[h], &src, NULL));
    }
    OK(w, refit_finalize(t));
}

/* One module's two checkpoint tensors (a fused gate_up) patched in one
 * update: its unit is rebuilt twice, each time with a status word, and
 * the update commits the bytes of a full reload of the patched
 * checkpoint (the zoo's 3% delta into Qwen3-30B-A3B's expert stacks ran
 * out of words: one a unit was taken to be enough). */
static void test_two_tensors_one_unit(void **state)
{
    (void)state;
    world dev;
    open_world_as(&dev, &cases[2] /* fp8 block-128 */, 1, 1);
    uint16_t *w1 = weight_v(1), *w2 = weight_v(2);
    load_halves(&dev, "v1", w1);
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "v2";
    o.base_version = "v1";
    o.others_unchanged = 1;
    refit_txn *t = NULL;
    OK(&dev, refit_begin(&t, dev.m, &o));
    void *dv;
    CU(cudaMalloc(&dv, 2 * 7 * sizeof(uint16_t)));
    for (int h = 0; h < 2; h++) { /* 7 elements of each half, values on the device */
        int64_t idx[7];
        uint16_t vals[7];
        for (int i = 0; i < 7; i++) {
            idx[i] = (int64_t)i * 4099 % ((int64_t)(N / 2) * K);
            size_t at = (size_t)h * (N / 2) * K + (size_t)idx[i];
            vals[i] = w1[at] = w2[at]; /* w1 becomes the patched checkpoint */
        }
        uint16_t *v = (uint16_t *)dv + h * 7;
        CU(cudaMemcpy(v, vals, sizeof vals, cudaMemcpyHostToDevice));
        int64_t vs[1] = {7};
        refit_tensor src = host_tensor(v, BF16, 1, vs);
        src.device = (refit_device){REFIT_DEVICE_CUDA, 0};
        OK(&dev, refit_load_delta(t, halves[h], 7, idx, &src, NULL));
    }
    int rc = refit_finalize(t);
    CU(cudaFree(dv));
    if (rc)
        fail_msg("a delta of both tensors of one unit: %s: %s", refit_status_name(rc),
                 refit_errmsg(dev.ctx));
    assert_string_equal(refit_worker_version(dev.ctx), "v2");
    size_t nd, nf;
    char *delta = runtime_bytes(&dev, &nd);
    load_halves(&dev, "v2-full", w1);
    char *full = runtime_bytes(&dev, &nf);
    assert_int_equal(nd, nf);
    if (memcmp(delta, full, nd))
        fail_msg("the delta's bytes differ from a full reload of the patched checkpoint");
    free(delta), free(full), free(w1), free(w2);
    close_world(&dev);
}

int main(void)
{
    if (twin_skip_suite_without_device())
        return 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_nan_in_patched_block),
        cmocka_unit_test(test_two_tensors_one_unit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
