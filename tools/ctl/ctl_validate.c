/*
 * refitctl validate: check format declarations and model manifests with
 * the validator the library itself runs, and print every mistake as
 * file:line:column: message (on stderr, one per line, like a compiler).
 *
 *   refitctl validate [--format | --model] [--json] FILE...
 *
 * The kind comes from the file's `kind:` key, else from its content
 * (`modules:` is a manifest, `checkpoint:`/`abi:` a declaration), unless
 * --format or --model says. --json: one object, each file with its kind
 * and mistakes. Exit status: 0 all valid, 1 any mistake or an unreadable
 * file, 2 usage.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "schemas/validate.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

static const cli_opt ctl_validate_opts[] = {
    {"format", 'f', NULL, "every FILE is a format declaration"},
    {"model", 'm', NULL, "every FILE is a model manifest"},
    {"json", 'j', NULL, "one JSON object: each file, valid or not, its kind and mistakes"},
    {NULL, 0, NULL, NULL},
};

static const cli ctl_validate_cli = {
    "refitctl validate", "[--format | --model] [--json] FILE...",
    "Checks each FILE with the validator the library runs and prints every\n"
    "mistake as file:line:column: message on stderr. The kind comes from the\n"
    "file's `kind:` key, else its content, unless --format or --model says.\n"
    "Exit status: 0 all valid, 1 any mistake or an unreadable file, 2 usage.",
    ctl_validate_opts,
};

typedef struct validate_args {
    schema_kind kind;
    int json;
} validate_args;

static const char *validate_why(int rc)
{
    return rc == REFIT_ENOMEM     ? "out of memory"
           : rc == REFIT_EINTERNAL ? "the built-in schema is broken (a refit bug)"
                                   : NULL;
}

static int validate_one(const char *path, schema_kind kind, json_t *out)
{
    sdiags d = {.max = 200};
    schema_kind found = SCHEMA_KIND_UNKNOWN;
    int rc = schema_validate_file(path, kind, &found, &d);
    const char *why = validate_why(rc);
    if (out) {
        json_t *errs = json_array();
        for (size_t i = 0; i < d.n; i++)
            json_array_append_new(errs, json_string(d.lines[i]));
        json_array_append_new(out, json_pack("{s:s, s:b, s:s, s:o, s:I, s:s?}", "path", path,
                                             "valid", rc == REFIT_OK, "kind",
                                             schema_kind_name(found), "errors", errs,
                                             "errors_not_shown", (json_int_t)d.dropped,
                                             "failure", why));
    } else {
        for (size_t i = 0; i < d.n; i++)
            fprintf(stderr, "%s\n", d.lines[i]);
        if (d.dropped)
            fprintf(stderr, "%s: %zu more error(s) not shown\n", path, d.dropped);
        if (rc == REFIT_OK)
            printf("%s: valid %s\n", path, schema_kind_name(found));
        else if (why)
            fprintf(stderr, "%s: %s\n", path, why);
    }
    sdiags_free(&d);
    return rc == REFIT_OK ? 0 : 1;
}

static int validate_opt(void *user, int key, const char *value)
{
    validate_args *a = user;
    (void)value;
    if (key == 'j')
        a->json = 1;
    else if (a->kind != SCHEMA_KIND_UNKNOWN)
        return cli_usage_error(&ctl_validate_cli, "--format and --model: one of them");
    else
        a->kind = key == 'f' ? SCHEMA_KIND_FORMAT : SCHEMA_KIND_MODEL;
    return 0;
}

int ctl_validate(int argc, char **argv)
{
    validate_args a = {SCHEMA_KIND_UNKNOWN, 0};
    int first, bad = 0;
    int rc = cli_parse(&ctl_validate_cli, argc, argv, validate_opt, &a, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (first >= argc)
        return cli_usage_error(&ctl_validate_cli, "no FILE");
    json_t *files = a.json ? json_array() : NULL;
    for (int i = first; i < argc; i++)
        bad |= validate_one(argv[i], a.kind, files);
    if (a.json && cli_json_print(json_pack("{s:b, s:o}", "valid", !bad, "files", files)))
        return 1;
    return bad;
}
