/* refitctl: inspect and operate refit journals, checkpoints, formats and
 * manifests. The area is the first argument that is not an option; each
 * area parses the rest (tools/cli.h: options anywhere, --help, --json). */
#include <stdio.h>
#include <string.h>

#include <refit/refit.h>

#include "tools/cli.h"
#include "tools/refitctl.h"

struct ctl_area {
    const char *name;
    ctl_main_fn fn;
    const char *help;
};

static const struct ctl_area areas[] = {
    {"journal", ctl_journal, "status|updates|show ID|modules ID|events|verify"},
    {"fleet", ctl_fleet, "JOURNAL...|DIR: every worker of many journals, mixed versions"},
    {"safetensors", ctl_safetensors, "ls|verify PATH"},
    {"snapshot", ctl_snapshot, "show|verify PATH: a worker's snapshot"},
    {"formats", ctl_formats, "the format plugins found, loaded and refused"},
    {"validate", ctl_validate, "FILE...: format declarations and model manifests"},
    {"manifest", ctl_manifest, "llama CONFIG.json: a model manifest from a config"},
    {"convert", ctl_convert, "IN OUT: quantize a checkpoint offline"},
    {"metrics", ctl_metrics, "--db JOURNAL...: Prometheus metrics of the journals' workers"},
    {"version", ctl_version, "the library version"},
    {NULL, NULL, NULL},
};

static int usage(FILE *f)
{
    fprintf(f, "usage: refitctl AREA [COMMAND] [OPTIONS] [ARGS]\n"
               "       refitctl AREA --help\n\nareas:\n");
    for (const struct ctl_area *a = areas; a->name; a++)
        fprintf(f, "  %-12s %s\n", a->name, a->help);
    fprintf(f, "\noptions:\n  -h, --help  print this help and exit\n");
    fprintf(f, "\nEvery area takes --help; those that read take --json (errors too).\n"
               "Exit status: 0 ok, 1 error or problems found, 2 usage.\n");
    return f == stderr ? 2 : 0;
}

static int version_opt(void *user, int key, const char *value)
{
    (void)key, (void)value;
    *(int *)user = 1; /* --json, the one option */
    return 0;
}

int ctl_version(int argc, char **argv)
{
    static const cli_opt opts[] = {{"json", 'j', NULL, "print {\"version\": \"X.Y.Z\"}"}, {NULL, 0, NULL, NULL}};
    static const cli c = {"refitctl version", "[--json]", "Prints the library version.", opts};
    int json = 0, first;
    int rc = cli_parse(&c, argc, argv, version_opt, &json, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (first < argc)
        return cli_usage_error(&c, "unexpected '%s'", argv[first]);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", REFIT_VERSION_MAJOR, REFIT_VERSION_MINOR,
             REFIT_VERSION_PATCH);
    if (json)
        return cli_json_print(json_pack("{s:s}", "version", v));
    printf("refit %s\n", v);
    return 0;
}

int main(int argc, char **argv)
{
    int at = 1;
    while (at < argc && argv[at][0] == '-' && strcmp(argv[at], "--")) {
        if (!strcmp(argv[at], "-h") || !strcmp(argv[at], "--help"))
            return usage(stdout);
        at++;
    }
    if (at >= argc)
        return usage(stderr);
    if (!strcmp(argv[at], "help"))
        return usage(stdout);
    for (const struct ctl_area *a = areas; a->name; a++) {
        if (strcmp(argv[at], a->name))
            continue;
        /* the area's argv: its name first, then every other argument in order */
        char *name = argv[at];
        memmove(argv + 2, argv + 1, (size_t)(at - 1) * sizeof *argv);
        argv[1] = name;
        return a->fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "refitctl: unknown area '%s'\n", argv[at]);
    return usage(stderr);
}
