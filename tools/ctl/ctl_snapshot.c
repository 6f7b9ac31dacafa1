/*
 * refitctl snapshot: read a snapshot of a worker's committed state
 * (docs/restart.md) without a worker.
 *
 *   refitctl snapshot show [--json] PATH     version, signature, fingerprints
 *   refitctl snapshot verify [--json] PATH   fingerprints recomputed from the files
 *
 * Exit status: 0 ok, 1 invalid or damaged snapshot (one line on stderr; a
 * JSON object on stdout under --json), 2 usage.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include <refit/refit.h>

#include "core/snapshot_manifest.h"
#include "tools/cli.h"
#include "tools/refitctl.h"

static const cli_opt ctl_snap_opts[] = {
    {"json", 'j', NULL, "one JSON object on stdout: show the manifest, verify the result;\n"
                        "errors as {\"error\": ...}"},
    {NULL, 0, NULL, NULL},
};

static const cli ctl_snap_cli = {
    "refitctl snapshot", "show [--json] PATH\nverify [--json] PATH",
    "PATH is a snapshot directory (refit_snapshot_write, Model.snapshot).\n"
    "  show    its version, the update and worker it came from, the plan\n"
    "          signature and each module's format and fingerprint (the\n"
    "          manifest's checksum is checked first)\n"
    "  verify  the manifest's checksum, the tensor file, and each module's\n"
    "          fingerprint recomputed from the file's bytes\n"
    "Exit status: 0 ok, 1 invalid or damaged snapshot, 2 usage.",
    ctl_snap_opts,
};

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "-";
}

/* Distinct values of a runtime member over every module ("9.0 cuda"). */
static void runtime_values(const json_t *mods, const char *key, char *out, size_t n)
{
    size_t used = 0, i, k;
    json_t *mod, *rt;
    out[0] = '\0';
    json_array_foreach(mods, i, mod) {
        json_array_foreach(json_object_get(mod, "runtime"), k, rt) {
            const char *v = str(rt, key);
            if (!strstr(out, v) && used + strlen(v) + 2 < n)
                used += (size_t)snprintf(out + used, n - used, "%s%s", used ? " " : "", v);
        }
    }
}

static int ctl_snap_show_text(const char *path, const json_t *man)
{
    const json_t *sig = json_object_get(man, "signature");
    const json_t *mods = json_object_get(sig, "modules");
    const json_t *abi = json_object_get(sig, "abi");
    char cc[128], dev[128];
    runtime_values(mods, "compute_capability", cc, sizeof cc);
    runtime_values(mods, "device", dev, sizeof dev);
    printf("snapshot     %s\n", path);
    printf("version      %s (update %lld of worker %s, journal %s)\n", str(man, "version"),
           (long long)json_integer_value(json_object_get(man, "update_id")), str(man, "worker"),
           str(man, "journal"));
    printf("created      %s\n", str(man, "created_at"));
    printf("tensor bytes %lld\n", (long long)json_integer_value(
                                      json_object_get(json_object_get(man, "tensor_bytes"),
                                                      SNAP_TENSORS_NAME)));
    printf("signature    refit %s, format ABI %lld, rank %lld, %zu modules, devices %s, "
           "compute capability %s\n", str(abi, "refit"),
           (long long)json_integer_value(json_object_get(abi, "format_abi")),
           (long long)json_integer_value(json_object_get(sig, "rank")), json_array_size(mods),
           dev, cc);
    printf("\n%-40s %-14s %-19s %-16s %s\n", "MODULE", "FORMAT", "PLUGIN", "FINGERPRINT",
           "TENSORS");
    size_t i;
    json_t *m;
    const json_t *fps = json_object_get(man, "modules");
    json_array_foreach(mods, i, m) {
        const json_t *plugin = json_object_get(m, "plugin");
        const char *v = str(plugin, "version");
        /* its declared version, else the start of the file's digest */
        printf("%-40s %-14s %-19.19s %-16s %zu\n", str(m, "name"), str(m, "format"),
               strcmp(v, "-") ? v : str(plugin, "identity"),
               str(json_array_get(fps, i), "fingerprint"),
               json_array_size(json_object_get(m, "runtime")));
    }
    return 0;
}

static int ctl_snap_verify(const char *path, int json)
{
    refit_options o = REFIT_OPTIONS_INIT;
    o.journal_path = "";
    refit_ctx *ctx;
    int rc = refit_open(&ctx, &o);
    if (rc)
        return cli_error(1, "cannot open a context: %s", refit_strerror(rc));
    rc = refit_snapshot_verify(ctx, path);
    if (rc) {
        int out = cli_error(1, "%s", refit_errmsg(ctx));
        refit_close(ctx);
        return out;
    }
    refit_close(ctx);
    if (json)
        return cli_json_print(json_pack("{s:s, s:b}", "path", path, "ok", 1));
    printf("ok: %s: the manifest's checksum, the tensor file and every module's fingerprint\n",
           path);
    return 0;
}

static int ctl_snap_opt(void *user, int key, const char *value)
{
    (void)key, (void)value;
    *(int *)user = 1; /* --json */
    return 0;
}

int ctl_snapshot(int argc, char **argv)
{
    int json = 0, first;
    int rc = cli_parse(&ctl_snap_cli, argc, argv, ctl_snap_opt, &json, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (argc - first != 2)
        return cli_usage_error(&ctl_snap_cli, argc == first ? "which command: show or verify?"
                                              : argc - first == 1 ? "no PATH"
                                                                  : "one PATH only");
    const char *cmd = argv[first], *path = argv[first + 1];
    if (!strcmp(cmd, "verify"))
        return ctl_snap_verify(path, json);
    if (strcmp(cmd, "show"))
        return cli_usage_error(&ctl_snap_cli, "unknown command '%s'", cmd);
    char mpath[4200], err[1400];
    if (snprintf(mpath, sizeof mpath, "%s/%s", path, SNAP_MANIFEST_NAME) >= (int)sizeof mpath)
        return cli_error(1, "%s: path too long", path);
    json_t *man;
    if (snap_manifest_read(mpath, &man, err, sizeof err))
        return cli_error(1, "%s", err);
    if (json)
        return cli_json_print(man);
    rc = ctl_snap_show_text(path, man);
    json_decref(man);
    return rc;
}
