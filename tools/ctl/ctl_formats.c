/*
 * refitctl formats: what the plugin loader finds, exactly as refit_open
 * would find it: the directories searched, the formats loaded (name, path,
 * ABI, routes and post-load kernels from the declaration), and every file
 * refused or shadowed, with the reason.
 *
 *   refitctl formats [--plugin-dir DIR]... [--only] [--json]
 *
 * --plugin-dir adds DIR before the usual path (as refit_options.plugin_dirs
 * does); --only searches the named directories alone. Exit status: 0, 1
 * when any plugin was refused, 2 usage.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/plugin_loader.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

static const cli_opt ctl_formats_opts[] = {
    {"plugin-dir", 'd', "DIR", "search DIR first (repeatable; as refit_options.plugin_dirs)"},
    {"only", 'o', NULL, "search the --plugin-dir directories alone"},
    {"json", 'j', NULL, "one JSON object: searched, formats, refused, shadowed"},
    {NULL, 0, NULL, NULL},
};

static const cli ctl_formats_cli = {
    "refitctl formats", "[--plugin-dir DIR]... [--only] [--json]",
    "What the plugin loader finds, as refit_open would: the directories searched,\n"
    "the formats loaded (name, path, ABI, routes, post-load kernels) and every\n"
    "file refused or shadowed, with the reason.\n"
    "Exit status: 0, 1 when any plugin was refused, 2 usage.",
    ctl_formats_opts,
};

static const char *routes_of(const fdecl *d, char *buf, size_t n)
{
    return fdecl_routes_text(d->all_routes, buf, n);
}

static void print_text(const plugin_set *ps)
{
    char routes[64];
    printf("searched:\n");
    for (size_t i = 0; i < ps->n_dirs; i++)
        printf("  %s (%s%s)\n", ps->dirs[i].path, ps->dirs[i].origin,
               ps->dirs[i].missing ? ", missing" : "");
    printf("formats:\n");
    for (size_t i = 0; i < ps->n; i++) {
        const plugin_entry *e = &ps->e[i];
        if (e->state != PLUGIN_LOADED)
            continue;
        printf("  %-12s ABI %u  %s\n", e->name, e->fmt->abi_version, e->real);
        printf("  %-12s routes %s; post-load kernels:", "", routes_of(e->decl, routes, sizeof routes));
        for (size_t k = 0; k < e->decl->n_kernels; k++)
            printf(" %s%s", e->decl->kernels[k].name,
                   e->decl->kernels[k].idempotent ? "" : " (not idempotent)");
        printf("%s\n", e->decl->n_kernels ? "" : " none");
    }
    for (size_t i = 0; i < ps->n; i++) {
        const plugin_entry *e = &ps->e[i];
        if (e->state == PLUGIN_REFUSED)
            printf("refused: %s: %s\n", e->path, e->reason ? e->reason : "?");
        else if (e->state == PLUGIN_SHADOWED)
            printf("shadowed: %s: by %s\n", e->path, e->reason ? e->reason : "?");
    }
}

static json_t *format_json(const plugin_entry *e)
{
    json_t *routes = json_array(), *kernels = json_array();
    for (uint32_t r = REFIT_ROUTE_DIRECT; routes && r <= REFIT_ROUTE_STAGED; r++)
        if (e->decl->all_routes & FDECL_ROUTE_BIT(r))
            json_array_append_new(routes, json_string(fdecl_route_name(r)));
    for (size_t k = 0; kernels && k < e->decl->n_kernels; k++)
        json_array_append_new(kernels, json_pack("{s:s, s:b}", "name", e->decl->kernels[k].name,
                                                 "idempotent", e->decl->kernels[k].idempotent));
    return json_pack("{s:s, s:s, s:i, s:s, s:o, s:o}", "name", e->name, "path", e->real,
                     "abi", (int)e->fmt->abi_version, "declaration", e->decl_path, "routes",
                     routes, "kernels", kernels);
}

static json_t *set_json(const plugin_set *ps)
{
    json_t *dirs = json_array(), *fmts = json_array(), *refused = json_array(),
           *shadowed = json_array();
    json_t *root = json_pack("{s:o, s:o, s:o, s:o}", "searched", dirs, "formats", fmts,
                             "refused", refused, "shadowed", shadowed);
    if (!root)
        return NULL;
    for (size_t i = 0; i < ps->n_dirs; i++)
        json_array_append_new(dirs, json_pack("{s:s, s:s, s:b}", "dir", ps->dirs[i].path,
                                              "origin", ps->dirs[i].origin, "exists",
                                              !ps->dirs[i].missing));
    for (size_t i = 0; i < ps->n; i++) {
        const plugin_entry *e = &ps->e[i];
        const char *why = e->reason ? e->reason : "?";
        if (e->state == PLUGIN_LOADED)
            json_array_append_new(fmts, format_json(e));
        else if (e->state == PLUGIN_REFUSED)
            json_array_append_new(refused, json_pack("{s:s, s:s}", "path", e->path, "reason", why));
        else
            json_array_append_new(shadowed, json_pack("{s:s, s:s, s:s}", "path", e->path,
                                                      "name", e->name, "by", why));
    }
    return root;
}

/* ':'-join the --plugin-dir arguments, in order. */
static int add_dir(char **dirs, const char *d)
{
    size_t old = *dirs ? strlen(*dirs) : 0;
    char *p = realloc(*dirs, old + strlen(d) + 2);
    if (!p)
        return -1;
    if (old)
        p[old++] = ':';
    strcpy(p + old, d);
    *dirs = p;
    return 0;
}

typedef struct formats_args {
    char *dirs;
    int json;
    unsigned flags;
} formats_args;

static int formats_opt(void *user, int key, const char *value)
{
    formats_args *a = user;
    if (key == 'j')
        a->json = 1;
    else if (key == 'o')
        a->flags |= PLUGINS_ONLY_NAMED;
    else if (add_dir(&a->dirs, value))
        return cli_error(1, "out of memory");
    return 0;
}

int ctl_formats(int argc, char **argv)
{
    formats_args a = {NULL, 0, 0};
    int first, rc = cli_parse(&ctl_formats_cli, argc, argv, formats_opt, &a, &first);
    if (!rc && first < argc)
        rc = cli_usage_error(&ctl_formats_cli, "unexpected '%s'", argv[first]);
    if (rc) {
        free(a.dirs);
        return rc == CLI_HELP ? 0 : rc;
    }
    plugin_set *ps = NULL;
    if (plugins_open(&ps, a.dirs, a.flags, NULL, NULL)) {
        free(a.dirs);
        return cli_error(1, "out of memory");
    }
    if (a.json) {
        rc = cli_json_print(set_json(ps));
    } else {
        print_text(ps);
        rc = 0;
    }
    if (plugins_count(ps, PLUGIN_REFUSED))
        rc = 1;
    plugins_close_set(ps);
    free(a.dirs);
    return rc;
}
