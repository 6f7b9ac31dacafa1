/*
 * refitctl metrics: the metrics of every worker of one or many journals,
 * in the Prometheus text exposition format (docs/operators.md "Metrics"),
 * for node_exporter's textfile collector or stdout.
 *
 *   refitctl metrics --db JOURNAL [--db JOURNAL]... [--out FILE]
 *
 * The figures are what a journal can tell (its updates' states, times,
 * bytes, sources, undo placement; its workers' health and version),
 * printed by the writer refit_metrics_text uses (core/metrics_text.c).
 * --out writes a temporary file beside FILE and renames it over FILE, so
 * a reader sees the old file or the new one, never a part.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <refit/refit.h>

#include "core/metrics_text.h"
#include "journal/journal.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

static const cli_opt metrics_cli_opts[] = {
    {"db", 'd', "PATH", "a journal (repeat for more); default $REFIT_JOURNAL"},
    {"out", 'o', "FILE", "write FILE atomically (temporary file, then rename);\n"
                         "default stdout"},
    {NULL, 0, NULL, NULL},
};

static const cli metrics_cli = {
    "refitctl metrics", "[--db JOURNAL]... [--out FILE]",
    "Prints the metrics of every worker the journals record, in the Prometheus\n"
    "text format 0.0.4 (docs/operators.md \"Metrics\"): a node_exporter textfile\n"
    "(--out DIR/refit.prom) covers a host's workers without touching the engines.\n"
    "Exit status: 0 ok, 1 error, 2 usage.",
    metrics_cli_opts,
};

typedef struct metrics_run {
    const char **dbs;
    size_t n_dbs;
    const char *out;
    metrics_worker *w;          /* strings strdup'ed, freed with the set */
    const char **w_db;          /* the journal each worker came from */
    size_t n, cap;
    const char *db;             /* the journal being read */
    size_t first;               /* its first worker in w */
} metrics_run;

static int metrics_opt(void *user, int key, const char *v)
{
    metrics_run *o = user;
    if (key == 'o') {
        o->out = v;
        return 0;
    }
    const char **d = realloc(o->dbs, (o->n_dbs + 1) * sizeof *d);
    if (!d)
        return cli_error(1, "out of memory");
    o->dbs = d;
    o->dbs[o->n_dbs++] = v;
    return 0;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int add_worker(void *user, const journal_worker_row *r)
{
    metrics_run *o = user;
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->w[i].worker, r->id) && o->w[i].rank == r->rank)
            return cli_error(1, "worker %s (rank %lld) is in both %s and %s: its series would "
                             "collide", r->id, (long long)r->rank, o->w_db[i], o->db);
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 8;
        metrics_worker *w = realloc(o->w, cap * sizeof *w);
        if (!w)
            return cli_error(1, "out of memory");
        o->w = w;
        const char **d = realloc(o->w_db, cap * sizeof *d);
        if (!d)
            return cli_error(1, "out of memory");
        o->w_db = d;
        o->cap = cap;
    }
    metrics_worker *w = &o->w[o->n];
    /* the version a worker serves: READY only, as refit_worker_version */
    bool ready = r->health && !strcmp(r->health, "ready");
    *w = (metrics_worker){.rank = r->rank, .worker = strdup(r->id),
                          .health = dup_or_null(r->health),
                          .version = ready ? dup_or_null(r->version) : NULL};
    o->w_db[o->n++] = o->db;
    if (!w->worker || (r->health && !w->health) || (ready && r->version && !w->version))
        return cli_error(1, "out of memory");
    return 0;
}

/* ISO 8601 UTC with milliseconds (the journal's times) to Unix seconds;
 * -1 when absent or malformed. */
static double unix_time(const char *iso)
{
    struct tm tm = {0};
    const char *rest = iso ? strptime(iso, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!rest)
        return -1;
    double frac = 0;
    if (*rest == '.')
        frac = strtod(rest, NULL);
    return (double)timegm(&tm) + frac;
}

static int add_update(void *user, const journal_update_row *r)
{
    metrics_run *o = user;
    metrics_worker *w = NULL;
    for (size_t i = o->first; i < o->n && !w; i++)
        if (!strcmp(o->w[i].worker, r->worker))
            w = &o->w[i];
    if (!w)
        return 0; /* verify reports an update of no worker */
    bool replay = r->mode && !strcmp(r->mode, "replay");
    bool restore = metrics_source_is_restore(metrics_source_of(r->source_uri));
    bool committed = !strcmp(r->state, "committed");
    bool interrupted = !strcmp(r->state, "interrupted");
    bool ended = committed || !strcmp(r->state, "aborted") || !strcmp(r->state, "rolled_back") ||
                 !strcmp(r->state, "failed");
    w->started++;
    w->replays_started += replay;
    w->restores_started += restore;
    if (committed) {
        w->committed++;
        w->replays_committed += replay;
        w->restores_committed += restore;
        w->commit_time = unix_time(r->ended_at);
    } else if (ended || interrupted) {
        metrics_reason why = metrics_reason_of(r->error, interrupted);
        w->aborted[why]++;
        w->poisoned[why] += !strcmp(r->state, "failed"); /* the journal's poisoned end */
        w->rollbacks += !strcmp(r->state, "rolled_back");
    }
    if (!ended)
        return 0;
    w->source_bytes[metrics_source_of(r->source_uri)] += r->bytes;
    double t0 = unix_time(r->started_at), t1 = unix_time(r->ended_at);
    if (t0 >= 0 && t1 >= t0)
        metrics_observe(&w->duration[committed ? METRICS_COMMITTED : METRICS_ABORTED], true,
                        t1 - t0);
    metrics_observe(&w->bytes, false, (double)r->bytes);
    w->has_undo = r->undo_recorded;
    w->undo[METRICS_DEVICE] = r->undo_recorded ? r->undo_device_bytes : 0;
    w->undo[METRICS_HOST] = r->undo_recorded ? r->undo_host_bytes : 0;
    return 0;
}

static int read_journal(metrics_run *o, const char *path)
{
    journal *j = NULL;
    journal_opts jo = JOURNAL_OPTS_INIT;
    char err[1024];
    jo.readonly = 1;
    if (journal_open(&j, path, &jo, err, sizeof err) != REFIT_OK)
        return cli_error(1, "%s", err);
    o->db = path;
    o->first = o->n;
    int rc = journal_workers_list(j, add_worker, o);
    if (!rc)
        rc = journal_updates_list(j, add_update, o);
    if (rc > 1 || rc < 0) /* the journal's own failure, not ours */
        rc = cli_error(1, "%s: %s", path, journal_errmsg(j));
    journal_close(j);
    return rc;
}

/* FILE.tmp.PID in FILE's folder (a textfile collector reads *.prom only),
 * flushed to disk, then renamed over FILE. */
static int write_atomic(const char *path, const char *text, size_t len)
{
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp)
        return cli_error(1, "out of memory");
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int e = errno;
        free(tmp);
        return cli_error(1, "%s: cannot create its temporary file: %s", path, strerror(e));
    }
    int e = 0;
    if (fwrite(text, 1, len, f) != len || fflush(f) || fsync(fileno(f)))
        e = errno ? errno : EIO;
    if (fclose(f) && !e)
        e = errno;
    if (!e && chmod(tmp, 0644))
        e = errno;
    if (!e && rename(tmp, path))
        e = errno;
    if (e)
        unlink(tmp);
    free(tmp);
    return e ? cli_error(1, "%s: %s; the file is unchanged", path, strerror(e)) : 0;
}

static void free_workers(metrics_run *o)
{
    for (size_t i = 0; i < o->n; i++) {
        free((char *)o->w[i].worker);
        free((char *)o->w[i].health);
        free((char *)o->w[i].version);
    }
    free(o->w);
    free(o->w_db);
    free(o->dbs);
}

int ctl_metrics(int argc, char **argv)
{
    metrics_run o = {0};
    int first, rc = cli_parse(&metrics_cli, argc, argv, metrics_opt, &o, &first);
    if (rc) {
        free(o.dbs);
        return rc == CLI_HELP ? 0 : rc;
    }
    if (first < argc) {
        free(o.dbs);
        return cli_usage_error(&metrics_cli, "unexpected '%s' (journals go after --db)",
                               argv[first]);
    }
    const char *env = getenv("REFIT_JOURNAL");
    if (!o.n_dbs && !(env && *env)) {
        free(o.dbs);
        return cli_usage_error(&metrics_cli, "which journal? (--db PATH or $REFIT_JOURNAL)");
    }
    if (!o.n_dbs)
        metrics_opt(&o, 'd', env);
    for (size_t i = 0; i < o.n_dbs && !rc; i++)
        rc = read_journal(&o, o.dbs[i]);
    size_t len = 0;
    char *text = rc ? NULL : metrics_text(o.w, o.n, &len);
    if (!rc && !text)
        rc = cli_error(1, "out of memory");
    if (!rc && o.out)
        rc = write_atomic(o.out, text, len);
    else if (!rc && fwrite(text, 1, len, stdout) != len)
        rc = cli_error(1, "stdout: %s", strerror(errno));
    free(text);
    free_workers(&o);
    return rc;
}
