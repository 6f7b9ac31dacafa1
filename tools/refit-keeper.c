/*
 * refit-keeper: a keeper process (docs/restart.md, "The keeper") started
 * from a snapshot of the group's committed state.
 *
 *   refit-keeper --model MODEL.yaml --snapshot DIR --serve PATH [--follow PATH]
 *                [--device N] [--journal DB] [--worker-id ID] [--for SECONDS]
 *
 * The model manifest declares the modules and checkpoint expectations as
 * the workers' engine does (refit_model_load_manifest); the snapshot's
 * plan signature says each runtime tensor's dtype, shape and strides, so
 * the keeper binds them in its pool (host memory, or device N), seals,
 * restores the snapshot (which checks the signature again, and every
 * fingerprint), and serves restores at PATH. With --follow it is one more
 * worker of the trainer's refit.ipc sends from then on.
 *
 * Exit status: 0 (the --for time is up), 1 an error, 2 usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <refit/ipc.h>
#include <refit/refit.h>

#include "core/snapshot_manifest.h"
#include "tools/cli.h"

typedef struct args {
    const char *model, *snapshot, *serve, *follow, *journal, *worker_id;
    int device;                 /* -1: host memory */
    double seconds;             /* < 0: forever */
} args;

enum { OPT_MODEL = 'm', OPT_SNAPSHOT = 's', OPT_SERVE = 'S', OPT_FOLLOW = 'f',
       OPT_DEVICE = 'd', OPT_JOURNAL = 'j', OPT_WORKER = 'w', OPT_FOR = 't' };

static const cli_opt keeper_opts[] = {
    {"model", OPT_MODEL, "MODEL.yaml", "the workers' model manifest (modules, expectations)"},
    {"snapshot", OPT_SNAPSHOT, "DIR", "a snapshot of the group's committed state: the keeper\n"
                                      "starts at its version"},
    {"serve", OPT_SERVE, "PATH", "the socket workers restore from (keeper://PATH)"},
    {"follow", OPT_FOLLOW, "PATH", "the socket the trainer's refit.ipc sender lists: the\n"
                                   "keeper votes on and holds every committed update"},
    {"device", OPT_DEVICE, "N", "CUDA device of the runtime tensors (default: host memory)"},
    {"journal", OPT_JOURNAL, "DB", "the keeper's journal (default: none)"},
    {"worker-id", OPT_WORKER, "ID", "its name in messages and journals (default: keeper)"},
    {"for", OPT_FOR, "SECONDS", "serve this long, then exit 0 (default: forever)"},
    {NULL, 0, NULL, NULL},
};

static const cli keeper_cli = {
    "refit-keeper",
    "--model MODEL.yaml --snapshot DIR --serve PATH [--follow PATH] [--device N]\n"
    "[--journal DB] [--worker-id ID] [--for SECONDS]",
    "Holds the committed state of a group of workers of one plan signature\n"
    "and serves restores of it (refit_ipc_restore, refit.keeper.restore).\n"
    "Exit status: 0 ok, 1 an error, 2 usage.",
    keeper_opts,
};

static int on_opt(void *user, int key, const char *v)
{
    args *a = user;
    char *end = NULL;
    switch (key) {
    case OPT_MODEL: a->model = v; break;
    case OPT_SNAPSHOT: a->snapshot = v; break;
    case OPT_SERVE: a->serve = v; break;
    case OPT_FOLLOW: a->follow = v; break;
    case OPT_JOURNAL: a->journal = v; break;
    case OPT_WORKER: a->worker_id = v; break;
    case OPT_DEVICE:
        errno = 0;
        a->device = (int)strtol(v, &end, 10);
        if (errno || *end || a->device < 0)
            return cli_usage_error(&keeper_cli, "--device %s: a device index", v);
        break;
    case OPT_FOR:
        errno = 0;
        a->seconds = strtod(v, &end);
        if (errno || *end || a->seconds < 0)
            return cli_usage_error(&keeper_cli, "--for %s: seconds", v);
        break;
    }
    return 0;
}

/* The dtype refit_dtype_name calls name (the signature's words). */
static int dtype_named(const char *name, refit_dtype *out)
{
    static const uint8_t bits[] = {1, 2, 4, 6, 8, 16, 32, 64};
    for (uint8_t code = 0; code < 32; code++)
        for (size_t b = 0; b < sizeof bits; b++) {
            refit_dtype dt = {code, bits[b], 1};
            if (!strcmp(refit_dtype_name(dt), name)) {
                *out = dt;
                return 0;
            }
        }
    unsigned c, bb, l;
    if (sscanf(name, "%u.%u.%u", &c, &bb, &l) == 3 && c < 256 && bb < 256 && l < 65536) {
        *out = (refit_dtype){(uint8_t)c, (uint8_t)bb, (uint16_t)l};
        return 0;
    }
    return -1;
}

typedef struct rt_decl {
    const char *module, *name;
    refit_dtype dtype;
    int32_t ndim;
    int64_t shape[REFIT_MAX_DIMS], strides[REFIT_MAX_DIMS];
    uint64_t span;              /* bytes from the first element to the last, inclusive */
    refit_tensor t;
} rt_decl;

/* Each runtime tensor of the snapshot's signature; *bytes: the pool they
 * need (256-byte aligned pieces). */
static int runtime_decls(const json_t *sig, rt_decl **out, size_t *n, uint64_t *bytes)
{
    const json_t *mods = json_object_get(sig, "modules"), *mod, *r;
    size_t i, k, cap = 0;
    *out = NULL;
    *n = 0;
    *bytes = 0;
    json_array_foreach(mods, i, mod) cap += json_array_size(json_object_get(mod, "runtime"));
    rt_decl *d = calloc(cap + 1, sizeof *d);
    if (!d)
        return cli_error(1, "out of memory");
    json_array_foreach(mods, i, mod) {
        json_array_foreach(json_object_get(mod, "runtime"), k, r) {
            rt_decl *x = &d[(*n)++];
            x->module = json_string_value(json_object_get(mod, "name"));
            x->name = json_string_value(json_object_get(r, "name"));
            const json_t *sh = json_object_get(r, "shape"), *st = json_object_get(r, "strides");
            const char *dt = json_string_value(json_object_get(r, "dtype"));
            x->ndim = (int32_t)json_array_size(sh);
            if (!x->module || !x->name || !dt || dtype_named(dt, &x->dtype) ||
                x->ndim > REFIT_MAX_DIMS || json_array_size(st) != (size_t)x->ndim) {
                free(d);
                return cli_error(1, "the snapshot's signature: module %zu runtime %zu is "
                                 "malformed", i, k);
            }
            uint64_t last = 0, empty = 0;
            for (int32_t j = 0; j < x->ndim; j++) {
                x->shape[j] = json_integer_value(json_array_get(sh, (size_t)j));
                x->strides[j] = json_integer_value(json_array_get(st, (size_t)j));
                empty |= x->shape[j] <= 0;
                last += x->shape[j] > 0 ? (uint64_t)(x->shape[j] - 1) * (uint64_t)x->strides[j]
                                        : 0;
            }
            x->span = empty ? 1 : ((last + 1) * x->dtype.bits * x->dtype.lanes + 7) / 8;
            *bytes += (x->span + 255) & ~(uint64_t)255;
        }
    }
    *out = d;
    return 0;
}

static int serve(const args *a, const json_t *man)
{
    const json_t *sig = json_object_get(man, "signature");
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = a->worker_id ? a->worker_id : "keeper";
    o.rank = (int32_t)json_integer_value(json_object_get(sig, "rank"));
    o.journal_path = a->journal ? a->journal : "";
    refit_ctx *ctx = NULL;
    refit_model *m = NULL;
    refit_ipc_pool *pool = NULL;
    refit_ipc_keeper *k = NULL;
    rt_decl *d = NULL;
    size_t n = 0;
    uint64_t bytes = 0;
    int rc = refit_open(&ctx, &o);
    if (rc)
        return cli_error(1, "refit_open: %s", refit_strerror(rc));
    const char *what = "refit_model_create";
    if (!(rc = refit_model_create(&m, ctx)))
        rc = refit_model_load_manifest(m, (what = a->model));
    if (!rc && (rc = runtime_decls(sig, &d, &n, &bytes))) {
        refit_close(ctx);
        return rc;
    }
    if (!rc)
        rc = refit_ipc_pool_create(&pool, ctx, a->device, bytes ? bytes : 256);
    for (size_t i = 0; !rc && i < n; i++) {
        rt_decl *x = &d[i];
        void *p = NULL;
        if (!(rc = refit_ipc_pool_alloc(pool, x->span, &p))) {
            x->t = (refit_tensor){.data = p, .ndim = x->ndim, .dtype = x->dtype,
                                  .shape = x->shape, .strides = x->strides};
            x->t.device = a->device < 0 ? (refit_device){REFIT_DEVICE_CPU, 0}
                                        : (refit_device){REFIT_DEVICE_CUDA, a->device};
            rc = refit_module_bind_runtime(m, x->module, x->name, &x->t);
        }
    }
    if (!rc) {
        what = "seal";
        rc = refit_model_seal(m);
    }
    if (!rc) {
        what = a->snapshot;
        rc = refit_restore(m, a->snapshot, NULL);
    }
    refit_ipc_keeper_opts ko = REFIT_IPC_KEEPER_OPTS_INIT;
    ko.follow_path = a->follow;
    if (!rc)
        rc = refit_ipc_keeper_create(&k, m, pool, (what = a->serve), &ko);
    if (!rc) {
        fprintf(stderr, "refit-keeper: serving version %s at %s%s%s\n",
                refit_worker_version(ctx), a->serve, a->follow ? ", following " : "",
                a->follow ? a->follow : "");
        rc = refit_ipc_keeper_run(k, a->seconds);
    }
    if (rc)
        rc = cli_error(1, "%s: %s", what, refit_errmsg(ctx));
    refit_ipc_keeper_destroy(k);
    refit_close(ctx);
    refit_ipc_pool_destroy(pool);
    free(d);
    return rc;
}

int main(int argc, char **argv)
{
    args a = {.device = -1, .seconds = -1};
    int first = 0, rc = cli_parse(&keeper_cli, argc, argv, on_opt, &a, &first);
    if (rc)
        return rc == CLI_HELP ? 0 : rc;
    if (first != argc)
        return cli_usage_error(&keeper_cli, "unexpected argument '%s'", argv[first]);
    if (!a.model || !a.snapshot || !a.serve)
        return cli_usage_error(&keeper_cli, "--model, --snapshot and --serve are needed");
    char mpath[4200], err[1400];
    if (snprintf(mpath, sizeof mpath, "%s/%s", a.snapshot, SNAP_MANIFEST_NAME) >=
        (int)sizeof mpath)
        return cli_error(1, "%s: path too long", a.snapshot);
    json_t *man;
    if (snap_manifest_read(mpath, &man, err, sizeof err))
        return cli_error(1, "%s", err);
    rc = serve(&a, man);
    json_decref(man);
    return rc;
}
