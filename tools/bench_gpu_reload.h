/* Whole reloads of the bench model's linear weights through refit, for
 * quant.<fmt>.online_reload_ms and online_reload_cost_vs_bf16: each weight
 * one module "w<i>" whose checkpoint tensor "w<i>.weight" comes from the
 * device source view x[i], rollback off, timed from refit_begin to the
 * return of refit_finalize (median of repeat runs after a warm-up). */
#ifndef REFIT_TOOLS_BENCH_GPU_RELOAD_H
#define REFIT_TOOLS_BENCH_GPU_RELOAD_H

#include <jansson.h>

#include <refit/refit.h>

/* The modules' format and its runtime tensors: n_rt per module, named
 * names[k]; rt[i * n_rt + k] is module i's (shapes owned by the caller,
 * alive for the call). */
typedef struct breload_spec {
    const char *what;          /* for messages: "quant mxfp8" */
    const char *format, *params;
    int n_rt;
    const char *const *names;
    const refit_tensor *rt;
} breload_spec;

/* One timed update of m (rollback off): the device synced, then
 * refit_begin, one refit_load_many of names[i] from srcs[i] (the Python
 * binding's load_dict path) and refit_finalize; *secs from begin to
 * finalize's return. Returns the first failing status (the txn aborted). */
int breload_many_once(refit_model *m, size_t n, const char *const *names,
                      const refit_tensor *srcs, double *secs);

/* Median seconds of a reload of the nw weights as s's modules. Returns 1
 * after a message on stderr when the model or a reload fails. */
int breload_time(const breload_spec *s, int nw, const refit_view *x, int repeat, double *out);

/* The baseline: the same source bytes reloaded unquantized into BF16
 * runtime tensors of x's shapes (a device arena of its own, checked equal
 * to the sources after the runs). */
int breload_bf16(int nw, const refit_view *x, int repeat, double *out);

/* Into each format object of quant that has online_reload_ms:
 * online_reload_cost_vs_bf16 (its reload / t_bf16), the target for that
 * format and whether it is met. */
void breload_costs(json_t *quant, double t_bf16);

#endif
