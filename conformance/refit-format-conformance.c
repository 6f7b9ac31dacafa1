/* refit-format-conformance: hold a format plugin to what every format owes
 * the core, on the CPU reference or a CUDA device (docs/conformance.md).
 *
 *   refit-format-conformance [--only=ID,...] [--device=cuda[:N]]
 *       [--reference=CMD] PLUGIN.so DECL.yaml CASE.yaml...
 *
 * The plugin and its declaration are staged into a private directory as
 * refit-fmt-<name>.so and <name>.yaml and vetted by the plugin loader; each
 * case (a model manifest whose modules use the format) then goes through
 * every check of kit_checks.c. TAP on stdout; exit 0 when every check
 * passed or was skipped, 1 when one failed, 2 on usage, 77 when the device
 * asked for cannot be used. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conformance/kit_checks.h"
#include "conformance/kit_mem.h"
#include "core/plugin_loader.h"

/* The exit status when the device asked for cannot be used (meson and
 * automake read 77 as a skip). */
#define EXIT_NO_DEVICE 77

static const char usage_head[] =
    "usage: refit-format-conformance [--only=ID,...] [--device=cuda[:N]] [--reference=CMD]\n"
    "                                PLUGIN.so DECL.yaml CASE.yaml...\n"
    "\n"
    "Runs the format conformance checks over a format plugin.\n"
    "  PLUGIN.so   the plugin (any file name; staged as refit-fmt-<name>.so)\n"
    "  DECL.yaml   its declaration (<name> is its name:)\n"
    "  CASE.yaml   a model manifest (kind: model) with modules of the format, its\n"
    "              runtime tensors declared; shards as the format is used under TP\n"
    "  --only=ID,...  run only these checks (the plugin is always loaded first)\n"
    "  --device=cuda[:N]  runtime tensors and sources on CUDA device N (default 0):\n"
    "              every check runs the plugin's kernels, and every update's bytes\n"
    "              must equal the plugin's CPU path's; --device=cpu is the default\n"
    "  --reference=CMD  the author's reference: `CMD DIR/request.json` gets the\n"
    "              checkpoint tensors and writes the runtime bytes it expects\n"
    "              (docs/conformance.md); the reference check compares them\n"
    "  --self-test-fault=refusal|twin  break the refusal check's bytes, or a device\n"
    "              world's after each update, on purpose (the kit's own tests show\n"
    "              those comparisons can fail)\n"
    "\n"
    "Checks, in the order they run:\n";
static const char usage_tail[] =
    "\nTAP on stdout. Exit 0: every check passed or was skipped; 1: one failed;\n"
    "2: usage; 77: the --device asked for cannot be used here.\n";

/* The ids --only takes: the checks of the table, and loads (always run). */
static const char loads_id[] = "loads";
static const char loads_title[] = "the declaration is valid and the loader takes the plugin";

static void print_usage(FILE *f)
{
    size_t n;
    const kit_check *checks = kit_checks(&n);
    fputs(usage_head, f);
    fprintf(f, "  %-12s %s (always)\n", loads_id, loads_title);
    for (size_t k = 0; k < n; k++)
        fprintf(f, "  %-12s %s\n", checks[k].id, checks[k].title);
    fputs(usage_tail, f);
}

/* Each comma-separated name of only is a check's id (or loads): 1, or 0
 * with the first that is not in bad. */
static int only_valid(const char *only, char *bad, size_t n)
{
    size_t count;
    const kit_check *checks = kit_checks(&count);
    for (const char *p = only;; p++) {
        size_t len = strcspn(p, ",");
        int known = len == strlen(loads_id) && !strncmp(p, loads_id, len);
        for (size_t k = 0; k < count && !known; k++)
            known = len == strlen(checks[k].id) && !strncmp(p, checks[k].id, len);
        if (!known) {
            snprintf(bad, n, "%.*s", (int)len, p);
            return 0;
        }
        p += len;
        if (!*p)
            return 1;
    }
}

/* --device's value: cpu, cuda or cuda:N. */
static int parse_device(const char *v, refit_device *dev)
{
    char *end;
    if (!strcmp(v, "cpu")) {
        *dev = (refit_device){REFIT_DEVICE_CPU, 0};
        return 0;
    }
    if (strncmp(v, "cuda", 4))
        return -1;
    if (!v[4]) {
        *dev = (refit_device){REFIT_DEVICE_CUDA, 0};
        return 0;
    }
    if (v[4] != ':' || !v[5])
        return -1;
    errno = 0;
    long id = strtol(v + 5, &end, 10);
    if (*end || errno || id < 0 || id > 1024)
        return -1;
    *dev = (refit_device){REFIT_DEVICE_CUDA, (int32_t)id};
    return 0;
}

static int copy_file(const char *src, const char *dst, mode_t mode, char *why, size_t n)
{
    FILE *in = fopen(src, "rb");
    if (!in) {
        snprintf(why, n, "cannot read %s: %s", src, strerror(errno));
        return -1;
    }
    int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL, mode);
    FILE *out = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!out) {
        snprintf(why, n, "cannot write %s: %s", dst, strerror(errno));
        if (fd >= 0)
            close(fd);
        fclose(in);
        return -1;
    }
    char buf[65536];
    size_t k;
    int rc = 0;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, k, out) != k)
            rc = -1;
    if (ferror(in))
        rc = -1;
    fclose(in);
    if (fclose(out))
        rc = -1;
    if (rc)
        snprintf(why, n, "copying %s to %s failed", src, dst);
    return rc | chmod(dst, mode);
}

static void loader_log(void *user, int level, const char *fmt, ...)
{
    (void)user;
    if (level > 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("# loader: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

static int tap_n;

static void tap(kit_verdict v, const char *id, const char *what, const char *msg)
{
    printf("%s %d - %s: %s%s\n", v == KIT_FAIL ? "not ok" : "ok", ++tap_n, id, what,
           v == KIT_SKIP ? " # SKIP" : "");
    /* the message, as TAP comment lines */
    const char *p = msg;
    while (p && *p) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        printf("#   %.*s\n", len, p);
        p = e ? e + 1 : NULL;
    }
}

/* The largest shard count of the case (1: nothing sharded). */
static int case_tp(const mdoc *doc)
{
    int tp = 1;
    for (size_t i = 0; i < doc->n_mods; i++)
        for (size_t j = 0; j < doc->mods[i].n_ck; j++)
            if (doc->mods[i].ck[j].shard_rank < 0 && doc->mods[i].ck[j].shard_count > tp)
                tp = doc->mods[i].ck[j].shard_count;
    return tp;
}

static int wanted(const char *only, const char *id)
{
    if (!only)
        return 1;
    size_t n = strlen(id);
    for (const char *p = only; (p = strstr(p, id)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == 0))
            return 1;
    return 0;
}

/* The value of option name at argv[*a] (--name=V, or --name V); NULL when
 * argv[*a] is not that option. *missing when it has no value. */
static const char *option(char **argv, int argc, int *a, const char *name, int *missing)
{
    size_t n = strlen(name);
    if (strncmp(argv[*a], name, n))
        return NULL;
    if (argv[*a][n] == '=')
        return argv[*a] + n + 1;
    if (argv[*a][n])
        return NULL;
    if (*a + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*a];
}

int main(int argc, char **argv)
{
    const char *only = NULL, *fault = NULL, *reference = NULL, *v;
    refit_device device = {REFIT_DEVICE_CPU, 0};
    int a = 1, missing = 0;
    char bad[256];
    for (; a < argc && !strncmp(argv[a], "--", 2); a++) {
        if (!strcmp(argv[a], "--help")) {
            print_usage(stdout);
            return 0;
        } else if ((v = option(argv, argc, &a, "--only", &missing))) {
            only = v;
            if (!only_valid(only, bad, sizeof bad)) {
                fprintf(stderr, "refit-format-conformance: --only: no check is called \"%s\"; "
                        "the checks are:\n", bad);
                size_t n;
                const kit_check *checks = kit_checks(&n);
                fprintf(stderr, "  %s", loads_id);
                for (size_t k = 0; k < n; k++)
                    fprintf(stderr, " %s", checks[k].id);
                fputc('\n', stderr);
                return 2;
            }
        } else if ((v = option(argv, argc, &a, "--device", &missing))) {
            if (parse_device(v, &device)) {
                fprintf(stderr, "refit-format-conformance: --device=%s: expected cpu, cuda or "
                        "cuda:N\n", v);
                return 2;
            }
        } else if ((v = option(argv, argc, &a, "--reference", &missing))) {
            if (!*v) {
                fprintf(stderr, "refit-format-conformance: --reference: an empty command\n");
                return 2;
            }
            reference = v;
        } else if (!strcmp(argv[a], "--self-test-fault=refusal")) {
            fault = "refusal";
        } else if (!strcmp(argv[a], "--self-test-fault=twin")) {
            fault = "twin";
        } else {
            fprintf(stderr, "refit-format-conformance: %s %s\n", missing ? "no value for"
                    : "unknown option", argv[a]);
            print_usage(stderr);
            return 2;
        }
    }
    if (argc - a < 3) {
        print_usage(stderr);
        return 2;
    }
    if (device.device_type == REFIT_DEVICE_CUDA &&
        !kit_mem_device_ready(device.device_id, bad, sizeof bad)) {
        printf("1..0 # SKIP --device=cuda:%d: %s\n", device.device_id, bad);
        fprintf(stderr, "refit-format-conformance: --device=cuda:%d: %s\n", device.device_id,
                bad);
        return EXIT_NO_DEVICE;
    }
    const char *plugin = argv[a], *decl_path = argv[a + 1];
    int failed = 0;
    char why[8192];

    /* the declaration, then the plugin as the loader vets it */
    fdecl *decl = NULL;
    sdiags d = {.max = 16};
    int rc = fdecl_load_file(&decl, decl_path, &d);
    if (rc) {
        snprintf(why, sizeof why, "%s", sdiags_count(&d) ? sdiags_first(&d) : refit_status_name(rc));
        sdiags_free(&d);
        tap(KIT_FAIL, loads_id, loads_title, why);
        printf("1..%d\n", tap_n);
        return 1;
    }
    sdiags_free(&d);
    char dir[] = "/tmp/refit-conformance-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "refit-format-conformance: mkdtemp: %s\n", strerror(errno));
        fdecl_free(decl);
        return 1;
    }
    char so[512], yaml[512];
    snprintf(so, sizeof so, "%s/refit-fmt-%s.so", dir, decl->name);
    snprintf(yaml, sizeof yaml, "%s/%s.yaml", dir, decl->name);
    plugin_set *ps = NULL;
    const plugin_entry *pe = NULL;
    if (copy_file(plugin, so, 0755, why, sizeof why) ||
        copy_file(decl_path, yaml, 0644, why, sizeof why)) {
        failed = 1;
    } else if (plugins_open(&ps, dir, PLUGINS_ONLY_NAMED, loader_log, NULL)) {
        snprintf(why, sizeof why, "the loader ran out of memory");
        failed = 1;
    } else {
        for (size_t i = 0; i < ps->n; i++)
            if (!strcmp(ps->e[i].name, decl->name))
                pe = &ps->e[i];
        if (!pe || pe->state != PLUGIN_LOADED) {
            snprintf(why, sizeof why, "%s (as %s): %s", plugin, so,
                     pe && pe->reason ? pe->reason : "not found by the loader");
            failed = 1;
        } else {
            snprintf(why, sizeof why, "format %s from %s, ABI %u, %s post_load, declaration %s",
                     pe->fmt->name, plugin, pe->fmt->abi_version,
                     pe->fmt->post_load ? "with" : "without", decl_path);
        }
    }
    plugins_close_set(ps);
    tap(failed ? KIT_FAIL : KIT_PASS, loads_id, loads_title, why);

    size_t n_checks;
    const kit_check *checks = kit_checks(&n_checks);
    for (int c = a + 2; c < argc && !failed; c++) {
        mdoc *doc = NULL;
        sdiags cd = {.max = 16};
        rc = mdoc_load_file(&doc, argv[c], &cd);
        if (rc) {
            tap(KIT_FAIL, "case", argv[c], sdiags_count(&cd) ? sdiags_first(&cd)
                                                             : refit_status_name(rc));
            sdiags_free(&cd);
            failed = 1;
            break;
        }
        sdiags_free(&cd);
        kit_env env = {.plugin_dir = dir, .format = decl->name, .decl = decl,
                       .case_path = argv[c], .doc = doc, .tp = case_tp(doc), .fault = fault,
                       .device = device, .reference = reference};
        for (size_t k = 0; k < n_checks; k++) {
            if (!wanted(only, checks[k].id))
                continue;
            kit_result r = {KIT_FAIL, ""};
            checks[k].run(&env, &r);
            char what[512];
            snprintf(what, sizeof what, "%s (%s)", checks[k].title, argv[c]);
            tap(r.verdict, checks[k].id, what, r.msg);
            if (r.verdict == KIT_FAIL)
                failed = 1;
            if (r.verdict == KIT_FAIL && !strcmp(checks[k].id, "declaration")) {
                printf("Bail out! the case does not agree with the declaration\n");
                break;
            }
        }
        mdoc_free(doc);
    }
    printf("1..%d\n", tap_n);
    unlink(so);
    unlink(yaml);
    rmdir(dir);
    fdecl_free(decl);
    return failed ? 1 : 0;
}
