/* refitctl fleet: the table and the JSON object (ctl_fleet.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "ctl_fleet.h"
#include "ctl_journal_int.h"

/* Seconds since the epoch of the journal's ISO 8601 UTC text; -1 when it
 * is not that. */
static int64_t iso_seconds(const char *iso)
{
    struct tm tm = {0};
    if (!iso || sscanf(iso, "%4d-%2d-%2dT%2d:%2d:%2d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                       &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm);
}

int64_t fleet_age(const fleet *f, const fleet_worker *w)
{
    const char *at = w->last_ended ? w->last_ended
                     : w->last_started ? w->last_started : w->heartbeat;
    int64_t t = iso_seconds(at);
    if (t < 0)
        return -1;
    return (int64_t)f->now > t ? (int64_t)f->now - t : 0;
}

/* "42s", "17m", "5h", "3d"; "-" when unknown. */
static const char *age_text(int64_t s, char *buf, size_t len)
{
    if (s < 0)
        return "-";
    if (s < 60)
        snprintf(buf, len, "%" PRId64 "s", s);
    else if (s < 3600)
        snprintf(buf, len, "%" PRId64 "m", s / 60);
    else if (s < 86400)
        snprintf(buf, len, "%" PRId64 "h", s / 3600);
    else
        snprintf(buf, len, "%" PRId64 "d", s / 86400);
    return buf;
}

/* "v2 on 2 workers, v1 on 1": the versions of the group of worker i. */
static void group_versions(const fleet *f, size_t i, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < f->n && at < len; k++) {
        const fleet_worker *w = &f->w[k];
        if (strcmp(w->group, f->w[i].group) || !w->version)
            continue;
        size_t seen = 0, count = 0;
        for (size_t m = 0; m < f->n; m++) {
            const fleet_worker *o = &f->w[m];
            if (strcmp(o->group, w->group) || !o->version || strcmp(o->version, w->version))
                continue;
            seen += m < k;
            count++;
        }
        if (!seen)
            at += (size_t)snprintf(buf + at, len - at, "%s%s on %zu worker%s", at ? ", " : "",
                                   w->version, count, count == 1 ? "" : "s");
    }
}

#define ROW "%-5s %-14s %-12s %-12s %4s %-12s %-9s %-17s %s\n"

static void print_worker(const fleet *f, const fleet_worker *w)
{
    char g[16], h[16], id[16], v[16], rank[24], last[64], l[18], age[24], health[16];
    snprintf(rank, sizeof rank, "%" PRId64, w->rank);
    if (w->last_update)
        snprintf(last, sizeof last, "%" PRId64 " %s", w->last_update,
                 w->last_state ? w->last_state : "?");
    else
        snprintf(last, sizeof last, "-");
    snprintf(health, sizeof health, "%s", w->health ? w->health : "-");
    if (fleet_poisoned(w))
        snprintf(health, sizeof health, "POISONED");
    printf(ROW, w->mixed ? "MIXED" : "", ctl_fit(w->group, 14, 1, g), ctl_fit(w->host, 12, 0, h),
           ctl_fit(w->id, 12, 0, id), rank, ctl_fit(w->version, 12, 0, v), health,
           ctl_fit(last, 17, 0, l), age_text(fleet_age(f, w), age, sizeof age));
}

int fleet_print_table(const fleet *f)
{
    char versions[1024];
    for (size_t i = 0; i < f->n; i++) {
        size_t first = 0;
        while (strcmp(f->w[first].group, f->w[i].group))
            first++;
        if (first != i || !f->w[i].mixed)
            continue;
        group_versions(f, i, versions, sizeof versions);
        printf("MIXED group %s: ", f->w[i].group);
        ctl_wrap(stdout, versions, 0);
    }
    for (size_t i = 0; i < f->n; i++)
        if (fleet_poisoned(&f->w[i]))
            printf("POISONED worker %s (rank %" PRId64 ", host %s) in %s: update %" PRId64
                   " %s\n", f->w[i].id, f->w[i].rank, f->w[i].host ? f->w[i].host : "-",
                   f->w[i].journal, f->w[i].last_update,
                   f->w[i].last_state ? f->w[i].last_state : "-");
    printf(ROW, "FLAG", "GROUP", "HOST", "WORKER", "RANK", "VERSION", "HEALTH", "LAST UPDATE",
           "AGE");
    for (size_t i = 0; i < f->n; i++)
        print_worker(f, &f->w[i]);
    printf("%zu worker%s in %zu group%s (%zu journal%s): %zu POISONED, %zu group%s mixed\n",
           f->n, f->n == 1 ? "" : "s", f->n_groups, f->n_groups == 1 ? "" : "s",
           f->n_journals, f->n_journals == 1 ? "" : "s", f->n_poisoned, f->n_mixed_groups,
           f->n_mixed_groups == 1 ? "" : "s");
    for (size_t i = 0; i < f->n_err; i++)
        fprintf(stderr, "refitctl fleet: %s\n", f->err[i].message);
    return fflush(stdout) ? 1 : 0;
}

static json_t *worker_json(const fleet *f, const fleet_worker *w)
{
    json_t *o = json_object(), *last = json_null();
    json_object_set_new(o, "group", json_string(w->group));
    json_object_set_new(o, "journal", json_string(w->journal));
    json_object_set_new(o, "host", ctl_jstr(w->host));
    json_object_set_new(o, "worker", ctl_jstr(w->id));
    json_object_set_new(o, "rank", json_integer(w->rank));
    json_object_set_new(o, "version", ctl_jstr(w->version));
    json_object_set_new(o, "health", ctl_jstr(w->health));
    json_object_set_new(o, "poisoned", json_boolean(fleet_poisoned(w)));
    json_object_set_new(o, "mixed", json_boolean(w->mixed));
    json_object_set_new(o, "alive", json_boolean(w->alive));
    json_object_set_new(o, "pid", json_integer(w->pid));
    json_object_set_new(o, "heartbeat", ctl_jstr(w->heartbeat));
    if (w->last_update)
        last = json_pack("{s:I, s:o, s:o, s:o, s:o}", "id", (json_int_t)w->last_update,
                         "state", ctl_jstr(w->last_state), "started_at",
                         ctl_jstr(w->last_started), "ended_at", ctl_jstr(w->last_ended),
                         "error", ctl_jstr(w->last_error));
    json_object_set_new(o, "last_update", last);
    int64_t age = fleet_age(f, w);
    json_object_set_new(o, "age_s", age < 0 ? json_null() : json_integer(age));
    return o;
}

/* {"group": KEY, "mixed": B, "workers": N, "versions": {V: N, ...}} per group. */
static json_t *groups_json(const fleet *f)
{
    json_t *a = json_array();
    for (size_t i = 0; i < f->n; i++) {
        size_t first = 0, n = 0;
        while (strcmp(f->w[first].group, f->w[i].group))
            first++;
        if (first != i)
            continue;
        json_t *versions = json_object();
        for (size_t k = 0; k < f->n; k++) {
            if (strcmp(f->w[k].group, f->w[i].group))
                continue;
            n++;
            if (!f->w[k].version)
                continue;
            json_t *c = json_object_get(versions, f->w[k].version);
            json_object_set_new(versions, f->w[k].version,
                                json_integer(c ? json_integer_value(c) + 1 : 1));
        }
        json_array_append_new(a, json_pack("{s:s, s:b, s:I, s:o}", "group", f->w[i].group,
                                           "mixed", f->w[i].mixed, "workers", (json_int_t)n,
                                           "versions", versions));
    }
    return a;
}

int fleet_print_json(const fleet *f, int status)
{
    json_t *root = json_object(), *workers = json_array(), *errors = json_array();
    for (size_t i = 0; i < f->n; i++)
        json_array_append_new(workers, worker_json(f, &f->w[i]));
    for (size_t i = 0; i < f->n_err; i++)
        json_array_append_new(errors, json_pack("{s:s, s:s}", "path", f->err[i].path,
                                                "error", f->err[i].message));
    json_object_set_new(root, "ok", json_boolean(!status));
    json_object_set_new(root, "journals", json_integer((json_int_t)f->n_journals));
    json_object_set_new(root, "poisoned", json_integer((json_int_t)f->n_poisoned));
    json_object_set_new(root, "mixed_groups", json_integer((json_int_t)f->n_mixed_groups));
    json_object_set_new(root, "groups", groups_json(f));
    json_object_set_new(root, "workers", workers);
    json_object_set_new(root, "errors", errors);
    if (f->n_err) { /* the tools' JSON error shape (tools/cli.h), beside the rest */
        json_object_set_new(root, "error", json_string(f->err[0].message));
        json_object_set_new(root, "command", json_string("refitctl fleet"));
        json_object_set_new(root, "status", json_integer(status));
    }
    return cli_json_print(root);
}
