/* refitctl fleet: the workers of many journals, shared between the reader
 * (ctl_fleet.c) and the output (ctl_fleet_out.c). */
#ifndef REFIT_TOOLS_CTL_FLEET_H
#define REFIT_TOOLS_CTL_FLEET_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* One worker row of one journal, with its latest update; strings owned
 * (malloc'ed), NULL where the journal has none. */
typedef struct fleet_worker {
    char *journal, *group;             /* the file it was read from; its group key */
    char *id, *host, *version, *health, *heartbeat;
    int64_t rank, pid;
    int alive;                         /* its process runs (judged on this host) */
    int64_t last_update;               /* 0: none */
    char *last_state, *last_started, *last_ended, *last_error;
    int mixed;                         /* its group holds more than one version */
} fleet_worker;

/* A journal that could not be read, and why. */
typedef struct fleet_error {
    char *path, *message;
} fleet_error;

typedef struct fleet {
    fleet_worker *w;
    size_t n, cap;
    fleet_error *err;
    size_t n_err, cap_err;
    size_t n_journals, n_groups, n_mixed_groups, n_poisoned;
    time_t now;                        /* ages are counted to this */
} fleet;

/* 1 when the worker's health is poisoned. */
int fleet_poisoned(const fleet_worker *w);
/* Seconds since the worker's last update ended (started, while open; the
 * heartbeat when it has none); -1 when unknown. */
int64_t fleet_age(const fleet *f, const fleet_worker *w);

/* Print the table (problems first, then one line a worker, a summary) or
 * one JSON object. Return 0, or 1 when the JSON could not be written. */
int fleet_print_table(const fleet *f);
int fleet_print_json(const fleet *f, int status);

#endif
