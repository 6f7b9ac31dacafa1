/* What the per-format quantization benches (tools/bench_gpu_<fmt>.c)
 * share: JSON figures, layer-0 dumps, and the PyTorch peer
 * (tools/bench_gpu.py) run on a spec and merged into a format's object. */
#ifndef REFIT_TOOLS_BENCH_GPU_PEER_H
#define REFIT_TOOLS_BENCH_GPU_PEER_H

#include <stddef.h>

#include <jansson.h>

/* o[k] = v as a JSON real. */
void bpeer_put(json_t *o, const char *k, double v);
/* n bytes at p to path (mode "wb" or "ab"); 0 on success. */
int bpeer_write(const char *path, const void *p, size_t n, const char *mode);
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
