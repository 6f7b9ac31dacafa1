/*
 * refit-bench: speed figures, as JSON, each against a ceiling or a peer
 * measured in the same run.
 *
 *   refit-bench host [--tensors N] [--modules M] [--repeat R] [--journal PATH] [--json]
 *       Host cost per tensor of begin/load/finalize on tiny MoE-shaped
 *       tensors (plan lookup, routing, completeness), with the byte copy
 *       itself (the same memcpy's, timed alone in the same run) taken out.
 *       Also plan building at seal. With --journal, the journal's writes for
 *       an update of the same size, against the host reload time.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include <refit/refit.h>
#include <refit/sys/stats.h> /* the journal's share of a reload */

#include "tools/bench.h"
#include "tools/cli.h"
#include "tools/bench_nccl.h"
#ifdef REFIT_HAVE_CUDA
#include "tools/bench_gpu.h"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- host: many tiny tensors ---- */

#define EXPERT_ROWS 4
#define EXPERT_COLS 8

typedef struct host_model {
    refit_ctx *ctx;
    refit_model *model;
    size_t n_modules, per_module, n_tensors;
    uint16_t *runtime;          /* one [per_module, 4, 8] bf16 stack per module */
    uint16_t *ckpt;             /* every checkpoint tensor, [4, 8] bf16 */
    int64_t *rt_shapes;         /* 3 per module */
    refit_tensor *rt;
    char **names;
} host_model;

static void host_free(host_model *h)
{
    refit_close(h->ctx);
    for (size_t i = 0; h->names && i < h->n_tensors; i++)
        free(h->names[i]);
    free(h->names);
    free(h->runtime);
    free(h->ckpt);
    free(h->rt_shapes);
    free(h->rt);
}

static int host_fail(host_model *h, const char *what, int rc)
{
    cli_error(1, "%s: %s: %s", what, refit_status_name(rc), h->ctx ? refit_errmsg(h->ctx) : "");
    return rc;
}

/* MoE-shaped: module m is one expert group, its checkpoint tensors
 * "model.layers.L.mlp.experts.E.w_G.weight" stacked into one runtime tensor. */
static int host_build(host_model *h, size_t n_tensors, size_t n_modules, const char *journal)
{
    memset(h, 0, sizeof *h);
    h->n_modules = n_modules;
    h->per_module = (n_tensors + n_modules - 1) / n_modules;
    h->n_tensors = h->per_module * n_modules;
    size_t elems = (size_t)EXPERT_ROWS * EXPERT_COLS;
    h->runtime = calloc(h->n_tensors * elems, 2);
    h->ckpt = malloc(h->n_tensors * elems * 2);
    h->rt_shapes = calloc(n_modules * 3, sizeof *h->rt_shapes);
    h->rt = calloc(n_modules, sizeof *h->rt);
    h->names = calloc(h->n_tensors, sizeof *h->names);
    if (!h->runtime || !h->ckpt || !h->rt_shapes || !h->rt || !h->names)
        return REFIT_ENOMEM;
    for (size_t i = 0; i < h->n_tensors * elems; i++)
        h->ckpt[i] = (uint16_t)(0x3c00u + (i * 2654435761u >> 20));
    refit_options o = REFIT_OPTIONS_INIT;
    o.worker_id = journal ? "bench-journaled" : "bench";
    o.journal_path = journal ? journal : "";
    int rc = refit_open(&h->ctx, &o);
    if (rc || (rc = refit_model_create(&h->model, h->ctx)))
        return rc;
    char mod[64], name[128];
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = REFIT_BF16;
    s.ndim = 2;
    s.shape[0] = EXPERT_ROWS;
    s.shape[1] = EXPERT_COLS;
    for (size_t m = 0; m < n_modules; m++) {
        snprintf(mod, sizeof mod, "layers.%zu.mlp.experts.g%zu", m / 64, m % 64);
        int64_t *shape = &h->rt_shapes[m * 3];
        shape[0] = (int64_t)h->per_module;
        shape[1] = EXPERT_ROWS;
        shape[2] = EXPERT_COLS;
        h->rt[m] = (refit_tensor){.data = h->runtime + m * h->per_module * elems,
                                  .device = {REFIT_DEVICE_CPU, 0}, .ndim = 3,
                                  .dtype = REFIT_BF16, .shape = shape};
        if ((rc = refit_model_add_module(h->model, mod, "unquantized", NULL)) ||
            (rc = refit_module_bind_runtime(h->model, mod, "w", &h->rt[m])))
            return rc;
        for (size_t e = 0; e < h->per_module; e++) {
            size_t t = m * h->per_module + e;
            snprintf(name, sizeof name, "model.layers.%zu.mlp.experts.%zu.w%zu.weight", m / 64,
                     (m % 64) * h->per_module + e, e % 3);
            if (!(h->names[t] = strdup(name)))
                return REFIT_ENOMEM;
            s.expert = (int64_t)e;
            if ((rc = refit_model_expect(h->model, mod, name, &s)))
                return rc;
        }
    }
    return REFIT_OK;
}

/* One full reload: begin, every tensor, finalize. */
static int host_reload(host_model *h, int rollback, double *secs)
{
    refit_update_opts uo = REFIT_UPDATE_OPTS_INIT;
    uo.version_label = "bench";
    uo.rollback = rollback;
    int64_t shape[2] = {EXPERT_ROWS, EXPERT_COLS};
    refit_tensor src = {.device = {REFIT_DEVICE_CPU, 0}, .ndim = 2, .dtype = REFIT_BF16,
                        .shape = shape};
    size_t elems = (size_t)EXPERT_ROWS * EXPERT_COLS;
    refit_txn *txn;
    double t0 = now_s();
    int rc = refit_begin(&txn, h->model, &uo);
    if (rc)
        return rc;
    for (size_t t = 0; t < h->n_tensors; t++) {
        src.data = h->ckpt + t * elems;
        if ((rc = refit_load(txn, h->names[t], &src, NULL))) {
            refit_abort(txn);
            return rc;
        }
    }
    rc = refit_finalize(txn);
    *secs = now_s() - t0;
    return rc;
}

/* The same bytes moved by plain memcpy's: the part that is not bookkeeping. */
static double host_copy_only(host_model *h)
{
    size_t bytes = (size_t)EXPERT_ROWS * EXPERT_COLS * 2;
    double t0 = now_s();
    for (size_t t = 0; t < h->n_tensors; t++)
        memcpy((char *)h->runtime + t * bytes, (char *)h->ckpt + t * bytes, bytes);
    double dt = now_s() - t0;
    if (memcmp(h->runtime, h->ckpt, h->n_tensors * bytes)) /* keeps the copies alive */
        fprintf(stderr, "refit-bench: copy check failed\n");
    return dt;
}

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

/* Median of v (sorted in place). */
static double median_of(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
            double x = v[k];
            v[k] = v[k - 1];
            v[k - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* "machine" and "date": the keys every bench object starts with. */
static json_t *machine_json(const char *bench)
{
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[32], machine[2 * sizeof u.nodename + 2];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(machine, sizeof machine, "%s %s", u.nodename, u.machine);
    return json_pack("{s:s, s:s, s:s}", "bench", bench, "machine", machine, "date", date);
}

typedef struct host_args {
    size_t n_tensors, n_modules;
    int repeat;
    const char *journal;
    bool json;
} host_args;

static const cli_opt host_opts[] = {
    {"tensors", 't', "N", "checkpoint tensors of the model (default 100000)"},
    {"modules", 'm', "M", "modules they are grouped in (default 10000)"},
    {"repeat", 'r', "R", "reloads measured, 1..100; the best counts (default 7)"},
    {"journal", 'J', "PATH", "also journal a copy of the model at PATH and report the\n"
                             "journal's cost against the host reload"},
    {"json", 'j', NULL, "one JSON object on stdout; errors too"},
    {NULL, 0, NULL, NULL},
};

static const cli host_cli = {
    "refit-bench host", "[--tensors N] [--modules M] [--repeat R] [--journal PATH] [--json]",
    "Host cost per tensor of begin/load/finalize on tiny MoE-shaped tensors (plan\n"
    "lookup, routing, completeness), with the byte copy itself (the same memcpy's,\n"
    "timed alone in the same run) taken out; also plan building at seal.\n"
    "Exit status: 0 ok, 1 a failure, 2 usage.",
    host_opts,
};

static int host_opt(void *user, int key, const char *v)
{
    host_args *a = user;
    char *end = NULL;
    if (key == 'j') {
        a->json = true;
        return 0;
    }
    if (key == 'J') {
        a->journal = v;
        return 0;
    }
    unsigned long long n = strtoull(v, &end, 10);
    if (!*v || *end || *v == '-' || n > (key == 'r' ? 100u : 100000000u) || n == 0)
        return cli_usage_error(&host_cli, "bad value '%s' for --%s", v,
                               key == 't' ? "tensors" : key == 'm' ? "modules" : "repeat");
    if (key == 't')
        a->n_tensors = (size_t)n;
    else if (key == 'm')
        a->n_modules = (size_t)n;
    else
        a->repeat = (int)n;
    return 0;
}

static int host_json(const host_args *a, const host_model *h, const double t[], const double *jr)
{
    /* t: register, seal, plain, rollback, copy, us, us_rb, journal, jwrites, plain_med */
    json_t *o = machine_json("host");
    double n = (double)h->n_tensors;
    if (o && json_object_update_new(o, json_pack(
            "{s:I, s:I, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b}",
            "tensors", (json_int_t)h->n_tensors, "modules", (json_int_t)h->n_modules,
            "bytes_per_tensor", EXPERT_ROWS * EXPERT_COLS * 2, "repeat", a->repeat,
            "register_ms", t[0] * 1e3, "seal_ms", t[1] * 1e3, "seal_us_per_tensor",
            t[1] / n * 1e6, "reload_ms", t[2] * 1e3, "reload_rollback_ms", t[3] * 1e3,
            "copy_only_ms", t[4] * 1e3, "us_per_tensor", t[5], "us_per_tensor_rollback", t[6],
            "target_us_per_tensor", 1.0, "meets_target", t[5] <= 1.0)))
        o = (json_decref(o), NULL);
    if (o && a->journal &&
        json_object_update_new(o, json_pack(
            "{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:b}", "journal_path", a->journal,
            "reload_journaled_ms", min_of(jr, a->repeat) * 1e3, "journal_ms", t[7] * 1e3,
            "journal_writes_only_ms", t[8] * 1e3, "reload_median_ms", t[9] * 1e3,
            "journal_ratio_to_reload", t[7] / t[9], "journal_target_ratio", 0.02,
            "journal_meets_target", t[7] / t[9] <= 0.02)))
        o = (json_decref(o), NULL);
    return cli_json_print(o);
}

static int bench_host(int argc, char **argv)
{
    host_args a = {100000, 10000, 7, NULL, false};
    int first, rc0 = cli_parse(&host_cli, argc, argv, host_opt, &a, &first);
    if (rc0)
        return rc0 == CLI_HELP ? 0 : rc0;
    if (first < argc)
        return cli_usage_error(&host_cli, "unexpected '%s'", argv[first]);
    if (a.n_tensors < a.n_modules)
        return cli_usage_error(&host_cli, "need modules <= tensors");
    size_t n_tensors = a.n_tensors, n_modules = a.n_modules;
    int repeat = a.repeat;
    const char *journal = a.journal;
    bool json = a.json;
    host_model h, hj;
    memset(&hj, 0, sizeof hj);
    double t0 = now_s();
    int rc = host_build(&h, n_tensors, n_modules, NULL);
    double t_register = now_s() - t0;
    if (rc)
        return host_fail(&h, "building the model", rc), host_free(&h), 1;
    t0 = now_s();
    rc = refit_model_seal(h.model);
    double t_seal = now_s() - t0;
    if (rc)
        return host_fail(&h, "seal", rc), host_free(&h), 1;
    /* the same model again, journaled: the journal's cost is the difference */
    if (journal && ((rc = host_build(&hj, n_tensors, n_modules, journal)) ||
                    (rc = refit_model_seal(hj.model))))
        return host_fail(&hj, "building the journaled model", rc), host_free(&h), host_free(&hj), 1;

    int reported = 0;
    double plain[100] = {0}, rb[100] = {0}, copy[100] = {0}, jr[100] = {0}, jw[100] = {0};
    for (int r = 0; r < repeat && !rc; r++) {
        rc = host_reload(&h, 0, &plain[r]);
        if (!rc)
            rc = host_reload(&h, 1, &rb[r]);
        if (!rc && journal) {
            double before = refit_sys_journal_seconds(hj.ctx);
            if ((rc = host_reload(&hj, 0, &jr[r])))
                reported = host_fail(&hj, "journaled reload", rc);
            jw[r] = refit_sys_journal_seconds(hj.ctx) - before; /* the journal's part of it */
        }
        copy[r] = host_copy_only(&h);
    }
    if (rc && !reported)
        host_fail(&h, "reload", rc);
    if (rc)
        return host_free(&h), host_free(&hj), 1;
    double t_plain = min_of(plain, repeat), t_rb = min_of(rb, repeat);
    double t_copy = min_of(copy, repeat);
    double n = (double)h.n_tensors;
    double us = (t_plain - t_copy) / n * 1e6, us_rb = (t_rb - t_copy) / n * 1e6;

    double t_journal = -1, t_jwrites = -1, t_plain_med = -1;
    if (journal) {
        /* typical against typical: the median of the journal's time inside
         * each journaled reload, over the median host-only reload */
        double plain_copy[100];
        memcpy(plain_copy, plain, sizeof(double) * (size_t)repeat);
        t_plain_med = median_of(plain_copy, repeat);
        t_journal = median_of(jw, repeat);
        /* the journal's writes alone, as the core issues them, for scale */
        if (bench_journal_write(journal, h.n_modules, h.n_tensors, &t_jwrites))
            return host_free(&h), host_free(&hj), 1;
    }

    if (json) {
        const double t[] = {t_register, t_seal, t_plain, t_rb, t_copy, us, us_rb,
                            t_journal, t_jwrites, t_plain_med};
        rc = host_json(&a, &h, t, jr);
    } else {
        printf("host bench: %zu tensors in %zu modules (%d bytes each), best of %d\n",
               h.n_tensors, h.n_modules, EXPERT_ROWS * EXPERT_COLS * 2, repeat);
        printf("  seal (plan)            %9.3f ms  %.4f us/tensor\n", t_seal * 1e3,
               t_seal / n * 1e6);
        printf("  reload                 %9.3f ms  (copy alone %.3f ms)\n", t_plain * 1e3,
               t_copy * 1e3);
        printf("  host cost per tensor   %9.4f us  (target <= 1.0)\n", us);
        printf("  with rollback          %9.4f us\n", us_rb);
        if (journal)
            printf("  journal cost           %9.3f ms  (median; %.2f%% of the median reload, "
                   "%.3f ms; target <= 2%%; its writes alone %.3f ms)\n",
                   t_journal * 1e3, 100 * t_journal / t_plain_med, t_plain_med * 1e3,
                   t_jwrites * 1e3);
    }
    host_free(&h);
    host_free(&hj);
    return rc ? 1 : 0;
}

static int usage(FILE *f)
{
    fprintf(f, "usage: refit-bench AREA [OPTIONS]\n"
               "       refit-bench AREA --help\n\n"
               "areas (each writes one JSON object of figures, docs/ lists the keys):\n"
               "  host         host cost per tensor of a reload, and the journal's\n"
               "  safetensors  streaming from a page-cached file against memcpy\n"
               "  nccl         a trainer broadcasting to a worker over NCCL (2 GPUs)\n"
               "  gpu          the CUDA figures (a CUDA build and a GPU)\n"
               "Exit status: 0 ok, 1 a failure, 2 usage.\n\n"
               "options:\n  -h, --help  print this help and exit\n");
    return f == stderr ? 2 : 0;
}

#ifndef REFIT_HAVE_CUDA
static int bench_gpu_missing(int argc, char **argv)
{
    static const cli_opt opts[] = {{"json", 'j', NULL, "errors as JSON"}, {NULL, 0, NULL, NULL}};
    static const cli c = {"refit-bench gpu", "[options]",
                          "The CUDA figures; this build has no CUDA backend "
                          "(-Dcuda=enabled).", opts};
    int first, rc = cli_parse(&c, argc, argv, NULL, NULL, &first);
    if (rc == CLI_HELP)
        return 0;
    return cli_error(2, "this build has no CUDA backend (-Dcuda=enabled)");
}
#endif

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } areas[] = {
        {"host", bench_host},
        {"nccl", bench_nccl_main},
        {"safetensors", bench_safetensors_main},
#ifdef REFIT_HAVE_CUDA
        {"gpu", bench_gpu_main},
#else
        {"gpu", bench_gpu_missing},
#endif
    };
    int at = 1;
    while (at < argc && argv[at][0] == '-' && strcmp(argv[at], "--")) {
        if (!strcmp(argv[at], "-h") || !strcmp(argv[at], "--help"))
            return usage(stdout);
        at++;
    }
    if (at >= argc)
        return usage(stderr);
    for (size_t i = 0; i < sizeof areas / sizeof *areas; i++) {
        if (strcmp(argv[at], areas[i].name))
            continue;
        char *name = argv[at]; /* the area's argv: its name, then the rest in order */
        memmove(argv + 2, argv + 1, (size_t)(at - 1) * sizeof *argv);
        argv[1] = name;
        return areas[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "refit-bench: unknown area '%s'\n", argv[at]);
    return usage(stderr);
}
