/* tools/bench_gpu_reload.h: whole reloads through refit, and the online
 * reload's cost against an unquantized reload of the same source bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include <refit/sys/cuda.h>

#include "tools/bench_gpu_peer.h"
#include "tools/bench_gpu_reload.h"

static double br_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int br_model(const breload_spec *s, int nw, const refit_view *x, refit_model *m)
{
    int rc = REFIT_OK;
    for (int w = 0; w < nw && !rc; w++) {
        char name[32], ck[40];
        snprintf(name, sizeof name, "w%d", w);
        snprintf(ck, sizeof ck, "w%d.weight", w);
        refit_ckpt_spec c = REFIT_CKPT_SPEC_INIT;
        c.dtype = x[w].dtype;
        c.ndim = 2;
        c.shape[0] = x[w].shape[0];
        c.shape[1] = x[w].shape[1];
        c.target = "weight";
        rc = refit_model_add_module(m, name, s->format, s->params);
        for (int k = 0; k < s->n_rt && !rc; k++)
            rc = refit_module_bind_runtime(m, name, s->names[k], &s->rt[w * s->n_rt + k]);
        if (!rc)
            rc = refit_model_expect(m, name, ck, &c);
    }
    return rc ? rc : refit_model_seal(m);
}

int breload_many_once(refit_model *m, size_t n, const char *const *names,
                      const refit_tensor *srcs, double *secs)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.rollback = 0;
    refit_txn *txn;
    if (cudaDeviceSynchronize() != cudaSuccess)
        return REFIT_EINTERNAL;
    double t0 = br_now();
    int rc = refit_begin(&txn, m, &o);
    if (!rc && (rc = refit_load_many(txn, n, names, srcs, NULL)))
        refit_abort(txn);
    else if (!rc)
        rc = refit_finalize(txn);
    *secs = br_now() - t0;
    return rc;
}

/* One update: every weight "w<i>.weight" from x[i] in one refit_load_many. */
static int br_once(refit_model *m, int nw, const refit_view *x, double *secs)
{
    char (*ck)[40] = calloc((size_t)nw + 1, sizeof *ck);
    const char **names = calloc((size_t)nw + 1, sizeof *names);
    refit_tensor *src = calloc((size_t)nw + 1, sizeof *src);
    int rc = ck && names && src ? REFIT_OK : REFIT_ENOMEM;
    for (int w = 0; w < nw && !rc; w++) {
        snprintf(ck[w], sizeof ck[w], "w%d.weight", w);
        names[w] = ck[w];
        src[w] = (refit_tensor){.data = x[w].data, .device = x[w].device, .ndim = 2,
                                .dtype = x[w].dtype, .shape = (int64_t *)x[w].shape};
    }
    if (!rc)
        rc = breload_many_once(m, (size_t)nw, names, src, secs);
    free(ck);
    free(names);
    free(src);
    return rc;
}

int breload_time(const breload_spec *s, int nw, const refit_view *x, int repeat, double *out)
{
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    int rc = refit_open(&ctx, NULL);
    if (!rc)
        rc = refit_model_create(&m, ctx);
    if (!rc)
        rc = br_model(s, nw, x, m);
    double v[64];
    if (repeat > 64)
        repeat = 64;
    for (int r = -1; r < repeat && !rc; r++) {
        double t = 0;
        rc = br_once(m, nw, x, &t);
        if (r >= 0)
            v[r] = t;
    }
    if (rc)
        fprintf(stderr, "refit-bench gpu: %s reload: %s: %s [%s]\n", s->what,
                refit_status_name(rc), ctx ? refit_errmsg(ctx) : "", refit_sys_cuda_last_error());
    else
        *out = bpeer_median(v, repeat);
    refit_close(ctx);
    return rc != 0;
}

static size_t br_bytes(const refit_view *x)
{
    return (size_t)(x->shape[0] * x->shape[1]) * 2;
}

/* The runtime arena against the sources, weight by weight. */
static int br_check(int nw, const refit_view *x, const char *arena, const size_t *off)
{
    int rc = 0;
    for (int w = 0; w < nw && !rc; w++) {
        size_t n = br_bytes(&x[w]);
        char *a = malloc(n), *b = malloc(n);
        rc = !a || !b || cudaMemcpy(a, arena + off[w], n, cudaMemcpyDeviceToHost) ||
             cudaMemcpy(b, x[w].data, n, cudaMemcpyDeviceToHost) || memcmp(a, b, n);
        if (rc)
            fprintf(stderr, "refit-bench gpu: bf16 reload: weight %d differs from its "
                            "source\n", w);
        free(a);
        free(b);
    }
    return rc;
}

int breload_bf16(int nw, const refit_view *x, int repeat, double *out)
{
    static const char *const names[1] = {"weight"};
    refit_tensor *rt = calloc((size_t)nw, sizeof *rt);
    size_t *off = calloc((size_t)nw, sizeof *off), total = 0;
    char *arena = NULL;
    int rc = !rt || !off;
    for (int w = 0; w < nw && !rc; w++) {
        off[w] = total;
        total += (br_bytes(&x[w]) + 255) & ~(size_t)255;
    }
    if (!rc)
        rc = cudaMalloc((void **)&arena, total ? total : 1) != cudaSuccess;
    for (int w = 0; w < nw && !rc; w++)
        rt[w] = (refit_tensor){.data = arena + off[w], .device = x[w].device, .ndim = 2,
                               .dtype = REFIT_BF16, .shape = (int64_t *)x[w].shape};
    breload_spec s = {"bf16 (unquantized)", "unquantized", NULL, 1, names, rt};
    if (!rc)
        rc = breload_time(&s, nw, x, repeat, out) || br_check(nw, x, arena, off);
    cudaFree(arena);
    free(rt);
    free(off);
    return rc;
}

/* The targets: a reload that quantizes costs at most this many
 * unquantized reloads of the same source bytes. */
static const struct {
    const char *fmt;
    double target;
} br_targets[] = {
    {"fp8_per_tensor", 2.0}, {"fp8_per_channel", 1.5}, {"fp8_block128", 1.5},
    {"mxfp8", 1.5},          {"mxfp4", 1.5},           {"int4", 1.5},
    {"nvfp4", 2.0},
};

void breload_costs(json_t *quant, double t_bf16)
{
    for (size_t i = 0; i < sizeof br_targets / sizeof br_targets[0]; i++) {
        json_t *o = json_object_get(quant, br_targets[i].fmt);
        json_t *ms = json_object_get(o, "online_reload_ms");
        if (!ms || t_bf16 <= 0)
            continue;
        double cost = json_number_value(ms) / (t_bf16 * 1e3);
        bpeer_put(o, "online_reload_cost_vs_bf16", cost);
        bpeer_put(o, "online_reload_cost_target", br_targets[i].target);
        json_object_set_new(o, "online_reload_cost_meets_target",
                            json_boolean(cost <= br_targets[i].target));
    }
}
