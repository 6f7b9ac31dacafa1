/* The Prometheus text exposition of refit's metrics: one writer for the
 * context (refit_metrics_text) and the journals (refitctl metrics).
 * docs/operators.md "Metrics" lists what is printed; keep the two equal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "core/metrics_text.h"

static const double seconds_bounds[METRICS_SECONDS_BUCKETS] = {
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600};
/* 1 KiB ... 1 TiB, powers of 4 */
static const double bytes_bounds[METRICS_BYTES_BUCKETS] = {
    0x1p10, 0x1p12, 0x1p14, 0x1p16, 0x1p18, 0x1p20, 0x1p22, 0x1p24,
    0x1p26, 0x1p28, 0x1p30, 0x1p32, 0x1p34, 0x1p36, 0x1p38, 0x1p40};

static const char *const reason_names[METRICS_N_REASONS] = {"caller", "failed", "finalize",
                                                            "interrupted"};
static const char *const source_names[METRICS_N_SOURCES] = {"memory", "file", "nccl", "ipc",
                                                              "snapshot", "keeper"};
static const char *const phase_names[METRICS_N_PHASES] = {"begin", "load", "post_load",
                                                          "finalize", "journal"};
static const char *const route_names[METRICS_N_ROUTES] = {"direct", "view", "staged"};
static const char *const outcome_names[2] = {"committed", "aborted"};
static const char *const placement_names[2] = {"device", "host"};
static const char *const health_names[4] = {"empty", "ready", "updating", "poisoned"};

metrics_reason metrics_reason_of(const char *error, bool interrupted)
{
    if (interrupted)
        return METRICS_REASON_INTERRUPTED;
    /* the texts txn_prepare records (core/txn.c) */
    if (error && !strncmp(error, "finalize: the update failed earlier", 35))
        return METRICS_REASON_FAILED;
    if (error && !strncmp(error, "finalize:", 9))
        return METRICS_REASON_FINALIZE;
    return METRICS_REASON_CALLER;
}

metrics_source metrics_source_of(const char *uri)
{
    static const struct {
        const char *scheme;
        metrics_source kind;
    } schemes[] = {{"file://", METRICS_SOURCE_FILE},
                   {"nccl://", METRICS_SOURCE_NCCL},
                   {"loopback://", METRICS_SOURCE_NCCL}, /* the NCCL receiver's test transport */
                   {"ipc://", METRICS_SOURCE_IPC},
                   {"snapshot://", METRICS_SOURCE_SNAPSHOT},  /* refit_restore's */
                   {"keeper://", METRICS_SOURCE_KEEPER}};     /* refit_ipc_restore's */
    for (size_t i = 0; uri && i < sizeof schemes / sizeof schemes[0]; i++)
        if (!strncmp(uri, schemes[i].scheme, strlen(schemes[i].scheme)))
            return schemes[i].kind;
    return METRICS_SOURCE_MEMORY;
}

bool metrics_source_is_restore(metrics_source s)
{
    return s == METRICS_SOURCE_SNAPSHOT || s == METRICS_SOURCE_KEEPER;
}

void metrics_observe(metrics_hist *h, bool seconds, double v)
{
    const double *b = seconds ? seconds_bounds : bytes_bounds;
    int n = seconds ? METRICS_SECONDS_BUCKETS : METRICS_BYTES_BUCKETS;
    for (int i = 0; i < n; i++)
        if (v <= b[i]) {
            h->bucket[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

void metrics_refusal(metrics_worker *w, int status)
{
    if (status < 0 && -status < METRICS_N_STATUS)
        w->refusals[-status]++;
}

/* ---- the writer ---- */

static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '"')
            fputc('\\', f), fputc(*s, f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

/* name{worker="..",rank="..",k="v"} with k NULL for no extra label; then
 * the caller prints the value. */
static void series(FILE *f, const char *name, const char *suffix, const metrics_worker *w,
                   const char *k, const char *v, const char *k2, const char *v2)
{
    fprintf(f, "%s%s{worker=\"", name, suffix);
    put_escaped(f, w->worker ? w->worker : "");
    fprintf(f, "\",rank=\"%lld\"", (long long)w->rank);
    if (k) {
        fprintf(f, ",%s=\"", k);
        put_escaped(f, v);
        fputc('"', f);
    }
    if (k2) {
        fprintf(f, ",%s=\"", k2);
        put_escaped(f, v2);
        fputc('"', f);
    }
    fputc('}', f);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(FILE *f, const char *name, const metrics_worker *w, const char *k,
                    const char *v, uint64_t n)
{
    series(f, name, "", w, k, v, NULL, NULL);
    fprintf(f, " %llu\n", (unsigned long long)n);
}

static void gauge(FILE *f, const char *name, const metrics_worker *w, const char *k,
                  const char *v, double x)
{
    series(f, name, "", w, k, v, NULL, NULL);
    fprintf(f, " %.17g\n", x);
}

static void histogram(FILE *f, const char *name, const metrics_worker *w, const char *k,
                      const char *v, const metrics_hist *h, bool seconds)
{
    const double *b = seconds ? seconds_bounds : bytes_bounds;
    int n = seconds ? METRICS_SECONDS_BUCKETS : METRICS_BYTES_BUCKETS;
    uint64_t cum = 0;
    char le[32];
    for (int i = 0; i < n; i++) {
        cum += h->bucket[i];
        snprintf(le, sizeof le, "%.17g", b[i]);
        series(f, name, "_bucket", w, k, v, "le", le);
        fprintf(f, " %llu\n", (unsigned long long)cum);
    }
    series(f, name, "_bucket", w, k, v, "le", "+Inf");
    fprintf(f, " %llu\n", (unsigned long long)h->count);
    series(f, name, "_sum", w, k, v, NULL, NULL);
    fprintf(f, " %.17g\n", h->sum);
    series(f, name, "_count", w, k, v, NULL, NULL);
    fprintf(f, " %llu\n", (unsigned long long)h->count);
}

/* The families, in docs/operators.md's order. */
static void write_counters(FILE *f, const metrics_worker *w, size_t n, bool live)
{
    static const struct {
        const char *name, *help;
        size_t off;
        bool replay;
    } plain[] = {
        {"refit_updates_started_total", "Updates begun (replays included).",
         offsetof(metrics_worker, started), false},
        {"refit_updates_committed_total", "Updates committed.",
         offsetof(metrics_worker, committed), false},
    };
    for (size_t p = 0; p < 2; p++) {
        family(f, plain[p].name, "counter", plain[p].help);
        for (size_t i = 0; i < n; i++)
            counter(f, plain[p].name, &w[i], NULL, NULL,
                    *(const uint64_t *)((const char *)&w[i] + plain[p].off));
    }
    family(f, "refit_updates_aborted_total", "counter",
           "Updates ended without a commit, by reason class.");
    for (size_t i = 0; i < n; i++)
        for (int r = 0; r < METRICS_N_REASONS; r++)
            counter(f, "refit_updates_aborted_total", &w[i], "reason", reason_names[r],
                    w[i].aborted[r]);
    family(f, "refit_updates_poisoned_total", "counter",
           "Aborted updates that left the worker POISONED, by reason class.");
    for (size_t i = 0; i < n; i++)
        for (int r = 0; r < METRICS_N_REASONS; r++)
            counter(f, "refit_updates_poisoned_total", &w[i], "reason", reason_names[r],
                    w[i].poisoned[r]);
    family(f, "refit_rollbacks_total", "counter",
           "Aborted updates whose written bytes the undo log put back.");
    for (size_t i = 0; i < n; i++)
        counter(f, "refit_rollbacks_total", &w[i], NULL, NULL, w[i].rollbacks);
    family(f, "refit_replays_started_total", "counter", "Replays begun.");
    for (size_t i = 0; i < n; i++)
        counter(f, "refit_replays_started_total", &w[i], NULL, NULL, w[i].replays_started);
    family(f, "refit_replays_committed_total", "counter", "Replays committed.");
    for (size_t i = 0; i < n; i++)
        counter(f, "refit_replays_committed_total", &w[i], NULL, NULL, w[i].replays_committed);
    family(f, "refit_restores_started_total", "counter",
           "Restores from a snapshot or a keeper begun.");
    for (size_t i = 0; i < n; i++)
        counter(f, "refit_restores_started_total", &w[i], NULL, NULL, w[i].restores_started);
    family(f, "refit_restores_committed_total", "counter",
           "Restores from a snapshot or a keeper committed.");
    for (size_t i = 0; i < n; i++)
        counter(f, "refit_restores_committed_total", &w[i], NULL, NULL,
                w[i].restores_committed);
    if (live) {
        family(f, "refit_refusals_total", "counter",
               "Calls refused with nothing changed, by status name.");
        for (size_t i = 0; i < n; i++)
            for (int s = 1; s < METRICS_N_STATUS; s++)
                if (w[i].live && w[i].refusals[s])
                    counter(f, "refit_refusals_total", &w[i], "status", refit_status_name(-s),
                            w[i].refusals[s]);
        family(f, "refit_route_bytes_total", "counter",
               "Checkpoint bytes accepted, by route and module format.");
        for (size_t i = 0; i < n; i++)
            for (uint32_t k = 0; w[i].live && k < w[i].n_formats; k++)
                for (int r = 0; w[i].formats[k].format && r < METRICS_N_ROUTES; r++) {
                    series(f, "refit_route_bytes_total", "", &w[i], "route", route_names[r],
                           "format", w[i].formats[k].format);
                    fprintf(f, " %llu\n", (unsigned long long)w[i].formats[k].route[r]);
                }
    }
    family(f, "refit_source_bytes_total", "counter",
           "Checkpoint bytes of ended updates, by source kind.");
    for (size_t i = 0; i < n; i++)
        for (int s = 0; s < METRICS_N_SOURCES; s++)
            counter(f, "refit_source_bytes_total", &w[i], "source", source_names[s],
                    w[i].source_bytes[s]);
}

static void write_histograms(FILE *f, const metrics_worker *w, size_t n, bool live)
{
    family(f, "refit_update_duration_seconds", "histogram",
           "Updates from refit_begin to commit or abort, by outcome.");
    for (size_t i = 0; i < n; i++)
        for (int o = 0; o < 2; o++)
            histogram(f, "refit_update_duration_seconds", &w[i], "outcome", outcome_names[o],
                      &w[i].duration[o], true);
    if (live) {
        family(f, "refit_update_phase_seconds", "histogram", "Each ended update's phases.");
        for (size_t i = 0; i < n; i++)
            for (int p = 0; w[i].live && p < METRICS_N_PHASES; p++)
                histogram(f, "refit_update_phase_seconds", &w[i], "phase", phase_names[p],
                          &w[i].phase[p], true);
    }
    family(f, "refit_update_bytes", "histogram", "Checkpoint bytes of each ended update.");
    for (size_t i = 0; i < n; i++)
        histogram(f, "refit_update_bytes", &w[i], NULL, NULL, &w[i].bytes, false);
}

static void write_gauges(FILE *f, const metrics_worker *w, size_t n, bool live)
{
    family(f, "refit_health", "gauge", "1 for the worker's health state, 0 for the others.");
    for (size_t i = 0; i < n; i++)
        for (int h = 0; h < 4; h++)
            gauge(f, "refit_health", &w[i], "state", health_names[h],
                  w[i].health && !strcmp(w[i].health, health_names[h]));
    family(f, "refit_version_info", "gauge", "1, labelled with the version the worker holds.");
    for (size_t i = 0; i < n; i++)
        if (w[i].version)
            gauge(f, "refit_version_info", &w[i], "version", w[i].version, 1);
    family(f, "refit_version_commit_time_seconds", "gauge",
           "Unix time of the commit that set the worker's version.");
    for (size_t i = 0; i < n; i++)
        if (w[i].commit_time > 0)
            gauge(f, "refit_version_commit_time_seconds", &w[i], NULL, NULL, w[i].commit_time);
    family(f, "refit_undo_bytes", "gauge",
           "Where the last ended update's undo log kept its bytes, by placement.");
    for (size_t i = 0; i < n; i++)
        for (int p = 0; w[i].has_undo && p < 2; p++)
            gauge(f, "refit_undo_bytes", &w[i], "placement", placement_names[p],
                  (double)w[i].undo[p]);
    if (live) {
        family(f, "refit_staging_peak_bytes", "gauge",
               "The most staging memory one update held at once.");
        for (size_t i = 0; i < n; i++)
            if (w[i].live)
                gauge(f, "refit_staging_peak_bytes", &w[i], NULL, NULL,
                      (double)w[i].staging_peak);
    }
}

char *metrics_text(const metrics_worker *w, size_t n, size_t *len)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f)
        return NULL;
    bool live = false;
    for (size_t i = 0; i < n; i++)
        live = live || w[i].live;
    write_counters(f, w, n, live);
    write_histograms(f, w, n, live);
    write_gauges(f, w, n, live);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = size;
    return buf;
}
