/*
 * refitctl validate: check format declarations and model manifests with
 * the validator the library itself runs, and print every mistake as
 * file:line:column: message (on stderr, one per line, like a compiler).
 *
 *   refitctl validate [--format | --model] FILE...
 *
 * The kind comes from the file's `kind:` key, else from its content
 * (`modules:` is a manifest, `checkpoint:`/`abi:` a declaration), unless
 * --format or --model says. Exit status: 0 all valid, 1 any mistake or an
 * unreadable file, 2 usage.
 */
#include <stdio.h>
#include <string.h>

#include "schemas/validate.h"
#include "tools/refitctl.h"

static int ctl_validate_usage(void)
{
    fprintf(stderr, "usage: refitctl validate [--format | --model] FILE...\n");
    return 2;
}

static int validate_one(const char *path, schema_kind kind)
{
    sdiags d = {.max = 200};
    schema_kind found = SCHEMA_KIND_UNKNOWN;
    int rc = schema_validate_file(path, kind, &found, &d);
    for (size_t i = 0; i < d.n; i++)
        fprintf(stderr, "%s\n", d.lines[i]);
    if (d.dropped)
        fprintf(stderr, "%s: %zu more error(s) not shown\n", path, d.dropped);
    if (rc == REFIT_OK)
        printf("%s: valid %s\n", path, schema_kind_name(found));
    else if (rc == REFIT_ENOMEM)
        fprintf(stderr, "%s: out of memory\n", path);
    else if (rc == REFIT_EINTERNAL)
        fprintf(stderr, "%s: the built-in schema is broken (a refit bug)\n", path);
    sdiags_free(&d);
    return rc == REFIT_OK ? 0 : 1;
}

int ctl_validate(int argc, char **argv)
{
    schema_kind kind = SCHEMA_KIND_UNKNOWN;
    int i = 1, bad = 0;
    for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
        if (!strcmp(argv[i], "--format"))
            kind = SCHEMA_KIND_FORMAT;
        else if (!strcmp(argv[i], "--model"))
            kind = SCHEMA_KIND_MODEL;
        else if (!strcmp(argv[i], "--")) {
            i++;
            break;
        } else
            return ctl_validate_usage();
    }
    if (i >= argc)
        return ctl_validate_usage();
    for (; i < argc; i++)
        bad |= validate_one(argv[i], kind);
    return bad;
}
