/* refitctl journal show ID, and verify. */
#include <stdio.h>
#include <string.h>

#include "ctl_journal_int.h"

/* Module counts per state, for show. */
typedef struct module_counts {
    size_t n[JOURNAL_MODULE_STATE_COUNT + 1]; /* last: unknown state */
} module_counts;

static int count_module(void *user, const journal_module_row *r)
{
    module_counts *c = user;
    size_t s = 0;
    while (s < JOURNAL_MODULE_STATE_COUNT &&
           strcmp(r->state ? r->state : "", journal_module_state_name(s)))
        s++;
    c->n[s]++;
    return 0;
}

static int event_add(void *user, const journal_event_row *r)
{
    return json_array_append_new(user, ctl_event_json(r)) ? 1 : 0;
}

static int update_keep(void *user, const journal_update_row *r)
{
    *(json_t **)user = ctl_update_json(r);
    return 0;
}

static json_t *counts_json(const module_counts *c)
{
    json_t *o = json_object();
    for (size_t s = 0; s < JOURNAL_MODULE_STATE_COUNT; s++)
        json_object_set_new(o, journal_module_state_name(s),
                            json_integer((json_int_t)c->n[s]));
    return o;
}

static int show_json(journal *j, const ctl_opts *o, json_t *u,
                     const module_counts *c)
{
    json_t *root = json_object(), *ev = json_array();
    json_object_set_new(root, "update", u);
    json_object_set_new(root, "modules", counts_json(c));
    json_object_set_new(root, "events", ev);
    if (journal_events_list(j, o->id, 0, event_add, ev) != REFIT_OK) {
        json_decref(root);
        return ctl_journal_fail(j);
    }
    return ctl_json_print(root);
}

static const char *jget(json_t *u, const char *key)
{
    const char *s = json_string_value(json_object_get(u, key));
    return s ? s : "-";
}

static void show_fields(json_t *u)
{
    static const char *const keys[] = {
        "worker", "version", "mode", "source_uri", "source_digest",
        "started_at", "ended_at", "host", "error"};
    printf("update %lld: %s", (long long)json_integer_value(
           json_object_get(u, "id")), jget(u, "state"));
    if (strcmp(jget(u, "state"), jget(u, "state_recorded")))
        printf(" (recorded %s; its writer no longer runs)",
               jget(u, "state_recorded"));
    printf("\n");
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        printf("  %-14s ", keys[i]);
        ctl_wrap(stdout, jget(u, keys[i]), 17);
    }
    json_t *r = json_object_get(u, "replay_of");
    if (json_is_integer(r))
        printf("  %-14s %lld\n", "replay_of",
               (long long)json_integer_value(r));
    printf("  %-14s %s\n", "rollback",
           json_is_true(json_object_get(u, "rollback")) ? "on" : "off");
    json_t *ud = json_object_get(u, "undo_device_bytes");
    json_t *uh = json_object_get(u, "undo_host_bytes");
    if (json_is_integer(ud) && json_is_integer(uh))
        printf("  %-14s device %lld bytes, host %lld bytes\n", "undo log",
               (long long)json_integer_value(ud), (long long)json_integer_value(uh));
    else
        printf("  %-14s not recorded\n", "undo log");
    json_t *us = json_object_get(u, "undo_source");
    printf("  %-14s ", "undo source");
    ctl_wrap(stdout, json_is_string(us) ? json_string_value(us) : "not recorded", 17);
    printf("  %-14s %lld\n  %-14s %lld\n  %-14s %lld\n", "tensors",
           (long long)json_integer_value(json_object_get(u, "tensors")),
           "bytes", (long long)json_integer_value(json_object_get(u, "bytes")),
           "pid", (long long)json_integer_value(json_object_get(u, "pid")));
}

static int show_text(journal *j, const ctl_opts *o, json_t *u,
                     const module_counts *c)
{
    show_fields(u);
    printf("  %-14s %lld:", "modules",
           (long long)json_integer_value(json_object_get(u, "modules")));
    for (size_t s = 0; s < JOURNAL_MODULE_STATE_COUNT; s++)
        if (c->n[s])
            printf(" %zu %s", c->n[s], journal_module_state_name(s));
    printf("\n\nevents:\n%6s %-19s %6s %-12s %-12s %s\n", "ID", "AT",
           "UPDATE", "WORKER", "KIND", "MESSAGE");
    json_decref(u);
    return journal_events_list(j, o->id, 0, ctl_event_print, NULL)
               ? ctl_journal_fail(j) : 0;
}

int ctl_journal_show(journal *j, const ctl_opts *o)
{
    json_t *u = NULL;
    module_counts c = {{0}};
    if (journal_update_get(j, o->id, update_keep, &u) != REFIT_OK ||
        journal_modules_list(j, o->id, 0, count_module, &c) != REFIT_OK) {
        json_decref(u);
        return ctl_journal_fail(j);
    }
    if (!u) {
        cli_error(1, "out of memory");
        return 1;
    }
    return o->json ? show_json(j, o, u, &c) : show_text(j, o, u, &c);
}

/* ---- verify ------------------------------------------------------------- */

static int problem_add(void *user, const char *problem)
{
    json_array_append_new(user, json_string(problem));
    return 0;
}

static int problem_print(void *user, const char *problem)
{
    (void)user;
    printf("problem: ");
    ctl_wrap(stdout, problem, 9);
    return 0;
}

int ctl_journal_verify(journal *j, const ctl_opts *o)
{
    size_t n = 0;
    json_t *a = o->json ? json_array() : NULL;
    if (journal_verify(j, o->json ? problem_add : problem_print, a, &n)) {
        json_decref(a);
        return ctl_journal_fail(j);
    }
    if (o->json) {
        json_t *root = json_object();
        json_object_set_new(root, "path", json_string(journal_path(j)));
        json_object_set_new(root, "ok", json_boolean(n == 0));
        json_object_set_new(root, "problems", a);
        return ctl_json_print(root) ? 1 : (n ? 1 : 0);
    }
    if (n)
        printf("%s: %zu problem%s\n", journal_path(j), n, n == 1 ? "" : "s");
    else
        printf("%s: ok\n", journal_path(j));
    return n ? 1 : 0;
}
