/* The tools' command-line conventions (tools/cli.h). */
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

#define CLI_MAX_OPTS 40
#define CLI_KEY_HELP 'h'

/* The error mode of the command being run: one per process, set by the
 * last cli_parse (a tool parses once; in-process tests parse again). */
static struct {
    const char *prog;
    int json;
    int progress_shown;
} cli_state = {"refit", 0, 0};

static void cli_lines(FILE *f, const char *text, const char *first, const char *rest)
{
    const char *p = text;
    for (int i = 0; *p; i++) {
        size_t n = strcspn(p, "\n");
        fprintf(f, "%s%.*s\n", i ? rest : first, (int)n, p);
        p += n + (p[n] == '\n');
    }
}

void cli_usage(const cli *c, FILE *f)
{
    const char *p = c->synopsis;
    for (int i = 0; *p; i++) {
        size_t n = strcspn(p, "\n");
        if (*p == ' ') /* a continuation of the line before */
            fprintf(f, "       %*s%.*s\n", (int)strlen(c->prog), "", (int)n, p);
        else
            fprintf(f, "%s%s %.*s\n", i ? "       " : "usage: ", c->prog, (int)n, p);
        p += n + (p[n] == '\n');
    }
    if (c->about) {
        fputc('\n', f);
        cli_lines(f, c->about, "", "");
    }
    fprintf(f, "\noptions:\n");
    for (const cli_opt *o = c->opts; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-22s ", left);
        cli_lines(f, o->help, "", "                         ");
    }
    fprintf(f, "  %-22s %s\n", "-h, --help", "print this help and exit");
}

int cli_usage_error(const cli *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (cli_state.json)
        return cli_error(2, "%s (see %s --help)", msg, c->prog);
    fprintf(stderr, "%s: %s\n", c->prog, msg);
    cli_usage(c, stderr);
    return 2;
}

int cli_parse(const cli *c, int argc, char **argv, cli_opt_fn on_opt, void *user, int *first)
{
    struct option lo[CLI_MAX_OPTS + 2];
    int n = 0;
    cli_state.prog = c->prog;
    cli_state.json = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        cli_state.json |= !strcmp(argv[i], "--json");
    for (const cli_opt *o = c->opts; o && o->name && n < CLI_MAX_OPTS; o++)
        lo[n++] = (struct option){o->name, o->arg ? required_argument : no_argument, NULL, o->key};
    lo[n++] = (struct option){"help", no_argument, NULL, CLI_KEY_HELP};
    lo[n] = (struct option){NULL, 0, NULL, 0};
    optind = 0; /* glibc: a full restart, for a second parse in one process */
    opterr = 0;
    for (;;) {
        int k = getopt_long(argc, argv, ":h", lo, NULL);
        if (k == -1)
            break;
        const char *arg = optind > 1 && optind - 1 < argc ? argv[optind - 1] : "?";
        if (k == CLI_KEY_HELP) {
            cli_usage(c, stdout);
            return CLI_HELP;
        }
        if (k == '?')
            return cli_usage_error(c, "unknown option '%s'",
                                   optopt ? (char[]){'-', (char)optopt, 0} : arg);
        if (k == ':')
            return cli_usage_error(c, "option '%s' needs a value", arg);
        int rc = on_opt ? on_opt(user, k, optarg) : 2;
        if (rc)
            return rc;
    }
    *first = optind;
    return 0;
}

int cli_json_mode(void)
{
    return cli_state.json;
}

int cli_error(int status, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_progress_end();
    if (!cli_state.json) {
        fprintf(stderr, "%s: %s\n", cli_state.prog, msg);
        return status;
    }
    json_t *e = json_pack("{s:s, s:s, s:i}", "error", msg, "command", cli_state.prog, "status",
                          status);
    if (cli_json_print(e))
        fprintf(stderr, "%s: %s\n", cli_state.prog, msg);
    return status;
}

int cli_json_print(json_t *root)
{
    int bad = !root || json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) ||
              fputc('\n', stdout) == EOF || fflush(stdout);
    json_decref(root);
    if (bad)
        fprintf(stderr, "%s: cannot write JSON (out of memory?)\n", cli_state.prog);
    return bad;
}

void cli_progress(const char *fmt, ...)
{
    if (!isatty(STDERR_FILENO))
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r%s: ", cli_state.prog);
    vfprintf(stderr, fmt, ap);
    fputs("\033[K", stderr);
    va_end(ap);
    fflush(stderr);
    cli_state.progress_shown = 1;
}

void cli_progress_end(void)
{
    if (cli_state.progress_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        cli_state.progress_shown = 0;
    }
}
