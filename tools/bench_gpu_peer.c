/* The per-format quantization benches' shared pieces (bench_gpu_peer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_gpu_peer.h"

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
