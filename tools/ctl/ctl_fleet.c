/*
 * refitctl fleet: every worker of many journals in one view.
 *
 *   refitctl fleet JOURNAL...|DIR... [--group-by file|name] [--json]
 *
 * A DIR is searched (subfolders too, symbolic links not followed) for
 * refit journals: SQLite files whose header carries the journal's
 * application_id, or that have the journal's PATH-writers file beside them
 * (a journal whose header is still in its WAL); other files are skipped.
 * A file named on the command line must be a journal. Each journal is
 * opened read-only, as `refitctl journal` does.
 *
 * A group is one journal file (docs/design.md: one journal per worker
 * group), or with --group-by name every journal of the same file name (a
 * group spanning hosts, each host's journal collected into its own folder).
 * A group is mixed when its workers hold more than one version.
 *
 * Exit status: 0 every worker healthy and no group mixed; 1 a worker
 * POISONED, a group mixed, or a journal that could not be read; 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctl_fleet.h"
#include "journal/journal.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

#define FLEET_MAX_DEPTH 16

static const cli_opt fleet_opts[] = {
    {"group-by", 'g', "file|name", "what makes a group: one journal file (default), or\n"
                                   "every journal of the same file name (across hosts)"},
    {"json", 'j', NULL, "one JSON object on stdout: workers, groups, errors"},
    {NULL, 0, NULL, NULL},
};

static const cli fleet_cli = {
    "refitctl fleet", "JOURNAL...|DIR... [--group-by file|name] [--json]",
    "Every worker found in the journals: host, worker, rank, version, health,\n"
    "its last update and how it ended, and the age of that. Groups whose workers\n"
    "hold more than one version come first, flagged MIXED; POISONED workers are\n"
    "flagged in the health column. A DIR is searched for journals (subfolders too).\n"
    "Exit status: 0 all healthy and no group mixed; 1 a worker POISONED, a group\n"
    "mixed, or a journal that could not be read; 2 usage.",
    fleet_opts,
};

struct fleet_args {
    int json, by_name;
};

/* ---- collecting ---------------------------------------------------------- */

/* Journals seen, by device and inode: a file named twice is read once. */
struct seen {
    dev_t *dev;
    ino_t *ino;
    size_t n, cap;
};

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Record that path could not be read; the message names it. */
static void fleet_fail(fleet *f, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fleet_fail(fleet *f, const char *path, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (f->n_err == f->cap_err) {
        size_t cap = f->cap_err ? 2 * f->cap_err : 8;
        fleet_error *e = realloc(f->err, cap * sizeof *e);
        if (!e)
            return;
        f->err = e, f->cap_err = cap;
    }
    f->err[f->n_err++] = (fleet_error){strdup(path), strdup(msg)};
}

struct read_ctx {
    fleet *f;
    const char *path, *group;
};

static int add_worker(void *user, const journal_worker_row *r)
{
    struct read_ctx *c = user;
    fleet *f = c->f;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        fleet_worker *w = realloc(f->w, cap * sizeof *w);
        if (!w)
            return 1;
        f->w = w, f->cap = cap;
    }
    f->w[f->n++] = (fleet_worker){
        .journal = strdup(c->path), .group = strdup(c->group), .id = dup_or_null(r->id),
        .host = dup_or_null(r->host), .version = dup_or_null(r->version),
        .health = dup_or_null(r->health), .heartbeat = dup_or_null(r->heartbeat),
        .rank = r->rank, .pid = r->pid, .alive = r->alive, .last_update = r->last_update,
        .last_state = dup_or_null(r->last_update_state)};
    return 0;
}

static int last_update_times(void *user, const journal_update_row *r)
{
    fleet_worker *w = user;
    w->last_started = dup_or_null(r->started_at);
    w->last_ended = dup_or_null(r->ended_at);
    w->last_error = dup_or_null(r->error);
    return 0;
}

/* Every worker of the journal at path, with its last update's times. */
static void read_journal(fleet *f, const char *path, int by_name)
{
    journal *j = NULL;
    journal_opts jo = JOURNAL_OPTS_INIT;
    char err[1024];
    jo.readonly = 1;
    if (journal_open(&j, path, &jo, err, sizeof err) != REFIT_OK) {
        fleet_fail(f, path, "%s", err); /* "journal PATH: ..." */
        return;
    }
    const char *base = strrchr(path, '/');
    struct read_ctx c = {f, path, by_name && base ? base + 1 : path};
    size_t first = f->n;
    int rc = journal_workers_list(j, add_worker, &c);
    for (size_t i = first; !rc && i < f->n; i++)
        if (f->w[i].last_update)
            rc = journal_update_get(j, f->w[i].last_update, last_update_times, &f->w[i]);
    if (rc)
        fleet_fail(f, path, "%s%s", rc == 1 ? path : journal_errmsg(j),
                   rc == 1 ? ": out of memory" : "");
    else
        f->n_journals++;
    journal_close(j);
}

/* 1 when the file at path is a refit journal as far as its first bytes
 * and its neighbours tell (a DIR search reads only those). */
static int looks_like_journal(const char *path)
{
    unsigned char h[72];
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return 0;
    size_t n = fread(h, 1, sizeof h, fp);
    fclose(fp);
    if (n < sizeof h || memcmp(h, "SQLite format 3", 16))
        return 0;
    uint32_t app = (uint32_t)h[68] << 24 | (uint32_t)h[69] << 16 | (uint32_t)h[70] << 8 | h[71];
    if (app == JOURNAL_APPLICATION_ID)
        return 1;
    char writers[4200];
    struct stat st;
    if (snprintf(writers, sizeof writers, "%s-writers", path) >= (int)sizeof writers)
        return 0;
    return stat(writers, &st) == 0;
}

static int seen_before(struct seen *s, const struct stat *st)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->dev[i] == st->st_dev && s->ino[i] == st->st_ino)
            return 1;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        dev_t *d = realloc(s->dev, cap * sizeof *d);
        if (d)
            s->dev = d;
        ino_t *i = realloc(s->ino, cap * sizeof *i);
        if (i)
            s->ino = i;
        if (!d || !i)
            return 0;
        s->cap = cap;
    }
    s->dev[s->n] = st->st_dev, s->ino[s->n++] = st->st_ino;
    return 0;
}

static int by_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in dir, sorted (a stable order whatever readdir gives); NULL
 * with errno set when it cannot be read. */
static char **list_dir(const char *dir, size_t *n_out)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                break;
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, by_name_cmp);
    *n_out = n;
    return names ? names : calloc(1, sizeof *names);
}

/* Reads every journal under dir not read before; returns how many
 * journals it found, read before or not. */
static size_t search_dir(fleet *f, struct seen *s, const char *dir, int depth, int by_name)
{
    size_t n = 0, found = 0;
    char **names = list_dir(dir, &n);
    if (!names) {
        fleet_fail(f, dir, "%s: cannot read the folder: %s", dir, strerror(errno));
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        int len = snprintf(path, sizeof path, "%s%s%s", dir,
                           dir[strlen(dir) - 1] == '/' ? "" : "/", names[i]);
        free(names[i]);
        if (len >= (int)sizeof path || lstat(path, &st))
            continue;
        if (S_ISDIR(st.st_mode) && depth < FLEET_MAX_DEPTH) {
            found += search_dir(f, s, path, depth + 1, by_name);
        } else if (S_ISREG(st.st_mode) && looks_like_journal(path)) {
            found++;
            if (!seen_before(s, &st))
                read_journal(f, path, by_name);
        }
    }
    free(names);
    return found;
}

/* One command-line argument: a journal, or a folder to search. */
static void collect(fleet *f, struct seen *s, const char *arg, int by_name)
{
    struct stat st;
    if (stat(arg, &st)) {
        fleet_fail(f, arg, "%s: %s", arg, strerror(errno));
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        if (!search_dir(f, s, arg, 0, by_name))
            fleet_fail(f, arg, "%s: no refit journal found in this folder (nor below it)", arg);
    } else if (!seen_before(s, &st)) {
        read_journal(f, arg, by_name);
    }
}

/* ---- judging ------------------------------------------------------------- */

int fleet_poisoned(const fleet_worker *w)
{
    return w->health && !strcmp(w->health, "poisoned");
}

static int same(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

/* Mark the workers of groups whose versions differ; count groups. */
static void judge(fleet *f)
{
    for (size_t i = 0; i < f->n; i++) {
        size_t first = 0;
        while (strcmp(f->w[first].group, f->w[i].group))
            first++;
        if (first == i)
            f->n_groups++;
        f->n_poisoned += fleet_poisoned(&f->w[i]);
        for (size_t k = 0; k < f->n; k++)
            if (!strcmp(f->w[k].group, f->w[i].group) && f->w[i].version && f->w[k].version &&
                !same(f->w[i].version, f->w[k].version))
                f->w[i].mixed = 1;
    }
    for (size_t i = 0; i < f->n; i++) {
        size_t first = 0;
        while (strcmp(f->w[first].group, f->w[i].group))
            first++;
        f->n_mixed_groups += first == i && f->w[i].mixed;
    }
}

static int worker_cmp(const void *pa, const void *pb)
{
    const fleet_worker *a = pa, *b = pb;
    if (a->mixed != b->mixed)
        return b->mixed - a->mixed;
    int c = strcmp(a->group, b->group);
    if (c)
        return c;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return strcmp(a->id ? a->id : "", b->id ? b->id : "");
}

static void fleet_free(fleet *f)
{
    for (size_t i = 0; i < f->n; i++) {
        fleet_worker *w = &f->w[i];
        char *s[] = {w->journal, w->group, w->id, w->host, w->version, w->health,
                     w->heartbeat, w->last_state, w->last_started, w->last_ended,
                     w->last_error};
        for (size_t k = 0; k < sizeof s / sizeof *s; k++)
            free(s[k]);
    }
    for (size_t i = 0; i < f->n_err; i++)
        free(f->err[i].path), free(f->err[i].message);
    free(f->w);
    free(f->err);
}

static int fleet_opt(void *user, int key, const char *v)
{
    struct fleet_args *a = user;
    if (key == 'j')
        a->json = 1;
    else if (!strcmp(v, "file") || !strcmp(v, "name"))
        a->by_name = !strcmp(v, "name");
    else
        return cli_usage_error(&fleet_cli, "--group-by is file or name, not '%s'", v);
    return 0;
}

int ctl_fleet(int argc, char **argv)
{
    struct fleet_args a = {0};
    int first, rc = cli_parse(&fleet_cli, argc, argv, fleet_opt, &a, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (first >= argc)
        return cli_usage_error(&fleet_cli, "give at least one JOURNAL or DIR");
    fleet f = {.now = time(NULL)};
    struct seen s = {0};
    for (int i = first; i < argc; i++)
        collect(&f, &s, argv[i], a.by_name);
    free(s.dev);
    free(s.ino);
    judge(&f);
    if (f.n)
        qsort(f.w, f.n, sizeof *f.w, worker_cmp);
    int status = f.n_err || f.n_poisoned || f.n_mixed_groups ? 1 : 0;
    if (a.json ? fleet_print_json(&f, status) : fleet_print_table(&f))
        status = 1;
    fleet_free(&f);
    return status;
}
