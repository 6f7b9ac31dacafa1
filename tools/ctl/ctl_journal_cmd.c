/* refitctl journal: the commands. Each reads through the journal's read
 * API and prints either an aligned table (at most CTL_COLUMNS wide) or one
 * JSON object. */
#include <stdio.h>
#include <string.h>

#include "ctl_journal_int.h"

/* ---- status ------------------------------------------------------------- */

static json_t *worker_json(const journal_worker_row *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", ctl_jstr(r->id));
    json_object_set_new(o, "rank", json_integer(r->rank));
    json_object_set_new(o, "health", ctl_jstr(r->health));
    json_object_set_new(o, "health_recorded", ctl_jstr(r->health_recorded));
    json_object_set_new(o, "version", ctl_jstr(r->version));
    json_object_set_new(o, "heartbeat", ctl_jstr(r->heartbeat));
    json_object_set_new(o, "pid", json_integer(r->pid));
    json_object_set_new(o, "host", ctl_jstr(r->host));
    json_object_set_new(o, "alive", json_boolean(r->alive));
    json_object_set_new(o, "last_update", r->last_update
                        ? json_integer(r->last_update) : json_null());
    json_object_set_new(o, "last_update_state",
                        ctl_jstr(r->last_update_state));
    return o;
}

static int worker_add(void *user, const journal_worker_row *r)
{
    return json_array_append_new(user, worker_json(r)) ? 1 : 0;
}

static int worker_print(void *user, const journal_worker_row *r)
{
    char b1[24], b2[24], t[24], last[40];
    (void)user;
    if (r->last_update)
        snprintf(last, sizeof last, "%lld %s", (long long)r->last_update,
                 r->last_update_state ? r->last_update_state : "?");
    else
        snprintf(last, sizeof last, "-");
    printf("%-16s %4lld %-9s %-5s %-16s %-19s %s\n", ctl_fit(r->id, 16, 0, b1),
           (long long)r->rank, r->health ? r->health : "-",
           r->alive ? "yes" : "no", ctl_fit(r->version, 16, 0, b2),
           ctl_time(r->heartbeat, t, sizeof t), last);
    return 0;
}

int ctl_journal_status(journal *j, const ctl_opts *o)
{
    if (o->json) {
        json_t *root = json_object(), *a = json_array();
        json_object_set_new(root, "workers", a);
        if (journal_workers_list(j, worker_add, a) != REFIT_OK) {
            json_decref(root);
            return ctl_journal_fail(j);
        }
        return ctl_json_print(root);
    }
    printf("%-16s %4s %-9s %-5s %-16s %-19s %s\n", "WORKER", "RANK", "HEALTH",
           "ALIVE", "VERSION", "HEARTBEAT", "LAST UPDATE");
    return journal_workers_list(j, worker_print, NULL) ? ctl_journal_fail(j)
                                                       : 0;
}

/* ---- updates ------------------------------------------------------------ */

json_t *ctl_update_json(const journal_update_row *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(r->id));
    json_object_set_new(o, "worker", ctl_jstr(r->worker));
    json_object_set_new(o, "state", ctl_jstr(r->state));
    json_object_set_new(o, "state_recorded", ctl_jstr(r->state_recorded));
    json_object_set_new(o, "version", ctl_jstr(r->version));
    json_object_set_new(o, "mode", ctl_jstr(r->mode));
    json_object_set_new(o, "replay_of", r->replay_of
                        ? json_integer(r->replay_of) : json_null());
    json_object_set_new(o, "rollback", json_boolean(r->rollback));
    json_object_set_new(o, "partial", json_boolean(r->partial));
    json_object_set_new(o, "source_uri", ctl_jstr(r->source_uri));
    json_object_set_new(o, "source_digest", ctl_jstr(r->source_digest));
    json_object_set_new(o, "started_at", ctl_jstr(r->started_at));
    json_object_set_new(o, "ended_at", ctl_jstr(r->ended_at));
    json_object_set_new(o, "tensors", json_integer((json_int_t)r->tensors));
    json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
    json_object_set_new(o, "modules", json_integer(r->n_modules));
    json_object_set_new(o, "undo_device_bytes", r->undo_recorded
                        ? json_integer((json_int_t)r->undo_device_bytes) : json_null());
    json_object_set_new(o, "undo_host_bytes", r->undo_recorded
                        ? json_integer((json_int_t)r->undo_host_bytes) : json_null());
    json_object_set_new(o, "undo_source", ctl_jstr(r->undo_source));
    json_object_set_new(o, "error", ctl_jstr(r->error));
    json_object_set_new(o, "pid", json_integer(r->pid));
    json_object_set_new(o, "host", ctl_jstr(r->host));
    return o;
}

static int update_add(void *user, const journal_update_row *r)
{
    return json_array_append_new(user, ctl_update_json(r)) ? 1 : 0;
}

/* The undo log's placement: "dev 1.2G host 300M", "-" when unknown or
 * nothing was saved; the undo source's kind ("files", "snapshot") when
 * one served the update instead. */
static const char *ctl_undo_text(const journal_update_row *r, char *buf, size_t len)
{
    char d[16], h[16];
    if (r->undo_source && strncmp(r->undo_source, "undo-log", 8) &&
        strcmp(r->undo_source, "none")) {
        snprintf(buf, len, "%.*s", (int)strcspn(r->undo_source, " "), r->undo_source);
        return buf;
    }
    if (!r->undo_recorded || (!r->undo_device_bytes && !r->undo_host_bytes))
        return "-";
    snprintf(buf, len, "dev %s host %s", ctl_bytes(r->undo_device_bytes, d, sizeof d),
             ctl_bytes(r->undo_host_bytes, h, sizeof h));
    return buf;
}

static int update_print(void *user, const journal_update_row *r)
{
    char b1[24], b2[24], t[24], by[16], un[48];
    (void)user;
    printf("%6lld %-14s %-11s %-14s %-6s %-19s %9llu %7s %s\n",
           (long long)r->id, ctl_fit(r->worker, 14, 0, b1), r->state,
           ctl_fit(r->version, 14, 0, b2), r->mode,
           ctl_time(r->started_at, t, sizeof t),
           (unsigned long long)r->tensors, ctl_bytes(r->bytes, by, sizeof by),
           ctl_undo_text(r, un, sizeof un));
    return 0;
}

int ctl_journal_updates(journal *j, const ctl_opts *o)
{
    if (o->json) {
        json_t *root = json_object(), *a = json_array();
        json_object_set_new(root, "updates", a);
        if (journal_updates_list(j, update_add, a) != REFIT_OK) {
            json_decref(root);
            return ctl_journal_fail(j);
        }
        return ctl_json_print(root);
    }
    printf("%6s %-14s %-11s %-14s %-6s %-19s %9s %7s %s\n", "ID", "WORKER",
           "STATE", "VERSION", "MODE", "STARTED", "TENSORS", "BYTES", "UNDO");
    return journal_updates_list(j, update_print, NULL) ? ctl_journal_fail(j)
                                                       : 0;
}

/* ---- modules ------------------------------------------------------------ */

static json_t *module_json(const journal_module_row *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(r->index));
    json_object_set_new(o, "name", ctl_jstr(r->name));
    json_object_set_new(o, "state", ctl_jstr(r->state));
    json_object_set_new(o, "expected_tensors",
                        json_integer((json_int_t)r->expected_tensors));
    json_object_set_new(o, "received_tensors",
                        json_integer((json_int_t)r->received_tensors));
    json_object_set_new(o, "expected_bytes",
                        json_integer((json_int_t)r->expected_bytes));
    json_object_set_new(o, "received_bytes",
                        json_integer((json_int_t)r->received_bytes));
    json_object_set_new(o, "fingerprint", ctl_jstr(r->fingerprint));
    return o;
}

static int module_add(void *user, const journal_module_row *r)
{
    return json_array_append_new(user, module_json(r)) ? 1 : 0;
}

static int module_print(void *user, const journal_module_row *r)
{
    char name[40], t[32], b[40], b1[16], b2[16];
    (void)user;
    snprintf(t, sizeof t, "%llu/%llu",
             (unsigned long long)r->received_tensors,
             (unsigned long long)r->expected_tensors);
    snprintf(b, sizeof b, "%s/%s",
             ctl_bytes(r->received_bytes, b1, sizeof b1),
             ctl_bytes(r->expected_bytes, b2, sizeof b2));
    printf("%6lld %-34s %-11s %11s %15s %s\n", (long long)r->index,
           ctl_fit(r->name, 34, 1, name), r->state ? r->state : "?", t, b,
           r->fingerprint ? r->fingerprint : "-");
    return 0;
}

int ctl_journal_modules(journal *j, const ctl_opts *o)
{
    if (o->json) {
        json_t *root = json_object(), *a = json_array();
        json_object_set_new(root, "update", json_integer(o->id));
        json_object_set_new(root, "modules", a);
        if (journal_modules_list(j, o->id, o->incomplete, module_add, a)) {
            json_decref(root);
            return ctl_journal_fail(j);
        }
        return ctl_json_print(root);
    }
    printf("%6s %-34s %-11s %11s %15s %s\n", "IDX", "MODULE", "STATE",
           "TENSORS", "BYTES", "FINGERPRINT");
    return journal_modules_list(j, o->id, o->incomplete, module_print, NULL)
               ? ctl_journal_fail(j) : 0;
}

/* ---- events ------------------------------------------------------------- */

json_t *ctl_event_json(const journal_event_row *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(r->id));
    json_object_set_new(o, "at", ctl_jstr(r->at));
    json_object_set_new(o, "update", r->update_id
                        ? json_integer(r->update_id) : json_null());
    json_object_set_new(o, "worker", ctl_jstr(r->worker));
    json_object_set_new(o, "kind", ctl_jstr(r->kind));
    json_object_set_new(o, "message", ctl_jstr(r->message));
    return o;
}

static int event_add(void *user, const journal_event_row *r)
{
    return json_array_append_new(user, ctl_event_json(r)) ? 1 : 0;
}

/* Columns before the message: the message wraps from there. */
#define EVENT_MSG_COL 61

int ctl_event_print(void *user, const journal_event_row *r)
{
    char t[24], u[24], w[16], k[16];
    (void)user;
    if (r->update_id)
        snprintf(u, sizeof u, "%lld", (long long)r->update_id);
    else
        snprintf(u, sizeof u, "-");
    printf("%6lld %-19s %6s %-12s %-12s ", (long long)r->id,
           ctl_time(r->at, t, sizeof t), u, ctl_fit(r->worker, 12, 0, w),
           ctl_fit(r->kind, 12, 0, k));
    ctl_wrap(stdout, r->message, EVENT_MSG_COL);
    return 0;
}

int ctl_journal_events(journal *j, const ctl_opts *o)
{
    if (o->json) {
        json_t *root = json_object(), *a = json_array();
        json_object_set_new(root, "events", a);
        if (journal_events_list(j, o->update, o->limit, event_add, a)) {
            json_decref(root);
            return ctl_journal_fail(j);
        }
        return ctl_json_print(root);
    }
    printf("%6s %-19s %6s %-12s %-12s %s\n", "ID", "AT", "UPDATE", "WORKER",
           "KIND", "MESSAGE");
    return journal_events_list(j, o->update, o->limit, ctl_event_print, NULL)
               ? ctl_journal_fail(j) : 0;
}
