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
#include "tools/refitctl.h"

static int ctl_formats_usage(void)
{
    fprintf(stderr, "usage: refitctl formats [--plugin-dir DIR]... [--only] [--json]\n");
    return 2;
}

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

int ctl_formats(int argc, char **argv)
{
    char *dirs = NULL;
    int json = 0, rc = 2;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--only"))
            flags |= PLUGINS_ONLY_NAMED;
        else if (!strcmp(argv[i], "--plugin-dir") && i + 1 < argc && add_dir(&dirs, argv[++i]) == 0)
            continue;
        else {
            free(dirs);
            return ctl_formats_usage();
        }
    }
    plugin_set *ps = NULL;
    if (plugins_open(&ps, dirs, flags, NULL, NULL)) {
        fprintf(stderr, "refitctl formats: out of memory\n");
        free(dirs);
        return 1;
    }
    if (json) {
        json_t *root = set_json(ps);
        char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(root);
        rc = text ? 0 : 1;
    } else {
        print_text(ps);
        rc = 0;
    }
    if (plugins_count(ps, PLUGIN_REFUSED))
        rc = 1;
    plugins_close_set(ps);
    free(dirs);
    return rc;
}
