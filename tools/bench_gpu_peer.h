/* What the per-format quantization benches (tools/bench_gpu_<fmt>.c)
 * share: medians of timed calls, JSON figures, layer-0 dumps, and the
 * PyTorch peer (tools/bench_gpu.py) run on a spec and merged into a
 * format's object. */
#ifndef REFIT_TOOLS_BENCH_GPU_PEER_H
#define REFIT_TOOLS_BENCH_GPU_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include <refit/format.h> /* refit_view */

/* How a bench calls its kernel: refit_sys_cuda_run(0, NULL, launch, arg),
 * where launch quantizes the count pieces from at (the two fields the
 * timing sets before each call; they belong to the bench's arena). */
typedef struct bpeer_calls {
    int (*launch)(void *arg, void *stream);
    void *arg;
    uint32_t *at, *count;
} bpeer_calls;

/* Median seconds (after one untimed warm-up, repeat at most 64) of one
 * call for all nw pieces (all), or of nw calls of one piece each. Returns
 * 1 after a message naming what ("quant int4") on a failed call. */
int bpeer_time(const bpeer_calls *c, int nw, int all, int repeat, const char *what, double *out);
/* The median of v[0..n) (sorted in place). */
double bpeer_median(double *v, int n);
/* A format's object with its "weights" (nw) and "elements" (of x[0..nw)). */
json_t *bpeer_object(int nw, const refit_view *x);
/* The call figures every format reports, from min_bytes moved per call,
 * the medians of one call for every weight (t_all) and of one call per
 * weight (t_each), and the d2d ceiling (copy_Bps): min_bytes, refit_ms,
 * refit_GBps, copy_GBps, ratio_to_d2d, per_weight_calls_ms,
 * per_weight_ratio_to_d2d. */
void bpeer_figures(json_t *o, double min_bytes, double t_all, double t_each, double copy_Bps);
/* target (0.70), meets_target (the one-call ratio_to_d2d against it) and
 * layer0_equals_cpu_reference (true: the caller checked layer 0 first). */
void bpeer_verdict(json_t *o);

/* o[k] = v as a JSON real. */
void bpeer_put(json_t *o, const char *k, double v);
/* n bytes at p to path (mode "wb" or "ab"); 0 on success. */
int bpeer_write(const char *path, const void *p, size_t n, const char *mode);
/* Layer-0 dump of weight w for the peer: n bytes of ours at q to
 * DIR/<qfile> and, where xfile is not NULL, x's BF16 source (its host
 * copy: host_base + (x->data - dev_base)) to DIR/<xfile>; weight 0 starts
 * the files, the others append. 0 on success. */
int bpeer_dump(const char *dir, int w, const char *qfile, const void *q, size_t n,
               const char *xfile, const refit_view *x, const char *host_base,
               const char *dev_base);
/* Removes DIR/<file> (a dump, once the peer has read it). */
void bpeer_remove(const char *dir, const char *file);
/* A peer spec: {"<tag>_shapes": [[rows, cols] of x[0..nw)], "repeat",
 * "<tag>_layer0": min(nw, layer0), "dir"}; the caller adds its own keys. */
json_t *bpeer_spec(const char *tag, int nw, const refit_view *x, int layer0, int repeat,
                   const char *dir);
/* Run tools/bench_gpu.py (under $REFIT_SOURCE_ROOT, else .) with python on
 * spec (consumed), written to DIR/bench-<tag>-spec.json and removed after.
 * Returns the script's JSON (the caller frees it), or NULL after a
 * message on stderr naming the command. */
json_t *bpeer_torch(json_t *spec, const char *python, const char *dir, const char *tag);
/* Merge py[key] ({"ms", "bytes_equal"}) into o: torch_ms,
 * speedup_vs_torch (against o's refit_ms), torch_bytes_equal_layer0, and
 * torch (the version py reports); "torch": "failed: see stderr" when py
 * has no timing for key. */
void bpeer_merge(json_t *o, json_t *py, const char *key);

#endif
