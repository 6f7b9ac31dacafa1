/* refitctl journal: shared between the argument parser (ctl_journal.c) and
 * the commands (ctl_journal_cmd.c, ctl_journal_text.c). */
#ifndef REFIT_TOOLS_CTL_JOURNAL_INT_H
#define REFIT_TOOLS_CTL_JOURNAL_INT_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "journal/journal.h"
#include "tools/cli.h"

typedef struct ctl_opts {
    const char *cmd;
    const char *db;
    int json;
    int incomplete;
    int64_t id;      /* show/modules: the update */
    int64_t update;  /* events --update */
    int64_t limit;   /* events --limit */
} ctl_opts;

/* Each returns the exit status: 0 ok, 1 error or problems. */
int ctl_journal_status(journal *j, const ctl_opts *o);
int ctl_journal_updates(journal *j, const ctl_opts *o);
int ctl_journal_show(journal *j, const ctl_opts *o);
int ctl_journal_modules(journal *j, const ctl_opts *o);
int ctl_journal_events(journal *j, const ctl_opts *o);
int ctl_journal_verify(journal *j, const ctl_opts *o);

/* Rows as JSON objects / table lines, shared by the commands. */
json_t *ctl_update_json(const journal_update_row *r);
json_t *ctl_event_json(const journal_event_row *r);
/* Prints one events table line (a journal_event_fn; user unused). */
int ctl_event_print(void *user, const journal_event_row *r);

/* ---- output helpers (ctl_journal_text.c) ---- */

/* Human output fits this many columns. */
#define CTL_COLUMNS 100

/* s cut to width columns: the end kept (left_cut) or the start, ".." where
 * it was cut; "-" for NULL. buf holds at least width + 1 bytes. */
const char *ctl_fit(const char *s, int width, int left_cut, char *buf);
/* "123", "4.5K", "1.2G" ...: len >= 16. */
const char *ctl_bytes(uint64_t v, char *buf, size_t len);
/* "2024-05-01 12:00:00" from the stored ISO text; "-" for NULL. */
const char *ctl_time(const char *iso, char *buf, size_t len);
/* Print text from column `col` on, wrapped to CTL_COLUMNS, continuation
 * lines indented to col; then a newline. */
void ctl_wrap(FILE *f, const char *text, int col);
/* JSON string or null. */
json_t *ctl_jstr(const char *s);
/* Print a JSON object and free it; 1 (error) when it could not. */
int ctl_json_print(json_t *root);
/* The journal's error on stderr; returns 1. */
int ctl_journal_fail(journal *j);

#endif
