/*
 * bench_journal_write: the journal's share of one reload, measured by
 * replaying the writes the core makes for an update of a given size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "journal/journal.h"
#include "bench_journal.h"
#include "tools/cli.h"

/* Modules completed between two progress batches: the core flushes
 * progress per source bucket; 1024 modules is a generous bucket. */
#define BENCH_PROGRESS_BATCH 1024

typedef struct bench_update {
    journal_module_info *mods;
    journal_module_progress *prog;
    char *names;
    size_t n;
    int64_t plan; /* from journal_plan_prepare, as the core keeps it */
} bench_update;

static void bench_free(bench_update *b)
{
    free(b->mods);
    free(b->prog);
    free(b->names);
}

/* Module names like a MoE checkpoint's; tensors spread evenly. */
static int bench_make(bench_update *b, size_t n_modules, size_t n_tensors)
{
    const size_t name_len = 64;
    b->n = n_modules;
    b->mods = calloc(n_modules ? n_modules : 1, sizeof *b->mods);
    b->prog = calloc(n_modules ? n_modules : 1, sizeof *b->prog);
    b->names = calloc(n_modules ? n_modules : 1, name_len);
    if (!b->mods || !b->prog || !b->names)
        return REFIT_ENOMEM;
    for (size_t i = 0; i < n_modules; i++) {
        char *name = b->names + i * name_len;
        uint64_t t = n_tensors / n_modules + (i < n_tensors % n_modules);
        snprintf(name, name_len, "model.layers.%zu.mlp.experts.%zu",
                 i / 128, i % 128);
        b->mods[i] = (journal_module_info){name, t, t * 4096};
    }
    return REFIT_OK;
}

/* Progress entries as the loading phase reports them: complete modules. */
static void bench_reset(bench_update *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->prog[i] = (journal_module_progress){
            .index = (uint32_t)i, .state = JOURNAL_MODULE_COMPLETE,
            .received_tensors = b->mods[i].expected_tensors,
            .received_bytes = b->mods[i].expected_bytes};
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The writes of one update, in the core's order. */
static int bench_run(journal *j, bench_update *b)
{
    const journal_update_info info = {
        .worker_id = "bench", .version = "bench-v1",
        .source_uri = "memory://bench", .rollback = 1, .plan_id = b->plan};
    int64_t id = 0;
    uint64_t tensors = 0, bytes = 0;
    int rc = journal_health(j, "bench", "ready", "updating", "begin", NULL);
    if (!rc)
        rc = journal_update_begin(j, &id, &info, b->n, b->mods);
    for (size_t i = 0; !rc && i < b->n; i += BENCH_PROGRESS_BATCH) {
        size_t n = b->n - i < BENCH_PROGRESS_BATCH ? b->n - i
                                                   : BENCH_PROGRESS_BATCH;
        rc = journal_modules_progress(j, id, n, b->prog + i);
    }
    if (!rc)
        rc = journal_update_state_set(j, id, JOURNAL_UPDATE_FINALIZING);
    for (size_t i = 0; i < b->n; i++) {
        b->prog[i].state = JOURNAL_MODULE_COMMITTED;
        b->prog[i].has_fingerprint = 1;
        b->prog[i].fingerprint = 0x9e3779b97f4a7c15ull * (i + 1);
        tensors += b->prog[i].received_tensors;
        bytes += b->prog[i].received_bytes;
    }
    if (!rc)
        rc = journal_update_end(j, id, JOURNAL_UPDATE_COMMITTED, bytes,
                                tensors, NULL, b->n, b->prog);
    if (!rc)
        rc = journal_health(j, "bench", "updating", "ready", "commit",
                            "bench-v1");
    return rc;
}

int bench_journal_write(const char *path, size_t n_modules, size_t n_tensors,
                        double *seconds_out)
{
    journal *j = NULL;
    bench_update b = {0};
    char err[512];
    int rc = journal_open(&j, path, NULL, err, sizeof err);
    if (rc) {
        cli_error(1, "journal writes: %s", err);
        return rc;
    }
    rc = bench_make(&b, n_modules, n_tensors);
    if (!rc)
        rc = journal_worker_register(j, "bench", 0);
    /* The core records its plan at seal, off the reload path. */
    if (!rc)
        rc = journal_plan_prepare(j, b.n, b.mods, &b.plan);
    /* A first update warms the statement cache and SQLite's page cache, as
     * the worker's first update does; the figure is the steady state. */
    bench_reset(&b);
    if (!rc)
        rc = bench_run(j, &b);
    bench_reset(&b);
    double t0 = now_s();
    if (!rc)
        rc = bench_run(j, &b);
    double t1 = now_s();
    if (rc)
        cli_error(1, "journal writes: %s", journal_errmsg(j));
    else if (seconds_out)
        *seconds_out = t1 - t0;
    bench_free(&b);
    journal_close(j);
    return rc;
}
