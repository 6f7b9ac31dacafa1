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

static const cli_opt journal_cli_opts[] = {
    {"db", 'd', "PATH", "the journal (default $REFIT_JOURNAL)"},
    {"json", 'j', NULL, "one JSON object on stdout; errors too"},
    {"incomplete", 'i', NULL, "modules: only those not complete or committed"},
    {"update", 'u', "ID", "events: only those of update ID"},
    {"limit", 'l', "N", "events: the first N"},
    {NULL, 0, NULL, NULL},
};

static const cli journal_cli = {
    "refitctl journal", "COMMAND [ID] [--db PATH] [--json] [options]",
    "commands:\n"
    "  status      each worker: health, version, heartbeat, latest update\n"
    "  updates     every update, oldest first\n"
    "  show ID     one update, its module counts and events\n"
    "  modules ID  the modules of an update [--incomplete]\n"
    "  events      events, oldest first [--update ID] [--limit N]\n"
    "  verify      integrity, foreign key, schema and consistency checks\n"
    "The journal is opened read-only: reading never blocks a worker that writes.\n"
    "Exit status: 0 ok, 1 error or problems found, 2 usage.",
    journal_cli_opts,
};

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

static int journal_opt(void *user, int key, const char *v)
{
    ctl_opts *o = user;
    if (key == 'j')
        o->json = 1;
    else if (key == 'i')
        o->incomplete = 1;
    else if (key == 'd')
        o->db = v;
    else if (parse_id(v, key == 'u' ? &o->update : &o->limit))
        return cli_usage_error(&journal_cli, "--%s needs a positive integer, not '%s'",
                               key == 'u' ? "update" : "limit", v);
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
    if (journal_open(&j, o->db, &jo, err, sizeof err) != REFIT_OK)
        return cli_error(1, "%s", err);
    int rc = fn(j, o);
    journal_close(j);
    return rc;
}

int ctl_journal(int argc, char **argv)
{
    ctl_opts o = {0};
    int first, rc = cli_parse(&journal_cli, argc, argv, journal_opt, &o, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (first >= argc)
        return cli_usage_error(&journal_cli, "which command?");
    o.cmd = argv[first];
    if (argc - first > 2)
        return cli_usage_error(&journal_cli, "unexpected '%s'", argv[first + 2]);
    if (argc - first == 2 && parse_id(argv[first + 1], &o.id))
        return cli_usage_error(&journal_cli, "'%s' is not an update ID", argv[first + 1]);
    if (!o.db)
        o.db = getenv("REFIT_JOURNAL");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (strcmp(o.cmd, commands[i].name))
            continue;
        if (commands[i].needs_id != (o.id != 0))
            return cli_usage_error(&journal_cli, "%s %s", o.cmd,
                                   commands[i].needs_id ? "needs an update ID" : "takes no ID");
        if (!o.db || !*o.db)
            return cli_usage_error(&journal_cli, "no journal: give --db PATH or set "
                                                 "REFIT_JOURNAL");
        return run(&o, commands[i].fn);
    }
    return cli_usage_error(&journal_cli, "unknown command '%s'", o.cmd);
}
