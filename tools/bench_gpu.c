/*
 * refit-bench gpu [--json] [--repeat R] [--layers L] [--dir PATH] [--keep]
 *                 [--python PY] [--no-torch] [--out FILE]
 *
 * Reloads through refit on one GPU, each figure against a ceiling or a peer
 * measured in the same run (medians of R runs after a warm-up):
 *
 *   d2d          a Llama-shaped BF16 model (TinyLlama 1.1B shapes, 2.2 GB,
 *                L layers) from device tensors; ceiling: one cudaMemcpy
 *                device-to-device of the same bytes; peer: a PyTorch
 *                param.copy_ loop. Also the same reload with rollback on.
 *   pinned       the same from pinned host memory; ceiling: one pinned
 *                cudaMemcpy host-to-device of the same bytes.
 *   safetensors  the same from a page-cached safetensors directory (two
 *                files and an index, written here); ceiling: the pinned
 *                copy; peer: safetensors.torch.load_file + copy_.
 *   moe100k      100,000 small BF16 tensors [32, 64] into 1,000 stacked
 *                expert tensors; peer: a PyTorch copy_ loop.
 *   quant        online FP8 quantization on the device of the model's
 *                linear weights (154 BF16 matrices, 1.9 GB) per tensor, per
 *                channel and per 128x128 block: the kernel (one call of the
 *                quant_fp8 service for all, and one per weight as post-load
 *                does per module) against the device copy bandwidth
 *                (minimum bytes: 2 read + 1 written per element), and a
 *                whole online-FP8 reload through refit; peer: the same
 *                quantization in PyTorch ops. Checked against the CPU
 *                reference on layer 0.
 *
 * The PyTorch peers run in tools/bench_gpu.py, exec'd here after refit's
 * figures with the same shapes; its JSON is merged into ours.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <jansson.h>

#include <refit/refit.h>
#include <refit/sys/cuda.h>

#include "core/cuda/kern_cuda.h"
#include "plugins/fp8/fp8_direct.h"
#include "plugins/fp8/quant_fp8.h"
#include "tools/bench_gpu.h"
#include "tools/bench_gpu_reload.h"
#include "tools/cli.h"

#define MAX_T 512
#define MOE_MODULES 1000
#define MOE_PER 100
#define MOE_R 32
#define MOE_C 64

typedef struct bt {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t bytes, off;          /* in the arenas */
    refit_tensor rt;
} bt;

typedef struct bench {
    int repeat, layers;
    const char *dir, *python, *out;
    bool json, keep, torch;
    const char *only;           /* comma-separated sections, NULL: all */
    bt t[MAX_T];
    int n;
    size_t total;
    char *dev_rt, *dev_src;     /* runtime arena, device source arena */
    char *pinned;               /* pinned source arena */
    refit_ctx *ctx;
    refit_model *model;
    json_t *res;
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define CU(call)                                                              \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) {                                              \
            fprintf(stderr, "refit-bench gpu: %s: %s\n", #call, cudaGetErrorString(e_)); \
            return 1;                                                         \
        }                                                                     \
    } while (0)

static int rfail(bench *b, const char *what, int rc)
{
    fprintf(stderr, "refit-bench gpu: %s: %s: %s [%s]\n", what, refit_status_name(rc),
            refit_errmsg(b->ctx), refit_sys_cuda_last_error());
    return 1;
}

/* ---- the Llama-shaped model ---- */

static void add_t(bench *b, const char *name, int ndim, int64_t d0, int64_t d1)
{
    bt *t = &b->t[b->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->bytes = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1) * 2;
    t->off = b->total;
    b->total += (t->bytes + 255) & ~(size_t)255;
}

/* TinyLlama-1.1B shapes: hidden 2048, 32 heads of 64, 4 KV heads,
 * intermediate 5632, vocab 32000, untied head. */
static void llama_shapes(bench *b)
{
    const int64_t H = 2048, KV = 256, I = 5632, V = 32000;
    char n[96];
    add_t(b, "model.embed_tokens.weight", 2, V, H);
    for (int l = 0; l < b->layers; l++) {
        static const char *attn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, attn[k]);
            add_t(b, n, 2, k == 1 || k == 2 ? KV : H, H);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
        add_t(b, n, 2, I, H);
        snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", l);
        add_t(b, n, 2, I, H);
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
        add_t(b, n, 2, H, I);
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
        add_t(b, n, 1, H, 1);
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
        add_t(b, n, 1, H, 1);
    }
    add_t(b, "model.norm.weight", 1, H, 1);
    add_t(b, "lm_head.weight", 2, V, H);
}

static void fill_random(char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t v = x & 0x3fff3fff3fff3fffull; /* finite BF16 values */
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (char)(x >> (8 * (i & 7)));
}

static int llama_setup(bench *b)
{
    llama_shapes(b);
    CU(cudaMalloc((void **)&b->dev_rt, b->total));
    CU(cudaMalloc((void **)&b->dev_src, b->total));
    CU(cudaHostAlloc((void **)&b->pinned, b->total, cudaHostAllocDefault));
    fill_random(b->pinned, b->total, 0x1234);
    CU(cudaMemcpy(b->dev_src, b->pinned, b->total, cudaMemcpyHostToDevice));
    CU(cudaMemset(b->dev_rt, 0, b->total));
    int rc = refit_open(&b->ctx, NULL);
    if (!rc)
        rc = refit_model_create(&b->model, b->ctx);
    for (int i = 0; i < b->n && !rc; i++) {
        bt *t = &b->t[i];
        t->rt = (refit_tensor){.data = b->dev_rt + t->off, .device = {REFIT_DEVICE_CUDA, 0},
                               .ndim = t->ndim, .dtype = REFIT_BF16, .shape = t->shape};
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = REFIT_BF16;
        s.ndim = t->ndim;
        s.shape[0] = t->shape[0];
        s.shape[1] = t->shape[1];
        if (!(rc = refit_model_add_module(b->model, t->name, "unquantized", NULL)) &&
            !(rc = refit_module_bind_runtime(b->model, t->name, "w", &t->rt)))
            rc = refit_model_expect(b->model, t->name, t->name, &s);
    }
    if (!rc)
        rc = refit_model_seal(b->model);
    return rc ? rfail(b, "building the Llama-shaped model", rc) : 0;
}

/* One reload from an arena (device or pinned), timed from begin to the
 * return of finalize (which waits for the stream). */
/* One reload of the arena; secs: begin to finalize's return. phase (may be
 * NULL): where the host spent it, [begin, the loads, finalize]. */
static int reload_arena(bench *b, char *arena, int dev_type, int rollback, double *secs,
                        double phase[3])
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "bench";
    o.rollback = rollback;
    refit_txn *txn;
    double t0 = now_s();
    int rc = refit_begin(&txn, b->model, &o);
    double t1 = now_s();
    for (int i = 0; i < b->n && !rc; i++) {
        bt *t = &b->t[i];
        refit_tensor src = {.data = arena + t->off, .device = {dev_type, 0}, .ndim = t->ndim,
                            .dtype = REFIT_BF16, .shape = t->shape};
        if ((rc = refit_load(txn, t->name, &src, NULL)))
            refit_abort(txn);
    }
    double t2 = now_s();
    if (!rc)
        rc = refit_finalize(txn);
    double t3 = now_s();
    *secs = t3 - t0;
    if (phase) {
        phase[0] = t1 - t0;
        phase[1] = t2 - t1;
        phase[2] = t3 - t2;
    }
    return rc ? rfail(b, "reload", rc) : 0;
}

static int check_equal(bench *b, const char *what)
{
    char *back = malloc(b->total);
    if (!back)
        return 1;
    CU(cudaMemcpy(back, b->dev_rt, b->total, cudaMemcpyDeviceToHost));
    for (int i = 0; i < b->n; i++)
        if (memcmp(back + b->t[i].off, b->pinned + b->t[i].off, b->t[i].bytes)) {
            fprintf(stderr, "refit-bench gpu: %s: %s differs from its source\n", what,
                    b->t[i].name);
            free(back);
            return 1;
        }
    free(back);
    return 0;
}

static int time_memcpy(bench *b, void *dst, const void *src, double *out)
{
    double v[64];
    for (int r = -1; r < b->repeat; r++) {
        double t0 = now_s();
        CU(cudaMemcpyAsync(dst, src, b->total, cudaMemcpyDefault, NULL));
        CU(cudaStreamSynchronize(NULL));
        if (r >= 0)
            v[r] = now_s() - t0;
    }
    *out = median(v, b->repeat);
    return 0;
}

/* The median reload time, and the median of each host phase (phase may be
 * NULL). */
static int time_reload(bench *b, char *arena, int dev_type, int rollback, double *out,
                       double phase[3])
{
    double v[64], ph[3][64];
    for (int r = -1; r < b->repeat; r++) {
        CU(cudaMemset(b->dev_rt, 0, b->total));
        CU(cudaDeviceSynchronize());
        double s, p[3];
        if (reload_arena(b, arena, dev_type, rollback, &s, p))
            return 1;
        if (r >= 0) {
            v[r] = s;
            for (int k = 0; k < 3; k++)
                ph[k][r] = p[k];
        }
    }
    *out = median(v, b->repeat);
    for (int k = 0; k < 3 && phase; k++)
        phase[k] = median(ph[k], b->repeat);
    return check_equal(b, dev_type == REFIT_DEVICE_CUDA ? "d2d" : "pinned");
}

static void put(json_t *o, const char *k, double v)
{
    json_object_set_new(o, k, json_real(v));
}

static int bench_d2d_pinned(bench *b)
{
    double t_d2d, t_d2d_rb, t_ceil_d2d, t_pin, t_ceil_h2d, ph[3];
    if (time_memcpy(b, b->dev_rt, b->dev_src, &t_ceil_d2d) ||
        time_reload(b, b->dev_src, REFIT_DEVICE_CUDA, 0, &t_d2d, ph) ||
        time_reload(b, b->dev_src, REFIT_DEVICE_CUDA, 1, &t_d2d_rb, NULL) ||
        time_memcpy(b, b->dev_rt, b->pinned, &t_ceil_h2d) ||
        time_reload(b, b->pinned, REFIT_DEVICE_CUDA_HOST, 0, &t_pin, NULL))
        return 1;
    json_t *d = json_object(), *p = json_object();
    json_object_set_new(d, "tensors", json_integer(b->n));
    json_object_set_new(d, "bytes", json_integer((json_int_t)b->total));
    put(d, "refit_ms", t_d2d * 1e3);
    put(d, "ceiling_memcpy_d2d_ms", t_ceil_d2d * 1e3);
    put(d, "ratio_to_ceiling", t_ceil_d2d / t_d2d);
    put(d, "refit_GBps", b->total / t_d2d / 1e9);
    put(d, "ceiling_GBps", b->total / t_ceil_d2d / 1e9);
    put(d, "refit_rollback_ms", t_d2d_rb * 1e3);
    put(d, "host_begin_ms", ph[0] * 1e3);
    put(d, "host_loads_ms", ph[1] * 1e3);
    put(d, "host_finalize_ms", ph[2] * 1e3);
    put(d, "target", 0.90);
    json_object_set_new(d, "meets_target", json_boolean(t_ceil_d2d / t_d2d >= 0.90));
    json_object_set_new(b->res, "d2d", d);
    json_object_set_new(p, "tensors", json_integer(b->n));
    json_object_set_new(p, "bytes", json_integer((json_int_t)b->total));
    put(p, "refit_ms", t_pin * 1e3);
    put(p, "ceiling_memcpy_h2d_ms", t_ceil_h2d * 1e3);
    put(p, "ratio_to_ceiling", t_ceil_h2d / t_pin);
    put(p, "refit_GBps", b->total / t_pin / 1e9);
    put(p, "ceiling_GBps", b->total / t_ceil_h2d / 1e9);
    put(p, "target", 0.95);
    json_object_set_new(p, "meets_target", json_boolean(t_ceil_h2d / t_pin >= 0.95));
    json_object_set_new(b->res, "pinned", p);
    return 0;
}

/* ---- safetensors: written here, read back page-cached ---- */

static int st_write_file(bench *b, const char *path, int first, int last)
{
    json_t *h = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(h, "__metadata__", meta);
    size_t off = 0;
    for (int i = first; i < last; i++) {
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < b->t[i].ndim; d++)
            json_array_append_new(shape, json_integer(b->t[i].shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += b->t[i].bytes;
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_object_set_new(e, "dtype", json_string("BF16"));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(h, b->t[i].name, e);
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    FILE *f = text ? fopen(path, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "refit-bench gpu: cannot write %s: %s\n", path, strerror(errno));
        free(text);
        return 1;
    }
    size_t hl = strlen(text), padded = (hl + 7) & ~(size_t)7;
    uint64_t n = padded;
    int bad = fwrite(&n, 8, 1, f) != 1 || fwrite(text, 1, hl, f) != hl;
    for (size_t i = hl; i < padded && !bad; i++)
        bad = fputc(' ', f) == EOF;
    for (int i = first; i < last && !bad; i++)
        bad = fwrite(b->pinned + b->t[i].off, 1, b->t[i].bytes, f) != b->t[i].bytes;
    /* written back before it is read: the case is a page-cached file,
     * not one whose dirty pages are being flushed meanwhile */
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    free(text);
    if (bad)
        fprintf(stderr, "refit-bench gpu: writing %s failed\n", path);
    return bad;
}

static int st_write_dir(bench *b)
{
    if (mkdir(b->dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "refit-bench gpu: mkdir %s: %s\n", b->dir, strerror(errno));
        return 1;
    }
    int split = b->n / 2;
    char p1[4096], p2[4096], pi[4096];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", b->dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", b->dir);
    snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", b->dir);
    if (st_write_file(b, p1, 0, split) || st_write_file(b, p2, split, b->n))
        return 1;
    json_t *idx = json_object(), *meta = json_object(), *map = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)b->total));
    for (int i = 0; i < b->n; i++)
        json_object_set_new(map, b->t[i].name, json_string(i < split
                                                               ? "model-00001-of-00002.safetensors"
                                                               : "model-00002-of-00002.safetensors"));
    json_object_set_new(idx, "metadata", meta);
    json_object_set_new(idx, "weight_map", map);
    int rc = json_dump_file(idx, pi, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(idx);
    return rc != 0;
}

static int reload_st(bench *b, double *secs)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = "bench-st";
    o.rollback = 0;
    refit_source *src = NULL;
    refit_txn *txn = NULL;
    double t0 = now_s();
    int rc = refit_source_open(&src, b->ctx, b->dir);
    if (!rc)
        rc = refit_begin(&txn, b->model, &o);
    if (!rc && (rc = refit_load_source(txn, src, NULL, NULL, NULL)))
        refit_abort(txn);
    else if (!rc)
        rc = refit_finalize(txn);
    refit_source_close(src);
    *secs = now_s() - t0;
    return rc ? rfail(b, "safetensors reload", rc) : 0;
}

static int bench_safetensors(bench *b, double t_ceil_h2d)
{
    if (st_write_dir(b))
        return 1;
    double v[64];
    refit_sys_cuda_stats s0, s1;
    refit_sys_cuda_stats_get(&s0);
    for (int r = -1; r < b->repeat; r++) {
        CU(cudaMemset(b->dev_rt, 0, b->total));
        CU(cudaDeviceSynchronize());
        double s;
        if (reload_st(b, &s))
            return 1;
        if (r >= 0)
            v[r] = s;
    }
    refit_sys_cuda_stats_get(&s1);
    double t = median(v, b->repeat);
    if (check_equal(b, "safetensors"))
        return 1;
    json_t *o = json_object();
    json_object_set_new(o, "files", json_integer(2));
    json_object_set_new(o, "bytes", json_integer((json_int_t)b->total));
    put(o, "refit_ms", t * 1e3);
    put(o, "ceiling_memcpy_h2d_ms", t_ceil_h2d * 1e3);
    put(o, "ratio_to_h2d_ceiling", t_ceil_h2d / t);
    put(o, "refit_GBps", b->total / t / 1e9);
    double runs = b->repeat + 1;
    put(o, "host_copy_ms_per_reload", (double)(s1.host_copy_ns - s0.host_copy_ns) / runs / 1e6);
    put(o, "prefault_ms_per_reload_all_threads",
        (double)(s1.prefault_ns - s0.prefault_ns) / runs / 1e6);
    put(o, "ring_wait_ms_per_reload", (double)(s1.ring_wait_ns - s0.ring_wait_ns) / runs / 1e6);
    put(o, "target", 0.80);
    json_object_set_new(o, "meets_target", json_boolean(t_ceil_h2d / t >= 0.80));
    json_object_set_new(b->res, "safetensors", o);
    return 0;
}

/* ---- moe100k ---- */

static int bench_moe(bench *b)
{
    enum { N = MOE_MODULES * MOE_PER };
    size_t tb = (size_t)MOE_R * MOE_C * 2, total = (size_t)N * tb;
    char *rt = NULL, *srcs = NULL;
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    static int64_t stack_shape[3] = {MOE_PER, MOE_R, MOE_C}, shape[2] = {MOE_R, MOE_C};
    refit_tensor *rts = calloc(MOE_MODULES, sizeof *rts);
    char (*names)[64] = calloc(N, sizeof *names);
    CU(cudaMalloc((void **)&rt, total));
    CU(cudaMalloc((void **)&srcs, total));
    CU(cudaMemcpy(srcs, b->dev_src, total < b->total ? total : b->total, cudaMemcpyDefault));
    int rc = !rts || !names ? REFIT_ENOMEM : refit_open(&ctx, NULL);
    if (!rc)
        rc = refit_model_create(&m, ctx);
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = REFIT_BF16;
    s.ndim = 2;
    s.shape[0] = MOE_R;
    s.shape[1] = MOE_C;
    for (int g = 0; g < MOE_MODULES && !rc; g++) {
        char mod[64];
        snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.g%d", g / 16, g % 16);
        rts[g] = (refit_tensor){.data = rt + (size_t)g * MOE_PER * tb,
                                .device = {REFIT_DEVICE_CUDA, 0}, .ndim = 3,
                                .dtype = REFIT_BF16, .shape = stack_shape};
        if ((rc = refit_model_add_module(m, mod, "unquantized", NULL)) ||
            (rc = refit_module_bind_runtime(m, mod, "w", &rts[g])))
            break;
        for (int e = 0; e < MOE_PER && !rc; e++) {
            int i = g * MOE_PER + e;
            snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.experts.%d.down_proj.weight",
                     g / 16, (g % 16) * MOE_PER + e);
            s.expert = e;
            rc = refit_model_expect(m, mod, names[i], &s);
        }
    }
    if (!rc)
        rc = refit_model_seal(m);
    double v[64];
    refit_sys_cuda_stats s0, s1;
    refit_sys_cuda_stats_get(&s0);
    for (int r = -1; r < b->repeat && !rc; r++) {
        refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
        o.rollback = 0;
        refit_txn *txn;
        double t0 = now_s();
        rc = refit_begin(&txn, m, &o);
        for (int i = 0; i < N && !rc; i++) {
            refit_tensor src = {.data = srcs + (size_t)i * tb, .device = {REFIT_DEVICE_CUDA, 0},
                                .ndim = 2, .dtype = REFIT_BF16, .shape = shape};
            if ((rc = refit_load(txn, names[i], &src, NULL)))
                refit_abort(txn);
        }
        if (!rc)
            rc = refit_finalize(txn);
        if (r >= 0)
            v[r] = now_s() - t0;
    }
    refit_sys_cuda_stats_get(&s1);
    if (rc) {
        fprintf(stderr, "refit-bench gpu: moe100k: %s: %s [%s]\n", refit_status_name(rc),
                ctx ? refit_errmsg(ctx) : "", refit_sys_cuda_last_error());
    } else {
        double t = median(v, b->repeat);
        json_t *o = json_object();
        json_object_set_new(o, "tensors", json_integer(N));
        json_object_set_new(o, "modules", json_integer(MOE_MODULES));
        json_object_set_new(o, "bytes", json_integer((json_int_t)total));
        put(o, "refit_ms", t * 1e3);
        put(o, "us_per_tensor", t / N * 1e6);
        put(o, "batch_launches_per_reload",
            (double)(s1.batch_launches - s0.batch_launches) / (b->repeat + 1));
        put(o, "target_speedup", 10);
        json_object_set_new(b->res, "moe100k", o);
        char *chk = malloc(total), *want = malloc(total);
        if (chk && want && cudaMemcpy(chk, rt, total, cudaMemcpyDefault) == cudaSuccess &&
            cudaMemcpy(want, srcs, total, cudaMemcpyDefault) == cudaSuccess &&
            memcmp(chk, want, total)) {
            fprintf(stderr, "refit-bench gpu: moe100k: runtime differs from the sources\n");
            rc = 1;
        }
        free(chk);
        free(want);
    }
    refit_close(ctx);
    cudaFree(rt);
    cudaFree(srcs);
    free(rts);
    free(names);
    return rc != 0;
}

/* ---- quant: online FP8 on the device ---- */

static double jget(json_t *o, const char *a, const char *k)
{
    json_t *x = json_object_get(json_object_get(o, a), k);
    return x ? json_number_value(x) : -1;
}

static const char *const quant_key[3] = {"fp8_per_tensor", "fp8_per_channel", "fp8_block128"};
static const char *const quant_param[3] = {"scheme: per_tensor", "scheme: per_channel",
                                           "scheme: block128"};

/* The linear weights: every 2-D tensor but the embedding and the head. */
static int quant_weights(const bench *b, int *idx)
{
    int n = 0;
    for (int i = 0; i < b->n; i++)
        if (b->t[i].ndim == 2 && !strstr(b->t[i].name, "embed_tokens") &&
            strcmp(b->t[i].name, "lm_head.weight"))
            idx[n++] = i;
    return n;
}

typedef struct qarena {
    int idx[MAX_T], nw;
    size_t elems, scales;
    size_t qoff[MAX_T], soff[MAX_T];
    char *q;                    /* device: the E4M3 weights */
    float *s;                   /* device: the scales */
    refit_view qv[MAX_T], sv[MAX_T], xv[MAX_T];
    refit_tensor qt[MAX_T], st[MAX_T];
    int64_t sshape[MAX_T][2];
} qarena;

/* Views of every weight for scheme sch (x: the device source arena). */
static void quant_views(bench *b, qarena *a, int sch)
{
    for (int w = 0; w < a->nw; w++) {
        const bt *t = &b->t[a->idx[w]];
        int64_t n = t->shape[0], k = t->shape[1];
        refit_view *x = &a->xv[w], *q = &a->qv[w], *s = &a->sv[w];
        *x = (refit_view){.data = b->dev_src + t->off, .device = {REFIT_DEVICE_CUDA, 0},
                          .dtype = REFIT_BF16, .ndim = 2, .shape = {n, k}, .strides = {k, 1}};
        *q = *x;
        q->data = a->q + a->qoff[w];
        q->dtype = (refit_dtype){REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1};
        kern_fp8_scale_shape((kern_fp8_scheme)sch, n, k, a->sshape[w]);
        *s = (refit_view){.data = a->s + a->soff[w], .device = {REFIT_DEVICE_CUDA, 0},
                          .dtype = REFIT_F32, .ndim = 2,
                          .shape = {a->sshape[w][0], a->sshape[w][1]},
                          .strides = {a->sshape[w][1], 1}};
    }
}

/* The first weights (layer 0) against the CPU reference on the pinned copy
 * of the sources. */
static int quant_check(bench *b, qarena *a, int sch)
{
    int rc = 0;
    for (int w = 0; w < a->nw && w < 7 && !rc; w++) {
        const bt *t = &b->t[a->idx[w]];
        int64_t n = t->shape[0], k = t->shape[1], ns = a->sshape[w][0] * a->sshape[w][1];
        uint8_t *q = malloc((size_t)(n * k)), *qd = malloc((size_t)(n * k));
        float *s = malloc(sizeof *s * (size_t)ns), *sd = malloc(sizeof *sd * (size_t)ns);
        refit_view x = a->xv[w], qv = a->qv[w], sv = a->sv[w];
        x.data = b->pinned + t->off;
        qv.data = q;
        sv.data = s;
        rc = !q || !qd || !s || !sd || kern_quant_fp8(&qv, &sv, &x, (kern_fp8_scheme)sch);
        if (!rc && (cudaMemcpy(qd, a->qv[w].data, (size_t)(n * k), cudaMemcpyDeviceToHost) ||
                    cudaMemcpy(sd, a->sv[w].data, sizeof *sd * (size_t)ns,
                               cudaMemcpyDeviceToHost)))
            rc = 1;
        if (!rc && (memcmp(q, qd, (size_t)(n * k)) || memcmp(s, sd, sizeof *s * (size_t)ns))) {
            fprintf(stderr, "refit-bench gpu: quant %s: %s differs from the CPU reference\n",
                    quant_key[sch], t->name);
            rc = 1;
        }
        free(q);
        free(qd);
        free(s);
        free(sd);
    }
    return rc;
}

/* Median seconds of one call for every weight (all = 1; all = 2: the
 * kernel itself, with the integer E4M3 encoder), or one call per weight;
 * *kern: the median of the kernels' launch time in the same runs (summed
 * over a run's calls), so that call - kernel shows what a call adds. */
static int time_quant(bench *b, qarena *a, int sch, int all, double *out, double *kern)
{
    double v[64], kv[64];
    int hw = kern_fp8_encoder(0, NULL, NULL) == 1; /* as the plugin encodes */
    kern_quant_fp8_cuda_timing(1);
    for (int r = -1; r < b->repeat; r++) {
        CU(cudaDeviceSynchronize());
        int32_t bad;
        int rc = 0;
        double t0 = now_s(), k = 0;
        if (all == 1)
            rc = kern_quant_fp8_cuda((uint32_t)a->nw, a->qv, a->sv, a->xv, sch, hw, &bad, NULL);
        else if (all == 2)
            rc = kern_quant_fp8_cuda((uint32_t)a->nw, a->qv, a->sv, a->xv, sch, 0, &bad, NULL);
        k = all ? kern_quant_fp8_cuda_kernel_ms() / 1e3 : 0;
        for (int w = 0; w < a->nw && !all && !rc; w++) {
            rc = kern_quant_fp8_cuda(1, &a->qv[w], &a->sv[w], &a->xv[w], sch, hw, &bad, NULL);
            k += kern_quant_fp8_cuda_kernel_ms() / 1e3;
        }
        if (r >= 0) {
            v[r] = now_s() - t0;
            kv[r] = k;
        }
        if (rc) {
            kern_quant_fp8_cuda_timing(0);
            fprintf(stderr, "refit-bench gpu: quant %s: %s: %s [%s]\n", quant_key[sch],
                    refit_status_name(rc), refit_sys_cuda_last_error(), kern_cuda_last_error());
            return 1;
        }
    }
    kern_quant_fp8_cuda_timing(0);
    *out = median(v, b->repeat);
    *kern = median(kv, b->repeat);
    return 0;
}

/* A reload of the weights as online-FP8 modules through refit: staged
 * copies from the device sources, then post-load per module. */
static int time_quant_reload(bench *b, qarena *a, int sch, double *out)
{
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    int rc = refit_open(&ctx, NULL);
    if (!rc)
        rc = refit_model_create(&m, ctx);
    for (int w = 0; w < a->nw && !rc; w++) {
        bt *t = &b->t[a->idx[w]];
        a->qt[w] = (refit_tensor){.data = a->qv[w].data, .device = {REFIT_DEVICE_CUDA, 0},
                                  .ndim = 2, .dtype = a->qv[w].dtype, .shape = t->shape};
        a->st[w] = (refit_tensor){.data = a->sv[w].data, .device = {REFIT_DEVICE_CUDA, 0},
                                  .ndim = 2, .dtype = REFIT_F32, .shape = a->sshape[w]};
        refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
        s.dtype = REFIT_BF16;
        s.ndim = 2;
        s.shape[0] = t->shape[0];
        s.shape[1] = t->shape[1];
        s.target = "weight";
        if (!(rc = refit_model_add_module(m, t->name, "fp8", quant_param[sch])) &&
            !(rc = refit_module_bind_runtime(m, t->name, "weight", &a->qt[w])) &&
            !(rc = refit_module_bind_runtime(m, t->name, "weight_scale", &a->st[w])))
            rc = refit_model_expect(m, t->name, t->name, &s);
    }
    if (!rc)
        rc = refit_model_seal(m);
    double v[64];
    /* every weight in one refit_load_many, as the Python binding loads */
    const char **names = calloc((size_t)a->nw + 1, sizeof *names);
    refit_tensor *src = calloc((size_t)a->nw + 1, sizeof *src);
    if (!rc && (!names || !src))
        rc = REFIT_ENOMEM;
    for (int w = 0; w < a->nw && !rc; w++) {
        names[w] = b->t[a->idx[w]].name;
        src[w] = (refit_tensor){.data = a->xv[w].data, .device = {REFIT_DEVICE_CUDA, 0},
                                .ndim = 2, .dtype = REFIT_BF16, .shape = b->t[a->idx[w]].shape};
    }
    for (int r = -1; r < b->repeat && !rc; r++) {
        double secs = 0;
        rc = breload_many_once(m, (size_t)a->nw, names, src, &secs);
        if (r >= 0)
            v[r] = secs;
    }
    free(names);
    free(src);
    if (rc)
        fprintf(stderr, "refit-bench gpu: quant %s reload: %s: %s [%s]\n", quant_key[sch],
                refit_status_name(rc), ctx ? refit_errmsg(ctx) : "", refit_sys_cuda_last_error());
    else
        *out = median(v, b->repeat);
    refit_close(ctx);
    return rc != 0;
}

/* quant.mxfp8, quant.mxfp4: tools/bench_gpu_mx.c */
int bench_gpu_mx(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                 const char *host_base, double copy_Bps, int repeat, const char *python,
                 const char *dir);
/* quant.nvfp4: tools/bench_gpu_nvfp4.c */
int bench_gpu_nvfp4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                    const char *host_base, double copy_Bps, int repeat, const char *python,
                    const char *dir);
/* quant.int4: tools/bench_gpu_int4.c */
int bench_gpu_int4(json_t *quant, int nw, const refit_view *x, const char *dev_base,
                   const char *host_base, double copy_Bps, int repeat, const char *python,
                   const char *dir);

static int bench_quant(bench *b)
{
    qarena *a = calloc(1, sizeof *a);
    if (!a)
        return 1;
    a->nw = quant_weights(b, a->idx);
    for (int w = 0; w < a->nw; w++) {
        const bt *t = &b->t[a->idx[w]];
        a->qoff[w] = a->elems;
        a->soff[w] = a->scales;
        a->elems += ((size_t)(t->shape[0] * t->shape[1]) + 255) & ~(size_t)255;
        a->scales += (size_t)t->shape[0] + 1; /* per-channel needs the most */
    }
    int rc = cudaMalloc((void **)&a->q, a->elems) != cudaSuccess ||
             cudaMalloc((void **)&a->s, a->scales * sizeof(float)) != cudaSuccess;
    double copy_Bps = 2.0 * (double)b->total /
                      (jget(b->res, "d2d", "ceiling_memcpy_d2d_ms") / 1e3);
    uint64_t cvt_bad = 0;
    int enc = kern_fp8_encoder(0, &cvt_bad, NULL);
    json_t *all = json_object();
    json_object_set_new(all, "encoder", json_string(enc == 1 ? "cvt.rn.satfinite.e4m3x2.f32"
                                                    : enc == 0 ? "integer" : "check failed"));
    json_object_set_new(all, "cvt_mismatches", json_integer((json_int_t)cvt_bad));
    /* the baseline of every online_reload_cost_vs_bf16: the same source
     * bytes reloaded unquantized, in this run */
    double t_bf16 = 0;
    quant_views(b, a, 0);
    if (!rc && !(rc = breload_bf16(a->nw, a->xv, b->repeat, &t_bf16)))
        put(all, "bf16_reload_ms", t_bf16 * 1e3);
    for (int sch = 0; sch < 3 && !rc; sch++) {
        double t_all, t_each, t_int, t_reload = -1, k_all, k_each, k_int;
        size_t n = 0;
        quant_views(b, a, sch);
        rc = time_quant(b, a, sch, 1, &t_all, &k_all) || quant_check(b, a, sch) ||
             time_quant(b, a, sch, 2, &t_int, &k_int) || quant_check(b, a, sch) ||
             time_quant(b, a, sch, 0, &t_each, &k_each) || quant_check(b, a, sch);
        if (!rc && (rc = time_quant_reload(b, a, sch, &t_reload) || quant_check(b, a, sch)))
            break;
        for (int w = 0; w < a->nw; w++)
            n += (size_t)(a->xv[w].shape[0] * a->xv[w].shape[1]);
        size_t sc = 0;
        for (int w = 0; w < a->nw; w++)
            sc += (size_t)(a->sshape[w][0] * a->sshape[w][1]);
        double min_bytes = 3.0 * (double)n + 4.0 * (double)sc;
        json_t *o = json_object();
        json_object_set_new(o, "weights", json_integer(a->nw));
        json_object_set_new(o, "elements", json_integer((json_int_t)n));
        put(o, "min_bytes", min_bytes);
        put(o, "refit_ms", t_all * 1e3);
        put(o, "refit_GBps", min_bytes / t_all / 1e9);
        put(o, "copy_GBps", copy_Bps / 1e9);
        put(o, "ratio_to_d2d", min_bytes / t_all / copy_Bps);
        put(o, "integer_encoder_ms", t_int * 1e3);
        put(o, "integer_encoder_ratio_to_d2d", min_bytes / t_int / copy_Bps);
        put(o, "per_weight_calls_ms", t_each * 1e3);
        put(o, "per_weight_ratio_to_d2d", min_bytes / t_each / copy_Bps);
        put(o, "kernel_ms", k_all * 1e3);
        put(o, "kernel_ratio_to_d2d", min_bytes / k_all / copy_Bps);
        put(o, "integer_encoder_kernel_ms", k_int * 1e3);
        put(o, "per_weight_kernel_ms", k_each * 1e3);
        put(o, "per_weight_kernel_ratio_to_d2d", min_bytes / k_each / copy_Bps);
        put(o, "online_reload_ms", t_reload * 1e3);
        put(o, "online_reload_ratio_to_d2d", min_bytes / t_reload / copy_Bps);
        put(o, "target", 0.70);
        json_object_set_new(o, "meets_target", json_boolean(min_bytes / t_all / copy_Bps >= 0.70));
        json_object_set_new(all, quant_key[sch], o);
    }
    if (!rc)
        rc = bench_gpu_mx(all, a->nw, a->xv, b->dev_src, b->pinned, copy_Bps, b->repeat,
                          b->torch ? b->python : NULL, b->dir);
    if (!rc)
        rc = bench_gpu_nvfp4(all, a->nw, a->xv, b->dev_src, b->pinned, copy_Bps, b->repeat,
                             b->torch ? b->python : NULL, b->dir);
    if (!rc)
        rc = bench_gpu_int4(all, a->nw, a->xv, b->dev_src, b->pinned, copy_Bps, b->repeat,
                            b->torch ? b->python : NULL, b->dir);
    if (!rc)
        breload_costs(all, t_bf16);
    json_object_set_new(b->res, "quant", all);
    cudaFree(a->q);
    cudaFree(a->s);
    free(a);
    return rc;
}

/* ---- the PyTorch peers ---- */

static int write_spec(bench *b, const char *path)
{
    json_t *o = json_object(), *ts = json_array();
    for (int i = 0; i < b->n; i++) {
        json_t *e = json_array(), *sh = json_array();
        for (int d = 0; d < b->t[i].ndim; d++)
            json_array_append_new(sh, json_integer(b->t[i].shape[d]));
        json_array_append_new(e, json_string(b->t[i].name));
        json_array_append_new(e, sh);
        json_array_append_new(ts, e);
    }
    json_object_set_new(o, "tensors", ts);
    json_object_set_new(o, "dir", json_string(b->dir));
    json_object_set_new(o, "repeat", json_integer(b->repeat));
    json_object_set_new(o, "moe", json_pack("{s:i,s:i,s:i,s:i}", "modules", MOE_MODULES,
                                            "per", MOE_PER, "rows", MOE_R, "cols", MOE_C));
    json_object_set_new(o, "quant", json_boolean(json_object_get(b->res, "quant") != NULL));
    int rc = json_dump_file(o, path, JSON_COMPACT);
    json_decref(o);
    return rc;
}

static void merge_torch(bench *b, json_t *py)
{
    json_object_set(b->res, "torch", py);
    double v;
    json_t *d = json_object_get(b->res, "d2d"), *s = json_object_get(b->res, "safetensors");
    json_t *m = json_object_get(b->res, "moe100k");
    if (d && (v = jget(py, "d2d", "copy_loop_ms")) > 0) {
        put(d, "torch_copy_loop_ms", v);
        put(d, "ratio_to_torch", v / json_number_value(json_object_get(d, "refit_ms")));
    }
    if (s && (v = jget(py, "safetensors", "load_file_copy_ms")) > 0) {
        put(s, "torch_load_file_copy_ms", v);
        put(s, "speedup_vs_torch", v / json_number_value(json_object_get(s, "refit_ms")));
    }
    json_t *q = json_object_get(b->res, "quant");
    for (int sch = 0; q && sch < 3; sch++) {
        json_t *o = json_object_get(q, quant_key[sch]);
        json_t *tq = json_object_get(json_object_get(py, "quant"), quant_key[sch]);
        double tv = tq ? json_number_value(json_object_get(tq, "ms")) : -1;
        if (!o || tv <= 0)
            continue;
        put(o, "torch_ms", tv);
        put(o, "speedup_vs_torch", tv / json_number_value(json_object_get(o, "refit_ms")));
    }
    if (m && (v = jget(py, "moe100k", "copy_loop_ms")) > 0) {
        double sp = v / json_number_value(json_object_get(m, "refit_ms"));
        put(m, "torch_copy_loop_ms", v);
        put(m, "speedup_vs_torch", sp);
        json_object_set_new(m, "meets_target", json_boolean(sp >= 10));
    }
}

static void run_torch(bench *b)
{
    char spec[4200], cmd[8400], script[4096];
    snprintf(spec, sizeof spec, "%s/bench-spec.json", b->dir);
    const char *root = getenv("REFIT_SOURCE_ROOT");
    snprintf(script, sizeof script, "%s/tools/bench_gpu.py", root ? root : ".");
    if (write_spec(b, spec)) {
        fprintf(stderr, "refit-bench gpu: cannot write %s\n", spec);
        return;
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", b->python, script, spec);
    FILE *p = popen(cmd, "r");
    json_error_t err;
    json_t *py = p ? json_loadf(p, 0, &err) : NULL;
    int st = p ? pclose(p) : -1;
    if (!py) {
        fprintf(stderr, "refit-bench gpu: no JSON from %s (exit %d)%s%s\n", cmd, st,
                p ? ": " : "", p ? err.text : "");
        json_object_set_new(b->res, "torch", json_string("failed: see stderr"));
        return;
    }
    merge_torch(b, py);
    json_decref(py);
}

/* ---- main ---- */

static bool wanted(const bench *b, const char *section)
{
    if (!b->only)
        return true;
    size_t n = strlen(section);
    for (const char *p = b->only; (p = strstr(p, section)); p += n)
        if ((p == b->only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static void machine(bench *b)
{
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[32], m[300];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(m, sizeof m, "%s %s", u.nodename, u.machine);
    json_object_set_new(b->res, "bench", json_string("gpu"));
    json_object_set_new(b->res, "machine", json_string(m));
    json_object_set_new(b->res, "date", json_string(date));
    struct cudaDeviceProp p;
    int drv = 0, rtv = 0;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        json_object_set_new(b->res, "device", json_string(p.name));
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rtv);
    json_object_set_new(b->res, "cuda_driver", json_integer(drv));
    json_object_set_new(b->res, "cuda_runtime", json_integer(rtv));
    json_object_set_new(b->res, "repeat", json_integer(b->repeat));
    json_object_set_new(b->res, "statistic", json_string("median"));
    json_t *env = json_object();
    static const char *vars[] = {"REFIT_CUDA_ROW_KB", "REFIT_CUDA_H2D_MIN_KB",
        "REFIT_CUDA_D2D_MEMCPY_MIN_KB", "REFIT_CUDA_RING_CHUNKS", "REFIT_CUDA_RING_CHUNK_MB",
        "REFIT_CUDA_COPY_THREADS", "REFIT_CUDA_TABLE_ROWS", "REFIT_CUDA_POPULATE",
        "REFIT_CUDA_BATCH_VARIANT", "REFIT_CUDA_UNDO_CACHE_MB"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            json_object_set_new(env, vars[i], json_string(getenv(vars[i])));
    json_object_set_new(b->res, "env", env);
}

/* --write-only: the safetensors directory alone, from host memory (no
 * GPU needed), kept in --dir: for checking the writer or reusing the data. */
static int write_only_dir(bench *b)
{
    llama_shapes(b);
    b->pinned = malloc(b->total);
    if (!b->pinned)
        return 1;
    fill_random(b->pinned, b->total, 0x1234);
    int rc = st_write_dir(b);
    free(b->pinned);
    if (!rc)
        rc = cli_json_print(json_pack("{s:s, s:i, s:I}", "dir", b->dir, "tensors", b->n,
                                      "bytes", (json_int_t)b->total));
    return rc;
}

static const cli_opt gpu_opts[] = {
    {"json", 'j', NULL, "JSON on stdout (the figures are JSON either way: the tools' common flag)"},
    {"repeat", 'r', "R", "runs per figure, 1..64; the median counts (default 7)"},
    {"layers", 'L', "L", "decoder layers of the Llama-shaped model, 1..50 (default 22)"},
    {"dir", 'd', "PATH", "where the safetensors files are written (default /tmp/refit-bench-gpu)"},
    {"keep", 'k', NULL, "keep the files in --dir afterwards"},
    {"python", 'p', "PY", "the Python that runs the PyTorch peer (default python3)"},
    {"no-torch", 'T', NULL, "skip the PyTorch peer figures"},
    {"out", 'o', "FILE", "also write the JSON to FILE"},
    {"only", 'O', "LIST", "sections, comma-separated: d2d,pinned,safetensors,moe100k,quant"},
    {"write-only", 'W', NULL, "only write the safetensors files into --dir (no GPU needed)"},
    {NULL, 0, NULL, NULL},
};

static const cli gpu_cli = {
    "refit-bench gpu", "[options]",
    "The CUDA figures of a Llama-shaped model on GPU 0: device-to-device and\n"
    "pinned copies against cudaMemcpy, safetensors loading, a 100k-tensor MoE, the\n"
    "quantized formats, and a PyTorch peer; JSON on stdout.\n"
    "Exit status: 0 ok, 1 a failure or no GPU, 2 usage.",
    gpu_opts,
};

typedef struct gpu_args {
    bench *b;
    bool write_only;
} gpu_args;

static int gpu_int(const char *v, int lo, int hi, int *out, const char *name)
{
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < lo || n > hi)
        return cli_usage_error(&gpu_cli, "--%s needs an integer in %d..%d, not '%s'", name, lo,
                               hi, v);
    *out = (int)n;
    return 0;
}

static int gpu_opt(void *user, int key, const char *v)
{
    gpu_args *a = user;
    bench *b = a->b;
    switch (key) {
    case 'j': b->json = true; return 0;
    case 'k': b->keep = true; return 0;
    case 'T': b->torch = false; return 0;
    case 'W': a->write_only = true; return 0;
    case 'r': return gpu_int(v, 1, 64, &b->repeat, "repeat");
    case 'L': return gpu_int(v, 1, 50, &b->layers, "layers");
    case 'd': b->dir = v; return 0;
    case 'p': b->python = v; return 0;
    case 'o': b->out = v; return 0;
    case 'O': b->only = v; return 0;
    }
    return 2;
}

static void cleanup_dir(bench *b)
{
    if (b->keep)
        return;
    char p[4200];
    static const char *files[] = {"model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "bench-spec.json"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", b->dir, files[i]);
        unlink(p);
    }
    rmdir(b->dir);
}

int bench_gpu_main(int argc, char **argv)
{
    static bench B;
    bench *b = &B;
    b->repeat = 7;
    b->layers = 22;
    b->dir = "/tmp/refit-bench-gpu";
    b->python = "python3";
    b->torch = true;
    gpu_args a = {b, false};
    int first, prc = cli_parse(&gpu_cli, argc, argv, gpu_opt, &a, &first);
    if (prc)
        return prc == CLI_HELP ? 0 : prc;
    if (first < argc)
        return cli_usage_error(&gpu_cli, "unexpected '%s'", argv[first]);
    bool write_only = a.write_only;
    if (write_only)
        return write_only_dir(b);
    int ndev = 0;
    cudaError_t de = cudaGetDeviceCount(&ndev);
    if (de != cudaSuccess || ndev == 0) {
        fprintf(stderr, "refit-bench gpu: the CUDA runtime found no %s%s\n",
                de != cudaSuccess ? "usable device: " : "device",
                de != cudaSuccess ? cudaGetErrorString(de) : "");
        return 1;
    }
    b->res = json_object();
    machine(b);
    double ceil_h2d = 0;
    int rc = llama_setup(b) || bench_d2d_pinned(b);
    if (!rc) {
        ceil_h2d = jget(b->res, "pinned", "ceiling_memcpy_h2d_ms") / 1e3;
        rc = (wanted(b, "safetensors") && bench_safetensors(b, ceil_h2d)) ||
             (wanted(b, "moe100k") && bench_moe(b)) || (wanted(b, "quant") && bench_quant(b));
    }
    refit_close(b->ctx);
    cudaFree(b->dev_rt);
    cudaFree(b->dev_src);
    cudaFreeHost(b->pinned);
    if (!rc && b->torch)
        run_torch(b);
    cleanup_dir(b);
    if (!rc) {
        char *text = json_dumps(b->res, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", text ? text : "{}");
        if (b->out && text) {
            FILE *f = fopen(b->out, "w");
            if (f) {
                fprintf(f, "%s\n", text);
                fclose(f);
            }
        }
        free(text);
    }
    json_decref(b->res);
    return rc;
}
