/* The per-format quantization benches' shared pieces (bench_gpu_peer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <refit/sys/cuda.h>

#include "bench_gpu_peer.h"

#define BPEER_RUNS 64

/* Seconds since t0 (CLOCK_MONOTONIC), the difference taken in integers. */
static double bpeer_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static int bpeer_cmp(const void *a, const void *b)
{
    double u = *(const double *)a, v = *(const double *)b;
    return u < v ? -1 : u > v;
}

double bpeer_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bpeer_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int bpeer_time(const bpeer_calls *c, int nw, int all, int repeat, const char *what, double *out)
{
    double v[BPEER_RUNS];
    if (repeat > BPEER_RUNS)
        repeat = BPEER_RUNS;
    for (int r = -1; r < repeat; r++) {
        /* each run starts on an idle device, so that it times only its calls */
        if (cudaDeviceSynchronize() != cudaSuccess)
            return 1;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = 0;
        for (int w = 0; w < nw && !rc; w += all ? nw : 1) {
            *c->at = (uint32_t)w;
            *c->count = all ? (uint32_t)nw : 1;
            rc = refit_sys_cuda_run(0, NULL, c->launch, c->arg);
        }
        if (rc) {
            fprintf(stderr, "refit-bench gpu: %s: %s: %s\n", what, refit_status_name(rc),
                    refit_sys_cuda_last_error());
            return 1;
        }
        if (r >= 0)
            v[r] = bpeer_since(&t0);
    }
    *out = bpeer_median(v, repeat);
    return 0;
}

json_t *bpeer_object(int nw, const refit_view *x)
{
    size_t elems = 0;
    for (int w = 0; w < nw; w++)
        elems += (size_t)(x[w].shape[0] * x[w].shape[1]);
    json_t *o = json_object();
    json_object_set_new(o, "weights", json_integer(nw));
    json_object_set_new(o, "elements", json_integer((json_int_t)elems));
    return o;
}

void bpeer_figures(json_t *o, double min_bytes, double t_all, double t_each, double copy_Bps)
{
    /* in this order, as every format's object has always listed them */
    static const char *const keys[7] = {"min_bytes", "refit_ms", "refit_GBps", "copy_GBps",
                                        "ratio_to_d2d", "per_weight_calls_ms",
                                        "per_weight_ratio_to_d2d"};
    const double values[7] = {min_bytes, t_all * 1e3, min_bytes / t_all / 1e9, copy_Bps / 1e9,
                              min_bytes / t_all / copy_Bps, t_each * 1e3,
                              min_bytes / t_each / copy_Bps};
    for (int i = 0; i < 7; i++)
        bpeer_put(o, keys[i], values[i]);
}

void bpeer_verdict(json_t *o)
{
    double ratio = json_real_value(json_object_get(o, "ratio_to_d2d"));
    bpeer_put(o, "target", 0.70);
    json_object_set_new(o, "meets_target", json_boolean(ratio >= 0.70));
    json_object_set_new(o, "layer0_equals_cpu_reference", json_true());
}

void bpeer_put(json_t *o, const char *k, double v)
{
    json_object_set_new(o, k, json_real(v));
}

int bpeer_write(const char *path, const void *p, size_t n, const char *mode)
{
    FILE *f = fopen(path, mode);
    int rc = !f || fwrite(p, 1, n, f) != n;
    if (f && fclose(f))
        rc = 1;
    return rc;
}

int bpeer_dump(const char *dir, int w, const char *qfile, const void *q, size_t n,
               const char *xfile, const refit_view *x, const char *host_base,
               const char *dev_base)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, qfile);
    if (bpeer_write(path, q, n, w ? "ab" : "wb"))
        return 1;
    if (!xfile)
        return 0;
    size_t xb = (size_t)(x->shape[0] * x->shape[1]) * 2;
    snprintf(path, sizeof path, "%s/%s", dir, xfile);
    return bpeer_write(path, host_base + ((const char *)x->data - dev_base), xb, w ? "ab" : "wb");
}

void bpeer_remove(const char *dir, const char *file)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    unlink(path);
}

json_t *bpeer_spec(const char *tag, int nw, const refit_view *x, int layer0, int repeat,
                   const char *dir)
{
    char key[64];
    json_t *s = json_object(), *ts = json_array();
    for (int w = 0; w < nw; w++)
        json_array_append_new(ts, json_pack("[I,I]", (json_int_t)x[w].shape[0],
                                            (json_int_t)x[w].shape[1]));
    snprintf(key, sizeof key, "%s_shapes", tag);
    json_object_set_new(s, key, ts);
    json_object_set_new(s, "repeat", json_integer(repeat));
    snprintf(key, sizeof key, "%s_layer0", tag);
    json_object_set_new(s, key, json_integer(nw < layer0 ? nw : layer0));
    json_object_set_new(s, "dir", json_string(dir));
    return s;
}

json_t *bpeer_torch(json_t *spec, const char *python, const char *dir, const char *tag)
{
    char path[4200], cmd[8600], script[4096];
    snprintf(path, sizeof path, "%s/bench-%s-spec.json", dir, tag);
    const char *root = getenv("REFIT_SOURCE_ROOT");
    snprintf(script, sizeof script, "%s/tools/bench_gpu.py", root ? root : ".");
    int rc = json_dump_file(spec, path, JSON_COMPACT);
    json_decref(spec);
    if (rc) {
        fprintf(stderr, "refit-bench gpu: quant %s: cannot write %s\n", tag, path);
        return NULL;
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", python, script, path);
    FILE *p = popen(cmd, "r");
    json_error_t err;
    json_t *py = p ? json_loadf(p, 0, &err) : NULL;
    int st = p ? pclose(p) : -1;
    if (!py)
        fprintf(stderr, "refit-bench gpu: quant %s: no JSON from %s (exit %d)\n", tag, cmd, st);
    unlink(path);
    return py;
}

void bpeer_merge(json_t *o, json_t *py, const char *key)
{
    json_t *t = py ? json_object_get(py, key) : NULL;
    json_t *ms = t ? json_object_get(t, "ms") : NULL;
    if (!ms) {
        if (py)
            fprintf(stderr, "refit-bench gpu: quant %s: the PyTorch peer gave no timing\n", key);
        json_object_set_new(o, "torch", json_string("failed: see stderr"));
        return;
    }
    double tv = json_number_value(ms);
    bpeer_put(o, "torch_ms", tv);
    bpeer_put(o, "speedup_vs_torch", tv / json_number_value(json_object_get(o, "refit_ms")));
    json_object_set(o, "torch_bytes_equal_layer0", json_object_get(t, "bytes_equal"));
    json_object_set(o, "torch", json_object_get(py, "torch"));
}
