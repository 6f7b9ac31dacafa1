/*
 * refitctl journal: read a refit journal.
 *
 *   refitctl journal status|updates|show ID|modules ID [--incomplete]|
 *                    events [--update ID] [--limit N]|verify
 *                    [--db PATH] [--json]
 *
 * The journal is opened read-only (SQLITE_OPEN_READONLY): reading never
 * blocks a worker that writes (WAL) and never changes the file. Updates
 * whose writer died show `interrupted` even before a worker reopens the
 * journal and records it. Exit: 0 ok, 1 error or problems, 2 usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "journal/journal.h"
#include "refitctl.h"
#include "ctl_journal_int.h"

static int usage(FILE *f)
{
    fprintf(f,
        "usage: refitctl journal COMMAND [--db PATH] [--json]\n"
        "\n"
        "commands:\n"
        "  status                 each worker: health, version, heartbeat,\n"
        "                         latest update\n"
        "  updates                every update, oldest first\n"
        "  show ID                one update, its module counts and events\n"
        "  modules ID             the modules of an update\n"
        "      [--incomplete]     only those not complete or committed\n"
        "  events                 events, oldest first\n"
        "      [--update ID] [--limit N]\n"
        "  verify                 integrity, foreign key, schema and\n"
        "                         consistency checks; exit 1 on problems\n"
        "\n"
        "--db PATH defaults to $REFIT_JOURNAL. --json prints one JSON\n"
        "object. Exit status: 0 ok, 1 error or problems found, 2 usage.\n");
    return f == stderr ? 2 : 0;
}

static int parse_id(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || end == s || v <= 0)
        return -1;
    *out = v;
    return 0;
}

/* Option values: "--db PATH" and "--db=PATH". */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (!strncmp(argv[*i], name, n) && argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (!strcmp(argv[*i], name) && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static int parse_opt(int argc, char **argv, int *i, ctl_opts *o)
{
    const char *v;
    const char *a = argv[*i];
    if (!strcmp(a, "--json"))
        o->json = 1;
    else if (!strcmp(a, "--incomplete"))
        o->incomplete = 1;
    else if ((v = opt_value(argc, argv, i, "--db")))
        o->db = v;
    else if ((v = opt_value(argc, argv, i, "--update")))
        return parse_id(v, &o->update);
    else if ((v = opt_value(argc, argv, i, "--limit")))
        return parse_id(v, &o->limit);
    else
        return -1;
    return 0;
}

/* 0 ok, 2 usage error (message printed), 1 help printed. */
static int parse_args(int argc, char **argv, ctl_opts *o)
{
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return 1;
        if (a[0] == '-' && a[1]) {
            if (parse_opt(argc, argv, &i, o) != 0) {
                fprintf(stderr, "refitctl journal: bad option '%s'\n", a);
                return 2;
            }
        } else if (positional == 0) {
            o->cmd = a;
            positional++;
        } else if (positional == 1 && !parse_id(a, &o->id)) {
            positional++;
        } else {
            fprintf(stderr, "refitctl journal: unexpected '%s'\n", a);
            return 2;
        }
    }
    return 0;
}

static const struct {
    const char *name;
    int needs_id;
    int (*fn)(journal *, const ctl_opts *);
} commands[] = {
    {"status", 0, ctl_journal_status},
    {"updates", 0, ctl_journal_updates},
    {"show", 1, ctl_journal_show},
    {"modules", 1, ctl_journal_modules},
    {"events", 0, ctl_journal_events},
    {"verify", 0, ctl_journal_verify},
};

static int run(const ctl_opts *o, int (*fn)(journal *, const ctl_opts *))
{
    journal *j = NULL;
    journal_opts jo = JOURNAL_OPTS_INIT;
    char err[1024];
    jo.readonly = 1;
    if (journal_open(&j, o->db, &jo, err, sizeof err) != REFIT_OK) {
        fprintf(stderr, "refitctl journal: %s\n", err);
        return 1;
    }
    int rc = fn(j, o);
    journal_close(j);
    return rc;
}

int ctl_journal(int argc, char **argv)
{
    ctl_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 1 ? usage(stdout) : usage(stderr);
    if (!o.cmd)
        return usage(stderr);
    if (!o.db)
        o.db = getenv("REFIT_JOURNAL");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (strcmp(o.cmd, commands[i].name))
            continue;
        if (commands[i].needs_id != (o.id != 0)) {
            fprintf(stderr, "refitctl journal %s: %s\n", o.cmd,
                    commands[i].needs_id ? "needs an update ID"
                                         : "takes no ID");
            return usage(stderr);
        }
        if (!o.db || !*o.db) {
            fprintf(stderr, "refitctl journal: no journal: give --db PATH "
                    "or set REFIT_JOURNAL\n");
            return 2;
        }
        return run(&o, commands[i].fn);
    }
    fprintf(stderr, "refitctl journal: unknown command '%s'\n", o.cmd);
    return usage(stderr);
}
