/*
 * The command-line conventions every refit tool follows, in one place:
 * getopt_long parsing (options before or after positionals, "--" ends
 * them, --name=VALUE or --name VALUE), --help (usage with each option
 * explained, on stdout, exit 0), errors as one line on stderr or, under
 * --json, as one JSON object on stdout, and progress on stderr only when
 * it is a terminal.
 *
 * Exit status everywhere: 0 ok, 1 an error or a refused check, 2 usage.
 */
#ifndef REFIT_TOOLS_CLI_H
#define REFIT_TOOLS_CLI_H

#include <stdio.h>

#include <jansson.h>

#define CLI_HELP (-1) /* cli_parse printed the usage: exit 0 */

/* One option: --name, or --name ARG when arg is set. key is what the
 * option callback receives (distinct per table, > 255 or a letter). */
typedef struct cli_opt {
    const char *name;
    int key;
    const char *arg;  /* NULL: a flag; else the value's name in the usage */
    const char *help; /* one line; "\n" starts a continuation line */
} cli_opt;

typedef struct cli {
    const char *prog;      /* "refitctl safetensors": prefixes every message */
    const char *synopsis;  /* usage lines, '\n'-separated, after the program */
    const char *about;     /* paragraph after the usage lines, or NULL */
    const cli_opt *opts;   /* ended by {NULL}; --help is added */
} cli;

/* Called for each option, in command-line order; returns 0, or an exit
 * status (2: the value is bad, after cli_usage_error). */
typedef int (*cli_opt_fn)(void *user, int key, const char *value);

/* Parses argv[1..] (argv[0] names the command). On 0, argv is permuted so
 * that argv[*first..argc-1] are the positionals in order. CLI_HELP after
 * printing the usage on stdout; 2 after a usage error; or what on_opt
 * returned. Sets the error mode (JSON when --json is present). */
int cli_parse(const cli *c, int argc, char **argv, cli_opt_fn on_opt, void *user, int *first);

void cli_usage(const cli *c, FILE *f);
/* A usage error: the message and the usage lines; returns 2. */
int cli_usage_error(const cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error of the last parsed command: "PROG: message" on stderr, or under
 * --json {"error": message, "command": PROG, "status": status} on stdout.
 * Returns status. */
int cli_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when the last parsed command had --json. */
int cli_json_mode(void);

/* Prints root on stdout (indented, keys in insertion order) and releases
 * it; a NULL root is an out-of-memory error. Returns 0 or 1. */
int cli_json_print(json_t *root);

/* A progress line on stderr, rewritten in place, when stderr is a
 * terminal; nothing otherwise. cli_progress_end clears it. */
void cli_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_end(void);

#endif
