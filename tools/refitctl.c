/* refitctl: inspect and operate refit journals, checkpoints, formats and
 * manifests. */
#include <stdio.h>
#include <string.h>

#include <refit/refit.h>

#include "refitctl.h"

struct ctl_area {
    const char *name;
    ctl_main_fn fn;
    const char *help;
};

static const struct ctl_area areas[] = {
    {"journal", ctl_journal, "status|updates|show ID|modules ID|events|verify"},
    {"safetensors", ctl_safetensors, "ls PATH [--json] | verify PATH"},
    {"formats", ctl_formats, "[--plugin-dir DIR]... [--only] [--json]"},
    {"validate", ctl_validate, "[--format|--model] FILE..."},
    {"manifest", ctl_manifest, "llama CONFIG.json [--tp N] [--pad-unit U]"},
    {"convert", ctl_convert, "--format NAME [--param KEY=VALUE]... IN OUT"},
    {NULL, NULL, NULL},
};

static int usage(FILE *f)
{
    fprintf(f, "usage: refitctl AREA COMMAND [ARGS]\n\nareas:\n");
    for (const struct ctl_area *a = areas; a->name; a++)
        fprintf(f, "  %-12s %s\n", a->name, a->help);
    fprintf(f, "  %-12s %s\n", "version", "print the library version");
    return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))
        return usage(stdout);
    if (!strcmp(argv[1], "version")) {
        printf("refit %d.%d.%d\n", REFIT_VERSION_MAJOR, REFIT_VERSION_MINOR,
               REFIT_VERSION_PATCH);
        return 0;
    }
    for (const struct ctl_area *a = areas; a->name; a++)
        if (!strcmp(argv[1], a->name))
            return a->fn(argc - 1, argv + 1);
    fprintf(stderr, "refitctl: unknown area '%s'\n", argv[1]);
    return usage(stderr);
}
