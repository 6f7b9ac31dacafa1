/* Host cost of refit's bookkeeping at MoE scale (issue 28, item 6): a
 * model shaped like an MoE checkpoint (L layers, each 6 dense modules of
 * one tensor and, per projection, E experts' checkpoint tensors stacked
 * into one module or one module an expert), registered, sealed and
 * updated on host memory with tiny tensors, so that what is timed is
 * refit's per-tensor and per-module work, not copies. Prints one JSON
 * line per run: registration, seal, and per update the seconds and the
 * microseconds per checkpoint tensor, for refit_load in checkpoint order
 * and one refit_load_many.
 *
 *   moe_scale [--layers L] [--experts E] [--unstacked] [--scales]
 *             [--staged] [--journal PATH] [--rollback] [--updates N]
 *
 * --scales adds a scale tensor per expert weight (block-FP8 checkpoints
 * carry one); --staged routes expert tensors through staging and a
 * post-load an expert at a time (REFIT_MODULE_EXPERT_SLICES) instead of
 * DIRECT copies. Public API only (refit.h, format.h, sys/stats.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <refit/format.h>
#include <refit/refit.h>
#include <refit/sys/stats.h>

#define R 2 /* rows of a tiny tensor */
#define C 4 /* columns */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int probe_plan(const refit_host_v2 *h, refit_fmt_module *m)
{
    const char *st = h->param(h->host, m, "staged");
    int staged = st && !strcmp(st, "1");
    for (uint32_t i = 0; i < m->n_ckpt; i++)
        refit_ckpt(m, i)->route = staged ? REFIT_ROUTE_STAGED : REFIT_ROUTE_DIRECT;
    m->flags = staged ? REFIT_MODULE_WHOLE | REFIT_MODULE_POST_LOAD | REFIT_MODULE_EXPERT_SLICES
                      : 0;
    return REFIT_OK;
}

/* place = staged, element by element (host memory). */
static int probe_post_load(const refit_host_v2 *h, const refit_fmt_module *m, void *stream)
{
    for (uint32_t i = 0; i < m->n_ckpt; i++) {
        const refit_fmt_ckpt *c = refit_ckpt(m, i);
        int rc = h->copy(h->host, &c->place, &c->staged, stream);
        if (rc)
            return rc;
    }
    return REFIT_OK;
}

static const refit_format_v2 probe_fmt = {
    .abi_version = REFIT_FORMAT_ABI_VERSION,
    .struct_size = sizeof(refit_format_v2),
    .name = "probe",
    .plan = probe_plan,
    .post_load = probe_post_load,
};

typedef struct cfg {
    int layers, experts, unstacked, scales, staged, rollback, updates;
    const char *journal;
} cfg;

typedef struct model {
    refit_ctx *ctx;
    refit_model *m;
    refit_tensor *rt;     /* runtime descriptors */
    int64_t *rt_shape;    /* REFIT_MAX_DIMS a descriptor */
    float **rt_buf;
    size_t n_rt, cap_rt;
    char **names;         /* checkpoint names, in checkpoint order */
    size_t n_ck, cap_ck;
    float *src;           /* one source buffer for every checkpoint tensor */
    refit_tensor src_t, src_scale;
    int64_t src_shape[2], scale_shape[2];
} model;

static void die(model *w, const char *what, int rc)
{
    fprintf(stderr, "moe_scale: %s: %s: %s\n", what, refit_status_name(rc),
            w->ctx ? refit_errmsg(w->ctx) : "");
    exit(1);
}

/* Bind a runtime tensor of ndim dims (shape) to module mod. */
static void runtime(model *w, const char *mod, const char *name, int ndim, const int64_t *shape)
{
    if (w->n_rt == w->cap_rt) {
        /* descriptors are borrowed by the model: allocate them in blocks
         * that never move */
        fprintf(stderr, "moe_scale: too many runtime tensors\n");
        exit(1);
    }
    refit_tensor *t = &w->rt[w->n_rt];
    int64_t *sh = &w->rt_shape[w->n_rt * REFIT_MAX_DIMS];
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        n *= (size_t)shape[i];
    }
    float *buf = calloc(n, sizeof *buf);
    if (!buf)
        die(w, "out of memory", REFIT_ENOMEM);
    w->rt_buf[w->n_rt++] = buf;
    memset(t, 0, sizeof *t);
    t->data = buf;
    t->device.device_type = REFIT_DEVICE_CPU;
    t->ndim = ndim;
    t->dtype = (refit_dtype){REFIT_DTYPE_FLOAT, 32, 1};
    t->shape = sh;
    int rc = refit_module_bind_runtime(w->m, mod, name, t);
    if (rc)
        die(w, "bind", rc);
}

static void expect(model *w, const char *mod, const char *name, const char *target,
                   int64_t expert, int64_t row, int64_t rows)
{
    refit_ckpt_spec s = REFIT_CKPT_SPEC_INIT;
    s.dtype = (refit_dtype){REFIT_DTYPE_FLOAT, 32, 1};
    s.ndim = 2;
    s.shape[0] = rows;
    s.shape[1] = C;
    s.target = target;
    s.expert = expert;
    s.dst_offset[0] = row;
    int rc = refit_model_expect(w->m, mod, name, &s);
    if (rc)
        die(w, name, rc);
    if (w->n_ck == w->cap_ck) {
        w->cap_ck = w->cap_ck ? 2 * w->cap_ck : 1024;
        w->names = realloc(w->names, w->cap_ck * sizeof *w->names);
        if (!w->names)
            die(w, "out of memory", REFIT_ENOMEM);
    }
    w->names[w->n_ck++] = strdup(name);
}

/* One layer: 6 dense modules, then the experts of gate/up (fused into
 * w13) and down (w2), stacked or one module an expert. */
static void layer(model *w, const cfg *c, int l)
{
    static const char *const dense[6] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                         "input_layernorm", "post_attention_layernorm"};
    const char *params = c->staged ? "staged: 1" : NULL;
    char mod[128], name[192];
    for (int i = 0; i < 6; i++) {
        snprintf(mod, sizeof mod, "model.layers.%d.%s", l, dense[i]);
        if (refit_model_add_module(w->m, mod, "probe", NULL))
            die(w, mod, REFIT_EINVAL);
        runtime(w, mod, "weight", 2, (int64_t[]){R, C});
        snprintf(name, sizeof name, "%s.weight", mod);
        expect(w, mod, name, "weight", -1, 0, R);
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    int E = c->experts;
    for (int s = 0; s < (c->unstacked ? E : 1); s++) {
        for (int k = 0; k < 2; k++) { /* w13, w2 */
            if (c->unstacked)
                snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.%d.w%s", l, s,
                         k ? "2" : "13");
            else
                snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.w%s", l, k ? "2" : "13");
            int rc = refit_model_add_module(w->m, mod, "probe", params);
            if (rc)
                die(w, mod, rc);
            int64_t n = c->unstacked ? 1 : E, rows = k ? R : 2 * R;
            runtime(w, mod, "weight", 3, (int64_t[]){n, rows, C});
            if (c->scales)
                runtime(w, mod, "scale", 3, (int64_t[]){n, rows, C});
        }
    }
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            int k = p == 2;
            if (c->unstacked)
                snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.%d.w%s", l, e,
                         k ? "2" : "13");
            else
                snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.w%s", l, k ? "2" : "13");
            int64_t x = c->unstacked ? 0 : e, row = p == 1 ? R : 0;
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, e,
                     proj[p]);
            expect(w, mod, name, "weight", x, row, R);
            if (c->scales) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight_scale",
                         l, e, proj[p]);
                expect(w, mod, name, "scale", x, row, R);
            }
        }
}

static double update(model *w, const cfg *c, int many, const char *label)
{
    refit_update_opts o = REFIT_UPDATE_OPTS_INIT;
    o.version_label = label;
    o.rollback = c->rollback;
    refit_tensor *srcs = many ? malloc(w->n_ck * sizeof *srcs) : NULL;
    for (size_t i = 0; srcs && i < w->n_ck; i++)
        srcs[i] = w->src_t; /* the table is the caller's: not timed */
    refit_txn *t;
    double t0 = now();
    int rc = refit_begin(&t, w->m, &o);
    if (rc)
        die(w, "begin", rc);
    if (many && (rc = refit_load_many(t, w->n_ck, (const char *const *)w->names, srcs, NULL)))
        die(w, "load_many", rc);
    for (size_t i = 0; !many && i < w->n_ck; i++)
        if ((rc = refit_load(t, w->names[i], &w->src_t, NULL)))
            die(w, w->names[i], rc);
    if ((rc = refit_finalize(t)))
        die(w, "finalize", rc);
    double dt = now() - t0;
    free(srcs);
    return dt;
}

int main(int argc, char **argv)
{
    cfg c = {48, 128, 0, 0, 0, 0, 3, NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            c.layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc)
            c.experts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--updates") && i + 1 < argc)
            c.updates = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--journal") && i + 1 < argc)
            c.journal = argv[++i];
        else if (!strcmp(argv[i], "--unstacked"))
            c.unstacked = 1;
        else if (!strcmp(argv[i], "--scales"))
            c.scales = 1;
        else if (!strcmp(argv[i], "--staged"))
            c.staged = 1;
        else if (!strcmp(argv[i], "--rollback"))
            c.rollback = 1;
        else {
            fprintf(stderr, "usage: moe_scale [--layers L] [--experts E] [--unstacked] "
                            "[--scales] [--staged] [--journal PATH] [--rollback] "
                            "[--updates N]\n");
            return 2;
        }
    }
    model w;
    memset(&w, 0, sizeof w);
    size_t mods = (size_t)c.layers * (6 + (c.unstacked ? 2 * (size_t)c.experts : 2));
    w.cap_rt = mods * 2;
    w.rt = calloc(w.cap_rt, sizeof *w.rt);
    w.rt_shape = calloc(w.cap_rt * REFIT_MAX_DIMS, sizeof *w.rt_shape);
    w.rt_buf = calloc(w.cap_rt, sizeof *w.rt_buf);
    refit_options opt = REFIT_OPTIONS_INIT;
    opt.journal_path = c.journal ? c.journal : "";
    int rc = refit_open(&w.ctx, &opt);
    if (rc)
        die(&w, "open", rc);
    if ((rc = refit_format_register(w.ctx, &probe_fmt)))
        die(&w, "register", rc);
    double t0 = now();
    if ((rc = refit_model_create(&w.m, w.ctx)))
        die(&w, "model", rc);
    for (int l = 0; l < c.layers; l++)
        layer(&w, &c, l);
    double t1 = now();
    if ((rc = refit_model_seal(w.m)))
        die(&w, "seal", rc);
    double t2 = now();
    w.src = calloc(R * C, sizeof *w.src);
    w.src_shape[0] = R;
    w.src_shape[1] = C;
    w.src_t = (refit_tensor){.data = w.src, .device = {REFIT_DEVICE_CPU, 0}, .ndim = 2,
                             .dtype = {REFIT_DTYPE_FLOAT, 32, 1}, .shape = w.src_shape};
    refit_model_stats st;
    refit_model_stats_get(w.m, &st);
    printf("{\"layers\": %d, \"experts\": %d, \"stacked\": %s, \"staged\": %s, "
           "\"journal\": %s, \"rollback\": %s, \"modules\": %u, \"ckpt_tensors\": %u, "
           "\"register_s\": %.4f, \"seal_s\": %.4f",
           c.layers, c.experts, c.unstacked ? "false" : "true", c.staged ? "true" : "false",
           c.journal ? "true" : "false", c.rollback ? "true" : "false", st.modules,
           st.ckpt_tensors, t1 - t0, t2 - t1);
    double best_load = 1e9, best_many = 1e9;
    for (int u = 0; u < c.updates; u++) {
        char label[32];
        snprintf(label, sizeof label, "v%d", 2 * u);
        double a = update(&w, &c, 0, label);
        snprintf(label, sizeof label, "v%d", 2 * u + 1);
        double b = update(&w, &c, 1, label);
        best_load = a < best_load ? a : best_load;
        best_many = b < best_many ? b : best_many;
    }
    printf(", \"update_load_s\": %.4f, \"us_per_tensor_load\": %.3f, "
           "\"update_many_s\": %.4f, \"us_per_tensor_many\": %.3f}\n",
           best_load, 1e6 * best_load / (double)w.n_ck, best_many,
           1e6 * best_many / (double)w.n_ck);
    refit_model_destroy(w.m);
    refit_close(w.ctx);
    for (size_t i = 0; i < w.n_rt; i++)
        free(w.rt_buf[i]);
    for (size_t i = 0; i < w.n_ck; i++)
        free(w.names[i]);
    free(w.names);
    free(w.rt);
    free(w.rt_shape);
    free(w.rt_buf);
    free(w.src);
    return 0;
}
